package budget_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/capacity/budget"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/capacity/quota"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

// t0 is inside December 2026, whose month period is [Dec 1, Jan 1).
var t0 = time.Date(2026, 12, 10, 12, 0, 0, 0, time.UTC)

func hours(n float64) time.Time { return t0.Add(time.Duration(n * float64(time.Hour))) }

const (
	tenant = "tnt_acme"
	h100   = "pool_h100"
	free   = "pool_free"
	star   = "pool_star"
)

// fixture is a database with every module's tables, a pool whose H100
// GPU-hour costs 1.00 and a pool without prices.
type fixture struct {
	db *store.DB
}

func setup(t *testing.T) *fixture {
	t.Helper()
	db := bctest.NewDB(t, bctest.NewSimClock(t0))
	require.NoError(t, db.Migrate(context.Background(), app.Modules()...))
	require.NoError(t, db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		for id, policy := range map[string]string{
			h100: `{"prices": {"gpu_hour": {"H100": "1"}, "vcpu_hour": "0.01"}}`,
			free: `{}`,
			star: `{"prices": {"gpu_hour": {"*": "2", "A100": "1"}}}`,
		} {
			if err := pool.Insert(ctx, tx, &pool.Pool{ID: id, TenantID: "tnt_owner", Name: id, Policy: policy, CreatedBy: "test",
				CreateTime: t0, UpdateTime: t0}); err != nil {
				return err
			}
		}
		return nil
	}))
	return &fixture{db: db}
}

// reserve inserts a reservation with plain SQL: the check reads the table,
// it never writes it.
func reserve(ctx context.Context, tx store.Tx, id, poolID, state string, gpus int, from, to time.Time) error {
	_, err := tx.Exec(ctx, `INSERT INTO reservations (id, tenant_id, project_id, pool_id, state, gpus, model, gpu_model,
		binding, starts_at, ends_at, created_by, create_time, update_time)
		VALUES ($1, $2, 'prj_web', $3, $4, $5, '', 'H100', 'none', $6, $7, 'test', $8, $8)`,
		id, tenant, poolID, state, gpus, from, to, t0)
	return err
}

func (f *fixture) reserve(t *testing.T, id, poolID, state string, gpus int, from, to time.Time) {
	t.Helper()
	require.NoError(t, f.db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return reserve(ctx, tx, id, poolID, state, gpus, from, to)
	}))
}

func (f *fixture) set(t *testing.T, period, enforcement string, amount budget.Micros) budget.Budget {
	t.Helper()
	b := budget.Budget{ID: envelope.NewID(budget.IDPrefix, t0), TenantID: tenant, Period: period, Amount: amount, Enforcement: enforcement,
		Thresholds: budget.DefaultThresholds, CreatedBy: "test", CreateTime: t0, UpdateTime: t0}
	require.NoError(t, f.db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error { return budget.Upsert(ctx, tx, &b) }))
	return b
}

func charge(poolID string, gpus int, from, to time.Time) quota.Charge {
	return quota.Charge{TenantID: tenant, ProjectID: "prj_web", PoolID: poolID, Model: "H100", GPUs: gpus, Start: from, End: to}
}

// checkLocked is what the placer's Batch.CheckQuota does for a batch of one:
// lock the tenant's budget, price the charge, check it.
func checkLocked(ctx context.Context, tx store.Tx, c quota.Charge) ([]envelope.Event, error) {
	bs, err := budget.LockTenants(ctx, tx, []string{c.TenantID})
	if err != nil {
		return nil, err
	}
	b, ok := bs[c.TenantID]
	if !ok {
		return nil, nil
	}
	var pb budget.PriceBook
	cost, err := budget.CostOf(ctx, tx, &pb, c)
	if err != nil {
		return nil, err
	}
	return budget.Check(ctx, tx, b, cost, nil, &pb, t0)
}

func (f *fixture) check(t *testing.T, c quota.Charge) ([]envelope.Event, error) {
	t.Helper()
	var evs []envelope.Event
	err := f.db.Write(context.Background(), func(ctx context.Context, tx store.Tx) (err error) {
		evs, err = checkLocked(ctx, tx, c)
		return err
	})
	return evs, err
}

func percents(evs []envelope.Event) []int {
	var out []int
	for _, ev := range evs {
		out = append(out, ev.Data["percent"].(int))
	}
	return out
}

func requireLimit(t *testing.T, err error, parts ...string) {
	t.Helper()
	var apiErr *envelope.Error
	require.True(t, errors.As(err, &apiErr), "%T: %v", err, err)
	require.Equal(t, envelope.CodeSpendLimitReached, apiErr.Code)
	for _, p := range parts {
		require.Contains(t, apiErr.Message, p)
	}
	require.Equal(t, "SPEND_LIMIT_REACHED", envelope.DetailOf(envelope.ToConnect(err)).GetCode())
}

func TestNoBudgetNoCheck(t *testing.T) {
	t.Parallel()
	f := setup(t)
	evs, err := f.check(t, charge(h100, 1000, hours(0), hours(100)))
	require.NoError(t, err)
	require.Empty(t, evs)
}

func TestHardLimit(t *testing.T) {
	t.Parallel()
	f := setup(t)
	b := f.set(t, budget.PeriodMonth, budget.Hard, 100_000_000)
	f.reserve(t, "r1", h100, "active", 8, hours(0), hours(5))    // 40.00
	f.reserve(t, "r2", h100, "released", 2, hours(0), hours(5))  // 10.00: released hours stay committed
	f.reserve(t, "r3", h100, "canceled", 8, hours(0), hours(50)) // nothing
	f.reserve(t, "r4", free, "active", 8, hours(0), hours(50))   // a free pool: nothing
	// November and January are other periods.
	f.reserve(t, "r5", h100, "expired", 8, time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC), time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))

	// 50.00 committed: 60.00 more passes the budget, with the amounts said.
	_, err := f.check(t, charge(h100, 4, hours(10), hours(25)))
	requireLimit(t, err, "allows 100.00 per month", "50.00 is committed", "costs 60.00 more", "4.00 an hour", "10.00 over")

	// 50.00 exactly reaches it: 50, 80 and 100 % are reached, once.
	evs, err := f.check(t, charge(h100, 5, hours(10), hours(20)))
	require.NoError(t, err)
	require.Equal(t, []int{50, 80, 100}, percents(evs))
	require.Equal(t, "budget.threshold", evs[1].Type)
	require.Equal(t, b.ID, evs[1].ResourceID)
	require.Equal(t, "100.00", evs[1].Data["committed"])
	require.Equal(t, "2026-12-01T00:00:00Z", evs[1].Data["period_start"])
	evs, err = f.check(t, charge(h100, 5, hours(10), hours(20)))
	require.NoError(t, err)
	require.Empty(t, evs, "a threshold goes out once a period")
	f.reserve(t, "r6", h100, "placed", 5, hours(10), hours(20))

	// A free pool and a CPU-only booking of no price are never refused.
	_, err = f.check(t, charge(free, 8, hours(0), hours(100)))
	require.NoError(t, err)

	// What falls in January is January's (December is spent).
	_, err = f.check(t, charge(h100, 8, time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 10, 0, 0, 0, time.UTC)))
	require.NoError(t, err)
	// A window across the boundary is refused for its December part.
	_, err = f.check(t, charge(h100, 1, time.Date(2026, 12, 31, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 2, 0, 0, 0, time.UTC)))
	requireLimit(t, err, "in the month from 2026-12-01", "costs 24.00 more")
}

func TestExtensionCostsItsWholeWindowOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.set(t, budget.PeriodMonth, budget.Hard, 100_000_000)
	f.reserve(t, "r1", h100, "active", 8, hours(0), hours(10)) // 80.00
	// Extended to 12 h: 96.00 in all, its own 80.00 not counted twice.
	c := charge(h100, 8, hours(0), hours(12))
	c.ExcludeReservationID = "r1"
	evs, err := f.check(t, c)
	require.NoError(t, err)
	require.Equal(t, []int{50, 80}, percents(evs))
	c.End = hours(13)
	_, err = f.check(t, c)
	requireLimit(t, err, "0.00 is committed", "costs 104.00 more")
}

func TestSoftBudgetAlertsOnly(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.set(t, budget.PeriodDay, budget.Soft, 10_000_000)
	evs, err := f.check(t, charge(h100, 1, hours(0), hours(6)))
	require.NoError(t, err)
	require.Equal(t, []int{50}, percents(evs))
	f.reserve(t, "r1", h100, "active", 1, hours(0), hours(6))
	evs, err = f.check(t, charge(h100, 8, hours(0), hours(2)))
	require.NoError(t, err, "a soft budget never refuses")
	require.Equal(t, []int{80, 100}, percents(evs))
}

func TestSpent(t *testing.T) {
	t.Parallel()
	f := setup(t)
	spent := func() bool {
		var s bool
		require.NoError(t, f.db.Read(context.Background(), func(ctx context.Context, tx store.Tx) (err error) {
			s, err = budget.Spent(ctx, tx, tenant, t0)
			return err
		}))
		return s
	}
	require.False(t, spent(), "no budget")
	b := f.set(t, budget.PeriodMonth, budget.Hard, 10_000_000)
	f.reserve(t, "r1", h100, "active", 1, hours(0), hours(9))
	require.False(t, spent())
	f.reserve(t, "r2", h100, "active", 1, hours(0), hours(1))
	require.True(t, spent())
	b.Enforcement = budget.Soft
	require.NoError(t, f.db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error { return budget.Upsert(ctx, tx, &b) }))
	require.False(t, spent(), "a soft budget never stops anything")
}

// TestConcurrentLastBudget: bookings racing for a budget's last amount take
// turns on the budget row; exactly as many win as it holds.
func TestConcurrentLastBudget(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.set(t, budget.PeriodMonth, budget.Hard, 100_000_000)
	f.reserve(t, "r0", h100, "active", 8, hours(0), hours(11)) // 88.00: one more 10.00 fits

	const n = 12
	var wg sync.WaitGroup
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			c := charge(h100, 1, hours(20), hours(30))
			errs[i] = f.db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
				if _, err := checkLocked(ctx, tx, c); err != nil {
					return err
				}
				// Widen the race window between the check and the insert.
				time.Sleep(5 * time.Millisecond)
				return reserve(ctx, tx, fmt.Sprintf("c%02d", i), h100, "pending", 1, c.Start, c.End)
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
		require.Equal(t, envelope.CodeSpendLimitReached, apiErr.Code, "goroutine %d: %v", i, err)
	}
	require.Equal(t, 1, won)
}

// TestPrecheck: the check before placement refuses only what passes a hard
// budget at the cheapest model the request could land on.
func TestPrecheck(t *testing.T) {
	t.Parallel()
	f := setup(t)
	pre := func(c quota.Charge) error {
		return f.db.Read(context.Background(), func(ctx context.Context, tx store.Tx) error { return budget.Precheck(ctx, tx, c) })
	}
	require.NoError(t, pre(charge(h100, 8, hours(0), hours(100))), "no budget")
	b := f.set(t, budget.PeriodMonth, budget.Hard, 100_000_000)
	f.reserve(t, "r1", h100, "active", 8, hours(0), hours(10)) // 80.00

	requireLimit(t, pre(charge(h100, 1, hours(0), hours(21))), "costs 21.00 more")
	require.NoError(t, pre(charge(h100, 1, hours(0), hours(20))))
	anyModel := charge(h100, 1, hours(0), hours(21))
	anyModel.Model = ""
	require.NoError(t, pre(anyModel), "a model the pool does not price is free: placement decides")
	anyModel.PoolID = star
	requireLimit(t, pre(anyModel), "costs 21.00 more", "1.00 an hour")
	anyModel.End = hours(11)
	require.NoError(t, pre(anyModel), "11.00 at the cheapest model fits; the commit check prices the one placed on")

	b.Enforcement = budget.Soft
	require.NoError(t, f.db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error { return budget.Upsert(ctx, tx, &b) }))
	require.NoError(t, pre(charge(h100, 8, hours(0), hours(100))), "a soft budget refuses nothing")
	var n int
	require.NoError(t, f.db.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM budget_thresholds`).Scan(&n)
	}))
	require.Zero(t, n, "a precheck records nothing")
}

// TestRearm: setting a budget again forgets the thresholds its periods
// reached, so they go out again, of the new amount.
func TestRearm(t *testing.T) {
	t.Parallel()
	f := setup(t)
	b := f.set(t, budget.PeriodMonth, budget.Soft, 100_000_000)
	evs, err := f.check(t, charge(h100, 6, hours(0), hours(10)))
	require.NoError(t, err)
	require.Equal(t, []int{50}, percents(evs))
	evs, err = f.check(t, charge(h100, 6, hours(0), hours(10)))
	require.NoError(t, err)
	require.Empty(t, evs)
	require.NoError(t, f.db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error { return budget.Rearm(ctx, tx, b.ID) }))
	evs, err = f.check(t, charge(h100, 6, hours(0), hours(10)))
	require.NoError(t, err)
	require.Equal(t, []int{50}, percents(evs))
}
