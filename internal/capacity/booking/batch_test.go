package booking_test

import (
	"context"
	"io/fs"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/capacity/booking"
	"github.com/better-compute/better-compute/internal/store"
)

func cr(res, node string, lo, hi int, from, to time.Time) booking.CPURange {
	return booking.CPURange{ReservationID: res, NodeID: node, Lo: lo, Hi: hi, StartsAt: from, EndsAt: to}
}

func insertBatch(t *testing.T, db *store.DB, atoms []booking.Booking, cpus []booking.CPURange) error {
	t.Helper()
	return db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return booking.Insert(ctx, tx, atoms, cpus)
	})
}

// count returns the rows of table (of one reservation when res is set).
func count(t *testing.T, db *store.DB, table, res string) int {
	t.Helper()
	var n int
	require.NoError(t, db.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM `+table+` WHERE $1 = '' OR reservation_id = $1`, res).Scan(&n)
	}))
	return n
}

type cpuRow struct {
	res, node  string
	lo, hi     int
	start, end time.Time
}

func cpuRows(t *testing.T, db *store.DB, table string) []cpuRow {
	t.Helper()
	var out []cpuRow
	require.NoError(t, db.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		rows, err := tx.Query(ctx, `SELECT reservation_id, node_id, cpu_lo, cpu_hi, starts_at, ends_at FROM `+table+`
			ORDER BY reservation_id, node_id, cpu_lo, starts_at`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var r cpuRow
			if err := rows.Scan(&r.res, &r.node, &r.lo, &r.hi, &r.start, &r.end); err != nil {
				return err
			}
			r.start, r.end = r.start.UTC(), r.end.UTC()
			out = append(out, r)
		}
		return rows.Err()
	}))
	return out
}

func TestCPURanges(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   []int
		want [][2]int
	}{
		{nil, nil},
		{[]int{3}, [][2]int{{3, 4}}},
		{[]int{0, 1, 2, 3}, [][2]int{{0, 4}}},
		{[]int{7, 1, 0, 6, 2, 9}, [][2]int{{0, 3}, {6, 8}, {9, 10}}},
		{[]int{4, 4, 5}, [][2]int{{4, 6}}},
	} {
		require.Equal(t, tt.want, booking.CPURanges(tt.in), "%v", tt.in)
	}
}

func TestCPURangeOverlap(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	require.NoError(t, insertBatch(t, db, nil, []booking.CPURange{cr("r1", "n1", 0, 4, hours(0), hours(4))}))

	// Adjacent CPUs, same time: allowed.
	require.NoError(t, insertBatch(t, db, nil, []booking.CPURange{cr("r2", "n1", 4, 8, hours(0), hours(4))}))
	// Same CPUs, adjacent and disjoint times: allowed.
	require.NoError(t, insertBatch(t, db, nil, []booking.CPURange{cr("r3", "n1", 0, 4, hours(4), hours(6))}))
	require.NoError(t, insertBatch(t, db, nil, []booking.CPURange{cr("r4", "n1", 0, 4, hours(-3), hours(-1))}))
	// Same CPUs and time on another node: allowed.
	require.NoError(t, insertBatch(t, db, nil, []booking.CPURange{cr("r5", "n2", 0, 8, hours(0), hours(4))}))

	for _, r := range []booking.CPURange{
		cr("x", "n1", 3, 5, hours(0), hours(4)),                        // straddles [0,4) and [4,8)
		cr("x", "n1", 0, 4, hours(3), hours(5)),                        // same CPUs, overlapping time
		cr("x", "n1", 7, 9, hours(1), hours(2)),                        // last CPU of [4,8)
		cr("x", "n1", 0, 1, hours(5), hours(5).Add(time.Microsecond)),  // inside r3
		cr("x", "n2", 2, 3, hours(-1), hours(0).Add(time.Microsecond)), // one microsecond of r5
	} {
		requireOverlapOf(t, insertBatch(t, db, nil, []booking.CPURange{r}), "", r.NodeID)
	}
	require.Zero(t, count(t, db, "cpu_bookings", "x"))
	require.Equal(t, 5, count(t, db, "cpu_bookings", ""))
}

func TestInsertBatch(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	// Many reservations in one call, a GPU and a CPU range each.
	var atoms []booking.Booking
	var cpus []booking.CPURange
	for i := range 100 {
		res := "r" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		atoms = append(atoms, bk("", res, gpu+"/s"+string(rune('a'+i%26))+string(rune('a'+i/26)), hours(0), hours(2)))
		cpus = append(cpus, cr(res, "n1", 2*i, 2*i+2, hours(0), hours(2)))
	}
	require.NoError(t, insertBatch(t, db, atoms, cpus))
	for _, b := range atoms {
		require.NotEmpty(t, b.ID, "Insert fills in ids")
	}
	require.Equal(t, 100, count(t, db, "bookings", ""))
	require.Equal(t, 100, count(t, db, "cpu_bookings", ""))

	// The old reads see a CPU range as its CPUs.
	got := of(t, db, "raa")
	require.Len(t, got, 3)
	require.Equal(t, "n1/cpu/0", got[1].Atom)
	require.Equal(t, "n1/cpu/1", got[2].Atom)
}

func TestInsertBatchRefusedWritesNothing(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	require.NoError(t, insertBatch(t, db, []booking.Booking{bk("", "r0", gpu, hours(0), hours(4))},
		[]booking.CPURange{cr("r0", "n1", 0, 4, hours(0), hours(4))}))

	ok := []booking.Booking{bk("", "r1", gpu+"/s0", hours(1), hours(3)), bk("", "r2", gpu+"/s1", hours(1), hours(3))}
	okCPU := []booking.CPURange{cr("r1", "n1", 4, 6, hours(1), hours(3)), cr("r2", "n2", 0, 2, hours(1), hours(3))}
	for name, tt := range map[string]struct {
		atoms      []booking.Booking
		cpus       []booking.CPURange
		atom, node string
	}{
		"a stored atom":           {append(ok, bk("", "r2", gpu, hours(2), hours(5))), okCPU, gpu, ""},
		"a stored cpu range":      {ok, append(okCPU, cr("r2", "n1", 3, 5, hours(2), hours(5))), "", "n1"},
		"two atoms of the batch":  {append(ok, bk("", "r3", gpu+"/s0", hours(2), hours(4))), okCPU, gpu + "/s0", ""},
		"two ranges of the batch": {ok, append(okCPU, cr("r3", "n2", 1, 3, hours(2), hours(4))), "", "n2"},
	} {
		err := insertBatch(t, db, tt.atoms, tt.cpus)
		requireOverlapOf(t, err, tt.atom, tt.node)
		for _, res := range []string{"r1", "r2", "r3"} {
			require.Zero(t, count(t, db, "bookings", res), name)
			require.Zero(t, count(t, db, "cpu_bookings", res), name)
		}
	}
}

func TestInsertBadInput(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	good := []booking.Booking{bk("", "r1", gpu, hours(0), hours(1))}
	for name, tt := range map[string]struct {
		atoms   []booking.Booking
		cpus    []booking.CPURange
		overlap bool
		msg     string
	}{
		"no atom":             {atoms: []booking.Booking{bk("", "r1", "", hours(0), hours(1))}, msg: "atom and reservation id are required"},
		"no reservation":      {atoms: []booking.Booking{bk("", "", gpu, hours(0), hours(1))}, msg: "atom and reservation id are required"},
		"no node":             {atoms: good, cpus: []booking.CPURange{cr("r1", "", 0, 1, hours(0), hours(1))}, msg: "node and reservation id are required"},
		"empty cpu range":     {atoms: good, cpus: []booking.CPURange{cr("r1", "n1", 4, 4, hours(0), hours(1))}, msg: "[4, 4) is not a range of CPUs"},
		"negative cpu":        {atoms: good, cpus: []booking.CPURange{cr("r1", "n1", -1, 4, hours(0), hours(1))}, msg: "[-1, 4) is not a range of CPUs"},
		"empty time of a cpu": {atoms: good, cpus: []booking.CPURange{cr("r1", "n1", 0, 4, hours(1), hours(1))}, msg: "cpu_bookings_range"},
		"empty time":          {atoms: append(good, bk("", "r1", gpu+"/s1", hours(1), hours(1))), msg: "bookings_range"},
	} {
		err := insertBatch(t, db, tt.atoms, tt.cpus)
		require.ErrorIs(t, err, store.ErrConstraint, name)
		require.NotErrorIs(t, err, booking.ErrOverlap, name)
		require.ErrorContains(t, err, tt.msg, name)
		require.Zero(t, count(t, db, "bookings", ""), name)
		require.Zero(t, count(t, db, "cpu_bookings", ""), name)
	}
}

func TestReleaseMany(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	ctx := context.Background()
	require.NoError(t, insertBatch(t, db,
		[]booking.Booking{
			bk("a1", "r1", gpu, hours(0), hours(8)),
			bk("a2", "r2", gpu+"/s1", hours(0), hours(1)),   // already over
			bk("a3", "r3", gpu+"/s2", hours(10), hours(12)), // not yet started
			bk("a4", "r4", gpu+"/s3", hours(0), hours(8)),   // not released
		},
		[]booking.CPURange{
			cr("r1", "n1", 0, 4, hours(0), hours(8)),
			cr("r2", "n1", 4, 8, hours(0), hours(1)),
			// A start on the last microsecond of a second: its first
			// microsecond ends on the next second.
			cr("r3", "n1", 8, 9, hours(10).Add(-time.Microsecond), hours(12)),
			cr("r4", "n1", 9, 10, hours(0), hours(8)),
		}))
	release := func(ids ...string) int64 {
		var n int64
		require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			var err error
			n, err = booking.Release(ctx, tx, ids, hours(3))
			return err
		}))
		return n
	}
	require.EqualValues(t, 4, release("r1", "r2", "r3", "nope"))
	require.EqualValues(t, 0, release("r1", "r2", "r3"), "a second release changes nothing")

	ends := map[string]time.Time{}
	for _, res := range []string{"r1", "r2", "r3", "r4"} {
		for _, b := range of(t, db, res) {
			ends[b.Atom] = b.EndsAt
		}
	}
	require.Equal(t, map[string]time.Time{
		gpu: hours(3), "n1/cpu/0": hours(3), "n1/cpu/1": hours(3), "n1/cpu/2": hours(3), "n1/cpu/3": hours(3),
		gpu + "/s1": hours(1), "n1/cpu/4": hours(1), "n1/cpu/5": hours(1), "n1/cpu/6": hours(1), "n1/cpu/7": hours(1),
		gpu + "/s2": hours(10).Add(time.Microsecond), "n1/cpu/8": hours(10),
		gpu + "/s3": hours(8), "n1/cpu/9": hours(8),
	}, ends)

	// What was released is free again.
	require.NoError(t, insertBatch(t, db, []booking.Booking{bk("", "r5", gpu, hours(3), hours(8))},
		[]booking.CPURange{cr("r5", "n1", 0, 9, hours(3), hours(8).Add(-time.Hour))}))
}

func TestExtendBoth(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	ctx := context.Background()
	require.NoError(t, insertBatch(t, db, []booking.Booking{bk("", "r1", gpu, hours(0), hours(2))},
		[]booking.CPURange{cr("r1", "n1", 0, 4, hours(0), hours(2))}))
	require.NoError(t, insertBatch(t, db, nil, []booking.CPURange{cr("r2", "n1", 2, 6, hours(5), hours(8))}))
	extend := func(res string, to time.Time) error {
		return db.Write(ctx, func(ctx context.Context, tx store.Tx) error { return booking.Extend(ctx, tx, res, to) })
	}

	require.NoError(t, extend("r1", hours(5)))
	for _, b := range of(t, db, "r1") {
		require.True(t, b.EndsAt.Equal(hours(5)), "%s ends %s", b.Atom, b.EndsAt)
	}
	// The CPU range runs into r2's: refused, and the GPU keeps its end too.
	requireOverlapOf(t, extend("r1", hours(6)), "", "n1")
	for _, b := range of(t, db, "r1") {
		require.True(t, b.EndsAt.Equal(hours(5)), "%s ends %s", b.Atom, b.EndsAt)
	}
	// A reservation with only CPUs extends too.
	require.NoError(t, extend("r2", hours(9)))
	require.ErrorIs(t, extend("nope", hours(9)), store.ErrNotFound)
	require.ErrorIs(t, extend("r2", hours(5)), store.ErrConstraint, "an end before the start")
}

func TestDelete(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	require.NoError(t, insertBatch(t, db,
		[]booking.Booking{bk("", "r1", gpu, hours(0), hours(2)), bk("", "r2", gpu+"/s1", hours(0), hours(2))},
		[]booking.CPURange{cr("r1", "n1", 0, 4, hours(0), hours(2)), cr("r2", "n1", 4, 8, hours(0), hours(2))}))
	var n int64
	require.NoError(t, db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		var err error
		n, err = booking.Delete(ctx, tx, []string{"r1"})
		return err
	}))
	require.EqualValues(t, 2, n)
	require.Empty(t, of(t, db, "r1"))
	require.Len(t, of(t, db, "r2"), 5)
	// The CPUs are free: the reservation books afresh.
	require.NoError(t, insertBatch(t, db, nil, []booking.CPURange{cr("r1", "n1", 0, 4, hours(0), hours(2))}))
}

// poolTables makes the two tables of other modules Current reads (atoms
// maps an atom to its node, node_pools a node to its pool), with only the
// columns it reads: booking's tests do not depend on those modules.
func poolTables(t *testing.T, db *store.DB, pools map[string]map[string][]string) {
	t.Helper()
	require.NoError(t, db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.Exec(ctx, `CREATE TABLE atoms (id TEXT PRIMARY KEY, node_id TEXT NOT NULL)`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE node_pools (node_id TEXT PRIMARY KEY, pool_id TEXT NOT NULL)`); err != nil {
			return err
		}
		for pool, nodes := range pools {
			for node, atoms := range nodes {
				if _, err := tx.Exec(ctx, `INSERT INTO node_pools (node_id, pool_id) VALUES ($1, $2)`, node, pool); err != nil {
					return err
				}
				for _, a := range atoms {
					if _, err := tx.Exec(ctx, `INSERT INTO atoms (id, node_id) VALUES ($1, $2)`, a, node); err != nil {
						return err
					}
				}
			}
		}
		return nil
	}))
}

func TestCurrent(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	poolTables(t, db, map[string]map[string][]string{
		"p1": {"n1": {"g1", "g2"}, "n2": {"g3"}},
		"p2": {"n3": {"g4"}},
	})
	require.NoError(t, insertBatch(t, db,
		[]booking.Booking{
			bk("b1", "r1", "g1", hours(0), hours(2)),
			bk("b2", "r2", "g1", hours(-2), hours(0)), // ended
			bk("b3", "r3", "g3", hours(5), hours(6)),  // future
			bk("b4", "r4", "g4", hours(0), hours(2)),  // other pool
		},
		[]booking.CPURange{
			cr("r1", "n1", 0, 4, hours(0), hours(2)),
			cr("r2", "n1", 0, 4, hours(-2), hours(0)), // ended
			cr("r3", "n2", 4, 8, hours(5), hours(6)),
			cr("r4", "n3", 0, 4, hours(0), hours(2)),
		}))
	var atoms []booking.Booking
	var cpus []booking.CPURange
	require.NoError(t, db.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		var err error
		atoms, cpus, err = booking.Current(ctx, tx, "p1", hours(0))
		return err
	}))
	var ids []string
	for _, b := range atoms {
		ids = append(ids, b.ID)
	}
	require.Equal(t, []string{"b1", "b3"}, ids)
	require.Equal(t, []booking.CPURange{
		cr("r1", "n1", 0, 4, hours(0), hours(2)),
		cr("r3", "n2", 4, 8, hours(5), hours(6)),
	}, cpus)
}

func TestArchive(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	ctx := context.Background()
	var atoms []booking.Booking
	var cpus []booking.CPURange
	for i := range 10 { // ended at hours(-10+i): -10 … -1
		res := "old" + string(rune('0'+i))
		atoms = append(atoms, bk("", res, gpu, hours(-11+i), hours(-10+i)))
		cpus = append(cpus, cr(res, "n1", 0, 4, hours(-11+i), hours(-10+i)))
	}
	atoms = append(atoms, bk("", "edge", gpu, hours(0), hours(1)), bk("", "live", gpu, hours(1), hours(5)))
	cpus = append(cpus, cr("edge", "n1", 0, 4, hours(0), hours(1)), cr("live", "n1", 0, 4, hours(1), hours(5)))
	require.NoError(t, insertBatch(t, db, atoms, cpus))

	archive := func(before time.Time, limit int) int {
		var n int
		require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			var err error
			n, err = booking.Archive(ctx, tx, before, limit)
			return err
		}))
		return n
	}
	// Bounded by limit, oldest first, bookings before cpu ranges.
	require.Equal(t, 7, archive(hours(1), 7))
	require.Equal(t, 7, count(t, db, "bookings_archive", ""))
	require.Zero(t, count(t, db, "cpu_bookings_archive", ""))
	require.Zero(t, count(t, db, "bookings", "old0"))
	require.Equal(t, 1, count(t, db, "bookings", "old7"))

	// The rest: a booking ending exactly at before stays.
	require.Equal(t, 13, archive(hours(1), 100))
	require.Equal(t, 10, count(t, db, "bookings_archive", ""))
	require.Equal(t, 10, count(t, db, "cpu_bookings_archive", ""))
	require.Equal(t, 1, count(t, db, "bookings", "edge"))
	require.Equal(t, 1, count(t, db, "cpu_bookings", "edge"))
	require.Equal(t, 1, count(t, db, "cpu_bookings", "live"))
	require.Equal(t, 1, count(t, db, "bookings", "live"))
	require.Equal(t, 0, count(t, db, "bookings_archive", "live"))

	// Idempotent: nothing is left to move, nothing moves twice.
	require.Zero(t, archive(hours(1), 100))
	require.Equal(t, 10, count(t, db, "bookings_archive", ""))

	// The archive keeps the rows as they were.
	arch := cpuRows(t, db, "cpu_bookings_archive")
	require.Equal(t, cpuRow{"old3", "n1", 0, 4, hours(-8), hours(-7)}, arch[3])

	// An archived reservation is gone from the live tables: it cannot be
	// extended.
	err := db.Write(ctx, func(ctx context.Context, tx store.Tx) error { return booking.Extend(ctx, tx, "old3", hours(9)) })
	require.ErrorIs(t, err, store.ErrNotFound)

	err = db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := booking.Archive(ctx, tx, hours(1), 0)
		return err
	})
	require.ErrorContains(t, err, "limit 0")
}

// TestMigrationConvertsCPUAtoms books per-CPU atoms under migration 0001,
// applies 0002 and checks they became ranges: contiguous CPUs of one
// reservation and time range make one row, the rest stays in bookings.
func TestMigrationConvertsCPUAtoms(t *testing.T) {
	t.Parallel()
	db := bctest.NewDB(t, bctest.NewSimClock(t0))
	ctx := context.Background()
	full := booking.Migrations()
	first := fstest.MapFS{}
	for _, d := range []string{"sqlite", "postgres"} {
		b, err := fs.ReadFile(full.FS, d+"/0001_bookings.sql")
		require.NoError(t, err)
		first[d+"/0001_bookings.sql"] = &fstest.MapFile{Data: b}
	}
	require.NoError(t, db.Migrate(ctx, store.Migrations{Module: full.Module, FS: first}))

	old := map[string][]int{"r1": {0, 1, 2, 3, 6, 7}, "r2": {4, 5}}
	require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		n := 0
		row := func(res, atom string, from, to time.Time) error {
			n++
			_, err := tx.Exec(ctx, `INSERT INTO bookings (id, reservation_id, atom, starts_at, ends_at, create_time)
				VALUES ($1, $2, $3, $4, $5, $6)`, "b"+strings.Repeat("0", 3-len(itoa(n)))+itoa(n), res, atom, from, to, t0)
			return err
		}
		for res, cs := range old {
			for _, c := range cs {
				if err := row(res, "node/x-1/cpu/"+itoa(c), hours(0), hours(2)); err != nil {
					return err
				}
			}
		}
		// r3 holds CPU 0 of node-2 twice, at two times: two ranges.
		for _, r := range [][2]time.Time{{hours(3), hours(4)}, {hours(5), hours(6)}} {
			if err := row("r3", "node-2/cpu/0", r[0], r[1]); err != nil {
				return err
			}
		}
		for _, a := range []string{gpu, "node-2/cpu/x1", "node-2/cpu/", "/cpu/3"} {
			if err := row("r4", a, hours(0), hours(2)); err != nil {
				return err
			}
		}
		return nil
	}))
	require.NoError(t, db.Migrate(ctx, booking.Migrations()))

	require.Equal(t, []cpuRow{
		{"r1", "node/x-1", 0, 4, hours(0), hours(2)},
		{"r1", "node/x-1", 6, 8, hours(0), hours(2)},
		{"r2", "node/x-1", 4, 6, hours(0), hours(2)},
		{"r3", "node-2", 0, 1, hours(3), hours(4)},
		{"r3", "node-2", 0, 1, hours(5), hours(6)},
	}, cpuRows(t, db, "cpu_bookings"))
	require.Zero(t, count(t, db, "bookings", "r1"))
	require.Zero(t, count(t, db, "bookings", "r3"))
	require.Equal(t, 4, count(t, db, "bookings", "r4"), "what is not a CPU atom stays")
	// The converted ranges are booked against.
	requireOverlapOf(t, insertBatch(t, db, nil, []booking.CPURange{cr("r9", "node/x-1", 5, 7, hours(1), hours(3))}), "", "node/x-1")
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestOverlapProbeUsesEndsIndex asks SQLite how it runs the triggers'
// overlap probes (read from sqlite_master, so the test follows the
// triggers): by the (atom, ends_at) and (node_id, ends_at) indexes, with
// ends_at as a range, so bookings that ended before the new one starts are
// never visited.
func TestOverlapProbeUsesEndsIndex(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	if db.Dialect() != store.SQLite {
		t.Skip("the triggers are SQLite's; PostgreSQL probes its exclusion constraint's GiST index")
	}
	want := map[string]string{
		"bookings_no_overlap_insert":     "USING INDEX bookings_atom_ends (atom=? AND ends_at>?)",
		"bookings_no_overlap_update":     "USING INDEX bookings_atom_ends (atom=? AND ends_at>?)",
		"cpu_bookings_no_overlap_insert": "USING INDEX cpu_bookings_node_ends (node_id=? AND ends_at>?)",
		"cpu_bookings_no_overlap_update": "USING INDEX cpu_bookings_node_ends (node_id=? AND ends_at>?)",
	}
	probe := regexp.MustCompile(`(?s)WHEN EXISTS \((.*)\)\s*BEGIN`)
	newCol := regexp.MustCompile(`NEW\.\w+`)
	require.NoError(t, db.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		for trigger, plan := range want {
			var sql string
			require.NoError(t, tx.QueryRow(ctx, `SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = $1`, trigger).Scan(&sql))
			m := probe.FindStringSubmatch(sql)
			require.NotNil(t, m, sql)
			rows, err := tx.Query(ctx, `EXPLAIN QUERY PLAN `+newCol.ReplaceAllString(m[1], "'x'"))
			require.NoError(t, err)
			var details []string
			for rows.Next() {
				var id, parent, unused int
				var detail string
				require.NoError(t, rows.Scan(&id, &parent, &unused, &detail))
				details = append(details, detail)
			}
			require.NoError(t, rows.Close())
			require.Len(t, details, 1, trigger)
			require.Contains(t, details[0], plan, trigger)
			t.Logf("%s: %s", trigger, details[0])
		}
		return nil
	}))
}
