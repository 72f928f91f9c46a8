package booking_test

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
	"github.com/better-compute/better-compute/internal/capacity/booking"
	"github.com/better-compute/better-compute/internal/store"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func hours(n int) time.Time { return t0.Add(time.Duration(n) * time.Hour) }

func newDB(t *testing.T) *store.DB {
	t.Helper()
	db := bctest.NewDB(t, bctest.NewSimClock(t0))
	require.NoError(t, db.Migrate(context.Background(), booking.Migrations()))
	return db
}

func bk(id, res, atom string, from, to time.Time) booking.Booking {
	return booking.Booking{ID: id, ReservationID: res, Atom: atom, StartsAt: from, EndsAt: to, CreateTime: t0}
}

func insert(t *testing.T, db *store.DB, bs ...booking.Booking) error {
	t.Helper()
	return db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return booking.BookingInsert(ctx, tx, bs)
	})
}

func of(t *testing.T, db *store.DB, res string) []booking.Booking {
	t.Helper()
	var out []booking.Booking
	require.NoError(t, db.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		var err error
		out, err = booking.BookingsOf(ctx, tx, res)
		return err
	}))
	return out
}

func requireOverlap(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	require.ErrorIs(t, err, booking.ErrOverlap)
	require.ErrorIs(t, err, store.ErrConstraint)
	// Both dialects name the refusal: the exclusion constraint on
	// PostgreSQL, the triggers' RAISE message on SQLite (which goes on to
	// name the atom).
	c := store.ConstraintOf(err)
	require.True(t, c == booking.OverlapConstraint || c == booking.CPUOverlapConstraint ||
		strings.HasPrefix(c, booking.OverlapConstraint+": ") || strings.HasPrefix(c, booking.CPUOverlapConstraint+": "), "%v", err)
	var oe *booking.OverlapError
	require.ErrorAs(t, err, &oe)
	t.Log(err)
}

// requireOverlapOf checks that the refusal names what was taken: the atom,
// or the node of a CPU range.
func requireOverlapOf(t *testing.T, err error, atom, node string) {
	t.Helper()
	requireOverlap(t, err)
	var oe *booking.OverlapError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, atom, oe.Atom, "%v", err)
	require.Equal(t, node, oe.NodeID, "%v", err)
}

const gpu = "GPU-5a1c7e0e-0000-4000-8000-000000000001"

func TestOverlapRefusedOnInsert(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	require.NoError(t, insert(t, db, bk("b1", "r1", gpu, hours(0), hours(4))))

	for _, r := range [][2]time.Time{
		{hours(0), hours(4)},                        // same range
		{hours(3), hours(5)},                        // overlaps the tail
		{hours(-1), hours(1)},                       // overlaps the head
		{hours(1), hours(2)},                        // inside
		{hours(-1), hours(5)},                       // covers
		{hours(4).Add(-time.Microsecond), hours(6)}, // one microsecond
	} {
		requireOverlap(t, insert(t, db, bk("b2", "r2", gpu, r[0], r[1])))
	}
	require.Empty(t, of(t, db, "r2"))
}

func TestAdjacentRangesAllowed(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	require.NoError(t, insert(t, db, bk("b1", "r1", gpu, hours(0), hours(2))))
	require.NoError(t, insert(t, db, bk("b2", "r2", gpu, hours(2), hours(4))))
	require.NoError(t, insert(t, db, bk("b3", "r3", gpu, hours(-2), hours(0))))
	require.Len(t, of(t, db, "r2"), 1)
}

func TestDifferentAtomsIndependent(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	atoms := []string{gpu, gpu + "/mig/1g.10gb/0", gpu + "/mig/1g.10gb/1", gpu + "/s3", "node-7/cpu/17"}
	for i, a := range atoms {
		require.NoError(t, insert(t, db, bk(fmt.Sprintf("b%d", i), fmt.Sprintf("r%d", i), a, hours(0), hours(4))))
	}
	var active []booking.Booking
	require.NoError(t, db.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		var err error
		active, err = booking.BookingsActiveAt(ctx, tx, atoms, hours(1))
		return err
	}))
	require.Len(t, active, len(atoms))
	require.NoError(t, db.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		var err error
		active, err = booking.BookingsActiveAt(ctx, tx, atoms, hours(4)) // ends_at is exclusive
		return err
	}))
	require.Empty(t, active)
}

func TestSetWithOneConflictInsertsNothing(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	require.NoError(t, insert(t, db, bk("held", "r0", gpu+"/mig/1g.10gb/2", hours(0), hours(4))))
	set := []booking.Booking{
		bk("s0", "r1", gpu+"/mig/1g.10gb/0", hours(1), hours(3)),
		bk("s1", "r1", gpu+"/mig/1g.10gb/1", hours(1), hours(3)),
		bk("s2", "r1", gpu+"/mig/1g.10gb/2", hours(1), hours(3)), // conflicts
		bk("s3", "r1", gpu+"/mig/1g.10gb/3", hours(1), hours(3)),
	}
	requireOverlap(t, insert(t, db, set...))
	require.Empty(t, of(t, db, "r1"))

	// Two bookings of one set that overlap each other are refused too.
	requireOverlap(t, insert(t, db,
		bk("x0", "r2", "node-1/cpu/0", hours(0), hours(2)),
		bk("x1", "r2", "node-1/cpu/0", hours(1), hours(3))))
	require.Empty(t, of(t, db, "r2"))
}

func TestEmptyRangeIsNotAnOverlap(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	err := insert(t, db, bk("b1", "r1", gpu, hours(2), hours(2)))
	require.ErrorIs(t, err, store.ErrConstraint)
	require.NotErrorIs(t, err, booking.ErrOverlap)
}

func TestExtend(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	ctx := context.Background()
	require.NoError(t, insert(t, db,
		bk("a1", "r1", gpu, hours(0), hours(2)),
		bk("a2", "r1", gpu+"/s0", hours(0), hours(2))))
	require.NoError(t, insert(t, db, bk("b1", "r2", gpu, hours(5), hours(8))))

	// Up to the next booking: adjacent, allowed.
	require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return booking.BookingsExtend(ctx, tx, "r1", hours(5))
	}))
	for _, b := range of(t, db, "r1") {
		require.True(t, b.EndsAt.Equal(hours(5)), "%s ends %s", b.ID, b.EndsAt)
	}

	// Past it: the constraint refuses, and the transaction rolls back whole.
	err := db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return booking.BookingsExtend(ctx, tx, "r1", hours(6))
	})
	requireOverlap(t, err)
	for _, b := range of(t, db, "r1") {
		require.True(t, b.EndsAt.Equal(hours(5)), "%s ends %s", b.ID, b.EndsAt)
	}

	err = db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return booking.BookingsExtend(ctx, tx, "nope", hours(6))
	})
	require.ErrorIs(t, err, store.ErrNotFound)
}

func release(t *testing.T, db *store.DB, res string, at time.Time) int64 {
	t.Helper()
	var n int64
	require.NoError(t, db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		var err error
		n, err = booking.BookingsRelease(ctx, tx, res, at)
		return err
	}))
	return n
}

func TestReleaseThenRebookTail(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	require.NoError(t, insert(t, db,
		bk("a1", "r1", gpu, hours(0), hours(8)),
		bk("a2", "r1", gpu+"/s1", hours(0), hours(1)),   // already over at release
		bk("a3", "r1", gpu+"/s2", hours(10), hours(12)), // not yet started
	))
	requireOverlap(t, insert(t, db, bk("b1", "r2", gpu, hours(3), hours(8))))

	require.EqualValues(t, 2, release(t, db, "r1", hours(3)))
	got := of(t, db, "r1")
	require.Len(t, got, 3)
	ends := map[string]time.Time{}
	for _, b := range got {
		ends[b.ID] = b.EndsAt
	}
	require.True(t, ends["a1"].Equal(hours(3)), "a1 ends %s", ends["a1"])
	require.True(t, ends["a2"].Equal(hours(1)), "a2 ends %s", ends["a2"])
	require.True(t, ends["a3"].Equal(hours(10).Add(time.Microsecond)), "a3 ends %s", ends["a3"])

	// The tail is free again.
	require.NoError(t, insert(t, db, bk("b1", "r2", gpu, hours(3), hours(8))))
	require.NoError(t, insert(t, db, bk("b2", "r2", gpu+"/s2", hours(10).Add(time.Microsecond), hours(12))))
}

func TestReleaseIdempotent(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	require.NoError(t, insert(t, db,
		bk("a1", "r1", gpu, hours(0), hours(8)),
		bk("a2", "r1", gpu+"/s2", hours(10), hours(12))))
	require.EqualValues(t, 2, release(t, db, "r1", hours(3)))
	first := of(t, db, "r1")
	require.EqualValues(t, 0, release(t, db, "r1", hours(3)))
	// A later release does not lengthen what an earlier one ended.
	require.EqualValues(t, 0, release(t, db, "r1", hours(5)))
	require.Equal(t, first, of(t, db, "r1"))
	require.EqualValues(t, 0, release(t, db, "nope", hours(3)))
}

func TestConcurrentBookingsOneWins(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	const n = 16
	atom := gpu + "/mig/3g.40gb/0"
	var wg sync.WaitGroup
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			b := bk(fmt.Sprintf("c%02d", i), fmt.Sprintf("r%02d", i), atom,
				hours(0).Add(time.Duration(i)*time.Minute), hours(2).Add(time.Duration(i)*time.Minute))
			errs[i] = db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
				return booking.BookingInsert(ctx, tx, []booking.Booking{b})
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
		require.Truef(t, errors.Is(err, booking.ErrOverlap), "goroutine %d: %v", i, err)
	}
	require.Equal(t, 1, won)

	var active []booking.Booking
	require.NoError(t, db.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		var err error
		active, err = booking.BookingsActiveAt(ctx, tx, []string{atom}, hours(1))
		return err
	}))
	require.Len(t, active, 1)
}
