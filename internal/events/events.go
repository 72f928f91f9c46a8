// Package events is the transactional outbox: events written in the same
// transaction as the mutation that caused them, served in commit order to
// EventService.Watch streams that resume from a cursor.
//
// It must never publish an event whose transaction did not commit.
package events

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

//go:embed migrations
var migrationsFS embed.FS

// Migrations returns the module's tables.
func Migrations() store.Migrations {
	return store.Embedded("events", migrationsFS)
}

// Commit order without a writer lock.
//
// Every event row carries the id of the transaction that wrote it (xid: the
// column default pg_current_xact_id() on PostgreSQL, always 0 on SQLite),
// and the outbox is read in (xid, seq) order, only below a horizon: on
// PostgreSQL the xmin of the reading statement's own snapshot, the oldest
// transaction still running when it started. Why a watcher resuming from a
// cursor neither misses nor repeats an event:
//
//   - Every transaction with an xid below xmin has ended: its events are
//     visible to this very snapshot if it committed, and never will be if it
//     rolled back.
//   - No transaction can later write an event with an xid below xmin:
//     transaction ids are handed out in increasing order, and every one
//     handed out after this snapshot is at or above its xmax > xmin (the
//     column holds the top-level id even inside a savepoint).
//
// So the events below the horizon, sorted by (xid, seq), are final: a prefix
// of the order all events will ever have. A read returns the next events of
// that prefix after the cursor; the cursor only moves over events it
// returned, and since every read's prefix is final, a later read can only
// continue where the cursor stands (nothing can appear behind it), so each
// event is served exactly once. Ordering by seq alone would
// not do: a transaction still open holds a smaller seq than one that
// committed after it, and a watcher that moved past the later one would skip
// it. An event of a transaction that is still open (or of any older open
// transaction) simply waits until it ends.
//
// The public cursor stays the event's seq (a stable decimal id); a read
// looks up its xid, so (xid, seq) is the position resumed from. Ids are
// unique but, across concurrent transactions, not increasing.
//
// The one dialect difference is the view events_visible that readers read
// (migrations/<dialect>/0002): on PostgreSQL it applies the horizon; SQLite
// has one writer, so seq order is commit order and there is no horizon, and
// xid 0 on every row keeps one query for both stores.

// ErrUnknownCursor: the cursor names no stored event, so there is no
// position in the outbox to resume from.
var ErrUnknownCursor = errors.New("no event with this id")

// Hub wakes watchers in this process when events commit, and ends them
// when the server shuts down.
type Hub struct {
	mu       sync.Mutex
	ch       chan struct{}
	stopOnce sync.Once
	stopped  chan struct{}
}

// NewHub returns a Hub.
func NewHub() *Hub { return &Hub{ch: make(chan struct{}), stopped: make(chan struct{})} }

// Shutdown ends every watch stream: a watch never finishes on its own, and a
// graceful shutdown must not wait its whole grace period for one. Clients
// resume from their last event id.
func (h *Hub) Shutdown() { h.stopOnce.Do(func() { close(h.stopped) }) }

// Notify wakes every current waiter.
func (h *Hub) Notify() {
	h.mu.Lock()
	close(h.ch)
	h.ch = make(chan struct{})
	h.mu.Unlock()
}

// Wait returns a channel closed at the next Notify.
func (h *Hub) Wait() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ch
}

// Stored is an event as read back, with its cursor.
type Stored struct {
	Seq int64
	envelope.Event
}

// Service serves the EventService API.
type Service struct {
	env  *envelope.Envelope
	hub  *Hub
	poll time.Duration
}

var _ apiv1connect.EventServiceHandler = (*Service)(nil)

// NewService returns the event handlers. Watchers wake on hub notifications
// from this process and poll every interval for other replicas' commits.
func NewService(env *envelope.Envelope, hub *Hub, poll time.Duration) *Service {
	if poll <= 0 {
		poll = time.Second
	}
	return &Service{env: env, hub: hub, poll: poll}
}

// Watch streams events after the cursor, then live ones.
func (s *Service) Watch(ctx context.Context, req *connect.Request[apiv1.WatchEventsRequest], stream *connect.ServerStream[apiv1.WatchEventsResponse]) error {
	msg := req.Msg
	var vs envelope.Violations
	if len(msg.GetTypePrefixes()) > 32 {
		vs.Add("type_prefixes", "at most 32 prefixes")
	}
	return s.follow(ctx, followParams{
		Tenant: msg.GetTenant(), After: msg.GetAfter(), AfterField: "after", Violations: vs,
		Match: func(typ string) bool { return matches(typ, msg.GetTypePrefixes()) },
		// The header goes out now so a client knows the watch is
		// established before the first event.
		Ready: func() error { return stream.Send(nil) },
		Send:  func(ev Stored) error { return stream.Send(&apiv1.WatchEventsResponse{Event: Proto(ev)}) },
	})
}

// authorizeStream decides a read of a tenant's event stream (name or id;
// empty: the caller's own tenant for a tenant's key, as every tenant-scoped
// listing defaults, or every tenant for the platform's) and returns the
// tenant's id ("" for every tenant) and the resource decided.
func (s *Service) authorizeStream(ctx context.Context, tenant string) (string, iam.Resource, error) {
	if c, _ := envelope.CallerFrom(ctx); tenant == "" && c.Principal.TenantID != "" {
		tenant = c.Principal.TenantID
	}
	if tenant == "" {
		res := tenancy.PlatformResource()
		return "", res, s.env.AuthorizeRead(ctx, res)
	}
	var (
		t      tenancy.Tenant
		tfound bool
	)
	if err := s.env.Resolve(ctx, "tenant", func(ctx context.Context, q store.Querier) (err error) {
		t, tfound, err = tenancy.LookupTenant(ctx, q, tenant)
		return err
	}); err != nil {
		return "", iam.Resource{}, s.env.Fail(ctx, err)
	}
	res := iam.Resource{Type: "EventStream", ID: "unknown"}
	if tfound {
		res = iam.Resource{Type: "EventStream", ID: t.ID, TenantID: t.ID}
	}
	if err := s.env.AuthorizeRead(ctx, res); err != nil {
		return "", res, err
	}
	if !tfound {
		return "", res, s.env.Fail(ctx, envelope.NotFound("tenant", tenant))
	}
	return t.ID, res, nil
}

// followParams is one watch of the outbox, whatever carries it (a Connect
// stream or Server-Sent Events).
type followParams struct {
	// Tenant is a name or id; empty follows every tenant (platform admins).
	Tenant string
	// After is the cursor to resume after ("" starts with new events);
	// AfterField names it in errors.
	After, AfterField string
	// Violations already found in the caller's own fields.
	Violations envelope.Violations
	Match      func(typ string) bool
	// Ready runs once the stream is decided, before the first event.
	Ready func() error
	Send  func(Stored) error
	// Heartbeat, when set, runs every HeartbeatEvery without an event.
	Heartbeat      func() error
	HeartbeatEvery time.Duration
}

// follow validates, decides (once, then again every WatchRecheck) and
// streams the events after the cursor, then live ones, until ctx ends.
func (s *Service) follow(ctx context.Context, p followParams) error {
	vs := p.Violations
	if p.Tenant != "" {
		vs.Ref("tenant", p.Tenant, "tnt")
	}
	var after int64
	if p.After != "" {
		n, err := strconv.ParseInt(p.After, 10, 64)
		if err != nil || n < 0 {
			vs.Add(p.AfterField, "must be an event id (a non-negative integer), got %q", p.After)
		}
		after = n
	}
	if err := vs.Err(); err != nil {
		return s.env.Fail(ctx, err)
	}
	tenantID, res, err := s.authorizeStream(ctx, p.Tenant)
	if err != nil {
		return err
	}
	p.Tenant = tenantID
	if p.After == "" {
		if err := s.env.Resolve(ctx, "events", func(ctx context.Context, q store.Querier) (err error) {
			after, err = LastSeq(ctx, q)
			return err
		}); err != nil {
			return s.env.Fail(ctx, err)
		}
	} else if err := s.env.Resolve(ctx, "events", func(ctx context.Context, q store.Querier) error {
		// An unknown cursor is refused before the stream starts.
		_, err := ListAfter(ctx, q, tenantID, p.Tenant == "", after, 1)
		if errors.Is(err, ErrUnknownCursor) {
			return envelope.Invalid(envelope.Violation{Field: p.AfterField, Reason: fmt.Sprintf("no event with id %d (it may have been pruned by the outbox retention)", after)})
		}
		return err
	}); err != nil {
		return s.env.Fail(ctx, err)
	}
	if err := p.Ready(); err != nil {
		return err
	}
	ticker := time.NewTicker(s.poll)
	defer ticker.Stop()
	var beat <-chan time.Time
	if p.Heartbeat != nil && p.HeartbeatEvery > 0 {
		hb := time.NewTicker(p.HeartbeatEvery)
		defer hb.Stop()
		beat = hb.C
	}
	// A long watch follows policy changes: the stream is decided again
	// every WatchRecheck and ends with PERMISSION_DENIED once refused.
	rf := s.env.NewReadFilter(res)
	for {
		wake := s.hub.Wait()
		var batch []Stored
		if err := s.env.Resolve(ctx, "events", func(ctx context.Context, q store.Querier) (err error) {
			batch, err = ListAfter(ctx, q, tenantID, p.Tenant == "", after, 500)
			if errors.Is(err, ErrUnknownCursor) {
				return envelope.Invalid(envelope.Violation{Field: p.AfterField, Reason: fmt.Sprintf("no event with id %d", after)})
			}
			return err
		}); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return s.env.Fail(ctx, err)
		}
		if err := rf.Recheck(ctx); err != nil {
			return err
		}
		for _, ev := range batch {
			after = ev.Seq
			if !p.Match(ev.Type) {
				continue
			}
			if err := p.Send(ev); err != nil {
				return err
			}
		}
		if len(batch) == 500 {
			continue
		}
	wait:
		select {
		case <-ctx.Done():
			return nil
		case <-s.hub.stopped:
			return nil
		case <-wake:
		case <-ticker.C:
		case <-beat:
			if err := p.Heartbeat(); err != nil {
				return err
			}
			goto wait
		}
	}
}

func matches(typ string, prefixes []string) bool {
	if len(prefixes) == 0 {
		return true
	}
	for _, p := range prefixes {
		if strings.HasPrefix(typ, p) {
			return true
		}
	}
	return false
}

// Proto converts a stored event for the API.
func Proto(ev Stored) *apiv1.Event {
	out := &apiv1.Event{
		Id: strconv.FormatInt(ev.Seq, 10), Type: ev.Type, TenantId: ev.TenantID, ResourceType: ev.ResourceType,
		ResourceId: ev.ResourceID, Time: timestamppb.New(ev.Time),
	}
	if s, err := structpb.NewStruct(ev.Data); err == nil {
		out.Data = s
	}
	return out
}
