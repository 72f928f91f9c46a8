package views_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/capacity/views"
	"github.com/better-compute/better-compute/internal/store"
)

// scenario builds two tenants' pools, nodes, atoms, reservations and
// bookings, with deltas that add up to the truth, inserted in pieces as the
// reservation engine would.
func scenario(t *testing.T) (*store.DB, *world) {
	t.Helper()
	db, w := newDB(t)
	w.pool("tnt_a", "pool_1", "h100")
	w.pool("tnt_a", "pool_2", "shared")
	w.pool("tnt_b", "pool_3", "other")
	w.node("n1", "tnt_a", "pool_1")
	w.node("n2", "tnt_a", "pool_2")
	w.node("n3", "tnt_a", "") // claimed by two pools: in none
	w.node("n4", "tnt_b", "pool_3")
	for _, id := range []string{"g1", "g2", "g3"} {
		w.atom(id, "n1", views.KindGPU, "H100")
	}
	w.atom("g4", "n1", views.KindGPU, "H100", quarantined)
	w.atom("m1", "n1", views.KindMIG, "H100", partitionPending)
	w.atom("c1", "n1", "cpu", "")
	for _, id := range []string{"s1", "s2", "s3"} {
		w.atom(id, "n2", views.KindSlot, "A100")
	}
	w.atom("x1", "n3", views.KindGPU, "H100")
	w.atom("o1", "n4", views.KindGPU, "L40S")
	w.atom("o2", "n4", views.KindGPU, "L40S")

	w.reservation("r1", "tnt_a", "pool_1", "placed", 2)
	w.book("r1", "g1", hours(0), hours(4))
	w.book("r1", "g2", hours(0), hours(4))
	w.reservation("r2", "tnt_a", "pool_1", "active", 1)
	w.book("r2", "g3", hours(0), hours(2))
	w.book("r2", "g3", hours(2), hours(4)) // extended: one atom, counted once
	w.book("r2", "c1", hours(0), hours(4)) // CPUs have no rollup
	w.reservation("r3", "tnt_a", "pool_1", "released", 1)
	w.book("r3", "g1", hours(5), hours(6))
	w.reservation("r4", "tnt_a", "pool_1", "pending", 1)
	w.reservation("r5", "tnt_a", "pool_1", "pending", 1)
	w.reservation("r6", "tnt_a", "pool_2", "binding", 1)
	w.book("r6", "s1", hours(0), hours(1))
	w.reservation("r7", "tnt_b", "pool_3", "canceled", 1)
	w.book("r7", "o1", hours(0), hours(1))

	w.delta("pool_1", "H100", "gpu", 4, 0, 0)
	w.delta("pool_1", "H100", "gpu", 0, 0, 1)
	w.delta("pool_1", "H100", "gpu", 0, 2, 0)
	w.delta("pool_1", "H100", "gpu", 0, 1, 0)
	w.delta("pool_1", "H100", "gpu", 0, 1, 0)  // r3 placed …
	w.delta("pool_1", "H100", "gpu", 0, -1, 0) // … and released
	w.delta("pool_1", "H100", "mig", 1, 0, 1)
	w.delta("pool_2", "A100", "slot", 3, 0, 0)
	w.delta("pool_2", "A100", "slot", 0, 1, 0)
	w.delta("pool_3", "L40S", "gpu", 2, 1, 0)
	w.delta("pool_3", "L40S", "gpu", 0, -1, 0)
	w.delta("pool_9", "X", "gpu", 1, 0, 0) // a pool that came and went
	w.delta("pool_9", "X", "gpu", -1, 0, 0)
	return db, w
}

var truth = map[views.Key]views.Counts{
	{PoolID: "pool_1", Model: "H100", Kind: "gpu"}:  {Total: 4, Booked: 3, Quarantined: 1},
	{PoolID: "pool_1", Model: "H100", Kind: "mig"}:  {Total: 1, Quarantined: 1},
	{PoolID: "pool_2", Model: "A100", Kind: "slot"}: {Total: 3, Booked: 1},
	{PoolID: "pool_3", Model: "L40S", Kind: "gpu"}:  {Total: 2},
}

func read[T any](t *testing.T, db *store.DB, fn func(ctx context.Context, q store.Querier) (T, error)) T {
	t.Helper()
	var out T
	require.NoError(t, db.Read(context.Background(), func(ctx context.Context, tx store.Tx) (err error) {
		out, err = fn(ctx, tx)
		return err
	}))
	return out
}

func check(t *testing.T, db *store.DB) []string {
	t.Helper()
	return read(t, db, views.Check)
}

func stored(t *testing.T, db *store.DB, tenantID string) map[views.Key]views.Counts {
	t.Helper()
	rows := read(t, db, func(ctx context.Context, q store.Querier) ([]views.Row, error) { return views.Stored(ctx, q, tenantID) })
	out := map[views.Key]views.Counts{}
	for _, r := range rows {
		out[r.Key] = r.Counts
	}
	return out
}

func TestRecomputeAndCheck(t *testing.T) {
	t.Parallel()
	db, _ := scenario(t)
	require.Equal(t, truth, read(t, db, views.Recompute))
	require.Empty(t, check(t, db))
	require.Equal(t, truth, stored(t, db, ""))
}

func TestStoredByTenant(t *testing.T) {
	t.Parallel()
	db, _ := scenario(t)
	rows := read(t, db, func(ctx context.Context, q store.Querier) ([]views.Row, error) { return views.Stored(ctx, q, "tnt_a") })
	require.Len(t, rows, 3)
	// Ordered by pool name, then model and kind.
	require.Equal(t, []string{"h100/H100/gpu", "h100/H100/mig", "shared/A100/slot"},
		[]string{rows[0].PoolName + "/" + rows[0].Model + "/" + rows[0].Kind, rows[1].PoolName + "/" + rows[1].Model + "/" + rows[1].Kind,
			rows[2].PoolName + "/" + rows[2].Model + "/" + rows[2].Kind})
	require.Equal(t, "tnt_a", rows[0].TenantID)
	require.Equal(t, 0, rows[0].Free(), "4 total - 3 booked - 1 quarantined")
	require.Equal(t, 0, rows[1].Free())
	require.Equal(t, 2, rows[2].Free())

	require.Len(t, stored(t, db, "tnt_b"), 1)
	require.Empty(t, stored(t, db, "tnt_nobody"))

	pending := read(t, db, func(ctx context.Context, q store.Querier) (map[string]views.PendingCount, error) {
		return views.Pending(ctx, q, "tnt_a")
	})
	require.Equal(t, map[string]views.PendingCount{"pool_1": {PoolID: "pool_1", PoolName: "h100", TenantID: "tnt_a", Count: 2}}, pending)
	pending = read(t, db, func(ctx context.Context, q store.Querier) (map[string]views.PendingCount, error) {
		return views.Pending(ctx, q, "tnt_b")
	})
	require.Empty(t, pending)
}

func TestCheckFindsMismatchRebuildFixesIt(t *testing.T) {
	t.Parallel()
	db, w := scenario(t)
	w.delta("pool_1", "H100", "gpu", 0, 1, 0)     // a booking counted twice
	w.delta("pool_ghost", "H100", "gpu", 2, 0, 0) // a pool with no atoms
	w.delta("pool_2", "A100", "slot", 0, -1, 0)   // a release counted, the booking still live
	want := []string{
		"pool_1/H100/gpu: stored total=4 booked=4 quarantined=1, recomputed total=4 booked=3 quarantined=1",
		"pool_2/A100/slot: stored total=3 booked=0 quarantined=0, recomputed total=3 booked=1 quarantined=0",
		"pool_ghost/H100/gpu: stored total=2 booked=0 quarantined=0, recomputed total=0 booked=0 quarantined=0",
	}
	require.Equal(t, want, check(t, db))

	var (
		mismatches []string
		rows       int
	)
	require.NoError(t, db.Write(context.Background(), func(ctx context.Context, tx store.Tx) (err error) {
		mismatches, rows, err = views.Rebuild(ctx, tx)
		return err
	}))
	require.Equal(t, want, mismatches)
	require.Equal(t, len(truth), rows)
	require.Empty(t, check(t, db))
	require.Equal(t, truth, stored(t, db, ""))
	require.Equal(t, len(truth), w.deltaRows(), "one row per key")

	// Rebuilding a correct rollup reports nothing and changes nothing.
	require.NoError(t, db.Write(context.Background(), func(ctx context.Context, tx store.Tx) (err error) {
		mismatches, rows, err = views.Rebuild(ctx, tx)
		return err
	}))
	require.Empty(t, mismatches)
	require.Equal(t, truth, stored(t, db, ""))
}

func TestRebuildRollsBackWithItsTransaction(t *testing.T) {
	t.Parallel()
	db, w := scenario(t)
	w.delta("pool_ghost", "H100", "gpu", 2, 0, 0)
	before := w.deltaRows()
	err := db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		_, _, err := views.Rebuild(ctx, tx)
		require.NoError(t, err)
		return context.Canceled // the caller fails after Rebuild
	})
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, before, w.deltaRows())
	require.Len(t, check(t, db), 1)
}

func compact(t *testing.T, db *store.DB) {
	t.Helper()
	require.NoError(t, db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error { return views.Compact(ctx, tx) }))
}

func TestCompactKeepsSums(t *testing.T) {
	t.Parallel()
	db, w := scenario(t)
	before := stored(t, db, "")
	require.Equal(t, 13, w.deltaRows())
	compact(t, db)
	require.Equal(t, before, stored(t, db, ""))
	require.Equal(t, len(truth), w.deltaRows(), "one row per key; the key that sums to zero is gone")
	require.Empty(t, check(t, db))

	// Compacting a compacted rollup changes nothing.
	compact(t, db)
	require.Equal(t, len(truth), w.deltaRows())

	// Deltas after a compaction add to the folded rows, and fold in turn.
	w.delta("pool_1", "H100", "gpu", 1, 0, 0)
	w.delta("pool_1", "H100", "gpu", 0, 0, -1)
	w.delta("pool_new", "B200", "gpu", 8, 0, 0)
	want := stored(t, db, "")
	require.Equal(t, views.Counts{Total: 5, Booked: 3}, want[views.Key{PoolID: "pool_1", Model: "H100", Kind: "gpu"}])
	compact(t, db)
	require.Equal(t, want, stored(t, db, ""))
	require.Equal(t, len(truth)+1, w.deltaRows())

	// An empty table compacts to nothing.
	db2, w2 := newDB(t)
	compact(t, db2)
	require.Equal(t, 0, w2.deltaRows())
}

func TestTimeline(t *testing.T) {
	t.Parallel()
	db, w := scenario(t)
	w.reservation("r9", "tnt_a", "pool_1", "placed", 1)
	w.book("r9", "g4", hours(1), hours(2))
	w.book("r9", "m1", hours(0), hours(4)) // MIG: not a GPU-kind atom
	w.book("r6", "x1", hours(0), hours(4)) // another pool's reservation

	points := read(t, db, func(ctx context.Context, q store.Querier) ([]views.Point, error) {
		return views.Timeline(ctx, q, "pool_1", hours(-1), hours(5), time.Hour)
	})
	var booked []int
	for i, p := range points {
		require.Equal(t, hours(float64(i-1)), p.Time.UTC())
		require.Equal(t, 4, p.Total)
		booked = append(booked, p.Booked)
	}
	// r1 holds g1, g2 over [0,4h); r2 holds g3 over [0,2h) and [2h,4h);
	// r9 holds g4 over [1h,2h); r3 is released.
	require.Equal(t, []int{0, 3, 4, 3, 3, 0, 0}, booked)

	// Points fall on start + k*step; the end is included only on a step.
	points = read(t, db, func(ctx context.Context, q store.Querier) ([]views.Point, error) {
		return views.Timeline(ctx, q, "pool_1", hours(0.5), hours(2.2), 45*time.Minute)
	})
	require.Len(t, points, 3)
	require.Equal(t, hours(2), points[2].Time.UTC())
	require.Equal(t, []int{3, 4, 3}, []int{points[0].Booked, points[1].Booked, points[2].Booked})

	// A pool with no rollup and no bookings.
	points = read(t, db, func(ctx context.Context, q store.Querier) ([]views.Point, error) {
		return views.Timeline(ctx, q, "pool_none", hours(0), hours(0), time.Hour)
	})
	require.Equal(t, []views.Point{{Time: hours(0)}}, points)

	_, err := views.Timeline(context.Background(), nil, "pool_1", hours(1), hours(0), time.Hour)
	require.Error(t, err)
}

// Deltas inserted while compactions run are neither lost nor counted twice.
func TestCompactConcurrentWithInserts(t *testing.T) {
	t.Parallel()
	db, w := newDB(t)
	const writers, each = 4, 25
	done := make(chan error, writers)
	for i := range writers {
		go func() {
			var err error
			for j := 0; j < each && err == nil; j++ {
				err = db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
					_, err := tx.Exec(ctx, `INSERT INTO capacity_deltas (pool_id, model, kind, total, booked, quarantined)
						VALUES ($1, 'H100', 'gpu', 1, $2, 0)`, []string{"pool_a", "pool_b"}[i%2], j%2)
					return err
				})
			}
			done <- err
		}()
	}
	stop := make(chan struct{})
	compacted := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				compacted <- nil
				return
			default:
			}
			if err := db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error { return views.Compact(ctx, tx) }); err != nil {
				compacted <- err
				return
			}
		}
	}()
	for range writers {
		require.NoError(t, <-done)
	}
	close(stop)
	require.NoError(t, <-compacted)
	compact(t, db)
	half := writers / 2 * each
	require.Equal(t, map[views.Key]views.Counts{
		{PoolID: "pool_a", Model: "H100", Kind: "gpu"}: {Total: half, Booked: writers / 2 * (each / 2)},
		{PoolID: "pool_b", Model: "H100", Kind: "gpu"}: {Total: half, Booked: writers / 2 * (each / 2)},
	}, stored(t, db, ""), "pools without rows show too, nameless")
	require.Equal(t, 2, w.deltaRows())
}
