package webhooks_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	"github.com/better-compute/better-compute/client/webhook"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/webhooks"
)

// received is one request a receiver got, verified.
type received struct {
	id    string // webhook-id
	event map[string]any
	sigs  string
}

// receiver is a webhook endpoint: it verifies every request with secret (at
// the control plane's clock, unless lenient) and answers 503 while down.
type receiver struct {
	t   *testing.T
	srv *httptest.Server
	clk *bctest.SimClock

	mu      sync.Mutex
	secret  string
	down    bool
	lenient bool
	got     []received
	refused int
	bad     []string
}

func newReceiver(t *testing.T, clk *bctest.SimClock) *receiver {
	r := &receiver{t: t, clk: clk}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		defer r.mu.Unlock()
		at := clk.Now()
		if r.lenient {
			// The test moves the clock while requests fly: check the
			// signature at the time it claims.
			ts, _ := strconv.ParseInt(req.Header.Get(webhook.HeaderTimestamp), 10, 64)
			at = time.Unix(ts, 0)
		}
		if err := webhook.VerifyAt(r.secret, req.Header, body, at); err != nil {
			r.bad = append(r.bad, err.Error())
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		if req.Header.Get("Content-Type") != "application/cloudevents+json" {
			r.bad = append(r.bad, "content type "+req.Header.Get("Content-Type"))
		}
		if r.down {
			r.refused++
			http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
			return
		}
		var ev map[string]any
		if err := json.Unmarshal(body, &ev); err != nil {
			r.bad = append(r.bad, err.Error())
		}
		r.got = append(r.got, received{id: req.Header.Get(webhook.HeaderID), event: ev, sigs: req.Header.Get(webhook.HeaderSignature)})
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) setSecret(s string) { r.mu.Lock(); r.secret = s; r.mu.Unlock() }
func (r *receiver) setDown(d bool)     { r.mu.Lock(); r.down = d; r.mu.Unlock() }

// types returns the types received, once per webhook-id (deliveries are at
// least once), in order, and fails on a bad request.
func (r *receiver) types() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	require.Empty(r.t, r.bad, "every request verifies")
	seen := map[string]bool{}
	var out []string
	for _, g := range r.got {
		if !seen[g.id] {
			seen[g.id] = true
			out = append(out, g.event["type"].(string))
		}
	}
	return out
}

func (r *receiver) refusedCount() int { r.mu.Lock(); defer r.mu.Unlock(); return r.refused }

type fixture struct {
	cp    *bctest.ControlPlane
	admin *client.Client
	acme  string
}

func setup(t *testing.T, opts ...bctest.ControlPlaneOption) *fixture {
	t.Helper()
	// The clock jumps hours ahead: simulated nodes beating in real time
	// must not be declared lost for it.
	opts = append([]bctest.ControlPlaneOption{func(c *app.Config) { c.UnreachableAfter, c.LostAfter = 1000*time.Hour, 2000*time.Hour }}, opts...)
	cp := bctest.NewControlPlane(t, opts...)
	f := &fixture{cp: cp, admin: cp.Admin()}
	ctx := context.Background()
	for _, name := range []string{"acme", "other"} {
		tn, err := f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: name}))
		require.NoError(t, err)
		if name == "acme" {
			f.acme = tn.Msg.GetTenant().GetId()
		}
		_, err = f.admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: name, Name: "default"}))
		require.NoError(t, err)
	}
	return f
}

func (f *fixture) key(t *testing.T, tenant, role string) string {
	t.Helper()
	k, err := f.admin.ApiKeys.Create(context.Background(), connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: tenant, Role: role}))
	require.NoError(t, err)
	return k.Msg.GetSecret()
}

func (f *fixture) create(t *testing.T, url string, types ...string) (*apiv1.Webhook, string) {
	t.Helper()
	// A new endpoint starts at the outbox's horizon, so it may be sent
	// events of transactions still open when it was created (never miss
	// one, docs/webhooks.md). On PostgreSQL the horizon is the cluster's
	// oldest open transaction: with other tests' transactions open, the
	// setup's own events (acme's default project) could still be ahead of
	// it. Wait until they are behind, so a test sees only its own events.
	bctest.WaitFor(t, "the setup's events below the outbox horizon", func() bool {
		var all, visible int
		require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
			if err := tx.QueryRow(ctx, `SELECT COUNT(*) FROM events`).Scan(&all); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT COUNT(*) FROM events_visible`).Scan(&visible)
		}))
		return all == visible
	})
	res, err := f.admin.Webhooks.Create(context.Background(), connect.NewRequest(&apiv1.CreateWebhookRequest{Tenant: "acme", Url: url, Types: types}))
	require.NoError(t, err)
	require.Regexp(t, `^whsec_[A-Za-z0-9+/]+=*$`, res.Msg.GetSecret())
	return res.Msg.GetWebhook(), res.Msg.GetSecret()
}

func (f *fixture) head(t *testing.T, webhookID string) (webhooks.Delivery, bool) {
	t.Helper()
	var (
		d  webhooks.Delivery
		ok bool
	)
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		var err error
		d, err = webhooks.DeliveryHead(ctx, tx, webhookID)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		ok = err == nil
		return err
	}))
	return d, ok
}

// drive moves the clock to each retry of the endpoint's head delivery and
// waits for its attempt, until done.
func (f *fixture) drive(t *testing.T, webhookID string, done func() bool) {
	t.Helper()
	for !done() {
		d, ok := f.head(t, webhookID)
		if !ok || d.Attempts == 0 {
			// Nothing pending or the first attempt is on its way.
			bctest.WaitFor(t, "the first attempt or the end", func() bool {
				d2, ok := f.head(t, webhookID)
				return done() || (ok && d2.Attempts > 0)
			})
			continue
		}
		if now := f.cp.Clock.Now(); d.NextAttemptTime.After(now) {
			f.cp.Clock.Set(d.NextAttemptTime)
		}
		bctest.WaitFor(t, "the retry of "+d.ID, func() bool {
			d2, ok := f.head(t, webhookID)
			return done() || !ok || d2.ID != d.ID || d2.Attempts > d.Attempts
		})
	}
}

func code(err error) string { return client.Code(err) }

// TestReservationLifeIsSignedAndDelivered: a receiver verifies the
// signature of every event of a reservation's life, create → active →
// release, each a CloudEvent of acme.
func TestReservationLifeIsSignedAndDelivered(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rcv := newReceiver(t, f.cp.Clock)
	_, secret := f.create(t, rcv.srv.URL+"/hooks", "reservation.*")
	rcv.setSecret(secret)

	sim, err := bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		Template: bctest.FakeDaemonConfig{Gateway: f.cp.GatewayAddr}, Root: t.TempDir(), N: 1,
		Token: func(ctx context.Context, i int) (string, error) {
			tok, err := f.admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "default"}))
			return tok.Msg.GetToken(), err
		},
	})
	require.NoError(t, err)
	t.Cleanup(sim.Stop)
	pl, err := f.admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "h100",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}}}))
	require.NoError(t, err)
	bctest.WaitFor(t, "the node's GPUs in the pool", func() bool {
		c, err := f.admin.Capacity.Summary(ctx, connect.NewRequest(&apiv1.CapacitySummaryRequest{Tenant: "acme"}))
		return err == nil && c.Msg.String() != "" && countGPUs(t, f) == 8
	})
	member := f.cp.Client(f.key(t, "acme", "member"))
	res, err := member.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: "acme",
		Pool: pl.Msg.GetPool().GetId(), Gpus: 2, DurationSeconds: 3600}))
	require.NoError(t, err)
	id := res.Msg.GetReservation().GetId()
	bctest.WaitFor(t, "the reservation active", func() bool {
		r, err := member.Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "acme", Reservation: id}))
		return err == nil && r.Msg.GetReservation().GetState() == "active"
	})
	_, err = member.Reservations.Release(ctx, connect.NewRequest(&apiv1.ReleaseReservationRequest{Tenant: "acme", Reservation: id}))
	require.NoError(t, err)
	bctest.WaitFor(t, "the release delivered", func() bool {
		types := rcv.types()
		return len(types) > 0 && types[len(types)-1] == "reservation.released"
	})
	require.Equal(t, []string{"reservation.created", "reservation.placed", "reservation.binding", "reservation.active",
		"reservation.released"}, rcv.types())
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	for _, g := range rcv.got {
		require.Equal(t, "1.0", g.event["specversion"])
		require.Equal(t, "/tenants/"+f.acme, g.event["source"])
		require.Equal(t, "Reservation/"+id, g.event["subject"])
		require.Equal(t, f.acme, g.event["tenantid"])
		require.Regexp(t, `^[0-9]+$`, g.event["id"], "the CloudEvent id is the outbox cursor")
	}
}

func countGPUs(t *testing.T, f *fixture) int {
	var n int
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM atoms a JOIN node_pools np ON np.node_id = a.node_id WHERE a.kind = 'gpu'`).Scan(&n)
	}))
	return n
}

// TestReceiverDownGetsEveryEventInOrder: a receiver that answers 503 for a
// while gets every event, in order, once it recovers; the retries run on
// the control plane's clock.
func TestReceiverDownGetsEveryEventInOrder(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rcv := newReceiver(t, f.cp.Clock)
	rcv.lenient = true
	wh, secret := f.create(t, rcv.srv.URL, "project.*")
	rcv.setSecret(secret)
	rcv.setDown(true)
	var want []string
	for i := range 5 {
		_, err := f.admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "p" + strconv.Itoa(i)}))
		require.NoError(t, err)
		want = append(want, "project.created")
	}
	// Three refused attempts of the first event; the others wait behind it.
	// Done when the third is recorded, not when the receiver saw it: the
	// worker writes the attempt after the answer arrives.
	f.drive(t, wh.GetId(), func() bool {
		d, ok := f.head(t, wh.GetId())
		return ok && d.Attempts >= 3
	})
	require.Equal(t, 3, rcv.refusedCount())
	require.Empty(t, rcv.types(), "nothing got through while down")
	d, ok := f.head(t, wh.GetId())
	require.True(t, ok)
	require.Equal(t, 3, d.Attempts)
	require.Equal(t, 503, d.LastStatus)
	rcv.setDown(false)
	// Done when the fifth success is recorded, not when the receiver saw
	// it: as above, the worker writes the outcome after the answer.
	f.drive(t, wh.GetId(), func() bool {
		if len(rcv.types()) < 5 {
			return false
		}
		dl, err := f.admin.Webhooks.ListDeliveries(ctx, connect.NewRequest(&apiv1.ListWebhookDeliveriesRequest{Tenant: "acme", Webhook: wh.GetId()}))
		require.NoError(t, err)
		for _, d := range dl.Msg.GetDeliveries() {
			if d.GetState() != webhooks.DeliverySucceeded {
				return false
			}
		}
		return len(dl.Msg.GetDeliveries()) == 5
	})
	require.Equal(t, want, rcv.types())
	// Their order is the projects' order.
	rcv.mu.Lock()
	var names []string
	seen := map[string]bool{}
	for _, g := range rcv.got {
		if !seen[g.id] {
			seen[g.id] = true
			names = append(names, g.event["subject"].(string))
		}
	}
	rcv.mu.Unlock()
	require.Len(t, names, 5)
	ps, err := f.admin.Projects.List(ctx, connect.NewRequest(&apiv1.ListProjectsRequest{Tenant: "acme"}))
	require.NoError(t, err)
	byName := map[string]string{}
	for _, p := range ps.Msg.GetProjects() {
		byName[p.GetName()] = "Project/" + p.GetId()
	}
	for i, n := range names {
		require.Equal(t, byName["p"+strconv.Itoa(i)], n, "event %d", i)
	}
	dl, err := f.admin.Webhooks.ListDeliveries(ctx, connect.NewRequest(&apiv1.ListWebhookDeliveriesRequest{Tenant: "acme", Webhook: wh.GetId()}))
	require.NoError(t, err)
	require.Len(t, dl.Msg.GetDeliveries(), 5)
	require.Equal(t, int32(4), dl.Msg.GetDeliveries()[0].GetAttempts(), "three refusals, then success")
	for _, d := range dl.Msg.GetDeliveries() {
		require.Equal(t, webhooks.DeliverySucceeded, d.GetState())
	}
}

// TestDeadLetterDisablesAndRedelivers: an endpoint failing for a day
// dead-letters its delivery, is disabled, and its tenant hears of it by a
// webhook.disabled event; enabled again, a redelivery goes through.
func TestDeadLetterDisablesAndRedelivers(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rcv := newReceiver(t, f.cp.Clock)
	rcv.lenient = true
	// A second endpoint of acme hears about the first being disabled.
	watcher := newReceiver(t, f.cp.Clock)
	watcher.lenient = true
	_, secret2 := f.create(t, watcher.srv.URL, "webhook.disabled")
	watcher.setSecret(secret2)
	wh, secret := f.create(t, rcv.srv.URL, "webhook.test")
	rcv.setSecret(secret)
	rcv.setDown(true)

	tst, err := f.admin.Webhooks.Test(ctx, connect.NewRequest(&apiv1.TestWebhookRequest{Tenant: "acme", Webhook: wh.GetId()}))
	require.NoError(t, err)
	start := f.cp.Clock.Now()
	f.drive(t, wh.GetId(), func() bool {
		g, err := f.admin.Webhooks.Get(ctx, connect.NewRequest(&apiv1.GetWebhookRequest{Tenant: "acme", Webhook: wh.GetId()}))
		require.NoError(t, err)
		return g.Msg.GetWebhook().GetState() == webhooks.StateDisabled
	})
	require.GreaterOrEqual(t, f.cp.Clock.Now().Sub(start), webhooks.RetryWindow, "disabled after a day, not before")
	g, err := f.admin.Webhooks.Get(ctx, connect.NewRequest(&apiv1.GetWebhookRequest{Tenant: "acme", Webhook: wh.GetId()}))
	require.NoError(t, err)
	require.Contains(t, g.Msg.GetWebhook().GetDisabledReason(), "HTTP 503")
	dead, err := f.admin.Webhooks.ListDeliveries(ctx, connect.NewRequest(&apiv1.ListWebhookDeliveriesRequest{Tenant: "acme",
		Webhook: wh.GetId(), State: webhooks.DeliveryDead}))
	require.NoError(t, err)
	require.Len(t, dead.Msg.GetDeliveries(), 1)
	require.Equal(t, tst.Msg.GetDelivery().GetId(), dead.Msg.GetDeliveries()[0].GetId())
	require.Greater(t, dead.Msg.GetDeliveries()[0].GetAttempts(), int32(10), "retried with backoff over the day")
	require.Less(t, dead.Msg.GetDeliveries()[0].GetAttempts(), int32(60), "backoff, not a busy loop")
	bctest.WaitFor(t, "webhook.disabled delivered to the other endpoint", func() bool {
		return len(watcher.types()) == 1
	})
	require.Equal(t, []string{"webhook.disabled"}, watcher.types())

	// Fixed, enabled, redelivered.
	rcv.setDown(false)
	on := webhooks.StateEnabled
	_, err = f.admin.Webhooks.Update(ctx, connect.NewRequest(&apiv1.UpdateWebhookRequest{Tenant: "acme", Webhook: wh.GetId(), State: &on}))
	require.NoError(t, err)
	_, err = f.admin.Webhooks.Redeliver(ctx, connect.NewRequest(&apiv1.RedeliverWebhookRequest{Tenant: "acme", Webhook: wh.GetId(),
		Delivery: tst.Msg.GetDelivery().GetId()}))
	require.NoError(t, err)
	bctest.WaitFor(t, "the redelivery", func() bool {
		for _, typ := range rcv.types() {
			if typ == "webhook.test" {
				return true
			}
		}
		return false
	})
	// A pending delivery is not redelivered.
	_, err = f.admin.Webhooks.Redeliver(ctx, connect.NewRequest(&apiv1.RedeliverWebhookRequest{Tenant: "acme", Webhook: wh.GetId(),
		Delivery: "whd_00000000000000000000000000"}))
	require.Contains(t, []string{"NOT_FOUND", "INVALID_ARGUMENT"}, code(err))
}

// TestRotateSecretOverlap: during the overlap both secrets sign; after it,
// only the new one.
func TestRotateSecretOverlap(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rcv := newReceiver(t, f.cp.Clock)
	rcv.lenient = true
	wh, old := f.create(t, rcv.srv.URL, "webhook.test")
	rot, err := f.admin.Webhooks.RotateSecret(ctx, connect.NewRequest(&apiv1.RotateWebhookSecretRequest{Tenant: "acme",
		Webhook: wh.GetId(), OverlapSeconds: 3600}))
	require.NoError(t, err)
	fresh := rot.Msg.GetSecret()
	require.NotEqual(t, old, fresh)
	require.NotNil(t, rot.Msg.GetWebhook().GetPreviousSecretExpireTime())
	rcv.setSecret(old) // a receiver not yet updated still verifies
	_, err = f.admin.Webhooks.Test(ctx, connect.NewRequest(&apiv1.TestWebhookRequest{Tenant: "acme", Webhook: wh.GetId()}))
	require.NoError(t, err)
	bctest.WaitFor(t, "the test event", func() bool { return len(rcv.types()) == 1 })
	rcv.mu.Lock()
	sigs := rcv.got[0].sigs
	rcv.mu.Unlock()
	require.Len(t, strings.Fields(sigs), 2, "two v1 signatures during the overlap")

	f.cp.Clock.Advance(2 * time.Hour)
	rcv.setSecret(fresh)
	_, err = f.admin.Webhooks.Test(ctx, connect.NewRequest(&apiv1.TestWebhookRequest{Tenant: "acme", Webhook: wh.GetId()}))
	require.NoError(t, err)
	bctest.WaitFor(t, "the second test event", func() bool { return len(rcv.types()) == 2 })
	rcv.mu.Lock()
	sigs = rcv.got[len(rcv.got)-1].sigs
	rcv.mu.Unlock()
	require.Len(t, strings.Fields(sigs), 1, "the old secret stopped signing")
}

// TestSSRFRefusals: endpoints on loopback, link-local, private and
// unspecified addresses, and the control plane itself, are refused with a
// field error and nothing written; the operator's flag allows private ones.
func TestSSRFRefusals(t *testing.T) {
	t.Parallel()
	f := setup(t, func(c *app.Config) { c.WebhookAllowLoopback = false })
	ctx := context.Background()
	for _, u := range []string{
		"http://127.0.0.1:8080/x", "http://[::1]/x", "http://localhost/x", "http://10.1.2.3/x", "http://192.168.0.10/x",
		"http://172.16.5.4/x", "http://169.254.169.254/latest/meta-data", "http://0.0.0.0/x", "http://[fe80::1]/x",
		"http://100.64.0.1/x", "ftp://example.com/x", "http://user:pw@93.184.216.34/x", "not a url",
	} {
		_, err := f.admin.Webhooks.Create(ctx, connect.NewRequest(&apiv1.CreateWebhookRequest{Tenant: "acme", Url: u}))
		require.Equal(t, "INVALID_ARGUMENT", code(err), u)
		vs := client.Detail(err).GetViolations()
		require.NotEmpty(t, vs, u)
		require.Equal(t, "url", vs[0].GetField(), u)
	}
	// The control plane's own listener is refused even where loopback is
	// allowed (bctest's default, as in dev).
	g := setup(t)
	_, err := g.admin.Webhooks.Create(ctx, connect.NewRequest(&apiv1.CreateWebhookRequest{Tenant: "acme", Url: g.cp.URL + "/v1/hooks"}))
	require.Equal(t, "INVALID_ARGUMENT", code(err))
	require.Contains(t, client.Detail(err).GetViolations()[0].GetReason(), "own API listener")
	// Update is checked too.
	wh, _ := g.create(t, "http://127.0.0.1:9/ok")
	self := g.cp.URL
	_, err = g.admin.Webhooks.Update(ctx, connect.NewRequest(&apiv1.UpdateWebhookRequest{Tenant: "acme", Webhook: wh.GetId(), Url: &self}))
	require.Equal(t, "INVALID_ARGUMENT", code(err))
	var n int
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM webhooks`).Scan(&n)
	}))
	require.Zero(t, n, "nothing half-written")

	// The operator allows private endpoints.
	p := setup(t, func(c *app.Config) { c.WebhookAllowPrivate = true })
	_, err = p.admin.Webhooks.Create(ctx, connect.NewRequest(&apiv1.CreateWebhookRequest{Tenant: "acme", Url: "http://10.1.2.3/x"}))
	require.NoError(t, err)

	// Deliveries are checked at connect time: a name that resolves to a
	// refused address after creation is not dialed.
	guard := &webhooks.Guard{}
	require.ErrorContains(t, guard.Control("tcp4", "127.0.0.1:443", nil), "loopback")
	require.ErrorContains(t, guard.Control("tcp4", "10.0.0.7:443", nil), "private")
	require.NoError(t, guard.Control("tcp4", "93.184.216.34:443", nil))
	loop := &webhooks.Guard{AllowLoopback: true}
	loop.AddSelf("127.0.0.1:8080")
	require.NoError(t, loop.Control("tcp4", "127.0.0.1:9000", nil))
	require.ErrorContains(t, loop.Control("tcp4", "127.0.0.1:8080", nil), "own API listener")
	// A listener on every address is refused on each of this host's.
	all := &webhooks.Guard{AllowPrivate: true}
	all.AddSelf(":8443")
	require.ErrorContains(t, all.Control("tcp4", "127.0.0.1:8443", nil), "own API listener")
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil {
				require.ErrorContains(t, all.Control("tcp", netip.AddrPortFrom(p.Addr(), 8443).String(), nil), "own API listener", p.Addr())
			}
		}
	}
	require.NoError(t, all.Control("tcp4", "10.9.9.9:8444", nil), "private allowed, another port")

	// Bad types are field errors too.
	_, err = f.admin.Webhooks.Create(ctx, connect.NewRequest(&apiv1.CreateWebhookRequest{Tenant: "acme", Url: "http://93.184.216.34/x",
		Types: []string{"Reservation Created"}}))
	require.Equal(t, "INVALID_ARGUMENT", code(err))
	require.Equal(t, "types[0]", client.Detail(err).GetViolations()[0].GetField())
	// A typo matches nothing, silently: it is refused with the families.
	_, err = f.admin.Webhooks.Create(ctx, connect.NewRequest(&apiv1.CreateWebhookRequest{Tenant: "acme", Url: "http://93.184.216.34/x",
		Types: []string{"reservation.*", "reservaton.*"}}))
	require.Equal(t, "INVALID_ARGUMENT", code(err))
	v := client.Detail(err).GetViolations()[0]
	require.Equal(t, "types[1]", v.GetField())
	require.Contains(t, v.GetReason(), `no event type starts with "reservaton": the families are`)
	require.Contains(t, v.GetReason(), "reservation")
	// The flag's hint comes only with the addresses it admits.
	_, err = f.admin.Webhooks.Create(ctx, connect.NewRequest(&apiv1.CreateWebhookRequest{Tenant: "acme", Url: "ftp://x"}))
	require.NotContains(t, err.Error(), "--webhook-allow-private")
}

func TestMatches(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		typ   string
		globs []string
		want  bool
	}{
		{"reservation.created", nil, true},
		{"reservation.created", []string{"reservation.*"}, true},
		{"node.lost", []string{"reservation.*", "node.lost"}, true},
		{"node.lost", []string{"reservation.*"}, false},
		{"reservationx.created", []string{"reservation.*"}, false},
		{"pool.created", []string{"*"}, true},
	} {
		require.Equal(t, tc.want, webhooks.Matches(tc.typ, tc.globs), "%s %v", tc.typ, tc.globs)
	}
}

// TestCrossTenantWebhooks: another tenant's admin cannot read, list, test
// or redeliver acme's webhooks.
func TestCrossTenantWebhooks(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	wh, _ := f.create(t, "http://127.0.0.1:9/x", "webhook.never_emitted")
	evil := f.cp.Client(f.key(t, "other", "admin"))
	_, err := evil.Webhooks.List(ctx, connect.NewRequest(&apiv1.ListWebhooksRequest{Tenant: "acme"}))
	require.Equal(t, "PERMISSION_DENIED", code(err))
	_, err = evil.Webhooks.Test(ctx, connect.NewRequest(&apiv1.TestWebhookRequest{Tenant: "acme", Webhook: wh.GetId()}))
	require.Equal(t, "PERMISSION_DENIED", code(err))
	_, err = evil.Webhooks.Test(ctx, connect.NewRequest(&apiv1.TestWebhookRequest{Tenant: "other", Webhook: wh.GetId()}))
	require.Equal(t, "NOT_FOUND", code(err))
	_, err = evil.Webhooks.Redeliver(ctx, connect.NewRequest(&apiv1.RedeliverWebhookRequest{Tenant: "acme", Webhook: wh.GetId(),
		Delivery: "whd_00000000000000000000000000"}))
	require.Contains(t, []string{"PERMISSION_DENIED", "INVALID_ARGUMENT"}, code(err))
	// Nor rotate their secret, with an overlap in bounds or one that
	// would overflow.
	for tenant, want := range map[string]string{"acme": "PERMISSION_DENIED", "other": "NOT_FOUND"} {
		_, err = evil.Webhooks.RotateSecret(ctx, connect.NewRequest(&apiv1.RotateWebhookSecretRequest{Tenant: tenant, Webhook: wh.GetId(),
			OverlapSeconds: 3600}))
		require.Equal(t, want, code(err), tenant)
		_, err = evil.Webhooks.RotateSecret(ctx, connect.NewRequest(&apiv1.RotateWebhookSecretRequest{Tenant: tenant, Webhook: wh.GetId(),
			OverlapSeconds: 9_223_372_037}))
		require.Equal(t, "INVALID_ARGUMENT", code(err), tenant)
	}
	got, err := f.admin.Webhooks.Get(ctx, connect.NewRequest(&apiv1.GetWebhookRequest{Tenant: "acme", Webhook: wh.GetId()}))
	require.NoError(t, err)
	require.Nil(t, got.Msg.GetWebhook().GetPreviousSecretExpireTime(), "acme's secret was not rotated")
	mine, err := evil.Webhooks.List(ctx, connect.NewRequest(&apiv1.ListWebhooksRequest{Tenant: "other"}))
	require.NoError(t, err)
	require.Empty(t, mine.Msg.GetWebhooks())
	// No tenant named: the caller's own, never acme's.
	mine, err = evil.Webhooks.List(ctx, connect.NewRequest(&apiv1.ListWebhooksRequest{}))
	require.NoError(t, err)
	require.Empty(t, mine.Msg.GetWebhooks())
	_, err = f.admin.Webhooks.List(ctx, connect.NewRequest(&apiv1.ListWebhooksRequest{}))
	require.Equal(t, "INVALID_ARGUMENT", code(err), "the platform has no webhooks of its own")
}

// TestOutboxRetention: events past the retention that every webhook has
// passed are pruned; the one a cursor stands on is kept.
func TestOutboxRetention(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rcv := newReceiver(t, f.cp.Clock)
	rcv.lenient = true
	_, secret := f.create(t, rcv.srv.URL, "project.*")
	rcv.setSecret(secret)
	countEvents := func() (n int) {
		require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT COUNT(*) FROM events`).Scan(&n)
		}))
		return n
	}
	_, err := f.admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "a"}))
	require.NoError(t, err)
	bctest.WaitFor(t, "the delivery", func() bool { return len(rcv.types()) == 1 })
	before := countEvents()
	// Within the retention nothing goes.
	n, err := webhooks.PruneEvents(ctx, f.cp.App.DB, 24*time.Hour)
	require.NoError(t, err)
	require.Zero(t, n)
	f.cp.Clock.Advance(48 * time.Hour)
	var cursor int64
	bctest.WaitFor(t, "the cursor at the outbox's end", func() bool {
		var last int64
		require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			if err := tx.QueryRow(ctx, `SELECT MAX(seq) FROM events`).Scan(&last); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT MIN(event_cursor) FROM webhooks`).Scan(&cursor)
		}))
		return cursor == last
	})
	n, err = webhooks.PruneEvents(ctx, f.cp.App.DB, 24*time.Hour)
	require.NoError(t, err)
	require.Positive(t, n)
	require.Equal(t, before-int(n), countEvents())
	var kept int
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM events WHERE seq = $1`, cursor).Scan(&kept)
	}))
	require.Equal(t, 1, kept, "the event the cursor stands on stays")
}

// TestCreateIsIdempotentAndShowsTheSecretOnce: a replay with the same
// Idempotency-Key answers the same endpoint without its secret, and writes
// nothing more.
func TestCreateIsIdempotentAndShowsTheSecretOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	key := client.NewIdempotencyKey()
	call := func() *apiv1.CreateWebhookResponse {
		req := connect.NewRequest(&apiv1.CreateWebhookRequest{Tenant: "acme", Url: "http://127.0.0.1:9/x"})
		req.Header().Set(client.HeaderIdempotencyKey, key)
		res, err := f.admin.Webhooks.Create(ctx, req)
		require.NoError(t, err)
		return res.Msg
	}
	first, again := call(), call()
	require.NotEmpty(t, first.GetSecret())
	require.Empty(t, again.GetSecret(), "the secret is shown once")
	require.Equal(t, first.GetWebhook().GetId(), again.GetWebhook().GetId())
	list, err := f.admin.Webhooks.List(ctx, connect.NewRequest(&apiv1.ListWebhooksRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Len(t, list.Msg.GetWebhooks(), 1)
	// Bad input: field errors, nothing written.
	for _, tc := range []struct {
		req   *apiv1.CreateWebhookRequest
		field string
	}{
		{&apiv1.CreateWebhookRequest{Tenant: "acme"}, "url"},
		{&apiv1.CreateWebhookRequest{Url: "http://127.0.0.1:9/x"}, "tenant"},
		{&apiv1.CreateWebhookRequest{Tenant: "acme", Url: "http://127.0.0.1:9/x", Description: strings.Repeat("x", 300)}, "description"},
	} {
		_, err := f.admin.Webhooks.Create(ctx, connect.NewRequest(tc.req))
		require.Equal(t, "INVALID_ARGUMENT", code(err))
		require.Equal(t, tc.field, client.Detail(err).GetViolations()[0].GetField())
	}
	// An overlap past 7 days is refused, also one so large that it
	// overflows a time.Duration (to 1734, or to a few seconds).
	for _, o := range []int64{8 * 24 * 3600, -1, 9_223_372_037, 18_446_744_074, 1 << 62} {
		_, err = f.admin.Webhooks.RotateSecret(ctx, connect.NewRequest(&apiv1.RotateWebhookSecretRequest{Tenant: "acme",
			Webhook: first.GetWebhook().GetId(), OverlapSeconds: o}))
		require.Equal(t, "INVALID_ARGUMENT", code(err), "overlap %d", o)
		require.Equal(t, "overlap_seconds", client.Detail(err).GetViolations()[0].GetField(), "overlap %d", o)
	}
	got, err := f.admin.Webhooks.Get(ctx, connect.NewRequest(&apiv1.GetWebhookRequest{Tenant: "acme", Webhook: first.GetWebhook().GetId()}))
	require.NoError(t, err)
	require.Nil(t, got.Msg.GetWebhook().GetPreviousSecretExpireTime(), "no rotation was written")
	_, err = f.admin.Webhooks.Create(ctx, connect.NewRequest(&apiv1.CreateWebhookRequest{Tenant: "nobody", Url: "http://127.0.0.1:9/x"}))
	require.Equal(t, "NOT_FOUND", code(err))
	list, err = f.admin.Webhooks.List(ctx, connect.NewRequest(&apiv1.ListWebhooksRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Len(t, list.Msg.GetWebhooks(), 1)
}
