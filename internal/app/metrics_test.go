package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/proto"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/agent/hw/fake"
	"github.com/better-compute/better-compute/internal/agent/hypervisor"
	"github.com/better-compute/better-compute/internal/doctest"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/health"
	"github.com/better-compute/better-compute/internal/store"
)

var (
	descName   = regexp.MustCompile(`fqName: "([^"]+)"`)
	descLabels = regexp.MustCompile(`variableLabels: \{([^}]*)\}`)
)

// described returns the bc_ and bcd_ metrics a collector describes, with
// their variable labels sorted.
func described(t *testing.T, c prometheus.Collector) map[string][]string {
	t.Helper()
	ch := make(chan *prometheus.Desc)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	out := map[string][]string{}
	for d := range ch {
		s := d.String()
		m := descName.FindStringSubmatch(s)
		require.NotNil(t, m, "desc without a name: %s", s)
		if !strings.HasPrefix(m[1], "bc_") && !strings.HasPrefix(m[1], "bcd_") {
			continue
		}
		var labels []string
		if l := descLabels.FindStringSubmatch(s); l != nil && l[1] != "" {
			labels = strings.Split(l[1], ",")
		}
		slices.Sort(labels)
		out[m[1]] = labels
	}
	return out
}

// exposed is every bc_ metric the control plane registers and every bcd_
// metric bcd does.
func exposed(t *testing.T) map[string][]string {
	t.Helper()
	cp := bctest.NewControlPlane(t)
	out := described(t, cp.App.Registry)
	hw, err := fake.New(fake.Options{Model: "dgxh100", Seed: t.Name()})
	require.NoError(t, err)
	dir := t.TempDir()
	a, err := agent.New(agent.Config{Server: "127.0.0.1:1", StateDir: filepath.Join(dir, "state"), Hardware: hw,
		CgroupRoot: filepath.Join(dir, "cgroup"), PlainCgroupDir: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	collector, ok := a.Metrics().(prometheus.Collector)
	require.True(t, ok, "bcd's registry is a collector")
	for name, labels := range described(t, collector) {
		out[name] = labels
	}
	// A bcd that runs instances serves its hypervisor's balloon metric
	// with its own (agent.New registers the runner's Collector).
	bc, err := hypervisor.NewBalloonController(hypervisor.BalloonConfig{
		MemInfo: func() (uint64, uint64, error) { return 0, 0, nil }, Balloons: noBalloons{},
		Guests: func(context.Context) []hypervisor.BalloonGuest { return nil }})
	require.NoError(t, err)
	for name, labels := range described(t, bc.Collector()) {
		out[name] = labels
	}
	require.NotEmpty(t, out)
	return out
}

// noBalloons is a host without guests, for describing the metric.
type noBalloons struct{}

func (noBalloons) SetBalloon(context.Context, string, int) error { return nil }
func (noBalloons) Balloon(context.Context, string) (int, error)  { return 0, nil }

// TestMetricsDocumented holds docs/metrics.md to the registries: every
// exposed bc_ and bcd_ metric has a row with its labels, a counter is
// documented as one, and no row names a metric nothing exposes.
func TestMetricsDocumented(t *testing.T) {
	t.Parallel()
	want := exposed(t)
	doc := doctest.Read(t, "docs/metrics.md")
	documented := map[string]bool{}
	for _, section := range []string{"## Control plane", "## Node agent"} {
		for _, cells := range doctest.Table(t, doctest.Section(t, doc, section), "| metric | type | labels | meaning |") {
			require.Len(t, cells, 4, "docs/metrics.md row %q", cells)
			names := doctest.Code(cells[0])
			require.Len(t, names, 1, "docs/metrics.md row %q names one metric", cells)
			name := names[0]
			documented[name] = true
			labels, ok := want[name]
			if !ok {
				t.Errorf("docs/metrics.md documents %s, which neither the control plane nor bcd exposes", name)
				continue
			}
			got := doctest.Code(cells[2])
			slices.Sort(got)
			if !slices.Equal(got, labels) {
				t.Errorf("docs/metrics.md: %s has labels %v, documented as %v", name, labels, got)
			}
			if strings.HasSuffix(name, "_total") != (cells[1] == "counter") {
				t.Errorf("docs/metrics.md: %s is documented as a %s; counters, and only they, end in _total", name, cells[1])
			}
		}
	}
	for name := range want {
		if !documented[name] {
			t.Errorf("docs/metrics.md: %s is exposed but not documented", name)
		}
	}
}

// metricRef finds metric names in a PromQL expression.
var metricRef = regexp.MustCompile(`\bbcd?_[a-z0-9_]+`)

// checkExprNames fails for every metric an expression names that is not
// exposed (a histogram's _bucket, _sum and _count series count as its own).
func checkExprNames(t *testing.T, where, expr string, want map[string][]string) {
	t.Helper()
	for _, name := range metricRef.FindAllString(expr, -1) {
		base := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if _, ok := want[base]; !ok {
				base = strings.TrimSuffix(base, suffix)
			}
		}
		if _, ok := want[base]; !ok {
			t.Errorf("%s: %s names %s, which the control plane does not expose", where, expr, name)
		}
	}
}

func repoFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", filepath.FromSlash(name)))
	require.NoError(t, err)
	return b
}

// TestAlertRules checks deploy/prometheus/alerts.yml with promtool and
// holds every alert to exposed metrics and to its row in docs/metrics.md.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not on PATH (Debian package prometheus; .ci/run installs it): alert rules not checked")
	}
	path, err := filepath.Abs(filepath.Join("..", "..", "deploy", "prometheus", "alerts.yml"))
	require.NoError(t, err)
	out, err := exec.CommandContext(t.Context(), promtool, "check", "rules", path).CombinedOutput()
	require.NoError(t, err, "promtool check rules:\n%s", out)

	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(repoFile(t, "deploy/prometheus/alerts.yml"), &rules))
	want := exposed(t)
	doc := doctest.Read(t, "docs/metrics.md")
	documented := map[string]bool{}
	for _, cells := range doctest.Table(t, doctest.Section(t, doc, "## Alerts"), "| alert | fires when |") {
		for _, a := range doctest.Code(cells[0]) {
			documented[a] = true
		}
	}
	alerts := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = true
			checkExprNames(t, "alerts.yml "+r.Alert, r.Expr, want)
			if !documented[r.Alert] {
				t.Errorf("docs/metrics.md: alert %s is not in the alerts table", r.Alert)
			}
		}
	}
	for a := range documented {
		if !alerts[a] {
			t.Errorf("docs/metrics.md documents alert %s, which alerts.yml does not define", a)
		}
	}
	for _, a := range []string{"BetterComputeNodeLost", "BetterComputeGPUQuarantined", "BetterComputeWebhookDeadLettering", "BetterComputePlacementQueueGrowing"} {
		require.True(t, alerts[a], "alerts.yml defines %s", a)
	}
}

// TestGrafanaDashboard parses the dashboard and checks that every query
// names only exposed metrics.
func TestGrafanaDashboard(t *testing.T) {
	t.Parallel()
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			GridPos struct {
				X, Y, W, H int
			} `json:"gridPos"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(repoFile(t, "deploy/prometheus/grafana-dashboard.json"), &dash))
	require.NotEmpty(t, dash.Title)
	want := exposed(t)
	exprs := 0
	for _, p := range dash.Panels {
		// Grafana's grid is 24 columns wide.
		require.True(t, p.GridPos.W > 0 && p.GridPos.X >= 0 && p.GridPos.X+p.GridPos.W <= 24, "panel %q: gridPos %+v off the grid", p.Title, p.GridPos)
		if p.Type == "row" {
			continue
		}
		require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		for _, tg := range p.Targets {
			require.NotEmpty(t, metricRef.FindAllString(tg.Expr, -1), "panel %q: %s names no metric", p.Title, tg.Expr)
			checkExprNames(t, "dashboard panel "+p.Title, tg.Expr, want)
			exprs++
		}
	}
	require.Positive(t, exprs)

	// Every query parses: promtool checks them as recording rules.
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool is not on PATH (Debian package prometheus): dashboard queries not parsed")
		return
	}
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	n := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			expr, err := json.Marshal(tg.Expr) // a JSON string is a YAML string
			require.NoError(t, err)
			fmt.Fprintf(&rules, "      - record: dashboard:query_%d\n        expr: %s\n", n, expr)
			n++
		}
	}
	path := filepath.Join(t.TempDir(), "dashboard-rules.yml")
	require.NoError(t, os.WriteFile(path, []byte(rules.String()), 0o600))
	out, err := exec.CommandContext(t.Context(), promtool, "check", "rules", path).CombinedOutput()
	require.NoError(t, err, "promtool check rules on the dashboard's queries:\n%s", out)
}

// gathered reads one metric family from the control plane's registry.
func gathered(t *testing.T, cp *bctest.ControlPlane, name string) []*dto.Metric {
	t.Helper()
	mfs, err := cp.App.Registry.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()
		}
	}
	return nil
}

// value sums the samples of a metric whose labels include match.
func value(t *testing.T, cp *bctest.ControlPlane, name string, match map[string]string) (float64, bool) {
	t.Helper()
	sum, found := 0.0, false
next:
	for _, m := range gathered(t, cp, name) {
		for k, v := range match {
			if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == k && l.GetValue() == v }) {
				continue next
			}
		}
		found = true
		switch {
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetHistogram() != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum, found
}

// TestMetricsFleetAndCapacity: two simulated nodes join and a pool adopts
// them; the registry shows them ready with sessions, 16 free H100s, their
// GPU telemetry per node; a reservation moves 4 GPUs to booked, is
// observed by the placer's histograms, and its bind command by the
// dispatch histogram and the finished-commands counter.
func TestMetricsFleetAndCapacity(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "default"}))
	require.NoError(t, err)
	sim, err := bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		Template: bctest.FakeDaemonConfig{Gateway: cp.GatewayAddr, HeartbeatInterval: 100 * time.Millisecond}, Root: t.TempDir(), N: 2,
		Token: func(ctx context.Context, i int) (string, error) {
			tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "default"}))
			return tok.Msg.GetToken(), err
		},
	})
	require.NoError(t, err)
	defer sim.Stop()
	eventually(t, "two nodes with 8 GPUs each", func() bool { return countRows(t, cp, `SELECT COUNT(*) FROM gpus`) == 16 })
	_, err = admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "gpu",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}}}))
	require.NoError(t, err)

	// The database collector caches for a few seconds: wait for the values.
	eventually(t, "16 free GPUs and 2 ready nodes with sessions in the metrics", func() bool {
		free, _ := value(t, cp, "bc_capacity_gpus", map[string]string{"state": "free", "pool": "gpu"})
		ready, _ := value(t, cp, "bc_fleet_nodes", map[string]string{"state": "active", "liveness": "ready"})
		sessions, _ := value(t, cp, "bc_fleet_sessions_connected", nil)
		return free == 16 && ready == 2 && sessions == 2
	})
	installed, _ := value(t, cp, "bc_capacity_gpus_installed", map[string]string{"pool": "gpu"})
	require.EqualValues(t, 16, installed)
	pending, ok := value(t, cp, "bc_capacity_pending_reservations", map[string]string{"pool": "gpu"})
	require.True(t, ok, "an empty queue is exported as 0")
	require.Zero(t, pending)
	for _, d := range sim.Daemons {
		node := map[string]string{"node_id": d.NodeID()}
		eventually(t, "telemetry of node "+d.NodeID(), func() bool {
			n, _ := value(t, cp, "bc_node_gpus_reporting", node)
			return n == 8
		})
		util, ok := value(t, cp, "bc_node_gpu_utilization_ratio", node)
		require.True(t, ok)
		require.True(t, util >= 0 && util <= 1, "utilization %v is a ratio", util)
		used, _ := value(t, cp, "bc_node_gpu_memory_used_bytes", node)
		total, _ := value(t, cp, "bc_node_gpu_memory_total_bytes", node)
		require.Positive(t, total)
		require.LessOrEqual(t, used, total)
		temp, ok := value(t, cp, "bc_node_gpu_max_temperature_celsius", node)
		require.True(t, ok)
		require.Positive(t, temp)
		_, ok = value(t, cp, "bc_node_gpu_xid_errors_total", node)
		require.True(t, ok, "XID counts come from bcd")
		live, _ := value(t, cp, "bc_node_liveness", map[string]string{"node_id": d.NodeID(), "liveness": "ready"})
		require.EqualValues(t, 1, live)
	}

	res, err := admin.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{
		Tenant: "acme", Pool: "gpu", Gpus: 4, DurationSeconds: 3600}))
	require.NoError(t, err)
	eventually(t, "reservation active", func() bool {
		g, err := admin.Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "acme", Reservation: res.Msg.GetReservation().GetId()}))
		require.NoError(t, err)
		return g.Msg.GetReservation().GetState() == "active"
	})
	eventually(t, "4 booked and 12 free GPUs in the metrics", func() bool {
		free, _ := value(t, cp, "bc_capacity_gpus", map[string]string{"state": "free", "pool": "gpu"})
		booked, _ := value(t, cp, "bc_capacity_gpus", map[string]string{"state": "booked", "pool": "gpu"})
		return free == 12 && booked == 4
	})
	placed, _ := value(t, cp, "bc_placement_duration_seconds", map[string]string{"outcome": "ok"})
	require.GreaterOrEqual(t, placed, 1.0, "the reservation went through a placer")
	batches, _ := value(t, cp, "bc_placer_batch_size", nil)
	require.GreaterOrEqual(t, batches, 1.0)
	dispatched, _ := value(t, cp, "bc_fleet_command_dispatch_seconds", map[string]string{"kind": "allocation.bind"})
	require.GreaterOrEqual(t, dispatched, 1.0, "the bind command was sent")
	bound, _ := value(t, cp, "bc_fleet_commands_finished_total", map[string]string{"kind": "allocation.bind", "state": "succeeded"})
	require.GreaterOrEqual(t, bound, 1.0)
	errs, _ := value(t, cp, "bc_metrics_collect_errors_total", nil)
	require.Zero(t, errs, "every database collection worked")
	require.Empty(t, lintMetrics(t, cp), "promtool check metrics")

	// A quota the reservation uses up shows as exhausted.
	_, err = admin.Quotas.Set(ctx, connect.NewRequest(&apiv1.SetQuotaRequest{Tenant: "acme", Gpus: proto.Int32(4)}))
	require.NoError(t, err)
	eventually(t, "one exhausted GPU quota", func() bool {
		n, _ := value(t, cp, "bc_quota_gpu_limits_exhausted", nil)
		ratio, ok := value(t, cp, "bc_quota_gpu_headroom_ratio_min", nil)
		return n == 1 && ok && ratio == 0
	})
}

// TestMetricsWebhookBacklog: a disabled, failing endpoint with one pending
// delivery queued ten minutes ago and one dead-lettered shows in the
// webhook gauges, on the control plane's clock.
func TestMetricsWebhookBacklog(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	queued := cp.Clock.Now().Add(-10 * time.Minute)
	require.NoError(t, cp.App.DB.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO webhooks (id, tenant_id, url, state, disabled_reason, secret, failing_since, created_by, create_time, update_time)
			VALUES ('whk_metrics', 'ten_metrics', 'https://example.invalid/hook', 'disabled', 'failing since yesterday', $1, $2, 'test', $2, $2)`,
			[]byte("sealed"), queued); err != nil {
			return err
		}
		for i, state := range []string{"dead", "pending"} {
			if _, err := tx.Exec(ctx, `INSERT INTO webhook_deliveries (id, webhook_id, tenant_id, event_id, event_type, payload, state, next_attempt_time, create_time, update_time)
				VALUES ($1, 'whk_metrics', 'ten_metrics', $2, 'reservation.created', $3, $4, $5, $5, $5)`,
				fmt.Sprintf("whd_metrics%d", i), fmt.Sprintf("evt_%d", i), []byte("{}"), state, queued); err != nil {
				return err
			}
		}
		return nil
	}))
	eventually(t, "the webhook backlog in the metrics", func() bool {
		pending, _ := value(t, cp, "bc_webhook_deliveries", map[string]string{"state": "pending"})
		dead, _ := value(t, cp, "bc_webhook_deliveries", map[string]string{"state": "dead"})
		return pending == 1 && dead == 1
	})
	disabled, _ := value(t, cp, "bc_webhook_endpoints", map[string]string{"state": "disabled"})
	require.EqualValues(t, 1, disabled)
	enabled, ok := value(t, cp, "bc_webhook_endpoints", map[string]string{"state": "enabled"})
	require.True(t, ok, "both states are exported, 0 when empty")
	require.Zero(t, enabled)
	failing, _ := value(t, cp, "bc_webhook_endpoints_failing", nil)
	require.EqualValues(t, 1, failing)
	lag, _ := value(t, cp, "bc_webhook_delivery_lag_seconds", nil)
	require.GreaterOrEqual(t, lag, 600.0, "the oldest pending delivery was queued ten minutes ago on the control plane's clock")
}

// lintMetrics runs `promtool check metrics` (Prometheus's naming linter) on
// the control plane's /metrics and returns its complaints about bc_ series.
func lintMetrics(t *testing.T, cp *bctest.ControlPlane) []string {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool is not on PATH (Debian package prometheus): metric names not linted")
		return nil
	}
	resp, err := http.Get(cp.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	cmd := exec.CommandContext(t.Context(), promtool, "check", "metrics")
	cmd.Stdin = resp.Body
	out, _ := cmd.CombinedOutput() // exits 1 when it complains: the lines say about what
	var problems []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "bc_") {
			problems = append(problems, strings.TrimSpace(l))
		}
	}
	return problems
}

// TestMetricsHealth: the health gauges count a pool's open findings,
// active remediations, its breaker and budget, and the GPUs out of
// placement (on a node of no pool: pool "").
func TestMetricsHealth(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	tn, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	p, err := admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "h100",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"B300"}}}}))
	require.NoError(t, err)
	tenantID, poolID := tn.Msg.GetTenant().GetId(), p.Msg.GetPool().GetId()
	now := cp.Clock.Now()
	require.NoError(t, cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		n := &fleet.NodeInsertParams{ID: envelope.NewID(fleet.NodeIDPrefix, now), Name: "gpu-1", TenantID: tenantID, HardwareKey: "hw-1",
			State: fleet.NodeActive, Liveness: fleet.LivenessReady, CreateTime: now}
		if err := fleet.NodeInsert(ctx, tx, n); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO health_gpus (gpu_uuid, node_id, tenant_id, state, reason, create_time)
			VALUES ('GPU-metrics', $1, $2, 'quarantined', 'XID 48', $3)`, n.ID, tenantID, now); err != nil {
			return err
		}
		f := &health.Finding{ID: envelope.NewID(health.FindingIDPrefix, now), NodeID: n.ID, TenantID: tenantID, PoolID: poolID,
			GPUUUID: "GPU-metrics", Kind: "gpu.xid", Code: 48, Severity: "error", Action: "quarantine", State: health.FindingOpen, Count: 1,
			OccurTime: now, CreateTime: now, UpdateTime: now}
		if err := health.FindingInsert(ctx, tx, f); err != nil {
			return err
		}
		r := &health.Remediation{ID: envelope.NewID(health.RemediationIDPrefix, now), NodeID: n.ID, TenantID: tenantID, PoolID: poolID,
			Action: "reboot", State: health.RemRunning, FindingID: f.ID, CreateTime: now, UpdateTime: now}
		if err := health.RemediationInsert(ctx, tx, r); err != nil {
			return err
		}
		return health.BreakerPut(ctx, tx, &health.Breaker{PoolID: poolID, TenantID: tenantID, State: health.BreakerOpen, TripTime: &now, UpdateTime: now})
	}))
	pool := map[string]string{"pool_id": poolID}
	with := func(k, v string) map[string]string { return map[string]string{"pool_id": poolID, k: v} }
	eventually(t, "the health gauges", func() bool {
		open, _ := value(t, cp, "bc_health_breaker_open", pool)
		return open == 1
	})
	for _, c := range []struct {
		name  string
		match map[string]string
		want  float64
	}{
		{"bc_health_findings_open", with("severity", "error"), 1},
		{"bc_health_findings_open", with("severity", "critical"), 0},
		{"bc_health_remediations", with("state", "running"), 1},
		{"bc_health_remediations", with("state", "pending"), 0},
		{"bc_health_budget", pool, 1},
		{"bc_health_budget_used", pool, 1},
		{"bc_health_gpus_out", map[string]string{"pool_id": "", "state": "quarantined"}, 1},
		{"bc_health_gpus_out", with("state", "rma"), 0},
	} {
		got, ok := value(t, cp, c.name, c.match)
		require.True(t, ok, "%s%v is exported", c.name, c.match)
		require.Equal(t, c.want, got, "%s%v", c.name, c.match)
	}
}
