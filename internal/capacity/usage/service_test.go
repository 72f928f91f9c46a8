package usage_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/usage"
	"github.com/better-compute/better-compute/internal/store"
)

type cpFixture struct {
	cp               *bctest.ControlPlane
	admin            *client.Client
	viewer, evil     *client.Client
	acme, web, ml    string
	base             time.Time
	acmeWindowsTotal int
}

// setupService starts a control plane with acme (projects web and ml) and
// other, and rolls up three reservations' active hours.
func setupService(t *testing.T) *cpFixture {
	t.Helper()
	cp := bctest.NewControlPlane(t)
	migrate(t, cp.App.DB)
	ctx := context.Background()
	f := &cpFixture{cp: cp, admin: cp.Admin()}
	tenant := func(name string) string {
		res, err := f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: name}))
		require.NoError(t, err)
		return res.Msg.GetTenant().GetId()
	}
	project := func(name string) string {
		res, err := f.admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: name}))
		require.NoError(t, err)
		return res.Msg.GetProject().GetId()
	}
	key := func(tenant, role string) *client.Client {
		k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: tenant, Role: role}))
		require.NoError(t, err)
		return cp.Client(k.Msg.GetSecret())
	}
	f.acme = tenant("acme")
	other := tenant("other")
	f.web, f.ml = project("web"), project("ml")
	f.viewer, f.evil = key("acme", "viewer"), key("other", "admin")

	// Hours still to come on the simulated clock, so whatever the
	// periodic rollup did at start does not matter.
	f.base = cp.Clock.Now().UTC().Truncate(time.Hour).Add(time.Hour)
	h := func(n float64) time.Time { return f.base.Add(time.Duration(n * float64(time.Hour))) }
	db := cp.App.DB
	insertReservation(t, db, rsv{id: "rsv_web", tenant: f.acme, project: f.web, gpus: 2, vcpu: 4, mem: 16, gpuModel: "H100",
		since: h(0.5), until: ptr(h(2.5))})
	insertReservation(t, db, rsv{id: "rsv_ml", tenant: f.acme, project: f.ml, vcpu: 8, since: h(1)})
	insertReservation(t, db, rsv{id: "rsv_other", tenant: other, project: "prj_other", gpus: 1, gpuModel: "L40S", since: h(0)})
	cp.Clock.Set(h(3).Add(time.Minute))
	rollup(t, db, cp.Clock.Now())
	// web: 3 metrics × hours 0, 1, 2; ml: hours 1, 2.
	f.acmeWindowsTotal = 3*3 + 2
	return f
}

func TestUsageList(t *testing.T) {
	t.Parallel()
	f := setupService(t)
	ctx := context.Background()

	var windows []*apiv1.UsageWindow
	token := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10)
		res, err := f.viewer.Usage.List(ctx, connect.NewRequest(&apiv1.ListUsageRequest{Tenant: "acme", PageSize: 4, PageToken: token}))
		require.NoError(t, err)
		windows = append(windows, res.Msg.GetWindows()...)
		if token = res.Msg.GetNextPageToken(); token == "" {
			break
		}
	}
	// ml is still active: the open hour ends the listing as a partial
	// window, one minute of 8 vCPUs so far, not recorded.
	require.Len(t, windows, f.acmeWindowsTotal+1)
	open := windows[len(windows)-1]
	require.True(t, open.GetPartial())
	require.Equal(t, usage.MetricVCPUHours, open.GetMetric())
	require.InDelta(t, 8.0/60, open.GetQuantity(), 1e-9)
	require.Equal(t, f.cp.Clock.Now().UTC().Truncate(time.Hour), open.GetWindowStart().AsTime())
	require.Equal(t, f.acmeWindowsTotal, countRows(t, f.cp.App.DB, f.acme), "the open hour is not recorded")
	for _, w := range windows[:len(windows)-1] {
		require.False(t, w.GetPartial())
	}
	for i, w := range windows {
		require.Equal(t, f.acme, w.GetTenantId())
		if i > 0 {
			require.False(t, w.GetWindowStart().AsTime().Before(windows[i-1].GetWindowStart().AsTime()), "ordered by window")
		}
	}
	require.Equal(t, 1.0, windows[0].GetQuantity(), "web's first half hour of 2 GPUs")
	require.Equal(t, usage.GPUMetric("H100"), windows[0].GetMetric())

	res, err := f.viewer.Usage.List(ctx, connect.NewRequest(&apiv1.ListUsageRequest{Tenant: "acme", Project: "ml"}))
	require.NoError(t, err)
	require.Len(t, res.Msg.GetWindows(), 3, "two closed hours and the open one")
	require.Equal(t, f.ml, res.Msg.GetWindows()[0].GetProjectId())
	res, err = f.viewer.Usage.List(ctx, connect.NewRequest(&apiv1.ListUsageRequest{Tenant: "acme", Metric: "vcpu.hours",
		StartTime: timestamppb.New(f.base.Add(time.Hour)), EndTime: timestamppb.New(f.base.Add(2 * time.Hour))}))
	require.NoError(t, err)
	require.Len(t, res.Msg.GetWindows(), 2, "web's and ml's hour 1")
	// Metrics match case-insensitively.
	res, err = f.viewer.Usage.List(ctx, connect.NewRequest(&apiv1.ListUsageRequest{Tenant: "acme", Metric: "VCPU.Hours",
		StartTime: timestamppb.New(f.base.Add(time.Hour)), EndTime: timestamppb.New(f.base.Add(2 * time.Hour))}))
	require.NoError(t, err)
	require.Len(t, res.Msg.GetWindows(), 2, "the metric in any case")

	// The platform admin lists every tenant; a tenant's viewer may not.
	res, err = f.admin.Usage.List(ctx, connect.NewRequest(&apiv1.ListUsageRequest{}))
	require.NoError(t, err)
	require.Len(t, res.Msg.GetWindows(), f.acmeWindowsTotal+3+2, "both tenants' open hours too")
	_, err = f.viewer.Usage.List(ctx, connect.NewRequest(&apiv1.ListUsageRequest{}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err))
	_, err = f.viewer.Usage.List(ctx, connect.NewRequest(&apiv1.ListUsageRequest{Tenant: "acme", Project: "nope"}))
	require.Equal(t, "NOT_FOUND", client.Code(err))
	for _, req := range []*apiv1.ListUsageRequest{{Tenant: "acme"}, {Tenant: "acme", Project: "web"}, {Tenant: "other", Project: f.web}} {
		_, err = f.evil.Usage.List(ctx, connect.NewRequest(req))
		require.Contains(t, []string{"PERMISSION_DENIED", "NOT_FOUND"}, client.Code(err))
	}
}

func TestUsageExport(t *testing.T) {
	t.Parallel()
	f := setupService(t)
	ctx := context.Background()

	res, err := f.viewer.Usage.Export(ctx, connect.NewRequest(&apiv1.ExportUsageRequest{Tenant: "acme", Format: "csv"}))
	require.NoError(t, err)
	require.Equal(t, usage.ContentTypeCSV, res.Msg.GetContentType())
	records, err := csv.NewReader(bytes.NewReader(res.Msg.GetData())).ReadAll()
	require.NoError(t, err)
	require.Equal(t, usage.CSVHeader, records[0])
	require.Len(t, records, f.acmeWindowsTotal+1)
	for _, rec := range records[1:] {
		require.Equal(t, f.acme, rec[0])
		_, err := time.Parse(time.RFC3339, rec[4])
		require.NoError(t, err)
	}

	res, err = f.viewer.Usage.Export(ctx, connect.NewRequest(&apiv1.ExportUsageRequest{Tenant: "acme", Project: "web", Format: "cloudevents"}))
	require.NoError(t, err)
	require.Equal(t, usage.ContentTypeCloudEvents, res.Msg.GetContentType())
	lines := strings.Split(strings.TrimSuffix(string(res.Msg.GetData()), "\n"), "\n")
	require.Len(t, lines, 9)
	for _, line := range lines {
		var ev usage.CloudEvent
		require.NoError(t, json.Unmarshal([]byte(line), &ev))
		require.Equal(t, "1.0", ev.SpecVersion)
		require.Equal(t, "/tenants/"+f.acme, ev.Source)
		require.Equal(t, "rsv_web", ev.Data.ReservationID)
		require.True(t, strings.HasPrefix(ev.ID, "rsv_web/"), ev.ID)
	}

	// The default format is CSV; an empty result is the header alone.
	res, err = f.viewer.Usage.Export(ctx, connect.NewRequest(&apiv1.ExportUsageRequest{Tenant: "acme",
		StartTime: timestamppb.New(f.base.Add(100 * time.Hour))}))
	require.NoError(t, err)
	require.Equal(t, strings.Join(usage.CSVHeader, ",")+"\n", string(res.Msg.GetData()))
}

func usageCounts(t *testing.T, db *store.DB) [3]int {
	t.Helper()
	var out [3]int
	require.NoError(t, db.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		for i, tbl := range []string{"usage_windows", "audit_log", "events"} {
			if err := tx.QueryRow(ctx, `SELECT COUNT(*) FROM `+tbl).Scan(&out[i]); err != nil {
				return err
			}
		}
		return nil
	}))
	return out
}

func TestUsageValidation(t *testing.T) {
	t.Parallel()
	f := setupService(t)
	ctx := context.Background()
	c := f.viewer
	start := timestamppb.New(f.base)
	tests := []struct {
		field string
		call  func() error
	}{
		{"format", func() error {
			_, err := c.Usage.Export(ctx, connect.NewRequest(&apiv1.ExportUsageRequest{Tenant: "acme", Format: "xml"}))
			return err
		}},
		{"end_time", func() error {
			_, err := c.Usage.Export(ctx, connect.NewRequest(&apiv1.ExportUsageRequest{Tenant: "acme", StartTime: start, EndTime: start}))
			return err
		}},
		{"tenant", func() error {
			_, err := f.admin.Usage.Export(ctx, connect.NewRequest(&apiv1.ExportUsageRequest{Project: "web"}))
			return err
		}},
		{"metric", func() error {
			_, err := c.Usage.List(ctx, connect.NewRequest(&apiv1.ListUsageRequest{Tenant: "acme", Metric: "gpu.hours"}))
			return err
		}},
		{"end_time", func() error {
			_, err := c.Usage.List(ctx, connect.NewRequest(&apiv1.ListUsageRequest{Tenant: "acme", StartTime: start,
				EndTime: timestamppb.New(f.base.Add(-time.Hour))}))
			return err
		}},
		{"start_time", func() error {
			_, err := c.Usage.List(ctx, connect.NewRequest(&apiv1.ListUsageRequest{Tenant: "acme", StartTime: &timestamppb.Timestamp{Nanos: -1}}))
			return err
		}},
		{"project", func() error {
			_, err := c.Usage.List(ctx, connect.NewRequest(&apiv1.ListUsageRequest{Tenant: "acme", Project: "prj_NOPE"}))
			return err
		}},
		{"page_token", func() error {
			_, err := c.Usage.List(ctx, connect.NewRequest(&apiv1.ListUsageRequest{Tenant: "acme", PageToken: "%%%"}))
			return err
		}},
		{"page_size", func() error {
			_, err := c.Usage.List(ctx, connect.NewRequest(&apiv1.ListUsageRequest{Tenant: "acme", PageSize: -1}))
			return err
		}},
	}
	// A token issued for other filters is refused too.
	res, err := c.Usage.List(ctx, connect.NewRequest(&apiv1.ListUsageRequest{Tenant: "acme", PageSize: 1}))
	require.NoError(t, err)
	require.NotEmpty(t, res.Msg.GetNextPageToken())
	tests = append(tests, struct {
		field string
		call  func() error
	}{"page_token", func() error {
		_, err := c.Usage.List(ctx, connect.NewRequest(&apiv1.ListUsageRequest{Tenant: "acme", Metric: "vcpu.hours",
			PageToken: res.Msg.GetNextPageToken()}))
		return err
	}})

	before := usageCounts(t, f.cp.App.DB)
	for _, tt := range tests {
		err := tt.call()
		require.Equal(t, "INVALID_ARGUMENT", client.Code(err), "%s: %v", tt.field, err)
		var fields []string
		for _, v := range client.Detail(err).GetViolations() {
			fields = append(fields, v.GetField())
		}
		require.Contains(t, fields, tt.field, "%v", err)
	}
	require.Equal(t, before, usageCounts(t, f.cp.App.DB), "nothing was written")
}

func countRows(t *testing.T, db *store.DB, tenantID string) int {
	t.Helper()
	var n int
	require.NoError(t, db.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM usage_windows WHERE tenant_id = $1`, tenantID).Scan(&n)
	}))
	return n
}
