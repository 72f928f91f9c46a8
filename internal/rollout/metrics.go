package rollout

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/better-compute/better-compute/internal/store"
)

// metrics are the module's counters on this replica; the gauge of nodes
// by state is read from the database at scrape time (NodeGauge).
type metrics struct {
	transitions *prometheus.CounterVec
	waves       prometheus.Counter
	halts       prometheus.Counter
}

func newMetrics() *metrics {
	return &metrics{
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bc_rollout_node_transitions_total",
			Help: "Rollout nodes that entered a state (upgrading, soaking, done, failed, rolled_back) on this replica's controller.",
		}, []string{"state"}),
		waves: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "bc_rollout_waves_completed_total",
			Help: "Rollout waves whose every node upgraded and soaked.",
		}),
		halts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "bc_rollout_halts_total",
			Help: "Rollouts halted (a node failed its upgrade, did not come back, or showed a health finding) and rolled back.",
		}),
	}
}

// Collectors are the module's metrics, for the app's registry.
func (m *Module) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.metrics.transitions, m.metrics.waves, m.metrics.halts, &nodeGauge{m: m}}
}

func (x *metrics) nodeMoved(state string) { x.transitions.WithLabelValues(state).Inc() }
func (x *metrics) waveCompleted()         { x.waves.Inc() }
func (x *metrics) halted()                { x.halts.Inc() }

// nodeGauge reads the nodes of active rollouts by state at scrape time,
// so every replica reports the fleet's figure.
type nodeGauge struct{ m *Module }

var nodeGaugeDesc = prometheus.NewDesc("bc_rollout_nodes", "Nodes of active (running, paused, halted) rollouts, by rollout node state.", []string{"state"}, nil)

func (g *nodeGauge) Describe(ch chan<- *prometheus.Desc) { ch <- nodeGaugeDesc }

func (g *nodeGauge) Collect(ch chan<- prometheus.Metric) {
	var counts map[string]int
	err := g.m.cfg.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) (err error) {
		counts, err = ActiveNodeStateCounts(ctx, tx)
		return err
	})
	if err != nil {
		g.m.log.Warn("rollout metrics", "err", err)
		return
	}
	for _, s := range NodeStates {
		ch <- prometheus.MustNewConstMetric(nodeGaugeDesc, prometheus.GaugeValue, float64(counts[s]), s)
	}
}
