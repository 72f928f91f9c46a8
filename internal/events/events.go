// Package events is the transactional outbox: events written in the same
// transaction as the mutation that caused them, served in commit order to
// EventService.Watch streams that resume from a cursor.
//
// It must never publish an event whose transaction did not commit.
package events

import (
	"context"
	"embed"
	"encoding/json"
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

// outboxLockKey is the advisory lock that orders outbox writers on
// PostgreSQL; SQLite's single writer orders them already.
const outboxLockKey = 0x6263_6f75_7462 // "bcoutb"

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

// Insert writes events in tx and wakes local watchers after commit.
func Insert(ctx context.Context, tx store.Tx, hub *Hub, evs []envelope.Event) error {
	if tx.Dialect() == store.Postgres {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(outboxLockKey)); err != nil {
			return err
		}
	}
	for _, ev := range evs {
		data, err := json.Marshal(ev.Data)
		if err != nil {
			return err
		}
		if ev.Data == nil {
			data = []byte("{}")
		}
		if _, err := tx.Exec(ctx, `INSERT INTO events (type, tenant_id, resource_type, resource_id, time, data) VALUES ($1, $2, $3, $4, $5, $6)`,
			ev.Type, ev.TenantID, ev.ResourceType, ev.ResourceID, ev.Time, string(data)); err != nil {
			return err
		}
	}
	if hub != nil {
		tx.AfterCommit(hub.Notify)
	}
	return nil
}

// Stored is an event as read back, with its cursor.
type Stored struct {
	Seq int64
	envelope.Event
}

// ListAfter returns up to limit events after seq, of one tenant unless
// allTenants.
func ListAfter(ctx context.Context, q store.Querier, tenantID string, allTenants bool, after int64, limit int) ([]Stored, error) {
	rows, err := q.Query(ctx, `SELECT seq, type, tenant_id, resource_type, resource_id, time, data FROM events
		WHERE seq > $1 AND ($2 OR tenant_id = $3) ORDER BY seq LIMIT $4`, after, allTenants, tenantID, limit)
	if err != nil {
		return nil, err
	}
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

// LastSeq returns the newest event's cursor (0 when there is none).
func LastSeq(ctx context.Context, q store.Querier) (int64, error) {
	var seq int64
	err := q.QueryRow(ctx, `SELECT COALESCE(MAX(seq), 0) FROM events`).Scan(&seq)
	return seq, err
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
	if msg.GetTenant() != "" {
		vs.Ref("tenant", msg.GetTenant(), "tnt")
	}
	var after int64
	if msg.GetAfter() != "" {
		n, err := strconv.ParseInt(msg.GetAfter(), 10, 64)
		if err != nil || n < 0 {
			vs.Add("after", "must be an event id (a non-negative integer), got %q", msg.GetAfter())
		}
		after = n
	}
	if len(msg.GetTypePrefixes()) > 32 {
		vs.Add("type_prefixes", "at most 32 prefixes")
	}
	if err := vs.Err(); err != nil {
		return s.env.Fail(ctx, err)
	}
	res := tenancy.PlatformResource()
	var tenantID string
	if msg.GetTenant() != "" {
		var (
			t      tenancy.Tenant
			tfound bool
		)
		if err := s.env.Resolve(ctx, "tenant", func(ctx context.Context, q store.Querier) (err error) {
			t, tfound, err = tenancy.LookupTenant(ctx, q, msg.GetTenant())
			return err
		}); err != nil {
			return s.env.Fail(ctx, err)
		}
		res = iam.Resource{Type: "EventStream", ID: "unknown"}
		if tfound {
			res = iam.Resource{Type: "EventStream", ID: t.ID, TenantID: t.ID}
		}
		if err := s.env.AuthorizeRead(ctx, res); err != nil {
			return err
		}
		if !tfound {
			return s.env.Fail(ctx, envelope.NotFound("tenant", msg.GetTenant()))
		}
		tenantID = t.ID
	} else if err := s.env.AuthorizeRead(ctx, res); err != nil {
		return err
	}
	if msg.GetAfter() == "" {
		if err := s.env.Resolve(ctx, "events", func(ctx context.Context, q store.Querier) (err error) {
			after, err = LastSeq(ctx, q)
			return err
		}); err != nil {
			return s.env.Fail(ctx, err)
		}
	}
	// The header goes out now so a client knows the watch is established
	// before the first event.
	if err := stream.Send(nil); err != nil {
		return err
	}
	ticker := time.NewTicker(s.poll)
	defer ticker.Stop()
	// A long watch follows policy changes: the stream is decided again
	// every WatchRecheck and ends with PERMISSION_DENIED once refused.
	rf := s.env.NewReadFilter(res)
	for {
		wake := s.hub.Wait()
		var batch []Stored
		if err := s.env.Resolve(ctx, "events", func(ctx context.Context, q store.Querier) (err error) {
			batch, err = ListAfter(ctx, q, tenantID, msg.GetTenant() == "", after, 500)
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
			if !matches(ev.Type, msg.GetTypePrefixes()) {
				continue
			}
			if err := stream.Send(&apiv1.WatchEventsResponse{Event: Proto(ev)}); err != nil {
				return err
			}
		}
		if len(batch) == 500 {
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.hub.stopped:
			return nil
		case <-wake:
		case <-ticker.C:
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
