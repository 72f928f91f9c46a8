package app

import (
	"cmp"
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/better-compute/better-compute/internal/capacity/quota"
	"github.com/better-compute/better-compute/internal/capacity/views"
	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/gpuhealth"
	"github.com/better-compute/better-compute/internal/health"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/webhooks"
)

// Defaults of the scrape-time collector.
const (
	// metricsCacheTTL: scrapes within it (several Prometheus servers, a
	// dashboard's refresh) share one set of queries.
	metricsCacheTTL = 5 * time.Second
	// metricsQueryTimeout bounds the queries of one collection; a slow
	// database costs a scrape its database series, never a hung scrape.
	metricsQueryTimeout = 3 * time.Second
	// maxNodeSeries caps the per-node series (heartbeat, liveness); past it
	// bc_metrics_nodes_truncated says so.
	maxNodeSeries = 10000
	// maxQuotaRows caps the quotas summarized into headroom.
	maxQuotaRows = 10000
)

// Metric descriptions of the database collector. Fleet-wide series carry no
// tenant: a pool is named by its id and name, a node by its id and name.
var (
	descNodes = prometheus.NewDesc("bc_fleet_nodes", "Nodes by lifecycle state and liveness.",
		[]string{"state", "liveness"}, nil)
	descSessions = prometheus.NewDesc("bc_fleet_sessions_connected",
		"Nodes with a session open on some gateway replica.", nil, nil)
	descHeartbeatLag = prometheus.NewDesc("bc_fleet_heartbeat_lag_max_seconds",
		"Longest time since the last recorded heartbeat among nodes with a session (heartbeats are written in batches about every second).", nil, nil)
	descNodeBeat = prometheus.NewDesc("bc_node_last_heartbeat_timestamp_seconds",
		"When the node's last heartbeat was recorded (Unix time); absent for a node that never beat.", []string{"node", "node_id"}, nil)
	descNodeLiveness = prometheus.NewDesc("bc_node_liveness",
		"1 for the node's current liveness (ready, unreachable, lost), 0 for the others; retired nodes are left out.", []string{"node", "node_id", "liveness"}, nil)
	descNodesTruncated = prometheus.NewDesc("bc_metrics_nodes_truncated",
		"1 when there are more non-retired nodes than per-node series exported.", nil, nil)
	descCommandsOpen = prometheus.NewDesc("bc_fleet_commands_open",
		"Commands not yet finished, by kind and state (pending, delivered, accepted, running).", []string{"kind", "state"}, nil)

	descGPUs = prometheus.NewDesc("bc_capacity_gpus",
		"Whole GPUs by pool, model and state: free (bookable now), booked (held by placed, binding or active reservations) or quarantined.",
		[]string{"pool", "pool_id", "model", "state"}, nil)
	descGPUsInstalled = prometheus.NewDesc("bc_capacity_gpus_installed",
		"Whole GPUs on the nodes of a pool, by model, whatever their state.", []string{"pool", "pool_id", "model"}, nil)
	descPending = prometheus.NewDesc("bc_capacity_pending_reservations",
		"Reservations waiting in a pool's queue for capacity.", []string{"pool", "pool_id"}, nil)

	descQuotaLimits = prometheus.NewDesc("bc_quota_gpu_limits",
		"Quotas that limit the GPUs a tenant or project holds at once.", nil, nil)
	descQuotaExhausted = prometheus.NewDesc("bc_quota_gpu_limits_exhausted",
		"GPU quotas whose scope holds its whole limit now.", nil, nil)
	descQuotaHeadroom = prometheus.NewDesc("bc_quota_gpu_headroom_ratio_min",
		"Smallest share of a GPU quota left to book now, over all GPU quotas (0 to 1); absent without GPU quotas.", nil, nil)

	descWebhookEndpoints = prometheus.NewDesc("bc_webhook_endpoints",
		"Webhook endpoints by state (enabled, disabled).", []string{"state"}, nil)
	descWebhookFailing = prometheus.NewDesc("bc_webhook_endpoints_failing",
		"Webhook endpoints whose head delivery is being retried.", nil, nil)
	descWebhookDeliveries = prometheus.NewDesc("bc_webhook_deliveries",
		"Webhook deliveries waiting to be sent (pending) or given up on (dead).", []string{"state"}, nil)
	descWebhookLag = prometheus.NewDesc("bc_webhook_delivery_lag_seconds",
		"Age of the oldest pending webhook delivery; 0 when none is pending.", nil, nil)

	descHealthGPUsOut = prometheus.NewDesc("bc_health_gpus_out",
		"GPUs out of placement for health, by pool and state (quarantined, rma); pool \"\" holds the nodes of no pool.",
		[]string{"pool", "pool_id", "state"}, nil)
	descHealthFindings = prometheus.NewDesc("bc_health_findings_open",
		"Open health findings by pool and severity (critical, error, warning, info).", []string{"pool", "pool_id", "severity"}, nil)
	descHealthRemediations = prometheus.NewDesc("bc_health_remediations",
		"Active remediations by pool and state (pending, draining, running).", []string{"pool", "pool_id", "state"}, nil)
	descHealthBreakerOpen = prometheus.NewDesc("bc_health_breaker_open",
		"1 while the pool's health circuit breaker is open (remediation stopped until an operator resets it), else 0.",
		[]string{"pool", "pool_id"}, nil)
	descHealthBudget = prometheus.NewDesc("bc_health_budget",
		"The most nodes of the pool under remediation at once (its disruption budget).", []string{"pool", "pool_id"}, nil)
	descHealthBudgetUsed = prometheus.NewDesc("bc_health_budget_used",
		"Nodes of the pool under remediation now (draining or running).", []string{"pool", "pool_id"}, nil)

	dbDescs = []*prometheus.Desc{descNodes, descSessions, descHeartbeatLag, descNodeBeat, descNodeLiveness, descNodesTruncated,
		descCommandsOpen, descGPUs, descGPUsInstalled, descPending, descQuotaLimits, descQuotaExhausted, descQuotaHeadroom,
		descWebhookEndpoints, descWebhookFailing, descWebhookDeliveries, descWebhookLag,
		descHealthGPUsOut, descHealthFindings, descHealthRemediations, descHealthBreakerOpen, descHealthBudget, descHealthBudgetUsed}
)

// dbCollector exports gauges computed from the database at scrape time:
// nodes, sessions and heartbeats, open commands, capacity by pool and
// model, the placement queue, quota headroom and the webhook backlog.
// Counting rows on demand is correct by construction where counters kept
// by hand would drift across replicas and restarts. The queries run in one
// read transaction under metricsQueryTimeout, and their result is shared
// by the scrapes of the next metricsCacheTTL.
type dbCollector struct {
	db    *store.DB
	clock clock.Clock
	log   *slog.Logger
	ttl   time.Duration

	errors   prometheus.Counter
	duration prometheus.Gauge

	mu     sync.Mutex
	at     time.Time // real time of the cached collection
	cached []prometheus.Metric
}

func newDBCollector(db *store.DB, clk clock.Clock, log *slog.Logger) *dbCollector {
	return &dbCollector{
		db: db, clock: clk, log: log, ttl: metricsCacheTTL,
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "bc_metrics_collect_errors_total",
			Help: "Scrape-time database collections that failed or timed out; their series are missing from that scrape.",
		}),
		duration: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "bc_metrics_collect_duration_seconds", Help: "How long the last scrape-time database collection took.",
		}),
	}
}

// Describe implements prometheus.Collector.
func (c *dbCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range dbDescs {
		ch <- d
	}
	c.errors.Describe(ch)
	c.duration.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *dbCollector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.metrics() {
		ch <- m
	}
	c.errors.Collect(ch)
	c.duration.Collect(ch)
}

// metrics returns the cached collection, collecting again once it is older
// than the TTL. Concurrent scrapes wait for one collection.
func (c *dbCollector) metrics() []prometheus.Metric {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cached != nil && time.Since(c.at) < c.ttl {
		return c.cached
	}
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), metricsQueryTimeout)
	defer cancel()
	ms, err := c.collect(ctx)
	c.duration.Set(time.Since(began).Seconds())
	if err != nil {
		c.errors.Inc()
		c.log.Warn("metrics: database collection failed", "err", err)
		// A failed collection is not cached: the next scrape tries again.
		return nil
	}
	c.cached, c.at = ms, time.Now()
	return ms
}

func (c *dbCollector) collect(ctx context.Context) ([]prometheus.Metric, error) {
	var out []prometheus.Metric
	gauge := func(d *prometheus.Desc, v float64, lv ...string) {
		out = append(out, prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, lv...))
	}
	err := c.db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		now := c.clock.Now()
		if err := collectFleet(ctx, tx, now, gauge); err != nil {
			return err
		}
		if err := collectCapacity(ctx, tx, gauge); err != nil {
			return err
		}
		if err := collectHealth(ctx, tx, gauge); err != nil {
			return err
		}
		return collectWebhooks(ctx, tx, now, gauge)
	})
	return out, err
}

type gaugeFunc func(d *prometheus.Desc, v float64, lv ...string)

func collectFleet(ctx context.Context, tx store.Tx, now time.Time, gauge gaugeFunc) error {
	counts, err := fleet.NodeCounts(ctx, tx)
	if err != nil {
		return err
	}
	connected := 0
	for _, n := range counts {
		gauge(descNodes, float64(n.Nodes), n.State, n.Liveness)
		connected += n.Connected
	}
	gauge(descSessions, float64(connected))

	beats, more, err := fleet.NodeBeats(ctx, tx, maxNodeSeries)
	if err != nil {
		return err
	}
	var lag time.Duration
	for _, b := range beats {
		if b.LastHeartbeat != nil {
			gauge(descNodeBeat, float64(b.LastHeartbeat.UnixNano())/1e9, b.Name, b.ID)
			if b.Connected {
				lag = max(lag, now.Sub(*b.LastHeartbeat))
			}
		}
		for _, l := range []string{fleet.LivenessReady, fleet.LivenessUnreachable, fleet.LivenessLost} {
			gauge(descNodeLiveness, map[bool]float64{true: 1}[l == b.Liveness], b.Name, b.ID, l)
		}
	}
	gauge(descHeartbeatLag, lag.Seconds())
	gauge(descNodesTruncated, map[bool]float64{true: 1}[more])

	cmds, err := fleet.OpenCommandCounts(ctx, tx)
	if err != nil {
		return err
	}
	for _, c := range cmds {
		gauge(descCommandsOpen, float64(c.Count), c.Kind, c.State)
	}
	return nil
}

func collectCapacity(ctx context.Context, tx store.Tx, gauge gaugeFunc) error {
	rows, err := views.Stored(ctx, tx, "")
	if err != nil {
		return err
	}
	pending, err := views.Pending(ctx, tx, "")
	if err != nil {
		return err
	}
	pools := map[string]string{} // id → name, every pool with capacity or a queue
	for _, r := range rows {
		name := cmp.Or(r.PoolName, r.PoolID)
		pools[r.PoolID] = name
		if r.Kind != "gpu" {
			continue
		}
		gauge(descGPUsInstalled, float64(r.Total), name, r.PoolID, r.Model)
		gauge(descGPUs, float64(r.Free()), name, r.PoolID, r.Model, "free")
		gauge(descGPUs, float64(r.Booked), name, r.PoolID, r.Model, "booked")
		gauge(descGPUs, float64(r.Quarantined), name, r.PoolID, r.Model, "quarantined")
	}
	for id, p := range pending {
		pools[id] = cmp.Or(p.PoolName, id)
	}
	// Every known pool gets a queue series, 0 when empty, so that a sum
	// or a rate over it never starts from nothing.
	for id, name := range pools {
		gauge(descPending, float64(pending[id].Count), name, id)
	}

	hs, err := quota.GPUHeadrooms(ctx, tx, maxQuotaRows)
	if err != nil {
		return err
	}
	exhausted, minRatio := 0, 1.0
	for _, h := range hs {
		ratio := 0.0
		if h.Limit > 0 {
			ratio = float64(h.Headroom()) / float64(h.Limit)
		}
		minRatio = min(minRatio, ratio)
		if h.Headroom() == 0 {
			exhausted++
		}
	}
	gauge(descQuotaLimits, float64(len(hs)))
	gauge(descQuotaExhausted, float64(exhausted))
	if len(hs) > 0 {
		gauge(descQuotaHeadroom, minRatio)
	}
	return nil
}

func collectHealth(ctx context.Context, tx store.Tx, gauge gaugeFunc) error {
	pools, err := health.PoolsMetrics(ctx, tx)
	if err != nil {
		return err
	}
	for _, p := range pools {
		name := cmp.Or(p.Name, p.PoolID)
		for state, n := range p.GPUsOut {
			gauge(descHealthGPUsOut, float64(n), name, p.PoolID, state)
		}
		for _, sev := range []string{gpuhealth.SeverityCritical, gpuhealth.SeverityError, gpuhealth.SeverityWarning, gpuhealth.SeverityInfo} {
			gauge(descHealthFindings, float64(p.Findings[sev]), name, p.PoolID, sev)
		}
		for state, n := range p.Remediations {
			gauge(descHealthRemediations, float64(n), name, p.PoolID, state)
		}
		gauge(descHealthBreakerOpen, map[bool]float64{true: 1}[p.BreakerOpen], name, p.PoolID)
		gauge(descHealthBudget, float64(p.Budget), name, p.PoolID)
		gauge(descHealthBudgetUsed, float64(p.BudgetUsed), name, p.PoolID)
	}
	return nil
}

func collectWebhooks(ctx context.Context, tx store.Tx, now time.Time, gauge gaugeFunc) error {
	eps, err := webhooks.EndpointCounts(ctx, tx)
	if err != nil {
		return err
	}
	byState := map[string]int{webhooks.StateEnabled: 0, webhooks.StateDisabled: 0}
	failing := 0
	for _, e := range eps {
		byState[e.State] += e.Endpoints
		failing += e.Failing
	}
	for state, n := range byState {
		gauge(descWebhookEndpoints, float64(n), state)
	}
	gauge(descWebhookFailing, float64(failing))
	b, err := webhooks.DeliveryBacklogGet(ctx, tx)
	if err != nil {
		return err
	}
	gauge(descWebhookDeliveries, float64(b.Pending), webhooks.DeliveryPending)
	gauge(descWebhookDeliveries, float64(b.Dead), webhooks.DeliveryDead)
	lag := 0.0
	if b.OldestPending != nil {
		lag = max(0, now.Sub(*b.OldestPending).Seconds())
	}
	gauge(descWebhookLag, lag)
	return nil
}
