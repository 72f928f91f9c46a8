package health

import "github.com/prometheus/client_golang/prometheus"

// metrics are the module's counters on this replica; the fleet-wide
// gauges (GPUs out, breakers open, budget in use) are read from the
// database at scrape time by the app.
type metrics struct {
	findings     *prometheus.CounterVec
	quarantines  *prometheus.CounterVec
	remediations *prometheus.CounterVec
	trips        prometheus.Counter
	escalations  prometheus.Counter
}

func newMetrics(*Module) *metrics {
	return &metrics{
		findings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bc_health_findings_total",
			Help: "Health findings recorded from bcd's reports, by kind, severity and the action the pool's policy took.",
		}, []string{"kind", "severity", "action"}),
		quarantines: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bc_health_gpu_quarantines_total",
			Help: "GPUs taken out of placement for health, by state (quarantined, rma).",
		}, []string{"state"}),
		remediations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bc_health_remediations_total",
			Help: "Remediations that ended, by action (reset, reboot) and outcome (succeeded, failed, escalated, canceled).",
		}, []string{"action", "outcome"}),
		trips: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "bc_health_breaker_trips_total",
			Help: "Times a pool's health circuit breaker tripped (remediation stopped in the pool).",
		}),
		escalations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "bc_health_escalations_total",
			Help: "Nodes sent to maintenance because a remediation failed, was cancelled or did not hold.",
		}),
	}
}

// Collectors are the module's metrics, for the app's registry.
func (m *Module) Collectors() []prometheus.Collector {
	x := m.metrics
	return []prometheus.Collector{x.findings, x.quarantines, x.remediations, x.trips, x.escalations}
}

func (x *metrics) finding(kind, severity, action string) {
	x.findings.WithLabelValues(kind, severity, action).Inc()
}

func (x *metrics) quarantined(state string) { x.quarantines.WithLabelValues(state).Inc() }

func (x *metrics) remediationEnded(action, outcome string) {
	x.remediations.WithLabelValues(action, outcome).Inc()
}

func (x *metrics) tripped() { x.trips.Inc() }

func (x *metrics) escalated() { x.escalations.Inc() }
