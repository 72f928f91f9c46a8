package booking

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Migrations returns the module's tables.
func Migrations() store.Migrations {
	return store.Embedded("booking", migrationsFS)
}

// OverlapConstraint names the exclusion constraint (PostgreSQL) and the
// triggers' RAISE message (SQLite) that refuse overlapping bookings.
const OverlapConstraint = "bookings_no_overlap"

// ErrOverlap: the database refused a booking that would overlap another
// booking of the same atom. It matches store.ErrConstraint too.
var ErrOverlap = fmt.Errorf("%s: %w", overlapMsg, store.ErrConstraint)

const overlapMsg = "booking overlaps another booking of the same atom"

// Resolution is the precision both stores keep; times are truncated to it.
const Resolution = time.Microsecond

// Booking holds Atom over [StartsAt, EndsAt) for ReservationID.
type Booking struct {
	// ID is the booking's id; BookingInsert fills an empty one with "bkg_…".
	ID            string
	ReservationID string
	Atom          string
	StartsAt      time.Time
	EndsAt        time.Time
	// CreateTime is read back; inserts stamp it with compute_now().
	CreateTime time.Time
}

// overlapError wraps a refusal by the overlap constraint so that it matches
// ErrOverlap (and through it store.ErrConstraint) and keeps the driver error.
type overlapError struct{ err error }

func (e *overlapError) Error() string { return overlapMsg + ": " + e.err.Error() }

func (e *overlapError) Unwrap() []error { return []error{ErrOverlap, e.err} }

// classify maps the overlap constraint's refusal, on either dialect, to
// ErrOverlap; any other error is returned as is.
func classify(err error) error {
	if err == nil || errors.Is(err, ErrOverlap) {
		return err
	}
	if errors.Is(err, store.ErrConstraint) && isOverlap(err) {
		return &overlapError{err: err}
	}
	return err
}

func isOverlap(err error) bool {
	if c := store.ConstraintOf(err); c != "" {
		return c == OverlapConstraint || strings.Contains(c, OverlapConstraint)
	}
	return strings.Contains(err.Error(), OverlapConstraint)
}

func newID() string {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return "bkg_" + hex.EncodeToString(b[:])
}

func norm(t time.Time) time.Time { return t.UTC().Truncate(Resolution) }

// BookingInsert inserts the set of bookings. It is all or nothing only with
// the caller's transaction: the first overlap (with a stored booking or with
// another booking of the set) returns an error matching ErrOverlap, and the
// caller returns it so the transaction rolls back and nothing of the set is
// kept. A booking whose EndsAt is not after StartsAt fails with
// store.ErrConstraint (not ErrOverlap).
func BookingInsert(ctx context.Context, tx store.Tx, bookings []Booking) error {
	for i := range bookings {
		b := &bookings[i]
		if b.ID == "" {
			b.ID = newID()
		}
		if b.Atom == "" || b.ReservationID == "" {
			return fmt.Errorf("booking %s: atom and reservation id are required", b.ID)
		}
		// create_time comes from the one clock, so a caller cannot forget it.
		_, err := tx.Exec(ctx, `INSERT INTO bookings (id, reservation_id, atom, starts_at, ends_at, create_time)
			VALUES ($1, $2, $3, $4, $5, compute_now())`,
			b.ID, b.ReservationID, b.Atom, norm(b.StartsAt), norm(b.EndsAt))
		if err != nil {
			return fmt.Errorf("booking %s of %s: %w", b.ID, b.Atom, classify(err))
		}
	}
	return nil
}

// BookingsRelease ends the reservation's bookings at at: each booking's
// ends_at becomes max(starts_at+1µs, min(ends_at, at)), so a booking already
// over keeps its end, a running one ends at at, and one not yet started
// shrinks to its first microsecond. Releasing twice changes nothing the second
// time. It returns the number of bookings changed. Shrinking never overlaps,
// so the constraint never refuses it.
func BookingsRelease(ctx context.Context, tx store.Tx, reservationID string, at time.Time) (int64, error) {
	at = norm(at)
	own, err := BookingsOf(ctx, tx, reservationID)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, b := range own {
		end := b.EndsAt
		if at.Before(end) {
			end = at
		}
		if floor := b.StartsAt.Add(Resolution); end.Before(floor) {
			end = floor
		}
		if end.Equal(b.EndsAt) {
			continue
		}
		c, err := tx.Exec(ctx, `UPDATE bookings SET ends_at = $2 WHERE id = $1`, b.ID, end)
		if err != nil {
			return n, fmt.Errorf("release booking %s: %w", b.ID, classify(err))
		}
		n += c
	}
	return n, nil
}

// BookingsExtend moves the end of every booking of the reservation to newEnd.
// There is no read before the write: when the new range overlaps another
// booking of the same atom the database refuses the update and the error
// matches ErrOverlap; the caller's transaction must then roll back. A newEnd
// not after a booking's start fails with store.ErrConstraint. A reservation
// without bookings fails with store.ErrNotFound.
func BookingsExtend(ctx context.Context, tx store.Tx, reservationID string, newEnd time.Time) error {
	n, err := tx.Exec(ctx, `UPDATE bookings SET ends_at = $2 WHERE reservation_id = $1`, reservationID, norm(newEnd))
	if err != nil {
		return fmt.Errorf("extend reservation %s: %w", reservationID, classify(err))
	}
	if n == 0 {
		return fmt.Errorf("extend reservation %s: no bookings: %w", reservationID, store.ErrNotFound)
	}
	return nil
}

const columns = `id, reservation_id, atom, starts_at, ends_at, create_time`

// BookingsActiveAt returns the bookings of the atoms that hold at at, that is
// starts_at <= at < ends_at, ordered by atom.
func BookingsActiveAt(ctx context.Context, q store.Querier, atoms []string, at time.Time) ([]Booking, error) {
	if len(atoms) == 0 {
		return nil, nil
	}
	args := make([]any, 0, len(atoms)+1)
	args = append(args, norm(at))
	ph := make([]string, len(atoms))
	for i, a := range atoms {
		args = append(args, a)
		ph[i] = fmt.Sprintf("$%d", i+2)
	}
	return scan(q.Query(ctx, `SELECT `+columns+` FROM bookings
		WHERE atom IN (`+strings.Join(ph, ", ")+`) AND starts_at <= $1 AND ends_at > $1
		ORDER BY atom, starts_at, id`, args...))
}

// BookingsOf returns the reservation's bookings ordered by atom and start.
func BookingsOf(ctx context.Context, q store.Querier, reservationID string) ([]Booking, error) {
	return scan(q.Query(ctx, `SELECT `+columns+` FROM bookings
		WHERE reservation_id = $1 ORDER BY atom, starts_at, id`, reservationID))
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
