package app_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
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
