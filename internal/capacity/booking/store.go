package booking

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Migrations returns the module's tables.
func Migrations() store.Migrations {
	return store.Embedded("booking", migrationsFS)
}

// The constraints (PostgreSQL) and the triggers' RAISE messages (SQLite)
// that refuse overlapping bookings. On SQLite the message goes on with the
// atom or node (": atom <atom>"), so store.ConstraintOf starts with the name.
const (
	OverlapConstraint    = "bookings_no_overlap"
	CPUOverlapConstraint = "cpu_bookings_no_overlap"
)

// ErrOverlap: the database refused a booking that would overlap another
// booking of the same atom, or of the same CPU of a node. It matches
// store.ErrConstraint too.
var ErrOverlap = fmt.Errorf("%s: %w", overlapMsg, store.ErrConstraint)

const overlapMsg = "booking overlaps another booking of the same atom"

// Resolution is the precision both stores keep; times are truncated to it.
const Resolution = time.Microsecond

// Booking holds Atom over [StartsAt, EndsAt) for ReservationID.
type Booking struct {
	// ID is the booking's id; inserts fill an empty one with "bkg_…".
	ID            string
	ReservationID string
	Atom          string
	StartsAt      time.Time
	EndsAt        time.Time
	// CreateTime is read back; inserts stamp it with compute_now().
	CreateTime time.Time
}

// CPURange holds CPUs [Lo, Hi) of NodeID over [StartsAt, EndsAt) for
// ReservationID.
type CPURange struct {
	ReservationID, NodeID string
	Lo, Hi                int
	StartsAt, EndsAt      time.Time
}

// OverlapError is a refusal by an overlap constraint. It matches ErrOverlap
// (and through it store.ErrConstraint) and keeps the driver error. Atom or
// NodeID names what was taken when the driver says (both dialects do).
type OverlapError struct {
	// Constraint is OverlapConstraint or CPUOverlapConstraint.
	Constraint string
	// Atom is set for a device atom, NodeID for a CPU range.
	Atom, NodeID string
	err          error
}

func (e *OverlapError) Error() string {
	switch {
	case e.Atom != "":
		return overlapMsg + " (atom " + e.Atom + "): " + e.err.Error()
	case e.NodeID != "":
		return overlapMsg + " (CPUs of node " + e.NodeID + "): " + e.err.Error()
	}
	return overlapMsg + ": " + e.err.Error()
}

func (e *OverlapError) Unwrap() []error { return []error{ErrOverlap, e.err} }

// classify maps an overlap constraint's refusal, on either dialect, to an
// *OverlapError; any other error is returned as is.
func classify(err error) error {
	if err == nil || errors.Is(err, ErrOverlap) || !errors.Is(err, store.ErrConstraint) {
		return err
	}
	c := store.ConstraintOf(err)
	name, what, _ := strings.Cut(c, ": ")
	if name != OverlapConstraint && name != CPUOverlapConstraint {
		return err
	}
	oe := &OverlapError{Constraint: name, err: err}
	if what == "" {
		what = pgConflictKey(err)
	} else {
		what = what[strings.IndexByte(what, ' ')+1:] // "atom X" / "node N"
	}
	if name == CPUOverlapConstraint {
		oe.NodeID = what
	} else {
		oe.Atom = what
	}
	return oe
}

// pgConflictKey reads the first key column's value out of PostgreSQL's
// exclusion-violation detail, "Key (atom, tstzrange(…))=(GPU-…, [\"…\",
// \"…\")) conflicts with existing key …": the atom or the node id.
func pgConflictKey(err error) string {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return ""
	}
	_, rest, ok := strings.Cut(pe.Detail, ")=(")
	if !ok {
		return ""
	}
	key, _, _ := strings.Cut(rest, ", ")
	return key
}

func newID() string {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return "bkg_" + hex.EncodeToString(b[:])
}

func norm(t time.Time) time.Time { return t.UTC().Truncate(Resolution) }

// cpuAtom is the per-CPU atom name bookings used before CPU ranges; the old
// API still speaks it.
func cpuAtom(nodeID string, cpu int) string { return nodeID + "/cpu/" + strconv.Itoa(cpu) }

// parseCPUAtom splits "<node>/cpu/<n>".
func parseCPUAtom(atom string) (nodeID string, cpu int, ok bool) {
	i := strings.LastIndex(atom, "/cpu/")
	if i <= 0 {
		return "", 0, false
	}
	digits := atom[i+len("/cpu/"):]
	if len(digits) == 0 || len(digits) > 9 || strings.TrimLeft(digits, "0123456789") != "" {
		return "", 0, false
	}
	n, err := strconv.Atoi(digits)
	return atom[:i], n, err == nil
}

// CPURanges turns a set of CPU numbers into sorted, contiguous, half-open
// runs [lo, hi). Duplicates count once.
func CPURanges(cpus []int) [][2]int {
	if len(cpus) == 0 {
		return nil
	}
	s := slices.Clone(cpus)
	slices.Sort(s)
	s = slices.Compact(s)
	out := [][2]int{{s[0], s[0] + 1}}
	for _, c := range s[1:] {
		if last := &out[len(out)-1]; c == last[1] {
			last[1]++
			continue
		}
		out = append(out, [2]int{c, c + 1})
	}
	return out
}

// BookingInsert inserts the set of bookings. An atom of the old per-CPU form
// "<node>/cpu/<n>" is booked as a CPU range of its node, so old and new
// writers meet in one constraint. It is all or nothing only with the
// caller's transaction: an overlap (with a stored booking or with another
// booking of the set) returns an error matching ErrOverlap, and the caller
// returns it so the transaction rolls back and nothing of the set is kept.
// A booking whose EndsAt is not after StartsAt fails with
// store.ErrConstraint (not ErrOverlap).
//
// Deprecated: the placer uses Insert.
func BookingInsert(ctx context.Context, tx store.Tx, bookings []Booking) error {
	var atoms []Booking
	type key struct {
		rsv, node  string
		start, end time.Time
	}
	cpus := map[key][]int{}
	var order []key
	for _, b := range bookings {
		if node, cpu, ok := parseCPUAtom(b.Atom); ok && b.ReservationID != "" {
			k := key{b.ReservationID, node, norm(b.StartsAt), norm(b.EndsAt)}
			if _, seen := cpus[k]; !seen {
				order = append(order, k)
			}
			cpus[k] = append(cpus[k], cpu)
			continue
		}
		atoms = append(atoms, b)
	}
	var ranges []CPURange
	for _, k := range order {
		c := slices.Sorted(slices.Values(cpus[k]))
		for i := 1; i < len(c); i++ {
			if c[i] == c[i-1] {
				// One CPU twice in a set overlaps itself, as two rows of
				// one atom did; the ranges would hide it from the database.
				return fmt.Errorf("booking of %s: %w", cpuAtom(k.node, c[i]),
					&OverlapError{Constraint: CPUOverlapConstraint, NodeID: k.node, err: errors.New("the set books a CPU twice")})
			}
		}
		for _, r := range CPURanges(c) {
			ranges = append(ranges, CPURange{ReservationID: k.rsv, NodeID: k.node, Lo: r[0], Hi: r[1], StartsAt: k.start, EndsAt: k.end})
		}
	}
	return Insert(ctx, tx, atoms, ranges)
}

// BookingsRelease ends the reservation's bookings at at, as Release does
// for one reservation.
//
// Deprecated: the placer uses Release.
func BookingsRelease(ctx context.Context, tx store.Tx, reservationID string, at time.Time) (int64, error) {
	return Release(ctx, tx, []string{reservationID}, at)
}

// BookingsExtend is Extend.
//
// Deprecated: the placer uses Extend.
func BookingsExtend(ctx context.Context, tx store.Tx, reservationID string, newEnd time.Time) error {
	return Extend(ctx, tx, reservationID, newEnd)
}

const (
	columns    = `id, reservation_id, atom, starts_at, ends_at, create_time`
	cpuColumns = `id, reservation_id, node_id, cpu_lo, cpu_hi, starts_at, ends_at, create_time`
)

// BookingsActiveAt returns the bookings of the atoms that hold at at, that
// is starts_at <= at < ends_at, ordered by atom. An atom "<node>/cpu/<n>"
// is answered from the node's CPU ranges, one Booking per CPU with the
// range's id.
func BookingsActiveAt(ctx context.Context, q store.Querier, atoms []string, at time.Time) ([]Booking, error) {
	at = norm(at)
	var devices []string
	cpus := map[string]map[int]bool{}
	for _, a := range atoms {
		if node, cpu, ok := parseCPUAtom(a); ok {
			if cpus[node] == nil {
				cpus[node] = map[int]bool{}
			}
			cpus[node][cpu] = true
			continue
		}
		devices = append(devices, a)
	}
	var out []Booking
	for chunk := range slices.Chunk(devices, maxInList) {
		args := append([]any{at}, anys(chunk)...)
		bs, err := scan(q.Query(ctx, `SELECT `+columns+` FROM bookings
			WHERE atom IN (`+placeholders(2, len(chunk))+`) AND starts_at <= $1 AND ends_at > $1`, args...))
		if err != nil {
			return nil, err
		}
		out = append(out, bs...)
	}
	nodes := slices.Sorted(maps.Keys(cpus))
	for chunk := range slices.Chunk(nodes, maxInList) {
		args := append([]any{at}, anys(chunk)...)
		rs, err := scanCPU(q.Query(ctx, `SELECT `+cpuColumns+` FROM cpu_bookings
			WHERE node_id IN (`+placeholders(2, len(chunk))+`) AND starts_at <= $1 AND ends_at > $1`, args...))
		if err != nil {
			return nil, err
		}
		for _, r := range rs {
			for c := r.Lo; c < r.Hi; c++ {
				if cpus[r.NodeID][c] {
					out = append(out, r.booking(c))
				}
			}
		}
	}
	sortBookings(out)
	return out, nil
}

// BookingsOf returns the reservation's bookings ordered by atom and start;
// its CPU ranges come back as one Booking per CPU ("<node>/cpu/<n>", with
// the range's id).
func BookingsOf(ctx context.Context, q store.Querier, reservationID string) ([]Booking, error) {
	out, err := scan(q.Query(ctx, `SELECT `+columns+` FROM bookings WHERE reservation_id = $1`, reservationID))
	if err != nil {
		return nil, err
	}
	rs, err := scanCPU(q.Query(ctx, `SELECT `+cpuColumns+` FROM cpu_bookings WHERE reservation_id = $1`, reservationID))
	if err != nil {
		return nil, err
	}
	for _, r := range rs {
		for c := r.Lo; c < r.Hi; c++ {
			out = append(out, r.booking(c))
		}
	}
	sortBookings(out)
	return out, nil
}

// cpuRow is a cpu_bookings row as read.
type cpuRow struct {
	CPURange
	id         string
	createTime time.Time
}

func (r cpuRow) booking(cpu int) Booking {
	return Booking{ID: r.id, ReservationID: r.ReservationID, Atom: cpuAtom(r.NodeID, cpu),
		StartsAt: r.StartsAt, EndsAt: r.EndsAt, CreateTime: r.createTime}
}

func sortBookings(bs []Booking) {
	slices.SortFunc(bs, func(a, b Booking) int {
		if c := strings.Compare(a.Atom, b.Atom); c != 0 {
			return c
		}
		if c := a.StartsAt.Compare(b.StartsAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
}

func scan(rows store.Rows, err error) ([]Booking, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Booking
	for rows.Next() {
		var b Booking
		if err := rows.Scan(&b.ID, &b.ReservationID, &b.Atom, &b.StartsAt, &b.EndsAt, &b.CreateTime); err != nil {
			return nil, err
		}
		b.StartsAt, b.EndsAt, b.CreateTime = b.StartsAt.UTC(), b.EndsAt.UTC(), b.CreateTime.UTC()
		out = append(out, b)
	}
	return out, rows.Err()
}

func scanCPU(rows store.Rows, err error) ([]cpuRow, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []cpuRow
	for rows.Next() {
		var r cpuRow
		if err := rows.Scan(&r.id, &r.ReservationID, &r.NodeID, &r.Lo, &r.Hi, &r.StartsAt, &r.EndsAt, &r.createTime); err != nil {
			return nil, err
		}
		r.StartsAt, r.EndsAt, r.createTime = r.StartsAt.UTC(), r.EndsAt.UTC(), r.createTime.UTC()
		out = append(out, r)
	}
	return out, rows.Err()
}

// BookedAfter reports whether any of the device atoms has a booking that
// ends after at (running now or starting later): an atom that must not
// change under its holder.
func BookedAfter(ctx context.Context, q store.Querier, atoms []string, at time.Time) (bool, error) {
	at = norm(at)
	for chunk := range slices.Chunk(atoms, maxInList) {
		args := append([]any{at}, anys(chunk)...)
		var n int
		if err := q.QueryRow(ctx, `SELECT COUNT(*) FROM bookings WHERE atom IN (`+placeholders(2, len(chunk))+`) AND ends_at > $1`, args...).Scan(&n); err != nil {
			return false, err
		}
		if n > 0 {
			return true, nil
		}
	}
	return false, nil
}
