package gateway

import (
	"math"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
)

// fleetMetrics are what the sessions of this replica see: command dispatch
// and outcomes, heartbeats, and the GPU telemetry the nodes send with their
// heartbeats. Fleet-wide counts (nodes by state, open commands) are read
// from the database at scrape time by the app, not kept here.
type fleetMetrics struct {
	dispatch   *prometheus.HistogramVec
	finished   *prometheus.CounterVec
	heartbeats prometheus.Counter
	sessions   prometheus.GaugeFunc
	telemetry  *telemetryStore
}

func newFleetMetrics(g *Gateway) *fleetMetrics {
	return &fleetMetrics{
		dispatch: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "bc_fleet_command_dispatch_seconds",
			Help: "From a command's creation to its first send on the node's session, by kind.",
			// Commands to connected nodes go out in milliseconds; to a node
			// that was away, when it comes back.
			Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5, 15, 60, 300, 1800},
		}, []string{"kind"}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bc_fleet_commands_finished_total",
			Help: "Commands that reached a final state (succeeded, failed, canceled, expired), by kind.",
		}, []string{"kind", "state"}),
		heartbeats: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "bc_gateway_heartbeats_received_total", Help: "Heartbeats received on this replica's sessions.",
		}),
		sessions: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "bc_gateway_sessions", Help: "Agent sessions open on this replica.",
		}, func() float64 { return float64(g.hub.count()) }),
		telemetry: &telemetryStore{nodes: map[string]nodeTelemetry{}},
	}
}

func (m *fleetMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.dispatch, m.finished, m.heartbeats, m.sessions, m.telemetry}
}

// dispatched observes a command's first send.
func (m *fleetMetrics) dispatched(kind string, since time.Duration) {
	m.dispatch.WithLabelValues(kind).Observe(max(since, 0).Seconds())
}

// commandFinished counts a command's final state.
func (m *fleetMetrics) commandFinished(kind, state string) {
	m.finished.WithLabelValues(kind, state).Inc()
}

// heartbeat counts a heartbeat and keeps its telemetry.
func (m *fleetMetrics) heartbeat(nodeID, nodeName string, gpus []*agentv1.GpuTelemetry) {
	m.heartbeats.Inc()
	m.telemetry.set(nodeID, nodeName, gpus)
}

// nodeTelemetry is a node's latest GPU readings.
type nodeTelemetry struct {
	name string
	gpus []*agentv1.GpuTelemetry
}

// telemetryStore keeps the latest GPU telemetry of each node with a session
// on this replica and exports it summarized per node. Kept in memory, not
// the database: it is replaced every heartbeat and worth nothing once the
// session is gone, and each replica exports its own sessions' nodes (sum
// over replicas in queries).
type telemetryStore struct {
	mu    sync.Mutex
	nodes map[string]nodeTelemetry
}

func (t *telemetryStore) set(nodeID, name string, gpus []*agentv1.GpuTelemetry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(gpus) == 0 {
		delete(t.nodes, nodeID)
		return
	}
	t.nodes[nodeID] = nodeTelemetry{name: name, gpus: gpus}
}

func (t *telemetryStore) forget(nodeID string) {
	t.mu.Lock()
	delete(t.nodes, nodeID)
	t.mu.Unlock()
}

var (
	nodeLabels   = []string{"node", "node_id"}
	descGPUs     = prometheus.NewDesc("bc_node_gpus_reporting", "GPUs in the node's last telemetry.", nodeLabels, nil)
	descUtil     = prometheus.NewDesc("bc_node_gpu_utilization_ratio", "Mean compute utilization of the node's GPUs, 0 to 1.", nodeLabels, nil)
	descMemUsed  = prometheus.NewDesc("bc_node_gpu_memory_used_bytes", "GPU memory in use, summed over the node's GPUs.", nodeLabels, nil)
	descMemTotal = prometheus.NewDesc("bc_node_gpu_memory_total_bytes", "GPU memory, summed over the node's GPUs.", nodeLabels, nil)
	descTemp     = prometheus.NewDesc("bc_node_gpu_max_temperature_celsius", "Temperature of the node's hottest GPU.", nodeLabels, nil)
	descPower    = prometheus.NewDesc("bc_node_gpu_power_watts", "Power draw, summed over the node's GPUs.", nodeLabels, nil)
	descECC      = prometheus.NewDesc("bc_node_gpu_ecc_errors_total", "Volatile ECC errors since the driver loaded, summed over the node's GPUs, by type (corrected, uncorrected).", append(nodeLabels[:2:2], "type"), nil)
	descXID      = prometheus.NewDesc("bc_node_gpu_xid_errors_total", "XID errors bcd has seen on the node's GPUs since it started.", nodeLabels, nil)
)

// Describe implements prometheus.Collector.
func (t *telemetryStore) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descGPUs, descUtil, descMemUsed, descMemTotal, descTemp, descPower, descECC, descXID} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: one summary per node. A reading
// no GPU of the node reported is left out rather than exported as zero.
func (t *telemetryStore) Collect(ch chan<- prometheus.Metric) {
	t.mu.Lock()
	ids := make([]string, 0, len(t.nodes))
	for id := range t.nodes {
		ids = append(ids, id)
	}
	nodes := make([]nodeTelemetry, 0, len(ids))
	sort.Strings(ids)
	for _, id := range ids {
		nodes = append(nodes, t.nodes[id])
	}
	t.mu.Unlock()
	for i, n := range nodes {
		lv := []string{n.name, ids[i]}
		var s summary
		for _, g := range n.gpus {
			s.add(g)
		}
		gauge := func(d *prometheus.Desc, v float64, ok bool, extra ...string) {
			if ok {
				ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append(lv, extra...)...)
			}
		}
		counter := func(d *prometheus.Desc, v float64, ok bool, extra ...string) {
			if ok {
				ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, append(lv, extra...)...)
			}
		}
		gauge(descGPUs, float64(len(n.gpus)), true)
		gauge(descUtil, s.util/float64(max(s.utilN, 1))/100, s.utilN > 0)
		gauge(descMemUsed, s.memUsed, s.memUsedN > 0)
		gauge(descMemTotal, s.memTotal, s.memTotalN > 0)
		gauge(descTemp, s.tempMax, s.tempN > 0)
		gauge(descPower, s.power, s.powerN > 0)
		counter(descECC, s.eccCorr, s.eccCorrN > 0, "corrected")
		counter(descECC, s.eccUncorr, s.eccUncorrN > 0, "uncorrected")
		counter(descXID, s.xid, s.xidN > 0)
	}
}

// summary folds a node's GPU readings; each N counts the GPUs that gave
// the reading.
type summary struct {
	util, memUsed, memTotal, tempMax, power, eccCorr, eccUncorr, xid      float64
	utilN, memUsedN, memTotalN, tempN, powerN, eccCorrN, eccUncorrN, xidN int
}

func (s *summary) add(g *agentv1.GpuTelemetry) {
	if g.UtilizationPercent != nil {
		s.util += g.GetUtilizationPercent()
		s.utilN++
	}
	if g.MemoryUsedBytes != nil {
		s.memUsed += float64(g.GetMemoryUsedBytes())
		s.memUsedN++
	}
	if g.MemoryTotalBytes != nil {
		s.memTotal += float64(g.GetMemoryTotalBytes())
		s.memTotalN++
	}
	if g.TemperatureCelsius != nil {
		if s.tempN == 0 || g.GetTemperatureCelsius() > s.tempMax {
			s.tempMax = g.GetTemperatureCelsius()
		}
		s.tempN++
	}
	if g.PowerWatts != nil {
		s.power += g.GetPowerWatts()
		s.powerN++
	}
	if g.EccCorrectedTotal != nil {
		s.eccCorr += float64(g.GetEccCorrectedTotal())
		s.eccCorrN++
	}
	if g.EccUncorrectedTotal != nil {
		s.eccUncorr += float64(g.GetEccUncorrectedTotal())
		s.eccUncorrN++
	}
	if g.XidTotal != nil {
		s.xid += float64(g.GetXidTotal())
		s.xidN++
	}
}

// Telemetry bounds: a reading outside them is a broken or hostile agent,
// and the heartbeat is refused rather than exported.
const (
	maxGPUIndex    = 1023
	maxTemperature = 300    // °C; a die past this is not reporting
	maxPowerWatts  = 100000 // far above any single GPU
)

// validateHeartbeat checks a heartbeat's telemetry: at most maxListItems
// GPUs, each named once by a UUID-like token, every reading finite and in
// its range.
func validateHeartbeat(h *agentv1.Heartbeat) error {
	gpus := h.GetGpus()
	if len(gpus) > maxListItems {
		return invalid("heartbeat.gpus: more than %d GPUs", maxListItems)
	}
	seen := make(map[string]bool, len(gpus))
	for i, g := range gpus {
		switch uuid := g.GetUuid(); {
		case uuid == "" || len(uuid) > maxShort || !tokenRE.MatchString(uuid):
			return invalid("heartbeat.gpus[%d].uuid: want a GPU UUID of at most %d characters, got %q", i, maxShort, clip(uuid))
		case seen[uuid]:
			return invalid("heartbeat.gpus[%d].uuid: %s reported twice", i, clip(uuid))
		case g.GetIndex() < 0 || g.GetIndex() > maxGPUIndex:
			return invalid("heartbeat.gpus[%d].index: want 0 to %d, got %d", i, maxGPUIndex, g.GetIndex())
		}
		seen[g.GetUuid()] = true
		for _, r := range []struct {
			name      string
			set       bool
			v, lo, hi float64
		}{
			{"utilization_percent", g.UtilizationPercent != nil, g.GetUtilizationPercent(), 0, 100},
			{"temperature_celsius", g.TemperatureCelsius != nil, g.GetTemperatureCelsius(), -maxTemperature, maxTemperature},
			{"power_watts", g.PowerWatts != nil, g.GetPowerWatts(), 0, maxPowerWatts},
		} {
			if r.set && (math.IsNaN(r.v) || r.v < r.lo || r.v > r.hi) {
				return invalid("heartbeat.gpus[%d].%s: want %g to %g, got %g", i, r.name, r.lo, r.hi, r.v)
			}
		}
		if g.MemoryUsedBytes != nil && g.MemoryTotalBytes != nil && g.GetMemoryUsedBytes() > g.GetMemoryTotalBytes() {
			return invalid("heartbeat.gpus[%d].memory_used_bytes: %d is more than memory_total_bytes %d", i, g.GetMemoryUsedBytes(), g.GetMemoryTotalBytes())
		}
	}
	return nil
}
