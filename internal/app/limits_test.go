package app_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

// ltDenyRows counts the deny rows of one principal by result.
func ltDenyRows(t *testing.T, cp *bctest.ControlPlane, principalID string) map[string]int {
	t.Helper()
	out := map[string]int{}
	err := cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		rows, err := tx.Query(ctx, `SELECT result, count(*) FROM audit_log WHERE principal_id = $1 AND decision = 'deny' GROUP BY result`, principalID)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				r string
				n int
			)
			if err := rows.Scan(&r, &n); err != nil {
				return err
			}
			out[r] = n
		}
		return rows.Err()
	})
	require.NoError(t, err)
	return out
}

// TestRefusalAuditIsBounded: refusals are written into the targeted
// tenant's audit log, so one key could once fill a victim's log without
// bound. Each principal now writes at most the limit per window, plus one
// row saying the rest went unrecorded, while every call is still refused
// and another principal's refusals are still recorded.
func TestRefusalAuditIsBounded(t *testing.T) {
	t.Parallel()
	const limit = 3
	cp := bctest.NewControlPlane(t, func(c *app.Config) {
		c.RefusalAuditLimit, c.RefusalAuditWindow = limit, time.Minute
	})
	ctx := context.Background()
	admin := cp.Admin()
	sfTenant(t, admin, "victim")
	sfTenant(t, admin, "evil")
	floodSecret, flood := sfKey(t, admin, "evil", "admin", 0)
	otherSecret, other := sfKey(t, admin, "evil", "member", 0)
	attempt := func(secret string) {
		t.Helper()
		_, err := cp.Client(secret).Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "victim", Name: "x"}))
		sfRequireCode(t, err, "PERMISSION_DENIED")
	}

	for range 20 {
		attempt(floodSecret)
	}
	require.Equal(t, map[string]int{"PERMISSION_DENIED": limit, envelope.ResultAuditLimited: 1}, ltDenyRows(t, cp, flood.GetId()))

	for range 2 {
		attempt(otherSecret)
	}
	require.Equal(t, map[string]int{"PERMISSION_DENIED": 2}, ltDenyRows(t, cp, other.GetId()), "another principal is recorded")

	// A new window records again.
	cp.Clock.Advance(time.Minute)
	attempt(floodSecret)
	require.Equal(t, map[string]int{"PERMISSION_DENIED": limit + 1, envelope.ResultAuditLimited: 1}, ltDenyRows(t, cp, flood.GetId()))
}

// ltWatch opens an events watch from the start of the log and returns once
// the first event arrived, so the stream is known to be open on the server.
// Events keep arriving on the channel; end is closed with the watch.
func ltWatch(t *testing.T, c *client.Client, tenant string) (events <-chan *apiv1.Event, stop func(), end <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	evc := make(chan *apiv1.Event, 64)
	endc := make(chan error, 1)
	go func() {
		endc <- c.Watch(ctx, &apiv1.WatchEventsRequest{Tenant: tenant, After: "0"}, func(ev *apiv1.Event) error {
			select {
			case evc <- ev:
			default:
			}
			return nil
		})
	}()
	select {
	case <-evc:
	case err := <-endc:
		cancel()
		t.Fatalf("watch ended before its first event: %v", err)
	}
	t.Cleanup(cancel)
	return evc, cancel, endc
}

// TestPrincipalRateLimit: a principal over its request rate is refused
// RESOURCE_EXHAUSTED (machine code RATE_LIMITED) with a retry delay and a
// Retry-After header, while another principal is unaffected; the bucket
// refills on the (simulated) clock.
func TestPrincipalRateLimit(t *testing.T) {
	t.Parallel()
	const burst = 5
	cp := bctest.NewControlPlane(t, func(c *app.Config) {
		c.Limits = envelope.Limits{RequestRate: 1, RequestBurst: burst}
	})
	ctx := context.Background()
	admin := cp.Admin()
	sfTenant(t, admin, "acme")
	hotSecret, _ := sfKey(t, admin, "acme", "viewer", 0)
	coolSecret, _ := sfKey(t, admin, "acme", "viewer", 0)
	hot, cool := cp.Client(hotSecret), cp.Client(coolSecret)
	whoami := func(c *client.Client) error {
		_, err := c.Identity.WhoAmI(ctx, connect.NewRequest(&apiv1.WhoAmIRequest{}))
		return err
	}

	for i := range burst {
		require.NoError(t, whoami(hot), "request %d of the burst", i)
	}
	err := whoami(hot)
	sfRequireCode(t, err, "RATE_LIMITED")
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err))
	require.Equal(t, time.Second, envelope.RetryDelayOf(err))
	var ce *connect.Error
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "1", ce.Meta().Get("Retry-After"))
	// Refused calls take no token: the wait does not grow.
	sfRequireCode(t, whoami(hot), "RATE_LIMITED")

	require.NoError(t, whoami(cool), "another principal has its own bucket")

	cp.Clock.Advance(time.Second)
	require.NoError(t, whoami(hot), "a token came back")
	sfRequireCode(t, whoami(hot), "RATE_LIMITED")
}

// TestPrincipalStreamLimit: a principal holding its cap of watch streams
// is refused another (RESOURCE_EXHAUSTED, TOO_MANY_STREAMS); another
// principal is not, and closing one stream frees its slot.
func TestPrincipalStreamLimit(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t, func(c *app.Config) { c.Limits = envelope.Limits{MaxStreams: 2} })
	admin := cp.Admin()
	sfTenant(t, admin, "acme")
	otherSecret, _ := sfKey(t, admin, "acme", "viewer", 0)

	_, stop1, end1 := ltWatch(t, admin, "acme")
	ltWatch(t, admin, "acme")
	err := admin.Watch(context.Background(), &apiv1.WatchEventsRequest{Tenant: "acme", After: "0"}, func(*apiv1.Event) error { return nil })
	sfRequireCode(t, err, "TOO_MANY_STREAMS")
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err))
	require.Positive(t, envelope.RetryDelayOf(err))

	ltWatch(t, cp.Client(otherSecret), "acme")

	stop1()
	<-end1
	// The server ends the stream after the client goes: poll until the slot
	// is back.
	for {
		ctx, cancel := context.WithCancel(context.Background())
		opened := make(chan struct{})
		errc := make(chan error, 1)
		go func() {
			errc <- admin.Watch(ctx, &apiv1.WatchEventsRequest{Tenant: "acme", After: "0"}, func(*apiv1.Event) error {
				select {
				case <-opened:
				default:
					close(opened)
				}
				return nil
			})
		}()
		select {
		case <-opened:
			cancel()
			return
		case err := <-errc:
			cancel()
			sfRequireCode(t, err, "TOO_MANY_STREAMS")
		}
	}
}

// ltServe serves cp's API through App.ServeAPI (the server serve runs, with
// its deadlines and connection cap) on a loopback port.
func ltServe(t *testing.T, cp *bctest.ControlPlane) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cp.App.ServeAPI(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return ln.Addr().String()
}

// ltDial opens a raw connection; its reads fail rather than hang if the
// server never closes it (the failure this test guards against).
func ltDial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.SetReadDeadline(time.Now().Add(time.Minute)))
	return c
}

// ltRequireClosed reads until the server closes c.
func ltRequireClosed(t *testing.T, c net.Conn, what string) {
	t.Helper()
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: the server kept the connection open", what)
	}
}

// TestSlowAndIdleConnections: a client dribbling a body, one idling after
// a request and one that never sends a header are all cut off at their
// (small, test-configured) deadlines, unauthenticated, while the API keeps
// answering others and a watch stream — exempt from the body deadline —
// outlives them all.
func TestSlowAndIdleConnections(t *testing.T) {
	t.Parallel()
	const deadline = 200 * time.Millisecond
	cp := bctest.NewControlPlane(t, func(c *app.Config) {
		c.RequestBodyTimeout, c.IdleTimeout, c.ReadHeaderTimeout = deadline, deadline, deadline
	})
	addr := ltServe(t, cp)
	admin := client.New("http://"+addr, cp.AdminKey)
	ctx := context.Background()
	events, _, _ := ltWatch(t, admin, "")

	// A body that never finishes: one byte of ten.
	slow := ltDial(t, addr)
	_, err := fmt.Fprintf(slow, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n{",
		apiv1connect.IdentityServiceWhoAmIProcedure)
	require.NoError(t, err)

	// Idle after a request.
	idle := ltDial(t, addr)
	_, err = fmt.Fprint(idle, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	br := bufio.NewReader(idle)
	res, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	_, err = io.Copy(io.Discard, res.Body)
	require.NoError(t, err)
	require.NoError(t, res.Body.Close())
	require.Equal(t, http.StatusOK, res.StatusCode)

	// Silent: connects and sends nothing.
	silent := ltDial(t, addr)

	// Others are served meanwhile.
	_, err = admin.Identity.WhoAmI(ctx, connect.NewRequest(&apiv1.WhoAmIRequest{}))
	require.NoError(t, err)

	ltRequireClosed(t, slow, "slow body")
	_, err = io.Copy(io.Discard, br)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "idle: the server kept the connection open")
	ltRequireClosed(t, silent, "silent")

	// The watch outlived the body deadline: it still delivers.
	sfTenant(t, admin, "after-the-deadlines")
	for ev := range events {
		if ev.GetType() == "tenant.created" && ev.GetData().GetFields()["name"].GetStringValue() == "after-the-deadlines" {
			break
		}
	}
	_, err = admin.Identity.WhoAmI(ctx, connect.NewRequest(&apiv1.WhoAmIRequest{}))
	require.NoError(t, err)
}

// TestConnectionCap: connections beyond MaxConnections are closed at
// accept, and a slot held comes back when its connection ends.
func TestConnectionCap(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t, func(c *app.Config) {
		c.MaxConnections = 2
		// Long enough that the held slots are not freed by a deadline.
		c.ReadHeaderTimeout, c.IdleTimeout = time.Hour, time.Hour
	})
	addr := ltServe(t, cp)
	ctx := context.Background()

	// Two connections hold both slots (accepted in order: the kernel queues
	// them first in, first out).
	first := ltDial(t, addr)
	second := ltDial(t, addr)
	_, err := fmt.Fprint(second, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	res, err := http.ReadResponse(bufio.NewReader(second), nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode)
	// Closing the body does not close the connection: it keeps its slot.
	require.NoError(t, res.Body.Close())

	ltRequireClosed(t, ltDial(t, addr), "third connection")

	require.NoError(t, first.Close())
	// The server notices the close on its next read: poll until a request
	// gets through.
	admin := client.New("http://"+addr, cp.AdminKey, client.WithHTTPClient(&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}))
	for {
		if _, err := admin.Identity.WhoAmI(ctx, connect.NewRequest(&apiv1.WhoAmIRequest{})); err == nil {
			break
		}
	}
}

// ltCapture keeps every log record, at every level.
type ltCapture struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *ltCapture) Enabled(context.Context, slog.Level) bool { return true }
func (h *ltCapture) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r)
	return nil
}
func (h *ltCapture) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *ltCapture) WithGroup(string) slog.Handler      { return h }

// TestClientRefusalsLogAtDebug: a refusal of the caller's making (here the
// ALREADY_EXISTS every `dev --sim-nodes` restart once met) was logged at
// INFO besides its access line; its message goes to DEBUG, the access line
// keeps the code at INFO.
func TestClientRefusalsLogAtDebug(t *testing.T) {
	t.Parallel()
	h := &ltCapture{}
	cp := bctest.NewControlPlane(t, func(c *app.Config) { c.Logger = slog.New(h) })
	sfTenant(t, cp.Admin(), "acme")
	_, err := cp.Admin().Tenants.Create(context.Background(), connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	sfRequireCode(t, err, "ALREADY_EXISTS")

	h.mu.Lock()
	defer h.mu.Unlock()
	levels := map[string][]slog.Level{}
	for _, r := range h.records {
		code := ""
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "code" {
				code = a.Value.String()
			}
			return true
		})
		if code == "ALREADY_EXISTS" {
			levels[r.Message] = append(levels[r.Message], r.Level)
		}
	}
	require.Equal(t, map[string][]slog.Level{"request refused": {slog.LevelDebug}, "request": {slog.LevelInfo}}, levels)
}
