package agent

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are per Agent (not the global registry) so that many fake daemons
// can live in one test process.
type metrics struct {
	reg          *prometheus.Registry
	connected    prometheus.Gauge
	reconnects   prometheus.Counter
	commands     *prometheus.CounterVec
	heartbeatRTT prometheus.Gauge
	heartbeats   prometheus.Counter
	certExpiry   prometheus.Gauge
	renewals     *prometheus.CounterVec
	// telemetryErrors counts failed reads of the GPUs' live state
	// (telemetry.go).
	telemetryErrors prometheus.Counter
	// commandsRefused counts commands whose signature did not verify.
	commandsRefused *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "bcd_session_connected", Help: "1 while a session with the gateway is established.",
		}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "bcd_session_reconnects_total", Help: "Session attempts after the first.",
		}),
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bcd_commands_applied_total", Help: "Commands applied, by kind and final state.",
		}, []string{"kind", "state"}),
		heartbeatRTT: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "bcd_heartbeat_rtt_seconds", Help: "Round trip of the last Hello/HelloAck exchange, the session's only request/answer pair.",
		}),
		heartbeats: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "bcd_heartbeats_sent_total", Help: "Heartbeats sent.",
		}),
		certExpiry: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "bcd_certificate_expiry_timestamp_seconds", Help: "NotAfter of the node certificate.",
		}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bcd_certificate_renewals_total", Help: "Certificate renewals by result.",
		}, []string{"result"}),
	}
	m.telemetryErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "bcd_gpu_telemetry_errors_total", Help: "Reads of the GPUs' live state that failed or timed out.",
	})
	m.commandsRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "bcd_commands_refused_total", Help: "Commands refused before applying because their signature did not verify, by failure code.",
	}, []string{"code"})
	m.reg.MustRegister(m.telemetryErrors, m.commandsRefused)
	m.reg.MustRegister(m.connected, m.reconnects, m.commands, m.heartbeatRTT, m.heartbeats, m.certExpiry, m.renewals,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// MetricsHandler serves the agent's Prometheus metrics.
func (a *Agent) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(a.metrics.reg, promhttp.HandlerOpts{})
}

// Metrics is the agent's registry, for tests and embedding.
func (a *Agent) Metrics() prometheus.Gatherer { return a.metrics.reg }
