package envelope

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// PromMetrics exports the API's request and decision figures to Prometheus.
type PromMetrics struct {
	requests  *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	decisions *prometheus.CounterVec
	// unrecorded counts refusals past a principal's audit limit.
	unrecorded prometheus.Counter
}

// NewPromMetrics registers the envelope's collectors on reg.
func NewPromMetrics(reg prometheus.Registerer) *PromMetrics {
	m := &PromMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bc_api_requests_total", Help: "API requests by procedure and machine code.",
		}, []string{"procedure", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "bc_api_request_duration_seconds", Help: "API request latency by procedure and machine code.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"procedure", "code"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bc_authz_decisions_total", Help: "Authorization decisions by action and outcome.",
		}, []string{"action", "decision"}),
		unrecorded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "bc_audit_refusals_unrecorded_total",
			Help: "Refusals not written to the audit log because their principal exceeded its refusal audit limit.",
		}),
	}
	reg.MustRegister(m.requests, m.latency, m.decisions, m.unrecorded)
	return m
}

// Request records one served request.
func (m *PromMetrics) Request(procedure, code string, d time.Duration) {
	m.requests.WithLabelValues(procedure, code).Inc()
	m.latency.WithLabelValues(procedure, code).Observe(d.Seconds())
}

// Decision records one authorization decision.
func (m *PromMetrics) Decision(action, decision string) {
	m.decisions.WithLabelValues(action, decision).Inc()
}

// RefusalUnrecorded counts one refusal left out of the audit log.
func (m *PromMetrics) RefusalUnrecorded() { m.unrecorded.Inc() }
