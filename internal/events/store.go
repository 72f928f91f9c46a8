package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

// Insert writes events in tx and wakes local watchers after commit. It
// takes no lock: the row's xid (the column default) orders it for readers.
func Insert(ctx context.Context, tx store.Tx, hub *Hub, evs []envelope.Event) error {
	rows := make([][]any, 0, len(evs))
	for _, ev := range evs {
		data, err := json.Marshal(ev.Data)
		if err != nil {
			return err
		}
		if ev.Data == nil {
			data = []byte("{}")
		}
		rows = append(rows, []any{ev.Type, ev.TenantID, ev.ResourceType, ev.ResourceID, ev.Time, string(data)})
	}
	// One statement for a batch's events; rows take their sequence numbers
	// in the order given.
	if err := store.InsertRows(ctx, tx, `INSERT INTO events (type, tenant_id, resource_type, resource_id, time, data)`, "", rows); err != nil {
		return err
	}
	if hub != nil {
		tx.AfterCommit(hub.Notify)
	}
	return nil
}

// ListAfter returns up to limit events after the event whose id is after (0:
// from the beginning), of one tenant unless allTenants, in commit order and
// only those whose transactions have ended (events_visible). It fails with
// ErrUnknownCursor when after names no stored event.
func ListAfter(ctx context.Context, q store.Querier, tenantID string, allTenants bool, after int64, limit int) ([]Stored, error) {
	var xid uint64
	if after > 0 {
		err := q.QueryRow(ctx, `SELECT xid FROM events WHERE seq = $1`, after).Scan(&xid)
		if errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("resume after %d: %w", after, ErrUnknownCursor)
		}
		if err != nil {
			return nil, err
		}
	}
	rows, err := q.Query(ctx, `SELECT seq, type, tenant_id, resource_type, resource_id, time, data FROM events_visible
		WHERE (xid, seq) > ($1, $2) AND ($3 OR tenant_id = $4)
		ORDER BY xid, seq LIMIT $5`, xid, after, allTenants, tenantID, limit)
	if err != nil {
		return nil, err
	}
	return scanStored(rows)
}

// LastSeq returns the cursor of the newest event below the horizon (0 when
// there is none): a watch that starts there serves every event whose
// transaction had not ended yet, and nothing older.
func LastSeq(ctx context.Context, q store.Querier) (int64, error) {
	var seq int64
	err := q.QueryRow(ctx, `SELECT seq FROM events_visible ORDER BY xid DESC, seq DESC LIMIT 1`).Scan(&seq)
	if errors.Is(err, store.ErrNotFound) {
		return 0, nil
	}
	return seq, err
}

// Prune deletes the events older than before, but only those a cursor
// standing on the event keep has passed (keep 0: none; -1: no such bound).
// It returns how many it deleted. Only events whose transactions have ended
// are considered.
func Prune(ctx context.Context, tx store.Tx, before time.Time, keep int64) (int64, error) {
	if keep == 0 {
		return 0, nil
	}
	if keep < 0 {
		return tx.Exec(ctx, `DELETE FROM events WHERE seq IN (SELECT seq FROM events_visible WHERE time < $1)`, before)
	}
	var xid uint64
	err := tx.QueryRow(ctx, `SELECT xid FROM events WHERE seq = $1`, keep).Scan(&xid)
	if errors.Is(err, store.ErrNotFound) {
		return 0, nil // the cursor's own event is gone: prune nothing rather than guess
	}
	if err != nil {
		return 0, err
	}
	return tx.Exec(ctx, `DELETE FROM events WHERE seq IN (SELECT seq FROM events_visible
		WHERE time < $1 AND (xid, seq) < ($2, $3))`, before, xid, keep)
}

// ListFilter selects the events List returns; zero fields select all.
type ListFilter struct {
	// TenantID is the one tenant listed unless AllTenants.
	TenantID   string
	AllTenants bool
	// TypePrefixes: events whose type starts with one of these.
	TypePrefixes []string
	ResourceType string
	ResourceID   string
	// Since (inclusive) and Until (exclusive) bound the event's time.
	Since, Until time.Time
	// Before is the cursor to continue below (0: from the newest).
	Before int64
	Limit  int
}

// ListBefore returns up to f.Limit events matching f, newest first in commit
// order ((xid, seq) descending: the reverse of ListAfter's order), starting
// below the event f.Before. It fails with ErrUnknownCursor when f.Before
// names no stored event (pruned by the retention, say).
func ListBefore(ctx context.Context, q store.Querier, f ListFilter) ([]Stored, error) {
	var (
		xid   uint64
		where []string
		args  []any
	)
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	if f.Before > 0 {
		err := q.QueryRow(ctx, `SELECT xid FROM events WHERE seq = $1`, f.Before).Scan(&xid)
		if errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("continue below %d: %w", f.Before, ErrUnknownCursor)
		}
		if err != nil {
			return nil, err
		}
		where = append(where, fmt.Sprintf("(xid, seq) < (%s, %s)", arg(xid), arg(f.Before)))
	}
	if !f.AllTenants {
		where = append(where, "tenant_id = "+arg(f.TenantID))
	}
	if len(f.TypePrefixes) > 0 {
		var or []string
		for _, p := range f.TypePrefixes {
			// substr, not LIKE: SQLite's LIKE ignores ASCII case and both
			// would need '%' and '_' escaped.
			a := arg(p)
			or = append(or, fmt.Sprintf("substr(type, 1, length(CAST(%s AS TEXT))) = %s", a, a))
		}
		where = append(where, "("+strings.Join(or, " OR ")+")")
	}
	if f.ResourceType != "" {
		where = append(where, "resource_type = "+arg(f.ResourceType))
	}
	if f.ResourceID != "" {
		where = append(where, "resource_id = "+arg(f.ResourceID))
	}
	if !f.Since.IsZero() {
		where = append(where, "time >= "+arg(f.Since))
	}
	if !f.Until.IsZero() {
		where = append(where, "time < "+arg(f.Until))
	}
	query := `SELECT seq, type, tenant_id, resource_type, resource_id, time, data FROM events_visible`
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	query += " ORDER BY xid DESC, seq DESC LIMIT " + arg(f.Limit)
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return scanStored(rows)
}

func scanStored(rows store.Rows) ([]Stored, error) {
	defer rows.Close()
	var out []Stored
	for rows.Next() {
		var (
			s    Stored
			data []byte
		)
		if err := rows.Scan(&s.Seq, &s.Type, &s.TenantID, &s.ResourceType, &s.ResourceID, &s.Time, &data); err != nil {
			return nil, err
		}
		if err := json.Unmarshal(data, &s.Data); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}
