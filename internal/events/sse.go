package events

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/envelope"
)

// SSEPath is where the Server-Sent Events stream is served.
const SSEPath = "/v1/events/stream"

// MaxSSETypes bounds a stream's type filter.
const MaxSSETypes = 32

// SSE serves GET /v1/events/stream: the events EventService.Watch serves,
// decided and tenant-scoped the same way, as Server-Sent Events. Query
// parameters: tenant (name or id; empty: every tenant, platform admins),
// types (comma-separated event types or globs, reservation.*), after (a
// cursor; the Last-Event-ID header wins). Each event is one frame with its
// id, its type as the event name and its JSON as data; a comment line
// (": heartbeat") goes out every heartbeat without events so proxies keep
// the connection and clients notice a dead one.
func (s *Service) SSE(ctx context.Context, w http.ResponseWriter, r *http.Request, heartbeat time.Duration) error {
	flusher, ok := w.(http.Flusher)
	if !ok {
		return envelope.Errorf(envelope.CodeInternal, "streaming is not supported by this connection")
	}
	q := r.URL.Query()
	var vs envelope.Violations
	for k := range q {
		if k != "tenant" && k != "types" && k != "after" {
			vs.Add(k, "is not a parameter of this stream (tenant, types, after)")
		}
	}
	var globs []string
	if t := q.Get("types"); t != "" {
		globs = strings.Split(t, ",")
	}
	if len(globs) > MaxSSETypes {
		vs.Add("types", "at most %d types", MaxSSETypes)
	}
	for _, g := range globs {
		if _, err := path.Match(g, ""); err != nil || g == "" {
			vs.Add("types", "%q is not an event type or glob", g)
		}
	}
	after, field := q.Get("after"), "after"
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		after, field = id, "Last-Event-ID"
	}
	send := func(frame string) error {
		if _, err := fmt.Fprint(w, frame); err != nil {
			return err
		}
		flusher.Flush()
		return nil
	}
	return s.follow(ctx, followParams{
		Tenant: q.Get("tenant"), After: after, AfterField: field, Violations: vs,
		Match: func(typ string) bool {
			if len(globs) == 0 {
				return true
			}
			for _, g := range globs {
				if ok, _ := path.Match(g, typ); ok {
					return true
				}
			}
			return false
		},
		Ready: func() error {
			h := w.Header()
			h.Set("Content-Type", "text/event-stream")
			h.Set("Cache-Control", "no-cache")
			h.Set("X-Accel-Buffering", "no")
			w.WriteHeader(http.StatusOK)
			// Tell clients to wait a few seconds before reconnecting.
			return send("retry: 3000\n: connected\n\n")
		},
		Send: func(ev Stored) error {
			b, err := json.Marshal(sseEvent(ev))
			if err != nil {
				return err
			}
			return send(fmt.Sprintf("id: %d\nevent: %s\ndata: %s\n\n", ev.Seq, ev.Type, b))
		},
		Heartbeat:      func() error { return send(": heartbeat\n\n") },
		HeartbeatEvery: heartbeat,
	})
}

// SSEError writes an error frame on a stream that has started.
func SSEError(w http.ResponseWriter, e envelope.HTTPError) {
	b, _ := json.Marshal(e)
	_, _ = fmt.Fprintf(w, "event: error\ndata: %s\n\n", b)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
}

// sseEvent is an event's JSON on the stream: the fields of the API's Event.
func sseEvent(ev Stored) map[string]any {
	data := ev.Data
	if data == nil {
		data = map[string]any{}
	}
	return map[string]any{
		"id": fmt.Sprint(ev.Seq), "type": ev.Type, "tenantId": ev.TenantID, "resourceType": ev.ResourceType,
		"resourceId": ev.ResourceID, "time": ev.Time.UTC().Format(time.RFC3339Nano), "data": data,
	}
}
