package quota_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

type svcFixture struct {
	cp    *bctest.ControlPlane
	admin *client.Client // platform admin
	keys  map[string]*client.Client
	// ids of acme, its project web and its pool h100.
	acme, web, pool string
}

func setupService(t *testing.T) *svcFixture {
	t.Helper()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	f := &svcFixture{cp: cp, admin: cp.Admin(), keys: map[string]*client.Client{}}
	for _, name := range []string{"acme", "other"} {
		tn, err := f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: name}))
		require.NoError(t, err)
		if name == "acme" {
			f.acme = tn.Msg.GetTenant().GetId()
		}
	}
	for _, name := range []string{"web", "batch"} {
		p, err := f.admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: name}))
		require.NoError(t, err)
		if name == "web" {
			f.web = p.Msg.GetProject().GetId()
		}
	}
	pl, err := f.admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "h100"}))
	require.NoError(t, err)
	f.pool = pl.Msg.GetPool().GetId()
	for _, role := range []string{"admin", "member", "viewer", "agent"} {
		k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: role}))
		require.NoError(t, err)
		f.keys[role] = cp.Client(k.Msg.GetSecret())
	}
	k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "other", Role: "admin"}))
	require.NoError(t, err)
	f.keys["evil"] = cp.Client(k.Msg.GetSecret())
	return f
}

// count returns the rows of a table.
func (f *svcFixture) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM `+table).Scan(&n)
	}))
	return n
}

func (f *svcFixture) reserve(t *testing.T, r res) {
	t.Helper()
	require.NoError(t, f.cp.App.DB.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO reservations (id, tenant_id, project_id, pool_id, state, gpus, model, gpu_model,
			binding, starts_at, ends_at, created_by, create_time, update_time)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'none', $9, $10, 'test', $11, $11)`,
			r.id, f.acme, r.project, r.pool, r.state, r.gpus, r.model, r.gpuModel, r.from, r.to, r.from)
		return err
	}))
}

func i32(n int32) *int32     { return &n }
func f64(h float64) *float64 { return &h }
func set(m *apiv1.SetQuotaRequest) *connect.Request[apiv1.SetQuotaRequest] {
	return connect.NewRequest(m)
}

func TestQuotaLifecycle(t *testing.T) {
	t.Parallel()
	f := setupService(t)
	ctx := context.Background()

	// A tenant-wide quota is the platform's.
	tq, err := f.admin.Quotas.Set(ctx, set(&apiv1.SetQuotaRequest{Tenant: "acme", Gpus: i32(8)}))
	require.NoError(t, err)
	require.True(t, envelope.IsID(tq.Msg.GetQuota().GetId(), "quo"), tq.Msg.GetQuota().GetId())
	require.Equal(t, f.acme, tq.Msg.GetQuota().GetTenantId())
	require.Empty(t, tq.Msg.GetQuota().GetProjectId())
	require.Equal(t, int32(8), tq.Msg.GetQuota().GetGpus())
	require.Equal(t, float64(-1), tq.Msg.GetQuota().GetGpuHours(), "unset is unlimited")
	for _, role := range []string{"admin", "member", "viewer", "agent"} {
		_, err := f.keys[role].Quotas.Set(ctx, set(&apiv1.SetQuotaRequest{Tenant: "acme", Gpus: i32(100)}))
		require.Equal(t, "PERMISSION_DENIED", client.Code(err), "%s: %v", role, err)
	}

	// A project's quota is the tenant admins'; names resolve to ids and the
	// model is normalized.
	pq, err := f.keys["admin"].Quotas.Set(ctx, set(&apiv1.SetQuotaRequest{Tenant: "acme", Project: "web", Model: "h100", Pool: "h100",
		Gpus: i32(2), GpuHours: f64(100)}))
	require.NoError(t, err)
	q := pq.Msg.GetQuota()
	require.Equal(t, f.web, q.GetProjectId())
	require.Equal(t, "H100", q.GetModel())
	require.Equal(t, f.pool, q.GetPoolId())
	require.Equal(t, int32(2), q.GetGpus())
	require.InDelta(t, 100.0, q.GetGpuHours(), 1e-12)
	for _, role := range []string{"member", "viewer", "agent"} {
		_, err := f.keys[role].Quotas.Set(ctx, set(&apiv1.SetQuotaRequest{Tenant: "acme", Project: "web", Gpus: i32(100)}))
		require.Equal(t, "PERMISSION_DENIED", client.Code(err), "%s: %v", role, err)
	}

	// Set replaces the quota of its scope (ids and names alike): one row.
	rq, err := f.keys["admin"].Quotas.Set(ctx, set(&apiv1.SetQuotaRequest{Tenant: f.acme, Project: f.web, Model: "H100", Pool: f.pool,
		Gpus: i32(4)}))
	require.NoError(t, err)
	require.Equal(t, q.GetId(), rq.Msg.GetQuota().GetId())
	require.Equal(t, int32(4), rq.Msg.GetQuota().GetGpus())
	require.Equal(t, float64(-1), rq.Msg.GetQuota().GetGpuHours())
	require.Equal(t, 2, f.count(t, "quotas"))
	var events int
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM events WHERE type = 'quota.set' AND resource_id = $1`, q.GetId()).Scan(&events)
	}))
	require.Equal(t, 2, events)

	// Usage: GPUs held now, GPU-hours booked in all.
	now := f.cp.Clock.Now()
	f.reserve(t, res{id: "rsv_1", project: f.web, pool: f.pool, state: "active", gpus: 1, gpuModel: "H100", from: now.Add(-time.Hour), to: now.Add(time.Hour)})
	f.reserve(t, res{id: "rsv_2", project: f.web, pool: f.pool, state: "released", gpus: 2, model: "h100", from: now.Add(-5 * time.Hour), to: now.Add(-4 * time.Hour)})
	f.reserve(t, res{id: "rsv_3", project: f.web, pool: f.pool, state: "placed", gpus: 3, gpuModel: "A100", from: now.Add(time.Hour), to: now.Add(2 * time.Hour)})
	for _, role := range []string{"admin", "member", "viewer", "agent"} {
		got, err := f.keys[role].Quotas.Get(ctx, connect.NewRequest(&apiv1.GetQuotaRequest{Tenant: "acme", Quota: q.GetId()}))
		require.NoError(t, err, role)
		require.Equal(t, int32(1), got.Msg.GetQuota().GetGpusUsed(), role)
		require.InDelta(t, 4.0, got.Msg.GetQuota().GetGpuHoursUsed(), 1e-9, role)

		list, err := f.keys[role].Quotas.List(ctx, connect.NewRequest(&apiv1.ListQuotasRequest{Tenant: "acme"}))
		require.NoError(t, err, role)
		require.Len(t, list.Msg.GetQuotas(), 2)
		// The tenant-wide quota counts every model: 1 held now, 2+2+3 hours.
		tw := list.Msg.GetQuotas()[0]
		require.Equal(t, tq.Msg.GetQuota().GetId(), tw.GetId())
		require.Equal(t, int32(1), tw.GetGpusUsed())
		require.InDelta(t, 7.0, tw.GetGpuHoursUsed(), 1e-9)
	}
	proj, err := f.keys["viewer"].Quotas.List(ctx, connect.NewRequest(&apiv1.ListQuotasRequest{Tenant: "acme", Project: "web"}))
	require.NoError(t, err)
	require.Len(t, proj.Msg.GetQuotas(), 1)
	require.Equal(t, q.GetId(), proj.Msg.GetQuotas()[0].GetId())
	batch, err := f.keys["viewer"].Quotas.List(ctx, connect.NewRequest(&apiv1.ListQuotasRequest{Tenant: "acme", Project: "batch"}))
	require.NoError(t, err)
	require.Empty(t, batch.Msg.GetQuotas())
	all, err := f.admin.Quotas.List(ctx, connect.NewRequest(&apiv1.ListQuotasRequest{}))
	require.NoError(t, err)
	require.Len(t, all.Msg.GetQuotas(), 2)

	// Another tenant sees nothing of acme's.
	evil := f.keys["evil"]
	_, err = evil.Quotas.Get(ctx, connect.NewRequest(&apiv1.GetQuotaRequest{Tenant: "acme", Quota: q.GetId()}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err))
	_, err = evil.Quotas.Get(ctx, connect.NewRequest(&apiv1.GetQuotaRequest{Tenant: "other", Quota: q.GetId()}))
	require.Equal(t, "NOT_FOUND", client.Code(err))
	_, err = evil.Quotas.List(ctx, connect.NewRequest(&apiv1.ListQuotasRequest{Tenant: "acme"}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err))
	_, err = evil.Quotas.List(ctx, connect.NewRequest(&apiv1.ListQuotasRequest{}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err))
	_, err = evil.Quotas.Set(ctx, set(&apiv1.SetQuotaRequest{Tenant: "acme", Project: "web", Gpus: i32(1000)}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err))
	// A pool of acme does not resolve in other.
	_, err = evil.Quotas.Set(ctx, set(&apiv1.SetQuotaRequest{Tenant: "other", Pool: f.pool, Gpus: i32(1)}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err), "a tenant admin never sets a tenant quota")
	_, err = f.admin.Quotas.Set(ctx, set(&apiv1.SetQuotaRequest{Tenant: "other", Pool: f.pool, Gpus: i32(1)}))
	require.Equal(t, "NOT_FOUND", client.Code(err))
	_, err = f.admin.Quotas.Set(ctx, set(&apiv1.SetQuotaRequest{Tenant: "other", Project: f.web, Gpus: i32(1)}))
	require.Equal(t, "NOT_FOUND", client.Code(err))
}

func TestQuotaNotFoundAndPreconditions(t *testing.T) {
	t.Parallel()
	f := setupService(t)
	ctx := context.Background()
	admin := f.keys["admin"]
	cases := []struct {
		name string
		req  *apiv1.SetQuotaRequest
		code string
	}{
		{"no such project", &apiv1.SetQuotaRequest{Tenant: "acme", Project: "nope", Gpus: i32(1)}, "NOT_FOUND"},
		{"no such pool", &apiv1.SetQuotaRequest{Tenant: "acme", Project: "web", Pool: "nope", Gpus: i32(1)}, "NOT_FOUND"},
		{"no such tenant, platform admin", &apiv1.SetQuotaRequest{Tenant: "nope", Gpus: i32(1)}, "NOT_FOUND"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := admin
			if strings.Contains(tc.name, "platform") {
				c = f.admin
			}
			_, err := c.Quotas.Set(ctx, set(tc.req))
			require.Equal(t, tc.code, client.Code(err), "%v", err)
		})
	}
	// A tenant admin asking about a tenant that does not exist is refused
	// before learning so.
	_, err := admin.Quotas.Set(ctx, set(&apiv1.SetQuotaRequest{Tenant: "nope", Project: "web", Gpus: i32(1)}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err))

	_, err = f.admin.Pools.Archive(ctx, connect.NewRequest(&apiv1.ArchivePoolRequest{Tenant: "acme", Pool: "h100"}))
	require.NoError(t, err)
	_, err = admin.Quotas.Set(ctx, set(&apiv1.SetQuotaRequest{Tenant: "acme", Project: "web", Pool: "h100", Gpus: i32(1)}))
	require.Equal(t, "FAILED_PRECONDITION", client.Code(err))
	require.Zero(t, f.count(t, "quotas"))

	_, err = admin.Quotas.Get(ctx, connect.NewRequest(&apiv1.GetQuotaRequest{Tenant: "acme", Quota: "quo_01jx0000000000000000000000"}))
	require.Equal(t, "NOT_FOUND", client.Code(err))
	_, err = admin.Quotas.List(ctx, connect.NewRequest(&apiv1.ListQuotasRequest{Tenant: "acme", Project: "nope"}))
	require.Equal(t, "NOT_FOUND", client.Code(err))
}

func TestQuotaValidation(t *testing.T) {
	t.Parallel()
	f := setupService(t)
	ctx := context.Background()
	c := f.admin
	setCase := func(m *apiv1.SetQuotaRequest) func() error {
		return func() error { _, err := c.Quotas.Set(ctx, set(m)); return err }
	}
	cases := []struct {
		name  string
		field string
		call  func() error
	}{
		{"set no tenant", "tenant", setCase(&apiv1.SetQuotaRequest{Gpus: i32(1)})},
		{"set bad tenant id", "tenant", setCase(&apiv1.SetQuotaRequest{Tenant: "tnt_XYZ", Gpus: i32(1)})},
		{"set bad project", "project", setCase(&apiv1.SetQuotaRequest{Tenant: "acme", Project: "My Web", Gpus: i32(1)})},
		{"set bad project id", "project", setCase(&apiv1.SetQuotaRequest{Tenant: "acme", Project: "prj_nope", Gpus: i32(1)})},
		{"set bad model", "model", setCase(&apiv1.SetQuotaRequest{Tenant: "acme", Model: "H100 SXM", Gpus: i32(1)})},
		{"set model too long", "model", setCase(&apiv1.SetQuotaRequest{Tenant: "acme", Model: strings.Repeat("A", 33), Gpus: i32(1)})},
		{"set bad pool", "pool", setCase(&apiv1.SetQuotaRequest{Tenant: "acme", Pool: "H100!", Gpus: i32(1)})},
		{"set negative gpus", "gpus", setCase(&apiv1.SetQuotaRequest{Tenant: "acme", Gpus: i32(-1)})},
		{"set negative gpu hours", "gpu_hours", setCase(&apiv1.SetQuotaRequest{Tenant: "acme", GpuHours: f64(-0.5)})},
		{"set NaN gpu hours", "gpu_hours", setCase(&apiv1.SetQuotaRequest{Tenant: "acme", GpuHours: f64(math.NaN())})},
		{"set infinite gpu hours", "gpu_hours", setCase(&apiv1.SetQuotaRequest{Tenant: "acme", GpuHours: f64(math.Inf(1))})},
		{"get bad quota id", "quota", func() error {
			_, err := c.Quotas.Get(ctx, connect.NewRequest(&apiv1.GetQuotaRequest{Tenant: "acme", Quota: "pool_x"}))
			return err
		}},
		{"get no tenant", "tenant", func() error {
			_, err := c.Quotas.Get(ctx, connect.NewRequest(&apiv1.GetQuotaRequest{Quota: "quo_01jx0000000000000000000000"}))
			return err
		}},
		{"list project without tenant", "tenant", func() error {
			_, err := c.Quotas.List(ctx, connect.NewRequest(&apiv1.ListQuotasRequest{Project: "web"}))
			return err
		}},
		{"list bad page token", "page_token", func() error {
			_, err := c.Quotas.List(ctx, connect.NewRequest(&apiv1.ListQuotasRequest{Tenant: "acme", PageToken: "%%%"}))
			return err
		}},
		{"list page size too big", "page_size", func() error {
			_, err := c.Quotas.List(ctx, connect.NewRequest(&apiv1.ListQuotasRequest{Tenant: "acme", PageSize: envelope.MaxPageSize + 1}))
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			quotas, audit, events := f.count(t, "quotas"), f.count(t, "audit_log"), f.count(t, "events")
			err := tc.call()
			require.Equal(t, "INVALID_ARGUMENT", client.Code(err), "%v", err)
			var fields []string
			for _, v := range client.Detail(err).GetViolations() {
				fields = append(fields, v.GetField())
			}
			require.Contains(t, fields, tc.field)
			require.Equal(t, quotas, f.count(t, "quotas"), "nothing written")
			require.Equal(t, audit, f.count(t, "audit_log"), "nothing written")
			require.Equal(t, events, f.count(t, "events"), "nothing written")
		})
	}
}

func TestQuotaListPages(t *testing.T) {
	t.Parallel()
	f := setupService(t)
	ctx := context.Background()
	var ids []string
	for _, m := range []string{"H100", "A100", "B200"} {
		r, err := f.keys["admin"].Quotas.Set(ctx, set(&apiv1.SetQuotaRequest{Tenant: "acme", Project: "web", Model: m, Gpus: i32(1)}))
		require.NoError(t, err)
		ids = append(ids, r.Msg.GetQuota().GetId())
	}
	var got []string
	token := ""
	for range 3 {
		r, err := f.keys["viewer"].Quotas.List(ctx, connect.NewRequest(&apiv1.ListQuotasRequest{Tenant: "acme", Project: "web", PageSize: 2, PageToken: token}))
		require.NoError(t, err)
		for _, q := range r.Msg.GetQuotas() {
			got = append(got, q.GetId())
		}
		if token = r.Msg.GetNextPageToken(); token == "" {
			break
		}
	}
	require.Equal(t, ids, got)
	// A token is bound to its filters.
	first, err := f.keys["viewer"].Quotas.List(ctx, connect.NewRequest(&apiv1.ListQuotasRequest{Tenant: "acme", PageSize: 1}))
	require.NoError(t, err)
	_, err = f.keys["viewer"].Quotas.List(ctx, connect.NewRequest(&apiv1.ListQuotasRequest{Tenant: "acme", Project: "web",
		PageToken: first.Msg.GetNextPageToken()}))
	require.Equal(t, "INVALID_ARGUMENT", client.Code(err))
}
