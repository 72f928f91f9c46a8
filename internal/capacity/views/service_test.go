package views_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/views"
	"github.com/better-compute/better-compute/internal/store"
)

type cpFixture struct {
	cp    *bctest.ControlPlane
	w     *world
	admin *client.Client // platform admin
	keys  map[string]*client.Client
	// ids of the tenants and of acme's pools h100 and empty, other's pool.
	acme, other, h100, empty, otherPool string
	now                                 time.Time
}

// setupService starts a control plane with tenants acme and other, pools
// made through the API, and acme's capacity written as the reservation
// engine would.
func setupService(t *testing.T) *cpFixture {
	t.Helper()
	cp := bctest.NewControlPlane(t)
	migrateCapacity(t, cp.App.DB)
	ctx := context.Background()
	f := &cpFixture{cp: cp, w: &world{t: t, db: cp.App.DB}, admin: cp.Admin(), keys: map[string]*client.Client{},
		now: cp.Clock.Now().UTC().Truncate(time.Hour)}
	for _, name := range []string{"acme", "other"} {
		res, err := f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: name}))
		require.NoError(t, err)
		if name == "acme" {
			f.acme = res.Msg.GetTenant().GetId()
		} else {
			f.other = res.Msg.GetTenant().GetId()
		}
	}
	for _, role := range []string{"admin", "viewer"} {
		k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: role}))
		require.NoError(t, err)
		f.keys[role] = cp.Client(k.Msg.GetSecret())
	}
	k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "other", Role: "admin"}))
	require.NoError(t, err)
	f.keys["evil"] = cp.Client(k.Msg.GetSecret())
	mkPool := func(tenant, name string) string {
		p, err := f.admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: tenant, Name: name}))
		require.NoError(t, err)
		return p.Msg.GetPool().GetId()
	}
	f.h100, f.empty, f.otherPool = mkPool("acme", "h100"), mkPool("acme", "empty"), mkPool("other", "l40s")

	w := f.w
	w.node("n1", f.acme, f.h100)
	w.node("n2", f.other, f.otherPool)
	for _, id := range []string{"g1", "g2", "g3"} {
		w.atom(id, "n1", views.KindGPU, "H100")
	}
	w.atom("g4", "n1", views.KindGPU, "H100", quarantined)
	w.atom("s1", "n1", views.KindSlot, "H100")
	w.atom("o1", "n2", views.KindGPU, "L40S")
	at := func(h int) time.Time { return f.now.Add(time.Duration(h) * time.Hour) }
	w.reservation("r1", f.acme, f.h100, "active", 2)
	w.book("r1", "g1", at(0), at(2))
	w.book("r1", "g2", at(0), at(2))
	w.reservation("r2", f.acme, f.h100, "placed", 1)
	w.book("r2", "g3", at(1), at(3))
	w.reservation("r3", f.acme, f.h100, "pending", 1)
	w.reservation("r4", f.acme, f.empty, "pending", 1)
	w.reservation("r5", f.acme, f.empty, "pending", 1)
	w.delta(f.h100, "H100", "gpu", 4, 3, 1)
	w.delta(f.h100, "H100", "slot", 1, 0, 0)
	w.delta(f.otherPool, "L40S", "gpu", 1, 0, 0)
	require.Empty(t, check(t, cp.App.DB))
	return f
}

func rowKeys(rows []*apiv1.CapacityRow) []string {
	var out []string
	for _, r := range rows {
		out = append(out, r.GetPool()+"/"+r.GetModel()+"/"+r.GetKind())
	}
	return out
}

func TestCapacityService(t *testing.T) {
	t.Parallel()
	f := setupService(t)
	ctx := context.Background()
	viewer := f.keys["viewer"]

	sum, err := viewer.Capacity.Summary(ctx, connect.NewRequest(&apiv1.CapacitySummaryRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Len(t, sum.Msg.GetRows(), 2)
	gpu := sum.Msg.GetRows()[0]
	// r2's booking starts in an hour: it is on the timeline, not booked now
	// (the stored rollup counts it: 3).
	require.Equal(t, []any{"H100", "gpu", int32(4), int32(2), int32(1), int32(1), int32(1)},
		[]any{gpu.GetModel(), gpu.GetKind(), gpu.GetTotal(), gpu.GetBooked(), gpu.GetQuarantined(), gpu.GetFree(), gpu.GetPending()})
	require.Empty(t, gpu.GetPoolId(), "a summary row spans pools")
	require.Equal(t, int32(1), sum.Msg.GetRows()[1].GetFree())

	// A tenant's viewer may not read the platform's summary; the platform
	// admin reads every tenant's.
	_, err = viewer.Capacity.Summary(ctx, connect.NewRequest(&apiv1.CapacitySummaryRequest{}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err))
	sum, err = f.admin.Capacity.Summary(ctx, connect.NewRequest(&apiv1.CapacitySummaryRequest{}))
	require.NoError(t, err)
	require.Len(t, sum.Msg.GetRows(), 3)

	by, err := viewer.Capacity.ByPool(ctx, connect.NewRequest(&apiv1.CapacityByPoolRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Equal(t, []string{"empty//", "h100/H100/gpu", "h100/H100/slot"}, rowKeys(by.Msg.GetRows()))
	require.Equal(t, int32(2), by.Msg.GetRows()[0].GetPending(), "waiting demand shows on a pool with no atoms")
	require.Equal(t, f.h100, by.Msg.GetRows()[1].GetPoolId())
	require.Equal(t, []int32{2, 1}, []int32{by.Msg.GetRows()[1].GetBooked(), by.Msg.GetRows()[1].GetFree()}, "booked now")
	require.Equal(t, int32(1), by.Msg.GetRows()[1].GetPending())
	for _, ref := range []string{"h100", f.h100} {
		by, err = viewer.Capacity.ByPool(ctx, connect.NewRequest(&apiv1.CapacityByPoolRequest{Tenant: "acme", Pool: ref}))
		require.NoError(t, err)
		require.Equal(t, []string{"h100/H100/gpu", "h100/H100/slot"}, rowKeys(by.Msg.GetRows()))
	}
	by, err = f.admin.Capacity.ByPool(ctx, connect.NewRequest(&apiv1.CapacityByPoolRequest{Pool: f.otherPool}))
	require.NoError(t, err)
	require.Equal(t, []string{"l40s/L40S/gpu"}, rowKeys(by.Msg.GetRows()))
	_, err = viewer.Capacity.ByPool(ctx, connect.NewRequest(&apiv1.CapacityByPoolRequest{Tenant: "acme", Pool: "nope"}))
	require.Equal(t, "NOT_FOUND", client.Code(err))

	tl, err := viewer.Capacity.Timeline(ctx, connect.NewRequest(&apiv1.CapacityTimelineRequest{Tenant: "acme", Pool: "h100",
		StartTime: timestamppb.New(f.now), EndTime: timestamppb.New(f.now.Add(4 * time.Hour))}))
	require.NoError(t, err)
	var booked []int32
	for i, p := range tl.Msg.GetPoints() {
		require.Equal(t, f.now.Add(time.Duration(i)*time.Hour), p.GetTime().AsTime())
		require.Equal(t, int32(4), p.GetTotal())
		booked = append(booked, p.GetBooked())
	}
	require.Equal(t, []int32{2, 3, 1, 0, 0}, booked)
	// The defaults: now to now+24h, every hour.
	tl, err = viewer.Capacity.Timeline(ctx, connect.NewRequest(&apiv1.CapacityTimelineRequest{Tenant: "acme", Pool: f.h100}))
	require.NoError(t, err)
	require.Len(t, tl.Msg.GetPoints(), 25)
	tl, err = viewer.Capacity.Timeline(ctx, connect.NewRequest(&apiv1.CapacityTimelineRequest{Tenant: "acme", Pool: "h100",
		StartTime: timestamppb.New(f.now), EndTime: timestamppb.New(f.now.Add(time.Hour)), StepSeconds: 1800}))
	require.NoError(t, err)
	require.Len(t, tl.Msg.GetPoints(), 3)
}

func eventCount(t *testing.T, db *store.DB, where string) int {
	t.Helper()
	var n int
	require.NoError(t, db.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM events `+where).Scan(&n)
	}))
	return n
}

func auditCount(t *testing.T, db *store.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM audit_log`).Scan(&n)
	}))
	return n
}

func requireViolation(t *testing.T, err error, field string) {
	t.Helper()
	require.Equal(t, "INVALID_ARGUMENT", client.Code(err), "%v", err)
	var fields []string
	for _, v := range client.Detail(err).GetViolations() {
		fields = append(fields, v.GetField())
	}
	require.Contains(t, fields, field, "%v", err)
}

func TestCapacityValidation(t *testing.T) {
	t.Parallel()
	f := setupService(t)
	ctx := context.Background()
	c := f.keys["admin"]
	start := timestamppb.New(f.now)
	tests := []struct {
		field string
		call  func() error
	}{
		{"end_time", func() error {
			_, err := c.Capacity.Timeline(ctx, connect.NewRequest(&apiv1.CapacityTimelineRequest{Tenant: "acme", Pool: "h100",
				StartTime: start, EndTime: timestamppb.New(f.now.Add(-time.Second))}))
			return err
		}},
		{"step_seconds", func() error {
			_, err := c.Capacity.Timeline(ctx, connect.NewRequest(&apiv1.CapacityTimelineRequest{Tenant: "acme", Pool: "h100",
				StartTime: start, EndTime: timestamppb.New(f.now.Add(1000 * time.Minute)), StepSeconds: 60}))
			return err
		}},
		// Beyond ~292 years end - start saturates a time.Duration: the span
		// is capped before the points are counted.
		{"end_time", func() error {
			_, err := c.Capacity.Timeline(ctx, connect.NewRequest(&apiv1.CapacityTimelineRequest{Tenant: "acme", Pool: "h100",
				StartTime: timestamppb.New(time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)),
				EndTime:   timestamppb.New(time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)), StepSeconds: 365 * 24 * 3600}))
			return err
		}},
		{"end_time", func() error {
			_, err := c.Capacity.Timeline(ctx, connect.NewRequest(&apiv1.CapacityTimelineRequest{Tenant: "acme", Pool: "h100",
				StartTime: start, EndTime: timestamppb.New(f.now.Add(views.MaxTimelineSpan + time.Second)), StepSeconds: 365 * 24 * 3600}))
			return err
		}},
		{"step_seconds", func() error {
			_, err := c.Capacity.Timeline(ctx, connect.NewRequest(&apiv1.CapacityTimelineRequest{Tenant: "acme", Pool: "h100", StepSeconds: -1}))
			return err
		}},
		{"start_time", func() error {
			_, err := c.Capacity.Timeline(ctx, connect.NewRequest(&apiv1.CapacityTimelineRequest{Tenant: "acme", Pool: "h100",
				StartTime: &timestamppb.Timestamp{Seconds: 1, Nanos: -1}}))
			return err
		}},
		{"pool", func() error {
			_, err := c.Capacity.Timeline(ctx, connect.NewRequest(&apiv1.CapacityTimelineRequest{Tenant: "acme"}))
			return err
		}},
		{"pool", func() error {
			_, err := c.Capacity.ByPool(ctx, connect.NewRequest(&apiv1.CapacityByPoolRequest{Tenant: "acme", Pool: "pool_NOPE"}))
			return err
		}},
		{"tenant", func() error {
			_, err := f.admin.Capacity.ByPool(ctx, connect.NewRequest(&apiv1.CapacityByPoolRequest{Pool: "h100"}))
			return err
		}},
		{"tenant", func() error {
			_, err := c.Capacity.Summary(ctx, connect.NewRequest(&apiv1.CapacitySummaryRequest{Tenant: "Acme"}))
			return err
		}},
	}
	// 1000 minutes at one a minute is 1001 points; 999 is the most.
	_, err := c.Capacity.Timeline(ctx, connect.NewRequest(&apiv1.CapacityTimelineRequest{Tenant: "acme", Pool: "h100",
		StartTime: start, EndTime: timestamppb.New(f.now.Add(999 * time.Minute)), StepSeconds: 60}))
	require.NoError(t, err)
	events, audits := eventCount(t, f.cp.App.DB, ""), auditCount(t, f.cp.App.DB)
	for _, tt := range tests {
		requireViolation(t, tt.call(), tt.field)
	}
	require.Equal(t, events, eventCount(t, f.cp.App.DB, ""), "nothing was written")
	require.Equal(t, audits, auditCount(t, f.cp.App.DB), "nothing was written")
}

func TestCapacityRebuild(t *testing.T) {
	t.Parallel()
	f := setupService(t)
	ctx := context.Background()
	db := f.cp.App.DB
	f.w.delta(f.h100, "H100", "gpu", 0, -3, 0) // releases that never happened
	require.Len(t, check(t, db), 1)

	for _, who := range []string{"admin", "viewer", "evil"} {
		_, err := f.keys[who].Capacity.Rebuild(ctx, connect.NewRequest(&apiv1.RebuildCapacityRequest{}))
		require.Equal(t, "PERMISSION_DENIED", client.Code(err), who)
	}
	require.Len(t, check(t, db), 1, "refusals change nothing")

	res, err := f.admin.Capacity.Rebuild(ctx, connect.NewRequest(&apiv1.RebuildCapacityRequest{}))
	require.NoError(t, err)
	require.Equal(t, []string{f.h100 + "/H100/gpu: stored total=4 booked=0 quarantined=1, recomputed total=4 booked=3 quarantined=1"},
		res.Msg.GetMismatches())
	require.Equal(t, int32(3), res.Msg.GetRows())
	require.Empty(t, check(t, db))
	require.Equal(t, 1, eventCount(t, db, `WHERE type = 'capacity.rebuilt'`))

	res, err = f.admin.Capacity.Rebuild(ctx, connect.NewRequest(&apiv1.RebuildCapacityRequest{}))
	require.NoError(t, err)
	require.Empty(t, res.Msg.GetMismatches())
}

func TestCapacityCrossTenant(t *testing.T) {
	t.Parallel()
	f := setupService(t)
	ctx := context.Background()
	evil := f.keys["evil"]
	refused := []string{"PERMISSION_DENIED", "NOT_FOUND"}
	for _, call := range []func() error{
		func() error {
			_, err := evil.Capacity.Summary(ctx, connect.NewRequest(&apiv1.CapacitySummaryRequest{Tenant: "acme"}))
			return err
		},
		func() error {
			_, err := evil.Capacity.ByPool(ctx, connect.NewRequest(&apiv1.CapacityByPoolRequest{Pool: f.h100}))
			return err
		},
		func() error {
			_, err := evil.Capacity.ByPool(ctx, connect.NewRequest(&apiv1.CapacityByPoolRequest{Tenant: "other", Pool: f.h100}))
			return err
		},
		func() error {
			_, err := evil.Capacity.Timeline(ctx, connect.NewRequest(&apiv1.CapacityTimelineRequest{Pool: f.h100}))
			return err
		},
		func() error {
			_, err := evil.Capacity.Timeline(ctx, connect.NewRequest(&apiv1.CapacityTimelineRequest{Tenant: "nope", Pool: "h100"}))
			return err
		},
	} {
		require.Contains(t, refused, client.Code(call()))
	}
	// Its own tenant's view holds only its own pool.
	by, err := evil.Capacity.ByPool(ctx, connect.NewRequest(&apiv1.CapacityByPoolRequest{Tenant: "other"}))
	require.NoError(t, err)
	require.Equal(t, []string{"l40s/L40S/gpu"}, rowKeys(by.Msg.GetRows()))
}
