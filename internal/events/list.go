package events

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

// ListDefaultPageSize is List's page when the request names none: smaller
// than other lists' because an event carries its data.
const ListDefaultPageSize = 50

// List returns the stored events, newest first, a page at a time. It reads
// only what a watch would serve (events_visible) and decides the same
// resource as Watch, as the read action events.list.
func (s *Service) List(ctx context.Context, req *connect.Request[apiv1.ListEventsRequest]) (*connect.Response[apiv1.ListEventsResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	if msg.GetTenant() != "" {
		vs.Ref("tenant", msg.GetTenant(), "tnt")
	}
	if len(msg.GetTypePrefixes()) > 32 {
		vs.Add("type_prefixes", "at most 32 prefixes")
	}
	for _, p := range msg.GetTypePrefixes() {
		if p == "" || len(p) > 100 {
			vs.Add("type_prefixes", "a prefix must be 1 to 100 characters, got %q", p)
			break
		}
	}
	vs.MaxLen("resource_type", msg.GetResourceType(), 100)
	vs.MaxLen("resource_id", msg.GetResourceId(), 200)
	vs.PageSize("page_size", msg.GetPageSize())
	var since, until time.Time
	if msg.Since != nil {
		if err := msg.GetSince().CheckValid(); err != nil {
			vs.Add("since", "is not a valid time")
		} else {
			since = msg.GetSince().AsTime()
		}
	}
	if msg.Until != nil {
		if err := msg.GetUntil().CheckValid(); err != nil {
			vs.Add("until", "is not a valid time")
		} else {
			until = msg.GetUntil().AsTime()
		}
	}
	if !since.IsZero() && !until.IsZero() && !until.After(since) {
		vs.Add("until", "must be after since (%s), got %s", since.Format(time.RFC3339Nano), until.Format(time.RFC3339Nano))
	}
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	// The token is bound to the filters: continuing it with others would
	// silently skip events.
	filter := strings.Join([]string{msg.GetTenant(), strings.Join(msg.GetTypePrefixes(), ","), msg.GetResourceType(), msg.GetResourceId(),
		timeKey(since), timeKey(until)}, "/")
	tok, err := envelope.DecodePageToken("page_token", msg.GetPageToken(), filter)
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	f := ListFilter{TypePrefixes: msg.GetTypePrefixes(), ResourceType: msg.GetResourceType(), ResourceID: msg.GetResourceId(),
		Since: since, Until: until, Limit: ListDefaultPageSize + 1}
	if n := msg.GetPageSize(); n > 0 {
		f.Limit = int(n) + 1
	}
	if tok != "" {
		n, err := strconv.ParseInt(tok, 10, 64)
		if err != nil || n <= 0 {
			return nil, s.env.Fail(ctx, envelope.Invalid(envelope.Violation{Field: "page_token", Reason: "is not a token this server issued"}))
		}
		f.Before = n
	}
	if f.TenantID, _, err = s.authorizeStream(ctx, msg.GetTenant()); err != nil {
		return nil, err
	}
	f.AllTenants = f.TenantID == ""
	var evs []Stored
	if err := s.env.Resolve(ctx, "events", func(ctx context.Context, q store.Querier) (err error) {
		evs, err = ListBefore(ctx, q, f)
		if errors.Is(err, ErrUnknownCursor) {
			return envelope.Invalid(envelope.Violation{Field: "page_token", Reason: "names an event no longer stored (pruned by the outbox retention); list again without it"})
		}
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.ListEventsResponse{}
	for i, ev := range evs {
		if i == f.Limit-1 {
			out.NextPageToken = envelope.EncodePageToken(strconv.FormatInt(evs[i-1].Seq, 10), filter)
			break
		}
		out.Events = append(out.Events, Proto(ev))
	}
	return connect.NewResponse(out), nil
}

func timeKey(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}
