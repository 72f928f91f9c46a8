package events

import (
	"context"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
)

// Source is the outbox as a resource's Watch reads it (the app adapts the
// Hub and ListAfter to it).
type Source interface {
	// After returns up to limit events of the tenant after the cursor,
	// and the cursor of each.
	After(ctx context.Context, q store.Querier, tenantID string, after int64, limit int) ([]envelope.Event, []int64, error)
	// Last is the newest cursor.
	Last(ctx context.Context, q store.Querier) (int64, error)
	// Wait is closed when new events may be there.
	Wait() <-chan struct{}
}

// watchPage is how many events a resource watch reads at a time.
const watchPage = 500

// ParseCursor checks a Watch request's cursor (a previous response's, or
// "" for now) into vs and returns it.
func ParseCursor(vs *envelope.Violations, cursor string) int64 {
	var after int64
	if cursor == "" {
		return 0
	}
	if _, err := fmt.Sscan(cursor, &after); err != nil || after < 0 {
		vs.Add("cursor", "must be a cursor from a previous response, got %q", truncateCursor(cursor))
	}
	return after
}

func truncateCursor(s string) string {
	const limit = 64
	if len(s) > limit {
		return s[:limit] + "…"
	}
	return s
}

// ResourceWatch is one resource kind's Watch RPC over the outbox: the
// tenant's events of ResourceType (or of one resource) after the cursor,
// then live ones, each sent with the row as it is now and only where the
// caller may read it.
type ResourceWatch[Row, Resp any] struct {
	Env    *envelope.Envelope
	Events Source
	// Poll bounds how long a missed wake-up delays the next read.
	Poll time.Duration
	// TenantID is the scope; Scope its (or the one resource's) resource
	// for the read filter.
	TenantID string
	Scope    iam.Resource
	// ResourceType is the events' resource type; Only, when set, the one
	// resource id followed.
	ResourceType, Only string
	// After is the request's cursor; FromNow starts at the newest event
	// instead (the request gave none).
	After   int64
	FromNow bool
	// Load reads an event's resource; false skips it (gone, or not the
	// tenant's).
	Load func(ctx context.Context, q store.Querier, id string) (Row, bool, error)
	// Owner is a row's tenant and project, for the read filter.
	Owner func(Row) (tenantID, projectID string)
	// Message is what is sent for an event of the row.
	Message func(typ string, row Row, cursor string) *Resp
	// Send sends one message; nil first, as the stream's opening.
	Send func(*Resp) error
}

// Run follows the outbox until ctx ends (nil) or a read or send fails.
func (w ResourceWatch[Row, Resp]) Run(ctx context.Context) error {
	env := w.Env
	rf := env.NewReadFilter(w.Scope)
	after := w.After
	if w.FromNow {
		if err := env.Resolve(ctx, "events", func(ctx context.Context, q store.Querier) (err error) {
			after, err = w.Events.Last(ctx, q)
			return err
		}); err != nil {
			return env.Fail(ctx, err)
		}
	}
	if err := w.Send(nil); err != nil {
		return err
	}
	ticker := time.NewTicker(w.Poll)
	defer ticker.Stop()
	for {
		wake := w.Events.Wait()
		var (
			out  []*Resp
			rows []Row
			full bool
		)
		if err := env.Resolve(ctx, "events", func(ctx context.Context, q store.Querier) error {
			evs, seqs, err := w.Events.After(ctx, q, w.TenantID, after, watchPage)
			if err != nil {
				return err
			}
			full = len(evs) == watchPage
			for i, ev := range evs {
				after = seqs[i]
				if ev.ResourceType != w.ResourceType || (w.Only != "" && ev.ResourceID != w.Only) {
					continue
				}
				row, ok, err := w.Load(ctx, q, ev.ResourceID)
				if err != nil {
					return err
				}
				if !ok {
					continue
				}
				out = append(out, w.Message(ev.Type, row, fmt.Sprint(seqs[i])))
				rows = append(rows, row)
			}
			return nil
		}); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return env.Fail(ctx, err)
		}
		// A long watch follows policy changes: the scope and the projects
		// are decided again every WatchRecheck, after the read, so rows
		// written after a re-check was due are never sent on the old
		// decisions.
		if err := rf.Recheck(ctx); err != nil {
			return err
		}
		for i, o := range out {
			tenantID, projectID := w.Owner(rows[i])
			ok, err := rf.Readable(ctx, tenantID, projectID)
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			if err := w.Send(o); err != nil {
				return err
			}
		}
		if full {
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-ticker.C:
		}
	}
}
