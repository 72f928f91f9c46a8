package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
)

// capacityFake is an in-memory CapacityService and UsageService behind the
// generated handlers: it records the requests the CLI sent and answers with
// canned rows.
type capacityFake struct {
	f *fake

	mu        sync.Mutex
	summaries []*apiv1.CapacitySummaryRequest
	byPools   []*apiv1.CapacityByPoolRequest
	timelines []*apiv1.CapacityTimelineRequest
	consumers []*apiv1.CapacityByConsumerRequest
	lists     []*apiv1.ListUsageRequest
	exports   []*apiv1.ExportUsageRequest
	windows   []*apiv1.UsageWindow
}

func setupCapacity(t *testing.T) (*bundle, *capacityFake) {
	t.Helper()
	cf := &capacityFake{f: newFake()}
	w0 := time.Date(2025, 1, 2, 3, 0, 0, 0, time.UTC)
	for i, m := range []string{"gpu.H100.hours", "vcpu.hours", "memoryGiB.hours"} {
		cf.windows = append(cf.windows, &apiv1.UsageWindow{TenantId: "ten_1", ProjectId: "prj_1", ReservationId: "rsv_1",
			Metric: m, WindowStart: timestamppb.New(w0.Add(time.Duration(i) * time.Hour)), Quantity: 1.5})
	}
	// The hour still open.
	cf.windows = append(cf.windows, &apiv1.UsageWindow{TenantId: "ten_1", ProjectId: "prj_1", ReservationId: "rsv_1",
		Metric: "gpu.H100.hours", WindowStart: timestamppb.New(w0.Add(3 * time.Hour)), Quantity: 0.25, Partial: true})
	opt := connect.WithInterceptors(recorder{cf.f})
	mux := http.NewServeMux()
	mux.Handle(apiv1connect.NewIdentityServiceHandler(identitySvc{cf.f}, opt))
	mux.Handle(apiv1connect.NewCapacityServiceHandler(fakeCapacity{cf}, opt))
	mux.Handle(apiv1connect.NewUsageServiceHandler(fakeUsage{cf}, opt))
	mux.Handle(apiv1connect.NewTenantServiceHandler(fakeTenantNames{}, opt))
	mux.Handle(apiv1connect.NewProjectServiceHandler(fakeProjectNames{}, opt))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	b := &bundle{f: cf.f, srv: srv, cfgPath: filepath.Join(dir, "cfg", "config.yaml"), env: map[string]string{"HOME": dir}}
	// A tenant's key: --tenant defaults to the token's tenant.
	b.f.me = &apiv1.WhoAmIResponse{PrincipalId: "svc_1", Kind: "service", Role: "viewer", TenantId: "ten_1", TenantName: "acme"}
	return b, cf
}

// fakeTenantNames, fakeProjectNames and fakePoolNames answer the name
// lookups of usage and quota tables.
type fakeTenantNames struct {
	apiv1connect.UnimplementedTenantServiceHandler
}

func (fakeTenantNames) Get(_ context.Context, req *connect.Request[apiv1.GetTenantRequest]) (*connect.Response[apiv1.GetTenantResponse], error) {
	return connect.NewResponse(&apiv1.GetTenantResponse{Tenant: &apiv1.Tenant{Id: req.Msg.GetTenant(), Name: "acme"}}), nil
}

type fakeProjectNames struct {
	apiv1connect.UnimplementedProjectServiceHandler
}

func (fakeProjectNames) List(context.Context, *connect.Request[apiv1.ListProjectsRequest]) (*connect.Response[apiv1.ListProjectsResponse], error) {
	return connect.NewResponse(&apiv1.ListProjectsResponse{Projects: []*apiv1.Project{
		{Id: "prj_1", Name: "web"}, {Id: "prj_web", Name: "web"}, {Id: "prj_batch", Name: "batch"}}}), nil
}

type fakePoolNames struct {
	apiv1connect.UnimplementedPoolServiceHandler
}

func (fakePoolNames) List(context.Context, *connect.Request[apiv1.ListPoolsRequest]) (*connect.Response[apiv1.ListPoolsResponse], error) {
	return connect.NewResponse(&apiv1.ListPoolsResponse{Pools: []*apiv1.Pool{{Id: "pool_h100", Name: "h100"}}}), nil
}

type fakeCapacity struct{ cf *capacityFake }

var fakeRows = []*apiv1.CapacityRow{
	{PoolId: "pool_1", Pool: "h100", Model: "H100", Kind: "gpu", Total: 8, Booked: 5, Quarantined: 1, Free: 2, Pending: 3},
	{PoolId: "pool_2", Pool: "waiting", Pending: 1},
}

func (s fakeCapacity) Summary(_ context.Context, req *connect.Request[apiv1.CapacitySummaryRequest]) (*connect.Response[apiv1.CapacitySummaryResponse], error) {
	s.cf.mu.Lock()
	defer s.cf.mu.Unlock()
	s.cf.summaries = append(s.cf.summaries, req.Msg)
	// The server names models with their memory, as atoms do.
	return connect.NewResponse(&apiv1.CapacitySummaryResponse{Rows: []*apiv1.CapacityRow{
		{Model: "H100 80GB", Kind: "gpu", Total: 8, Booked: 5, Quarantined: 1, Free: 2, Pending: 3},
		{Model: "A100 40GB", Kind: "gpu", Total: 4, Booked: 1, Free: 3, Pending: 2},
		{Model: "A100 80GB", Kind: "gpu", Total: 4, Booked: 2, Free: 2, Pending: 2},
	}}), nil
}

func (s fakeCapacity) ByPool(_ context.Context, req *connect.Request[apiv1.CapacityByPoolRequest]) (*connect.Response[apiv1.CapacityByPoolResponse], error) {
	s.cf.mu.Lock()
	defer s.cf.mu.Unlock()
	s.cf.byPools = append(s.cf.byPools, req.Msg)
	return connect.NewResponse(&apiv1.CapacityByPoolResponse{Rows: fakeRows}), nil
}

func (s fakeCapacity) ByConsumer(_ context.Context, req *connect.Request[apiv1.CapacityByConsumerRequest]) (*connect.Response[apiv1.CapacityByConsumerResponse], error) {
	s.cf.mu.Lock()
	defer s.cf.mu.Unlock()
	s.cf.consumers = append(s.cf.consumers, req.Msg)
	return connect.NewResponse(&apiv1.CapacityByConsumerResponse{Rows: []*apiv1.ConsumerRow{
		{Pool: "h100", Tenant: "acme", Reservations: 2, Gpus: 5, GpuHours: 12.25},
		{Pool: "h100", Tenant: "globex", Reservations: 1, Gpus: 1},
	}}), nil
}

func (s fakeCapacity) Timeline(_ context.Context, req *connect.Request[apiv1.CapacityTimelineRequest]) (*connect.Response[apiv1.CapacityTimelineResponse], error) {
	s.cf.mu.Lock()
	defer s.cf.mu.Unlock()
	s.cf.timelines = append(s.cf.timelines, req.Msg)
	if req.Msg.GetStepSeconds() == 1 {
		return nil, apiError(connect.CodeInvalidArgument, "INVALID_ARGUMENT", "invalid step_seconds: too many points", "",
			&apiv1.FieldViolation{Field: "step_seconds", Reason: "gives 86401 points; at most 1000"})
	}
	start := time.Date(2025, 1, 2, 0, 0, 0, 0, time.UTC)
	return connect.NewResponse(&apiv1.CapacityTimelineResponse{Points: []*apiv1.TimelinePoint{
		{Time: timestamppb.New(start), Booked: 2, Total: 8},
		{Time: timestamppb.New(start.Add(time.Hour)), Booked: 5, Total: 8},
	}}), nil
}

func (s fakeCapacity) Rebuild(context.Context, *connect.Request[apiv1.RebuildCapacityRequest]) (*connect.Response[apiv1.RebuildCapacityResponse], error) {
	return connect.NewResponse(&apiv1.RebuildCapacityResponse{Rows: 4,
		Mismatches: []string{"pool_1/H100/gpu: stored total=8 booked=6 quarantined=1, recomputed total=8 booked=5 quarantined=1"}}), nil
}

type fakeUsage struct{ cf *capacityFake }

func (s fakeUsage) List(_ context.Context, req *connect.Request[apiv1.ListUsageRequest]) (*connect.Response[apiv1.ListUsageResponse], error) {
	s.cf.mu.Lock()
	defer s.cf.mu.Unlock()
	s.cf.lists = append(s.cf.lists, req.Msg)
	items, next := page(s.cf.f, s.cf.windows, req.Msg.GetPageToken(), req.Msg.GetPageSize())
	return connect.NewResponse(&apiv1.ListUsageResponse{Windows: items, NextPageToken: next}), nil
}

func (s fakeUsage) Export(_ context.Context, req *connect.Request[apiv1.ExportUsageRequest]) (*connect.Response[apiv1.ExportUsageResponse], error) {
	s.cf.mu.Lock()
	defer s.cf.mu.Unlock()
	s.cf.exports = append(s.cf.exports, req.Msg)
	if req.Msg.GetFormat() == "cloudevents" {
		return connect.NewResponse(&apiv1.ExportUsageResponse{ContentType: "application/x-ndjson",
			Data: []byte(`{"specversion":"1.0","id":"rsv_1/vcpu.hours/2025-01-02T03:00:00Z"}` + "\n")}), nil
	}
	if req.Msg.GetFormat() == "jsonl" {
		return connect.NewResponse(&apiv1.ExportUsageResponse{ContentType: "application/x-ndjson",
			Data: []byte(`{"idempotency_key":"rsv_1/vcpu.hours/2025-01-02T03:00:00Z","revision":1,"quantity":1.5}` + "\n")}), nil
	}
	return connect.NewResponse(&apiv1.ExportUsageResponse{ContentType: "text/csv; charset=utf-8",
		Data: []byte("tenant_id,project_id,reservation_id,metric,window_start,quantity,idempotency_key,revision,pool_id\n" +
			"ten_1,prj_1,rsv_1,vcpu.hours,2025-01-02T03:00:00Z,1.5,rsv_1/vcpu.hours/2025-01-02T03:00:00Z,1,pool_1\n")}), nil
}

func (b *bundle) fail(t *testing.T, argv ...string) string {
	t.Helper()
	r := b.run(t, "", argv...)
	require.Equal(t, 1, r.code, "stdout: %s", r.stdout)
	return r.stderr
}

func TestCapacityCommands(t *testing.T) {
	t.Parallel()
	b, cf := setupCapacity(t)

	lines := strings.Split(strings.TrimSpace(b.ok(t, "capacity", "summary")), "\n")
	require.Equal(t, []string{"MODEL", "KIND", "TOTAL", "BOOKED", "QUARANTINED", "FREE", "PENDING"}, strings.Fields(lines[0]))
	// One model name across nodes, capacity and reservations: the
	// gpu.model label's; rows that then share a model are summed.
	require.Len(t, lines, 3)
	require.Equal(t, []string{"H100", "gpu", "8", "5", "1", "2", "3"}, strings.Fields(lines[1]))
	require.Equal(t, []string{"A100", "gpu", "8", "3", "0", "5", "2"}, strings.Fields(lines[2]))
	require.Equal(t, "acme", cf.summaries[0].GetTenant(), "the token's tenant")

	lines = strings.Split(strings.TrimSpace(b.ok(t, "capacity", "by-pool", "--tenant", "globex", "--pool", "h100")), "\n")
	require.Equal(t, "POOL", strings.Fields(lines[0])[0])
	require.Equal(t, []string{"h100", "H100", "gpu", "8", "5", "1", "2", "3"}, strings.Fields(lines[1]))
	require.Equal(t, []string{"waiting", "-", "-", "0", "0", "0", "0", "1"}, strings.Fields(lines[2]))
	require.Equal(t, "globex", cf.byPools[0].GetTenant())
	require.Equal(t, "h100", cf.byPools[0].GetPool())

	var js struct {
		Rows []struct {
			PoolID string `json:"poolId"`
			Free   int    `json:"free"`
		} `json:"rows"`
	}
	require.NoError(t, json.Unmarshal([]byte(b.ok(t, "capacity", "by-pool", "-o", "json")), &js))
	require.Len(t, js.Rows, 2)
	require.Equal(t, 2, js.Rows[0].Free)

	lines = strings.Split(strings.TrimSpace(b.ok(t, "capacity", "by-consumer", "--pool", "h100")), "\n")
	require.Equal(t, []string{"POOL", "TENANT", "RESERVATIONS", "GPUS", "GPU-HOURS"}, strings.Fields(lines[0]))
	require.Equal(t, []string{"h100", "acme", "2", "5", "12.2"}, strings.Fields(lines[1]))
	require.Equal(t, "acme", cf.consumers[0].GetTenant(), "the token's tenant: the owner")
	require.Equal(t, "h100", cf.consumers[0].GetPool())

	out := b.ok(t, "capacity", "timeline", "--pool", "h100", "--start", "2025-01-02T00:00:00Z", "--end", "+2h", "--step", "30m")
	require.Equal(t, []string{"2025-01-02T01:00:00Z", "5", "8"}, strings.Fields(strings.Split(strings.TrimSpace(out), "\n")[2]))
	tl := cf.timelines[0]
	require.Equal(t, time.Date(2025, 1, 2, 0, 0, 0, 0, time.UTC), tl.GetStartTime().AsTime())
	require.WithinDuration(t, time.Now().Add(2*time.Hour), tl.GetEndTime().AsTime(), time.Minute)
	require.Equal(t, int64(1800), tl.GetStepSeconds())
	require.Equal(t, "acme", tl.GetTenant())

	// Refusals: locally (nothing sent) and by the server, with the field.
	require.Contains(t, b.fail(t, "capacity", "timeline"), "pool: required")
	require.Contains(t, b.fail(t, "capacity", "timeline", "--pool", "h100", "--step", "1500ms"), "step:")
	require.Contains(t, b.fail(t, "capacity", "timeline", "--pool", "h100", "--start", "yesterday"), "start:")
	require.Len(t, cf.timelines, 1)
	stderr := b.fail(t, "capacity", "timeline", "--pool", "h100", "--step", "1s")
	require.Contains(t, stderr, "Error: INVALID_ARGUMENT")
	require.Contains(t, stderr, "--step: gives 86401 points")

	out = b.ok(t, "capacity", "rebuild")
	require.Contains(t, out, "rebuilt 4 rollups; 1 differed")
	require.Contains(t, out, "pool_1/H100/gpu: stored total=8 booked=6")
}

func TestUsageCommands(t *testing.T) {
	t.Parallel()
	b, cf := setupCapacity(t)

	lines := strings.Split(strings.TrimSpace(b.ok(t, "usage", "list", "--metric", "vcpu.hours", "--start", "-24h", "--project", "web")), "\n")
	require.Len(t, lines, 8, "header, four windows across two pages, three totals")
	require.Equal(t, []string{"WINDOW", "TENANT", "PROJECT", "RESERVATION", "METRIC", "QUANTITY"}, strings.Fields(lines[0]))
	// Names, not ids.
	require.Equal(t, []string{"2025-01-02T03:00:00Z", "acme", "web", "rsv_1", "gpu.H100.hours", "1.5"}, strings.Fields(lines[1]))
	require.Equal(t, []string{"2025-01-02T06:00:00Z", "(open)", "acme", "web", "rsv_1", "gpu.H100.hours", "0.25"}, strings.Fields(lines[4]),
		"the open hour is marked partial")
	require.Equal(t, []string{"TOTAL", "gpu.H100.hours", "1.75"}, strings.Fields(lines[5]))
	require.Equal(t, []string{"TOTAL", "vcpu.hours", "1.5"}, strings.Fields(lines[7]))
	require.Len(t, cf.lists, 2, "follows next_page_token")
	req := cf.lists[0]
	require.Equal(t, []string{"acme", "web", "vcpu.hours"}, []string{req.GetTenant(), req.GetProject(), req.GetMetric()})
	require.WithinDuration(t, time.Now().Add(-24*time.Hour), req.GetStartTime().AsTime(), time.Minute)
	require.Nil(t, req.GetEndTime())

	var js struct {
		Windows []struct {
			Metric   string  `json:"metric"`
			Quantity float64 `json:"quantity"`
		} `json:"windows"`
	}
	require.NoError(t, json.Unmarshal([]byte(b.ok(t, "usage", "list", "-o", "json", "--limit", "2")), &js))
	require.Len(t, js.Windows, 2)
	require.Equal(t, 1.5, js.Windows[0].Quantity)

	// Export: the document as is, to stdout or a file.
	out := b.ok(t, "usage", "export")
	require.True(t, strings.HasPrefix(out, "tenant_id,project_id,reservation_id,metric,window_start,quantity,idempotency_key,revision,pool_id\n"), out)
	require.Equal(t, "csv", cf.exports[0].GetFormat())
	file := filepath.Join(t.TempDir(), "usage.jsonl")
	r := b.run(t, "", "usage", "export", "--format", "cloudevents", "-f", file, "--end", "2025-02-01T00:00:00Z")
	require.Equal(t, 0, r.code, r.stderr)
	require.Empty(t, r.stdout)
	require.Contains(t, r.stderr, "to "+file)
	got, err := os.ReadFile(file)
	require.NoError(t, err)
	sc := bufio.NewScanner(strings.NewReader(string(got)))
	for sc.Scan() {
		var ev map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &ev))
		require.Equal(t, "1.0", ev["specversion"])
	}
	require.Equal(t, time.Date(2025, 2, 1, 0, 0, 0, 0, time.UTC), cf.exports[1].GetEndTime().AsTime())

	// jsonl for a billing period named by --from and --to.
	out = b.ok(t, "usage", "export", "--format", "jsonl", "--from", "2025-01-01T00:00:00Z", "--to", "2025-02-01T00:00:00Z")
	require.Contains(t, out, `"idempotency_key":"rsv_1/vcpu.hours/2025-01-02T03:00:00Z"`)
	require.Equal(t, "jsonl", cf.exports[2].GetFormat())
	require.Equal(t, time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC), cf.exports[2].GetStartTime().AsTime())
	require.Equal(t, time.Date(2025, 2, 1, 0, 0, 0, 0, time.UTC), cf.exports[2].GetEndTime().AsTime())

	require.Contains(t, b.fail(t, "usage", "export", "--format", "xml"), "format: must be csv, jsonl or cloudevents")
	require.Contains(t, b.fail(t, "usage", "export", "--from", "-1h", "--start", "-2h"), "none of the others can be")
	require.Len(t, cf.exports, 3, "a bad format is refused before anything is sent")
}
