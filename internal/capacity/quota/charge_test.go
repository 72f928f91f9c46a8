package quota_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/quota"
	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func hours(n float64) time.Time { return t0.Add(time.Duration(n * float64(time.Hour))) }

const (
	tenant = "tnt_acme"
	web    = "prj_web"
	batch  = "prj_batch"
	h100   = "pool_h100"
	a100   = "pool_a100"
)

// fixture is a database with the reservation and quota tables.
type fixture struct {
	db *store.DB
}

func setup(t *testing.T) *fixture {
	t.Helper()
	db := bctest.NewDB(t, bctest.NewSimClock(t0))
	require.NoError(t, db.Migrate(context.Background(), reservation.Migrations(), quota.Migrations()))
	return &fixture{db: db}
}

// res is a reservation row as the reservation module would write it.
type res struct {
	id, project, pool, state string
	gpus                     int
	model, gpuModel          string
	from, to                 time.Time
}

// reserve inserts reservations with plain SQL: the quota check reads the
// table, it never writes it.
func (f *fixture) reserve(t *testing.T, rs ...res) {
	t.Helper()
	require.NoError(t, f.db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		for _, r := range rs {
			if err := insertReservation(ctx, tx, r); err != nil {
				return err
			}
		}
		return nil
	}))
}

func insertReservation(ctx context.Context, tx store.Tx, r res) error {
	_, err := tx.Exec(ctx, `INSERT INTO reservations (id, tenant_id, project_id, pool_id, state, gpus, model, gpu_model,
		binding, starts_at, ends_at, created_by, create_time, update_time)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'none', $9, $10, 'test', $11, $11)`,
		r.id, tenant, r.project, r.pool, r.state, r.gpus, r.model, r.gpuModel, r.from, r.to, t0)
	return err
}

// set writes a quota; gpus or gpuHours of -1 leave it unlimited.
func (f *fixture) set(t *testing.T, project, model, pool string, gpus int, gpuHours float64) quota.Quota {
	t.Helper()
	q := quota.Quota{ID: envelope.NewID(quota.IDPrefix, t0), TenantID: tenant, ProjectID: project, Model: model, PoolID: pool,
		GPUs: gpus, GPUHours: gpuHours, CreatedBy: "test", CreateTime: t0, UpdateTime: t0}
	require.NoError(t, f.db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return quota.Upsert(ctx, tx, &q)
	}))
	return q
}

func (f *fixture) check(t *testing.T, c quota.Charge) (*apiv1.QuotaEffect, error) {
	t.Helper()
	var eff *apiv1.QuotaEffect
	err := f.db.Write(context.Background(), func(ctx context.Context, tx store.Tx) (err error) {
		eff, err = checkLocked(ctx, tx, c)
		return err
	})
	return eff, err
}

// checkLocked is what the placer's Batch.CheckQuota does for a batch of one:
// lock the tenant's quotas, read those covering the charge, and check it.
func checkLocked(ctx context.Context, tx store.Tx, c quota.Charge) (*apiv1.QuotaEffect, error) {
	if err := quota.LockTenants(ctx, tx, []string{c.TenantID}); err != nil {
		return nil, err
	}
	qs, err := quota.Covering(ctx, tx, c)
	if err != nil {
		return nil, err
	}
	return quota.CheckCovered(ctx, tx, c, qs, nil)
}

// effect previews a charge in a read transaction.
func (f *fixture) effect(t *testing.T, c quota.Charge) *apiv1.QuotaEffect {
	t.Helper()
	var eff *apiv1.QuotaEffect
	require.NoError(t, f.db.Read(context.Background(), func(ctx context.Context, tx store.Tx) (err error) {
		eff, err = quota.Effect(ctx, tx, c)
		return err
	}))
	return eff
}

func charge(project, pool, model string, gpus int, from, to time.Time) quota.Charge {
	return quota.Charge{TenantID: tenant, ProjectID: project, PoolID: pool, Model: model, GPUs: gpus, Start: from, End: to}
}

// requireExceeded checks a refusal: QUOTA_EXCEEDED carrying the effect, and
// a message that names the scope.
func requireExceeded(t *testing.T, eff *apiv1.QuotaEffect, err error, scope string) {
	t.Helper()
	require.Error(t, err)
	var apiErr *envelope.Error
	require.True(t, errors.As(err, &apiErr), "%T: %v", err, err)
	require.Equal(t, envelope.CodeQuotaExceeded, apiErr.Code)
	require.Same(t, eff, apiErr.Quota)
	require.True(t, eff.GetExceeded())
	// The message says the scope in words (names where the store has
	// them; these fixtures' ids have none).
	words := strings.NewReplacer("project/", "project ", "/model=", ", model ", "/pool=", ", pool ").Replace(scope)
	require.Contains(t, apiErr.Message, "the quota on "+words)
	found := false
	for _, u := range eff.GetUses() {
		if u.GetScope() == scope {
			found = true
			require.True(t, u.GetExceeded(), "use %v", u)
		}
	}
	require.True(t, found, "no use of scope %s in %v", scope, eff)
	// The detail reaches clients.
	require.Equal(t, string(envelope.CodeQuotaExceeded), envelope.DetailOf(envelope.ToConnect(err)).GetCode())
	require.NotNil(t, envelope.DetailOf(envelope.ToConnect(err)).GetQuota())
}

func TestChargeGPUHours(t *testing.T) {
	t.Parallel()
	require.InDelta(t, 6.0, charge("", "", "", 4, hours(0), hours(1.5)).GPUHours(), 1e-12)
	require.Zero(t, charge("", "", "", 4, hours(2), hours(1)).GPUHours())
	require.Zero(t, charge("", "", "", 0, hours(0), hours(1)).GPUHours())
}

func TestNoCoveringQuota(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.reserve(t, res{id: "r1", project: web, pool: h100, state: "active", gpus: 8, from: hours(0), to: hours(10)})
	eff, err := f.check(t, charge(web, h100, "H100", 100, hours(0), hours(100)))
	require.NoError(t, err)
	require.NotNil(t, eff)
	require.Empty(t, eff.GetUses())
	require.False(t, eff.GetExceeded())

	// Quotas of other scopes do not cover the charge.
	f.set(t, batch, "", "", 1, -1)
	f.set(t, "", "A100", "", 1, -1)
	f.set(t, "", "", a100, 1, -1)
	require.NoError(t, f.db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		q := quota.Quota{ID: envelope.NewID(quota.IDPrefix, t0), TenantID: "tnt_other", GPUs: 0, GPUHours: 0, CreatedBy: "test", CreateTime: t0, UpdateTime: t0}
		return quota.Upsert(ctx, tx, &q)
	}))
	eff, err = f.check(t, charge(web, h100, "h100", 100, hours(0), hours(100)))
	require.NoError(t, err)
	require.Empty(t, eff.GetUses())
}

func TestGPULimit(t *testing.T) {
	t.Parallel()
	f := setup(t)
	q := f.set(t, "", "", "", 4, -1)
	f.reserve(t,
		res{id: "r1", project: web, pool: h100, state: "active", gpus: 2, from: hours(0), to: hours(4)},
		res{id: "r2", project: batch, pool: a100, state: "pending", gpus: 1, from: hours(1), to: hours(3)},
		// Not live: they hold nothing.
		res{id: "r3", project: web, pool: h100, state: "released", gpus: 8, from: hours(0), to: hours(4)},
		res{id: "r4", project: web, pool: h100, state: "expired", gpus: 8, from: hours(0), to: hours(4)},
		res{id: "r5", project: web, pool: h100, state: "failed", gpus: 8, from: hours(0), to: hours(4)},
		res{id: "r6", project: web, pool: h100, state: "canceled", gpus: 8, from: hours(0), to: hours(4)},
	)

	// 3 held over the window: one more exactly reaches the limit.
	eff, err := f.check(t, charge(web, h100, "H100", 1, hours(2), hours(5)))
	require.NoError(t, err)
	require.Len(t, eff.GetUses(), 1)
	u := eff.GetUses()[0]
	require.Equal(t, q.ID, u.GetQuotaId())
	require.Equal(t, "tenant", u.GetScope())
	require.Equal(t, int32(4), u.GetGpusLimit())
	require.Equal(t, int32(3), u.GetGpusUsed())
	require.Equal(t, int32(1), u.GetGpusRequested())
	require.Equal(t, float64(quota.Unlimited), u.GetGpuHoursLimit())
	require.InDelta(t, 3.0, u.GetGpuHoursRequested(), 1e-9)
	require.False(t, u.GetExceeded())

	// Two more is one too many.
	eff, err = f.check(t, charge(web, h100, "H100", 2, hours(2), hours(5)))
	requireExceeded(t, eff, err, "tenant")
	require.Contains(t, err.Error(), "allows 4 GPUs at once: 3 in use over the requested window, 2 requested")

	// Only r1 overlaps [3.5, 6): r2 ended at 3.
	_, err = f.check(t, charge(web, h100, "H100", 2, hours(3.5), hours(6)))
	require.NoError(t, err)
	// Windows are half-open: r1 ends where this one starts.
	_, err = f.check(t, charge(web, h100, "H100", 4, hours(4), hours(6)))
	require.NoError(t, err)

	// All or nothing: 5 GPUs never fit under 4, even with nothing held.
	eff, err = f.check(t, charge(web, h100, "H100", 5, hours(10), hours(11)))
	requireExceeded(t, eff, err, "tenant")
	require.Equal(t, int32(0), eff.GetUses()[0].GetGpusUsed())

	// A CPU-only charge is never refused by a GPU quota.
	_, err = f.check(t, charge(web, h100, "", 0, hours(0), hours(4)))
	require.NoError(t, err)
}

func TestScopes(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.set(t, web, "", "", 4, -1)
	f.set(t, "", "H100", "", 3, -1)
	f.set(t, "", "", a100, 2, -1)
	f.set(t, web, "H100", h100, 2, -1)
	f.reserve(t,
		// Placed on h100 (the placed model counts, whatever its case).
		res{id: "r1", project: web, pool: h100, state: "active", gpus: 1, model: "", gpuModel: "h100", from: hours(0), to: hours(4)},
		// Pending, asked for H100: the requested model counts.
		res{id: "r2", project: batch, pool: h100, state: "pending", gpus: 1, model: "H100", from: hours(0), to: hours(4)},
		// Asked for any model, placed on A100 in the a100 pool.
		res{id: "r3", project: web, pool: a100, state: "binding", gpus: 1, model: "", gpuModel: "A100", from: hours(0), to: hours(4)},
	)

	cases := []struct {
		name     string
		c        quota.Charge
		wantUses map[string][2]int32 // scope → {limit, used}
		exceeded string
	}{
		{
			name: "web on h100 pool, H100",
			c:    charge(web, h100, "h100", 1, hours(1), hours(2)),
			wantUses: map[string][2]int32{
				"tenant/model=H100": {3, 2}, "project/" + web: {4, 2}, "project/" + web + "/model=H100/pool=" + h100: {2, 1},
			},
		},
		{
			name: "web on h100, H100, one too many for the model",
			c:    charge(web, h100, "H100", 2, hours(1), hours(2)),
			wantUses: map[string][2]int32{
				"tenant/model=H100": {3, 2}, "project/" + web: {4, 2}, "project/" + web + "/model=H100/pool=" + h100: {2, 1},
			},
			exceeded: "tenant/model=H100",
		},
		{
			name:     "batch on a100 pool",
			c:        charge(batch, a100, "A100", 1, hours(1), hours(2)),
			wantUses: map[string][2]int32{"tenant/pool=" + a100: {2, 1}},
		},
		{
			name:     "batch on a100 pool, too many for the pool",
			c:        charge(batch, a100, "A100", 2, hours(1), hours(2)),
			wantUses: map[string][2]int32{"tenant/pool=" + a100: {2, 1}},
			exceeded: "tenant/pool=" + a100,
		},
		{
			name:     "web, any model, in a100: the project quota only",
			c:        charge(web, a100, "", 3, hours(1), hours(2)),
			wantUses: map[string][2]int32{"project/" + web: {4, 2}, "tenant/pool=" + a100: {2, 1}},
			exceeded: "project/" + web,
		},
		{
			name:     "batch is not bound by web's quota",
			c:        charge(batch, "pool_other", "B200", 50, hours(1), hours(2)),
			wantUses: map[string][2]int32{},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			eff, err := f.check(t, tc.c)
			got := map[string][2]int32{}
			for _, u := range eff.GetUses() {
				got[u.GetScope()] = [2]int32{u.GetGpusLimit(), u.GetGpusUsed()}
			}
			require.Equal(t, tc.wantUses, got)
			if tc.exceeded == "" {
				require.NoError(t, err)
				return
			}
			requireExceeded(t, eff, err, tc.exceeded)
		})
	}

	// Uses go from the broadest scope to the narrowest.
	eff := f.effect(t, charge(web, h100, "H100", 1, hours(1), hours(2)))
	var scopes []string
	for _, u := range eff.GetUses() {
		scopes = append(scopes, u.GetScope())
	}
	require.Equal(t, []string{"tenant/model=H100", "project/" + web, "project/" + web + "/model=H100/pool=" + h100}, scopes)
}

func TestGPUHours(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.set(t, web, "", "", -1, 10)
	f.reserve(t,
		// Released after 3 of its hours: 2 GPUs × 3 h.
		res{id: "r1", project: web, pool: h100, state: "released", gpus: 2, from: hours(-10), to: hours(-7)},
		// Expired: 1 GPU × 1 h.
		res{id: "r2", project: web, pool: h100, state: "expired", gpus: 1, from: hours(-20), to: hours(-19)},
		// Failed and canceled ones are never charged.
		res{id: "r3", project: web, pool: h100, state: "failed", gpus: 8, from: hours(0), to: hours(100)},
		res{id: "r4", project: web, pool: h100, state: "canceled", gpus: 8, from: hours(0), to: hours(100)},
		// Another project's hours are its own.
		res{id: "r5", project: batch, pool: h100, state: "active", gpus: 8, from: hours(0), to: hours(100)},
	)
	// 7 booked: 3 more (1 GPU × 1.5 h + ...) exactly reach 10.
	eff, err := f.check(t, charge(web, h100, "", 2, hours(100), hours(101.5)))
	require.NoError(t, err)
	require.Len(t, eff.GetUses(), 1)
	u := eff.GetUses()[0]
	require.Equal(t, int32(quota.Unlimited), u.GetGpusLimit())
	require.InDelta(t, 10.0, u.GetGpuHoursLimit(), 1e-12)
	require.InDelta(t, 7.0, u.GetGpuHoursUsed(), 1e-9)
	require.InDelta(t, 3.0, u.GetGpuHoursRequested(), 1e-9)
	require.False(t, u.GetExceeded())

	// One minute more is over.
	eff, err = f.check(t, charge(web, h100, "", 2, hours(100), hours(101.5).Add(time.Minute)))
	requireExceeded(t, eff, err, "project/"+web)
	require.Contains(t, err.Error(), "allows 10 GPU-hours: 7 booked, 3.03 requested")

	// Booked hours count whenever they run, and live reservations count in
	// full.
	f.reserve(t, res{id: "r6", project: web, pool: h100, state: "active", gpus: 1, from: hours(1000), to: hours(1002)})
	eff, err = f.check(t, charge(web, h100, "", 1, hours(0), hours(1)))
	require.NoError(t, err)
	require.InDelta(t, 9.0, eff.GetUses()[0].GetGpuHoursUsed(), 1e-9)
	eff, err = f.check(t, charge(web, h100, "", 1, hours(0), hours(1.5)))
	requireExceeded(t, eff, err, "project/"+web)
}

func TestExcludeReservation(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.set(t, "", "", "", 4, 16)
	f.reserve(t, res{id: "r1", project: web, pool: h100, state: "active", gpus: 4, from: hours(0), to: hours(2)})

	// Extending r1 to 4 h re-charges all of it: 4 GPUs, 16 GPU-hours.
	ext := charge(web, h100, "", 4, hours(0), hours(4))
	_, err := f.check(t, ext)
	require.Error(t, err, "without the exclusion r1 counts twice")
	ext.ExcludeReservationID = "r1"
	eff, err := f.check(t, ext)
	require.NoError(t, err)
	require.Equal(t, int32(0), eff.GetUses()[0].GetGpusUsed())
	require.Zero(t, eff.GetUses()[0].GetGpuHoursUsed())
	require.InDelta(t, 16.0, eff.GetUses()[0].GetGpuHoursRequested(), 1e-9)

	// Only r1 is left out.
	f.reserve(t, res{id: "r2", project: web, pool: h100, state: "pending", gpus: 1, from: hours(3), to: hours(4)})
	eff, err = f.check(t, ext)
	requireExceeded(t, eff, err, "tenant")
	require.Equal(t, int32(1), eff.GetUses()[0].GetGpusUsed())
}

func TestEffectNeverFails(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.set(t, web, "", "", 1, -1)
	eff := f.effect(t, charge(web, h100, "", 2, hours(0), hours(1)))
	require.True(t, eff.GetExceeded())
	require.True(t, eff.GetUses()[0].GetExceeded())
}

func TestUpsertReplaces(t *testing.T) {
	t.Parallel()
	f := setup(t)
	first := f.set(t, web, "H100", "", 4, -1)
	second := f.set(t, web, "H100", "", 8, 100)
	require.Equal(t, first.ID, second.ID, "one row per scope")
	require.NoError(t, f.db.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		got, err := quota.Get(ctx, tx, tenant, first.ID)
		require.NoError(t, err)
		require.Equal(t, 8, got.GPUs)
		require.InDelta(t, 100.0, got.GPUHours, 1e-12)
		all, err := quota.List(ctx, tx, &quota.ListParams{TenantID: tenant, Limit: 10})
		require.NoError(t, err)
		require.Len(t, all, 1)
		return nil
	}))
}

// TestConcurrentLastGPU races bookings for the last GPU under a quota: the
// quota row lock (PostgreSQL) or the single writer (SQLite) lets exactly
// one commit.
func TestConcurrentLastGPU(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.set(t, web, "", "", 4, -1)
	f.reserve(t, res{id: "r0", project: web, pool: h100, state: "active", gpus: 3, from: hours(0), to: hours(10)})

	const n = 12
	var wg sync.WaitGroup
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			c := charge(web, h100, "", 1, hours(1), hours(2))
			errs[i] = f.db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
				if _, err := checkLocked(ctx, tx, c); err != nil {
					return err
				}
				// Widen the race window between the check and the insert.
				time.Sleep(5 * time.Millisecond)
				return insertReservation(ctx, tx, res{id: fmt.Sprintf("c%02d", i), project: web, pool: h100, state: "pending",
					gpus: 1, from: c.Start, to: c.End})
			})
		}()
	}
	close(start)
	wg.Wait()

	won := 0
	for i, err := range errs {
		if err == nil {
			won++
			continue
		}
		var apiErr *envelope.Error
		require.True(t, errors.As(err, &apiErr), "goroutine %d: %v", i, err)
		require.Equal(t, envelope.CodeQuotaExceeded, apiErr.Code, "goroutine %d: %v", i, err)
	}
	require.Equal(t, 1, won)

	eff := f.effect(t, charge(web, h100, "", 0, hours(1), hours(2)))
	require.Equal(t, int32(4), eff.GetUses()[0].GetGpusUsed())
}
