package reservation_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/agent/devfilter"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/capacity/placement"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

// fixture is a control plane with tenant acme (project default, pool h100
// adopting every H100 node, bookings of at most a day) running simulated
// DGX H100 nodes (8 GPUs each, NVLink), and tenant other.
type fixture struct {
	cp     *bctest.ControlPlane
	admin  *client.Client // platform admin
	member *client.Client // a member of acme
	evil   *client.Client // an admin of other
	// evilKey is evil's API key, to call another replica with.
	evilKey string
	acme    string // acme's id
	pool    string // the id of acme's pool h100
	sim     *bctest.FleetSim
}

// poolMaxDuration is the longest booking pool h100 takes.
const poolMaxDuration = 24 * 3600

func setup(t *testing.T, nodes int) *fixture {
	t.Helper()
	return setupWith(t, nodes, bctest.FakeDaemonConfig{})
}

// setupWith is setup with simulated nodes made from template (its Gateway
// is set here).
func setupWith(t *testing.T, nodes int, template bctest.FakeDaemonConfig, opts ...bctest.ControlPlaneOption) *fixture {
	t.Helper()
	return setupOn(t, nodes, template, nil, opts...)
}

// setupOn is setupWith whose nodes hold their sessions on the gateway of
// the replica gateway returns (nil: the control plane's own).
func setupOn(t *testing.T, nodes int, template bctest.FakeDaemonConfig, gateway func(cp *bctest.ControlPlane) *bctest.ControlPlane, opts ...bctest.ControlPlaneOption) *fixture {
	t.Helper()
	return setupLabelled(t, nodes, template, gateway, nil, opts...)
}

// setupLabelled is setupOn whose node i joins with labels(i) (nil: none).
func setupLabelled(t *testing.T, nodes int, template bctest.FakeDaemonConfig, gateway func(cp *bctest.ControlPlane) *bctest.ControlPlane, labels func(i int) map[string]string, opts ...bctest.ControlPlaneOption) *fixture {
	t.Helper()
	// The simulated clock jumps hours ahead in some tests: nodes that beat
	// in real time must not be declared lost for it.
	cp := bctest.NewControlPlane(t, append([]bctest.ControlPlaneOption{func(c *app.Config) { c.UnreachableAfter, c.LostAfter = 1000*time.Hour, 2000*time.Hour }}, opts...)...)
	ctx := context.Background()
	f := &fixture{cp: cp, admin: cp.Admin()}
	for _, name := range []string{"acme", "other"} {
		tn, err := f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: name}))
		require.NoError(t, err)
		if name == "acme" {
			f.acme = tn.Msg.GetTenant().GetId()
		}
		_, err = f.admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: name, Name: "default"}))
		require.NoError(t, err)
	}
	k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "member"}))
	require.NoError(t, err)
	f.member = cp.Client(k.Msg.GetSecret())
	k, err = f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "other", Role: "admin"}))
	require.NoError(t, err)
	f.evilKey = k.Msg.GetSecret()
	f.evil = cp.Client(f.evilKey)

	template.Gateway = cp.GatewayAddr
	if gateway != nil {
		template.Gateway = gateway(cp).GatewayAddr
	}
	f.sim, err = bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		Template: template, Root: t.TempDir(), N: nodes,
		Token: func(ctx context.Context, i int) (string, error) {
			var l map[string]string
			if labels != nil {
				l = labels(i)
			}
			tok, err := f.admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "default", Labels: l}))
			return tok.Msg.GetToken(), err
		},
	})
	require.NoError(t, err)
	t.Cleanup(f.sim.Stop)
	f.eventually(t, "the nodes' GPUs", func() bool { return f.count(t, `SELECT COUNT(*) FROM gpus`) == 8*nodes })

	pl, err := f.admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "h100",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}},
		Policy:   &apiv1.PoolPolicy{MaxDurationSeconds: poolMaxDuration}}))
	require.NoError(t, err)
	f.pool = pl.Msg.GetPool().GetId()
	require.Equal(t, 8*nodes, f.count(t, `SELECT COUNT(*) FROM atoms a JOIN node_pools np ON np.node_id = a.node_id
		WHERE np.pool_id = $1 AND a.kind = 'gpu'`, f.pool), "every node joined the pool by label")
	return f
}

// eventually polls cond until it holds, failing the test after a generous
// deadline.
func (f *fixture) eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	bctest.WaitFor(t, what, cond)
}

func (f *fixture) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, query, args...).Scan(&n)
	}))
	return n
}

// written counts the rows a booking writes.
type written struct{ reservations, bookings, events int }

func (f *fixture) written(t *testing.T) written {
	t.Helper()
	return written{
		reservations: f.count(t, `SELECT COUNT(*) FROM reservations`),
		bookings:     f.count(t, `SELECT COUNT(*) FROM bookings`),
		events:       f.count(t, `SELECT COUNT(*) FROM events WHERE resource_type = 'Reservation'`),
	}
}

// held counts acme's reservations that hold their devices, and those that
// wait.
func (f *fixture) held(t *testing.T) (held, pending int) {
	t.Helper()
	return f.count(t, `SELECT COUNT(*) FROM reservations WHERE state IN ('placed', 'binding', 'active')`),
		f.count(t, `SELECT COUNT(*) FROM reservations WHERE state = 'pending'`)
}

func (f *fixture) create(t *testing.T, c *client.Client, req *apiv1.CreateReservationRequest) *apiv1.Reservation {
	t.Helper()
	if req.Tenant == "" {
		req.Tenant = "acme"
	}
	if req.Pool == "" {
		req.Pool = "h100"
	}
	// With two replicas, a create can meet the pool's placer being
	// claimed by the other (UNAVAILABLE, retry after a moment, nothing
	// written): it is asked again, as a client does.
	var (
		res *connect.Response[apiv1.CreateReservationResponse]
		err error
	)
	f.eventually(t, "the pool's placer settles", func() bool {
		res, err = c.Reservations.Create(context.Background(), connect.NewRequest(req))
		return connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "is moving to another replica")
	})
	require.NoError(t, err)
	return res.Msg.GetReservation()
}

func (f *fixture) get(t *testing.T, id string) *apiv1.Reservation {
	t.Helper()
	res, err := f.admin.Reservations.Get(context.Background(), connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "acme", Reservation: id}))
	require.NoError(t, err)
	return res.Msg.GetReservation()
}

func (f *fixture) waitState(t *testing.T, id, state string) *apiv1.Reservation {
	t.Helper()
	var r *apiv1.Reservation
	f.eventually(t, "reservation "+id+" "+state, func() bool {
		r = f.get(t, id)
		return r.GetState() == state
	})
	return r
}

// bookingEnds returns the distinct ends of a reservation's bookings.
func (f *fixture) bookingEnds(t *testing.T, id string) []time.Time {
	t.Helper()
	var out []time.Time
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		rows, err := tx.Query(ctx, `SELECT DISTINCT ends_at FROM bookings WHERE reservation_id = $1`, id)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var e time.Time
			if err := rows.Scan(&e); err != nil {
				return err
			}
			out = append(out, e.UTC())
		}
		return rows.Err()
	}))
	return out
}

func requireViolation(t *testing.T, err error, field string) {
	t.Helper()
	require.Equal(t, "INVALID_ARGUMENT", client.Code(err), "error: %v", err)
	d := envelope.DetailOf(err)
	require.NotNil(t, d, "error %v carries no detail", err)
	var fields []string
	for _, v := range d.GetViolations() {
		fields = append(fields, v.GetField())
	}
	require.Contains(t, fields, field, "violations of %v", err)
}

func TestCreateRefusesBadInput(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	now := f.cp.Clock.Now()
	ts := timestamppb.New
	cases := []struct {
		name  string
		req   *apiv1.CreateReservationRequest
		code  string
		field string
	}{
		{"no gpus", &apiv1.CreateReservationRequest{}, "INVALID_ARGUMENT", "gpus"},
		{"negative gpus", &apiv1.CreateReservationRequest{Gpus: -1}, "INVALID_ARGUMENT", "gpus"},
		{"gpus and slots", &apiv1.CreateReservationRequest{Gpus: 1, Slots: 1}, "INVALID_ARGUMENT", "slots"},
		{"unknown model", &apiv1.CreateReservationRequest{Gpus: 1, Model: "Z9000"}, "INVALID_ARGUMENT", "model"},
		{"unknown mig profile", &apiv1.CreateReservationRequest{Gpus: 1, MigProfile: "9g.999gb"}, "INVALID_ARGUMENT", "mig_profile"},
		{"mig profile in an exclusive pool", &apiv1.CreateReservationRequest{Gpus: 1, MigProfile: "1g.10gb"}, "INVALID_ARGUMENT", "mig_profile"},
		{"window in the past", &apiv1.CreateReservationRequest{Gpus: 1, StartTime: ts(now.Add(-time.Hour)), DurationSeconds: 600},
			"INVALID_ARGUMENT", "start_time"},
		{"end before start", &apiv1.CreateReservationRequest{Gpus: 1, StartTime: ts(now.Add(time.Hour)), EndTime: ts(now.Add(30 * time.Minute))},
			"INVALID_ARGUMENT", "end_time"},
		{"longer than the pool books", &apiv1.CreateReservationRequest{Gpus: 1, DurationSeconds: poolMaxDuration + 3600},
			"INVALID_ARGUMENT", "duration_seconds"},
		{"duration and end", &apiv1.CreateReservationRequest{Gpus: 1, DurationSeconds: 600, EndTime: ts(now.Add(time.Hour))},
			"INVALID_ARGUMENT", "end_time"},
		{"bad binding", &apiv1.CreateReservationRequest{Gpus: 1, Binding: "pod"}, "INVALID_ARGUMENT", "binding"},
		// A start beyond the pool's horizon (90 days by default) would hold
		// atoms out of every view for nothing.
		{"start in year 9999", &apiv1.CreateReservationRequest{Gpus: 1, StartTime: ts(time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)), DurationSeconds: 600},
			"INVALID_ARGUMENT", "start_time"},
		{"start beyond the horizon", &apiv1.CreateReservationRequest{Gpus: 1, StartTime: ts(now.Add(91 * 24 * time.Hour)), DurationSeconds: 600},
			"INVALID_ARGUMENT", "start_time"},
		{"unknown pool", &apiv1.CreateReservationRequest{Gpus: 1, Pool: "a100"}, "NOT_FOUND", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.Tenant = "acme"
			if tc.req.Pool == "" {
				tc.req.Pool = "h100"
			}
			before := f.written(t)
			_, err := f.admin.Reservations.Create(context.Background(), connect.NewRequest(tc.req))
			require.Equal(t, tc.code, client.Code(err), "error: %v", err)
			if tc.field != "" {
				requireViolation(t, err, tc.field)
			}
			require.Equal(t, before, f.written(t), "a refused request books nothing")
		})
	}

	t.Run("unknown model lists the pool's models", func(t *testing.T) {
		_, err := f.admin.Reservations.Create(context.Background(), connect.NewRequest(&apiv1.CreateReservationRequest{
			Tenant: "acme", Pool: "h100", Gpus: 1, Model: "Z9000"}))
		requireViolation(t, err, "model")
		require.Contains(t, err.Error(), "pool h100: it has H100")
	})

	t.Run("a model the pool lacks never fits", func(t *testing.T) {
		before := f.written(t)
		_, err := f.admin.Reservations.Create(context.Background(), connect.NewRequest(&apiv1.CreateReservationRequest{
			Tenant: "acme", Pool: "h100", Gpus: 1, Model: "A100"}))
		require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err), "error: %v", err)
		require.Equal(t, "NO_CAPACITY", client.Code(err))
		require.Contains(t, err.Error(), "the pool has no A100 GPUs (it has H100)")
		require.Equal(t, before, f.written(t), "a refused request books nothing")
	})

	t.Run("more GPUs than any node has", func(t *testing.T) {
		before := f.written(t)
		_, err := f.admin.Reservations.Create(context.Background(), connect.NewRequest(&apiv1.CreateReservationRequest{
			Tenant: "acme", Pool: "h100", Gpus: 9}))
		// Never fits: FAILED_PRECONDITION (400, waiting cannot help), not
		// the retryable RESOURCE_EXHAUSTED; the machine code stays.
		require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err), "error: %v", err)
		require.Equal(t, "NO_CAPACITY", client.Code(err), "error: %v", err)
		require.Contains(t, err.Error(), "pool h100 can never hold this request: the largest node has 8 GPUs, asked 9")
		ex := envelope.DetailOf(err).GetExplanation()
		require.NotNil(t, ex, "NO_CAPACITY explains itself: %v", err)
		require.NotEmpty(t, ex.GetLines())
		var reasons []string
		for _, l := range ex.GetLines() {
			reasons = append(reasons, l.GetReason())
		}
		require.Contains(t, reasons, placement.ReasonFreeGPUs)
		require.Equal(t, before, f.written(t), "a refused request books nothing")

		// Over plain HTTP (Connect's JSON protocol) it is a 400.
		body := `{"tenant":"acme","pool":"h100","gpus":9}`
		req, err := http.NewRequest(http.MethodPost, f.cp.URL+"/bettercompute.api.v1.ReservationService/Create", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+f.cp.AdminKey)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	})

	t.Run("fits later but nothing may wait", func(t *testing.T) {
		ctx := context.Background()
		_, err := f.admin.Pools.Update(ctx, connect.NewRequest(&apiv1.UpdatePoolRequest{Tenant: "acme", Pool: "h100",
			Policy: &apiv1.PoolPolicy{MaxDurationSeconds: poolMaxDuration, MaxPending: -1}}))
		require.NoError(t, err)
		all := f.create(t, f.admin, &apiv1.CreateReservationRequest{Gpus: 8})
		// Binding writes events of its own: let it finish before counting.
		f.waitState(t, all.GetId(), "active")
		before := f.written(t)
		_, err = f.admin.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Gpus: 1}))
		// Not now: the retryable RESOURCE_EXHAUSTED, as for a full queue.
		require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err), "error: %v", err)
		require.Equal(t, "NO_CAPACITY", client.Code(err))
		require.Equal(t, before, f.written(t), "a refused request books nothing")
		_, err = f.admin.Reservations.Release(ctx, connect.NewRequest(&apiv1.ReleaseReservationRequest{Tenant: "acme", Reservation: all.GetId()}))
		require.NoError(t, err)
	})
}

// TestConcurrentCreates is the acceptance scenario: 50 one-GPU requests race
// for 16 GPUs; 16 are placed, 34 wait, no atom is booked twice, and a
// release lets the queue place one more.
func TestConcurrentCreates(t *testing.T) {
	t.Parallel()
	f := setup(t, 2)
	ctx := context.Background()

	const n = 50
	got := make([]*apiv1.Reservation, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			res, err := f.member.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{
				Tenant: "acme", Pool: "h100", Gpus: 1, DurationSeconds: 3600}))
			if err != nil {
				errs[i] = err
				return
			}
			got[i] = res.Msg.GetReservation()
		})
	}
	wg.Wait()
	placedInline := 0
	for i := range n {
		require.NoError(t, errs[i], "create %d", i)
		switch st := got[i].GetState(); st {
		case "placed", "binding", "active":
			placedInline++
			require.Len(t, got[i].GetPlacement().GetAtoms(), 1)
		default:
			require.Equal(t, "pending", st)
		}
	}
	require.LessOrEqual(t, placedInline, 16)
	// A create that lost every race for its atoms waits, and the queued
	// placer it woke takes it from there (PostgreSQL; SQLite has one writer
	// and places all 16 inline).
	if bctest.Dialect() == store.SQLite {
		require.Equal(t, 16, placedInline)
	}
	f.eventually(t, "16 reservations placed and 34 waiting", func() bool {
		held, pending := f.held(t)
		return held == 16 && pending == 34
	})
	require.Zero(t, f.count(t, `SELECT COUNT(*) FROM (SELECT b.atom FROM bookings b JOIN reservations r ON r.id = b.reservation_id
		WHERE r.state IN ('placed', 'binding', 'active') GROUP BY b.atom HAVING COUNT(*) > 1) twice`), "no atom is booked twice")
	require.Equal(t, 16, f.count(t, `SELECT COUNT(DISTINCT b.atom) FROM bookings b JOIN atoms a ON a.id = b.atom
		WHERE a.kind = 'gpu'`), "every GPU is booked once")

	// A release a minute later gives a GPU back; the queued placer hands it
	// to the oldest pending reservation.
	f.cp.Clock.Advance(time.Minute)
	var victim string
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT id FROM reservations WHERE state IN ('placed', 'binding', 'active') ORDER BY id LIMIT 1`).Scan(&victim)
	}))
	rel, err := f.member.Reservations.Release(ctx, connect.NewRequest(&apiv1.ReleaseReservationRequest{Tenant: "acme", Reservation: victim}))
	require.NoError(t, err)
	require.Equal(t, "released", rel.Msg.GetReservation().GetState())
	_, err = f.cp.App.Capacity.PlacePending(ctx, f.pool)
	require.NoError(t, err)
	f.eventually(t, "one pending reservation placed", func() bool {
		held, pending := f.held(t)
		return held == 16 && pending == 33
	})
	require.Zero(t, f.count(t, `SELECT COUNT(*) FROM (SELECT b.atom FROM bookings b JOIN reservations r ON r.id = b.reservation_id
		WHERE r.state IN ('placed', 'binding', 'active') GROUP BY b.atom HAVING COUNT(*) > 1) twice`), "no atom is booked twice")
}

func TestQuota(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	ctx := context.Background()
	gpus := int32(4)
	_, err := f.admin.Quotas.Set(ctx, connect.NewRequest(&apiv1.SetQuotaRequest{Tenant: "acme", Gpus: &gpus}))
	require.NoError(t, err)

	before := f.written(t)
	_, err = f.member.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Gpus: 5}))
	require.Equal(t, "QUOTA_EXCEEDED", client.Code(err), "error: %v", err)
	eff := envelope.DetailOf(err).GetQuota()
	require.True(t, eff.GetExceeded(), "the detail carries the quota effect: %v", err)
	require.Len(t, eff.GetUses(), 1)
	use := eff.GetUses()[0]
	require.Equal(t, "tenant", use.GetScope())
	require.Equal(t, int32(4), use.GetGpusLimit())
	require.Equal(t, int32(5), use.GetGpusRequested())
	require.True(t, use.GetExceeded())
	require.Equal(t, before, f.written(t), "a refused request books nothing")

	r := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 4})
	require.Len(t, r.GetPlacement().GetAtoms(), 4)
	f.waitState(t, r.GetId(), "active")

	// The quota is spent: one more GPU is refused, even though one fits.
	before = f.written(t)
	_, err = f.member.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Gpus: 1}))
	require.Equal(t, "QUOTA_EXCEEDED", client.Code(err), "error: %v", err)
	require.Equal(t, int32(4), envelope.DetailOf(err).GetQuota().GetUses()[0].GetGpusUsed())
	require.Equal(t, before, f.written(t))
}

func TestPreview(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	ctx := context.Background()
	before := f.written(t)

	no, err := f.member.Reservations.Preview(ctx, connect.NewRequest(&apiv1.PreviewReservationRequest{
		Request: &apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Gpus: 9}}))
	require.NoError(t, err)
	require.False(t, no.Msg.GetFeasible())
	require.Nil(t, no.Msg.GetPlacement())
	require.NotEmpty(t, no.Msg.GetExplanation().GetLines())
	require.Contains(t, no.Msg.GetExplanation().GetLines()[0].GetReason(), placement.ReasonFreeGPUs)
	// The answer Create gives, not "nothing fits now".
	require.Contains(t, no.Msg.GetExplanation().GetSummary(), "pool h100 can never hold this request")
	_, err = f.member.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Gpus: 9}))
	require.Error(t, err)
	require.Contains(t, no.Msg.GetExplanation().GetSummary(), client.Detail(err).GetMessage())

	yes, err := f.member.Reservations.Preview(ctx, connect.NewRequest(&apiv1.PreviewReservationRequest{
		Request: &apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Gpus: 4, DurationSeconds: 7200}}))
	require.NoError(t, err)
	require.True(t, yes.Msg.GetFeasible())
	p := yes.Msg.GetPlacement()
	require.Len(t, p.GetAtoms(), 4)
	require.GreaterOrEqual(t, p.GetIsland(), int32(0), "four GPUs of one NVLink island")
	require.NotEmpty(t, p.GetNodeId())
	require.Equal(t, 2*time.Hour, yes.Msg.GetEndTime().AsTime().Sub(yes.Msg.GetStartTime().AsTime()))

	_, err = f.member.Reservations.Preview(ctx, connect.NewRequest(&apiv1.PreviewReservationRequest{
		Request: &apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Gpus: 1, Binding: "pod"}}))
	requireViolation(t, err, "request.binding")

	require.Equal(t, before, f.written(t), "a preview writes nothing")
}

func TestExtend(t *testing.T) {
	t.Parallel()
	f := setup(t, 2)
	ctx := context.Background()
	now := f.cp.Clock.Now()

	// All 16 GPUs for the next hour, and all 16 for the hour after.
	var first, second []*apiv1.Reservation
	for range 2 {
		first = append(first, f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 8, DurationSeconds: 3600}))
	}
	for range 2 {
		second = append(second, f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 8,
			StartTime: timestamppb.New(now.Add(time.Hour)), DurationSeconds: 3600}))
	}
	for _, r := range append(first, second...) {
		require.NotEqual(t, "pending", r.GetState(), "every reservation fits")
	}
	for _, r := range first {
		f.waitState(t, r.GetId(), "active")
	}
	a := first[0]
	end := a.GetEndTime().AsTime()

	extend := func(c *client.Client, tenant string, seconds int64) (*apiv1.Reservation, error) {
		res, err := c.Reservations.Extend(ctx, connect.NewRequest(&apiv1.ExtendReservationRequest{Tenant: tenant,
			Reservation: a.GetId(), ExtendSeconds: seconds}))
		if err != nil {
			return nil, err
		}
		return res.Msg.GetReservation(), nil
	}

	// The devices are booked by the next reservation from the end on.
	before := f.written(t)
	_, err := extend(f.member, "acme", 1800)
	require.Equal(t, "CONFLICT", client.Code(err), "error: %v", err)
	require.Equal(t, before, f.written(t))
	require.Equal(t, []time.Time{end}, f.bookingEnds(t, a.GetId()), "the bookings keep their end")
	require.Equal(t, end, f.get(t, a.GetId()).GetEndTime().AsTime())

	// Another tenant can neither extend it nor learn that it exists.
	for _, tenant := range []string{"acme", "other"} {
		before := f.written(t)
		_, err := extend(f.evil, tenant, 1800)
		require.Contains(t, []string{"PERMISSION_DENIED", "NOT_FOUND"}, client.Code(err), "via %s: %v", tenant, err)
		require.Equal(t, before, f.written(t))
	}
	require.Equal(t, end, f.get(t, a.GetId()).GetEndTime().AsTime())

	// Once the follower on its node is canceled, the owner extends it, and
	// its bookings move with it.
	for _, r := range second {
		if r.GetPlacement().GetNodeId() == a.GetPlacement().GetNodeId() {
			_, err := f.member.Reservations.Cancel(ctx, connect.NewRequest(&apiv1.CancelReservationRequest{Tenant: "acme", Reservation: r.GetId()}))
			require.NoError(t, err)
		}
	}
	got, err := extend(f.member, "acme", 1800)
	require.NoError(t, err)
	newEnd := end.Add(30 * time.Minute)
	require.Equal(t, newEnd, got.GetEndTime().AsTime())
	require.Equal(t, newEnd, f.get(t, a.GetId()).GetEndTime().AsTime())
	require.Equal(t, []time.Time{newEnd}, f.bookingEnds(t, a.GetId()), "the bookings end with the reservation")

	// Past the pool's longest booking.
	_, err = extend(f.member, "acme", poolMaxDuration)
	requireViolation(t, err, "end_time")
}

func TestReleaseTwice(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	ctx := context.Background()
	r := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 2, DurationSeconds: 3600})
	f.waitState(t, r.GetId(), "active")
	f.cp.Clock.Advance(time.Minute)

	release := func() *apiv1.Reservation {
		res, err := f.member.Reservations.Release(ctx, connect.NewRequest(&apiv1.ReleaseReservationRequest{Tenant: "acme", Reservation: r.GetId()}))
		require.NoError(t, err)
		return res.Msg.GetReservation()
	}
	first := release()
	require.Equal(t, "released", first.GetState())
	// Release means gone: the reservation waits for the node to confirm it
	// killed what was left and removed the cgroup.
	require.True(t, hasCondition(first, "NodeReleased", "false"), "conditions: %v", first.GetConditions())
	cg := filepath.Join(f.sim.Daemons[0].CgroupRoot(), r.GetId())
	var once *apiv1.Reservation
	f.eventually(t, "the node confirms the release", func() bool {
		// As stored (a response's times may carry more than the store's
		// microseconds).
		once = f.get(t, r.GetId())
		return hasCondition(once, "NodeReleased", "true")
	})
	require.NoDirExists(t, cg)
	require.Equal(t, "released", once.GetState())
	require.Equal(t, f.cp.Clock.Now().UTC().Truncate(time.Microsecond), once.GetEndTime().AsTime(), "it ends now")
	ends := f.bookingEnds(t, r.GetId())
	require.Equal(t, []time.Time{once.GetEndTime().AsTime()}, ends)

	f.cp.Clock.Advance(time.Minute)
	before := f.written(t)
	twice := release()
	require.Equal(t, once.GetState(), twice.GetState())
	require.Equal(t, once.GetEndTime().AsTime(), twice.GetEndTime().AsTime())
	require.Equal(t, once.GetUpdateTime().AsTime(), twice.GetUpdateTime().AsTime(), "the second release changes nothing")
	require.Equal(t, before, f.written(t))
	require.Equal(t, ends, f.bookingEnds(t, r.GetId()))
}

func hasCondition(r *apiv1.Reservation, typ, status string) bool {
	for _, c := range r.GetConditions() {
		if c.GetType() == typ && c.GetStatus() == status {
			return true
		}
	}
	return false
}

// refusingFilter is a device filter the kernel refuses.
type refusingFilter struct{}

func (refusingFilter) Attach(string, []devfilter.Rule) error {
	return errors.New("attach device program: operation not permitted")
}

// TestNodeBindingNeedsDeviceIsolation: a reservation that bcd binds on the
// node (binding "node", the default) places only on nodes that advertise
// devices.limits; one the node does not bind (binding "none") places on
// a node without it.
func TestNodeBindingNeedsDeviceIsolation(t *testing.T) {
	t.Parallel()
	f := setupWith(t, 1, bctest.FakeDaemonConfig{DeviceFilter: refusingFilter{}})
	before := f.written(t)
	_, err := f.member.Reservations.Create(context.Background(), connect.NewRequest(&apiv1.CreateReservationRequest{
		Tenant: "acme", Pool: "h100", Gpus: 1, DurationSeconds: 3600}))
	require.Equal(t, "NO_CAPACITY", client.Code(err), "error: %v", err)
	require.ErrorContains(t, err, "missing capability devices.limits")
	require.Equal(t, before, f.written(t), "nothing written")
	none := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 1, DurationSeconds: 3600, Binding: "none"})
	require.Equal(t, "active", none.GetState(), "explanation: %v", none.GetExplanation())
}

// TestLostCapabilityStopsPlacement: a node whose bcd comes back without
// devices.limits (its device filter no longer attaches) takes no more
// binding-node reservations: the pool's index reads the node again.
func TestLostCapabilityStopsPlacement(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	r := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 1, DurationSeconds: 3600})
	f.waitState(t, r.GetId(), "active")
	d, err := f.sim.Daemons[0].RestartWith(func(c *bctest.FakeDaemonConfig) { c.DeviceFilter = refusingFilter{} })
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Stop() })
	f.eventually(t, "the node advertises no devices.limits", func() bool {
		return f.count(t, `SELECT COUNT(*) FROM nodes WHERE id = $1 AND capabilities NOT LIKE '%devices.limits%' AND liveness = 'ready'`, d.NodeID()) == 1
	})
	_, err = f.member.Reservations.Create(context.Background(), connect.NewRequest(&apiv1.CreateReservationRequest{
		Tenant: "acme", Pool: "h100", Gpus: 1, DurationSeconds: 3600}))
	require.Equal(t, "NO_CAPACITY", client.Code(err), "error: %v", err)
	require.ErrorContains(t, err, "missing capability devices.limits")
}

// TestBoundReportsIsolation: the node's report of what it enforces is kept
// on the reservation as its Isolated condition (a simulated node's devices
// are confined by nothing, and it says so).
func TestBoundReportsIsolation(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	r := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 2, DurationSeconds: 3600})
	got := f.waitState(t, r.GetId(), "active")
	var iso *apiv1.ReservationCondition
	for _, c := range got.GetConditions() {
		if c.GetType() == "Isolated" {
			iso = c
		}
	}
	require.NotNil(t, iso, "conditions: %v", got.GetConditions())
	require.Equal(t, "false", iso.GetStatus())
	require.Equal(t, "Simulated", iso.GetReason())
	require.Contains(t, iso.GetMessage(), "devices: simulated")
	require.Contains(t, iso.GetMessage(), "/dev/nvidia")
	require.Contains(t, iso.GetMessage(), "cpuset: simulated")
	// The gateway's allocation.bound event carries the report as data.
	var data string
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT CAST(data AS TEXT) FROM events WHERE type = 'allocation.bound' AND resource_id = $1`, r.GetId()).Scan(&data)
	}))
	var ev struct {
		Enforced []struct{ Resource, State, Detail string } `json:"enforced"`
	}
	require.NoError(t, json.Unmarshal([]byte(data), &ev))
	require.Len(t, ev.Enforced, 4)
	require.Equal(t, "devices", ev.Enforced[0].Resource)
	require.Equal(t, "simulated", ev.Enforced[0].State)
	require.Contains(t, ev.Enforced[0].Detail, "/dev/nvidia")
}

func TestCancel(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	ctx := context.Background()
	active := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 8, DurationSeconds: 3600})
	f.waitState(t, active.GetId(), "active")
	waiting := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 1, DurationSeconds: 3600})
	require.Equal(t, "pending", waiting.GetState())

	cancel := func(id string) (*apiv1.Reservation, error) {
		res, err := f.member.Reservations.Cancel(ctx, connect.NewRequest(&apiv1.CancelReservationRequest{Tenant: "acme", Reservation: id}))
		if err != nil {
			return nil, err
		}
		return res.Msg.GetReservation(), nil
	}
	before := f.written(t)
	_, err := cancel(active.GetId())
	require.Equal(t, "FAILED_PRECONDITION", client.Code(err), "error: %v", err)
	require.Equal(t, before, f.written(t))
	require.Equal(t, "active", f.get(t, active.GetId()).GetState())

	got, err := cancel(waiting.GetId())
	require.NoError(t, err)
	require.Equal(t, "canceled", got.GetState())
	require.Equal(t, "canceled", f.get(t, waiting.GetId()).GetState())
	again, err := cancel(waiting.GetId())
	require.NoError(t, err, "canceling twice is not an error")
	require.Equal(t, "canceled", again.GetState())
}

func TestWatch(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// From the start of the outbox: acme has no reservation event yet.
	stream, err := f.member.Reservations.Watch(ctx, connect.NewRequest(&apiv1.WatchReservationsRequest{Tenant: "acme", Cursor: "0"}))
	require.NoError(t, err)
	defer func() { _ = stream.Close() }()

	r := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 1, DurationSeconds: 3600})
	var types []string
	for stream.Receive() {
		m := stream.Msg()
		if m.GetReservation() == nil {
			continue
		}
		require.Equal(t, r.GetId(), m.GetReservation().GetId())
		require.NotEmpty(t, m.GetCursor())
		types = append(types, m.GetType())
		if m.GetType() == "reservation.active" {
			break
		}
	}
	require.NoError(t, stream.Err())
	require.Equal(t, []string{"reservation.created", "reservation.placed", "reservation.binding", "reservation.active"}, types)
}

func TestTickExpires(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	ctx := context.Background()
	r := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 2, DurationSeconds: 3600})
	f.waitState(t, r.GetId(), "active")
	end := r.GetEndTime().AsTime()

	f.cp.Clock.Advance(2 * time.Hour)
	require.NoError(t, f.cp.App.Capacity.Tick(ctx))
	got := f.get(t, r.GetId())
	require.Equal(t, "expired", got.GetState())
	require.Equal(t, end, got.GetEndTime().AsTime())
	require.Zero(t, f.count(t, `SELECT COUNT(*) FROM bookings WHERE reservation_id = $1 AND ends_at > $2`, r.GetId(), end),
		"no booking outlives its reservation")
	held, _ := f.held(t)
	require.Zero(t, held)
	// Expiry releases on the node too: leftovers killed, cgroup removed,
	// and the node's confirmation recorded.
	// The node may confirm before this read (a busy machine schedules the
	// gateway push first), so the condition is either still pending or done.
	require.True(t, hasCondition(got, "NodeReleased", "false") || hasCondition(got, "NodeReleased", "true"),
		"conditions: %v", got.GetConditions())
	f.eventually(t, "the node confirms the release", func() bool { return hasCondition(f.get(t, r.GetId()), "NodeReleased", "true") })
	require.NoDirExists(t, filepath.Join(f.sim.Daemons[0].CgroupRoot(), r.GetId()))
}

func TestQuarantinedGPU(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	ctx := context.Background()
	node := f.sim.Daemons[0].NodeID()
	var bad string
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT uuid FROM gpus WHERE node_id = $1 ORDER BY idx LIMIT 1`, node).Scan(&bad)
	}))
	// As the gateway records a fatal XID.
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO node_conditions (node_id, type, status, reason, message, update_time)
			VALUES ($1, $2, 'true', 'XID79', 'fell off the bus', compute_now())`, node, "GpuQuarantined/"+bad); err != nil {
			return err
		}
		return f.cp.App.Capacity.Hooks().NodeChanged(ctx, tx, node)
	}))
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM atoms WHERE id = $1 AND quarantined = $2`, bad, true))

	pv, err := f.member.Reservations.Preview(ctx, connect.NewRequest(&apiv1.PreviewReservationRequest{
		Request: &apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Gpus: 8}}))
	require.NoError(t, err)
	require.False(t, pv.Msg.GetFeasible(), "seven GPUs are left to offer")

	r := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 7, DurationSeconds: 3600})
	require.NotEqual(t, "pending", r.GetState())
	require.Equal(t, node, r.GetPlacement().GetNodeId(), "the node still takes work")
	require.Len(t, r.GetPlacement().GetAtoms(), 7)
	require.NotContains(t, r.GetPlacement().GetAtoms(), bad)

	// The quarantined GPU is all that is left, and it is never booked: one
	// more GPU waits.
	one := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 1, DurationSeconds: 3600})
	require.Equal(t, "pending", one.GetState())
	require.Zero(t, f.count(t, `SELECT COUNT(*) FROM bookings WHERE atom = $1`, bad))
}

func TestPoolConflict(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	ctx := context.Background()
	node := f.sim.Daemons[0].NodeID()
	conflict := func() (pool, reason string, status string) {
		require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			if err := tx.QueryRow(ctx, `SELECT pool_id, conflict FROM node_pools WHERE node_id = $1`, node).Scan(&pool, &reason); err != nil {
				return err
			}
			err := tx.QueryRow(ctx, `SELECT status FROM node_conditions WHERE node_id = $1 AND type = 'PoolConflict'`, node).Scan(&status)
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return err
			}
			return nil
		}))
		return pool, reason, status
	}

	nodePool := func() *apiv1.Node {
		got, err := f.admin.Nodes.Get(ctx, connect.NewRequest(&apiv1.GetNodeRequest{Tenant: "acme", Node: node}))
		require.NoError(t, err)
		return got.Msg.GetNode()
	}
	// The node API says which pool a node is in (membership, not only a
	// join token's pool) and the labels selectors match.
	n := nodePool()
	require.Equal(t, "h100", n.GetPool())
	require.Equal(t, map[string]string{"gpu.model": "H100", "gpu.count": "8", "gpu.memory": "80GB"}, n.GetDerivedLabels())
	list, err := f.admin.Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Equal(t, "h100", list.Msg.GetNodes()[0].GetPool())

	pools := func() int { return f.count(t, `SELECT COUNT(*) FROM pools WHERE tenant_id = $1`, f.acme) }
	requireRefused := func(err error) {
		t.Helper()
		require.Equal(t, "FAILED_PRECONDITION", client.Code(err), "%v", err)
		require.Contains(t, err.Error(), "eights")
		require.Contains(t, err.Error(), "1 node with pool h100", "names the other pool and the nodes: %v", err)
		pool, reason, status := conflict()
		require.Equal(t, f.pool, pool, "nothing written: the node stays in h100")
		require.Empty(t, reason)
		require.Empty(t, status)
	}

	// A second pool that also matches the node is refused on create...
	before, nPools := f.written(t), pools()
	_, err = f.admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "eights",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.count", Operator: "In", Values: []string{"8"}}}}))
	requireRefused(err)
	require.Equal(t, nPools, pools(), "no pool row written")
	require.Equal(t, before, f.written(t))
	// ...and on update.
	_, err = f.admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "eights",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.count", Operator: "In", Values: []string{"16"}}}}))
	require.NoError(t, err, "a pool that selects no node of another is fine")
	_, err = f.admin.Pools.Update(ctx, connect.NewRequest(&apiv1.UpdatePoolRequest{Tenant: "acme", Pool: "eights",
		Selector: &apiv1.PoolSelector{Requirements: []*apiv1.SelectorRequirement{{Key: "gpu.count", Operator: "In", Values: []string{"8"}}}}}))
	requireRefused(err)
	got, err := f.admin.Pools.Get(ctx, connect.NewRequest(&apiv1.GetPoolRequest{Tenant: "acme", Pool: "eights"}))
	require.NoError(t, err)
	require.Equal(t, []string{"16"}, got.Msg.GetPool().GetSelector()[0].GetValues(), "the refused update wrote nothing")

	// A conflict the API cannot refuse (a node's labels or inventory
	// changed; here the selector is written behind the API's back and the
	// sweep reconciles): the node is in neither pool and says why.
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE pools SET selector = $1 WHERE tenant_id = $2 AND name = 'eights'`,
			`{"requirements":[{"key":"gpu.count","operator":"In","values":["8"]}]}`, f.acme); err != nil {
			return err
		}
		return f.cp.App.Capacity.Hooks().PoolChanged(ctx, tx, f.acme, "")
	}))
	pool, reason, status := conflict()
	require.Empty(t, pool, "a node two pools claim is in none")
	require.Contains(t, reason, "h100")
	require.Contains(t, reason, "eights")
	require.Equal(t, "true", status)
	require.Empty(t, nodePool().GetPool(), "a node two pools claim shows in none")
	pv, err := f.member.Reservations.Preview(ctx, connect.NewRequest(&apiv1.PreviewReservationRequest{
		Request: &apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Gpus: 1}}))
	require.NoError(t, err)
	require.False(t, pv.Msg.GetFeasible(), "the pool has no node: %v", pv.Msg)
	// An update of a pool already in conflict that adds no new conflict
	// (its policy) is not refused.
	_, err = f.admin.Pools.Update(ctx, connect.NewRequest(&apiv1.UpdatePoolRequest{Tenant: "acme", Pool: "eights",
		Policy: &apiv1.PoolPolicy{MaxPending: 5}}))
	require.NoError(t, err)

	// Archiving one pool settles it.
	_, err = f.admin.Pools.Archive(ctx, connect.NewRequest(&apiv1.ArchivePoolRequest{Tenant: "acme", Pool: "eights"}))
	require.NoError(t, err)
	pool, reason, status = conflict()
	require.Equal(t, f.pool, pool)
	require.Empty(t, reason)
	require.Equal(t, "false", status)
}

// TestIndexFollowsDeltas: once the placer's index is loaded, a node the
// atoms reconciler changes (a GPU quarantined) is read again on its own —
// a delta, not a reload of the pool — and placement sees the change.
func TestIndexFollowsDeltas(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	ctx := context.Background()
	node := f.sim.Daemons[0].NodeID()
	first := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 1, DurationSeconds: 3600})
	require.NotEqual(t, "pending", first.GetState())
	var bad string
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT uuid FROM gpus WHERE node_id = $1 AND uuid <> $2 ORDER BY idx LIMIT 1`,
			node, first.GetPlacement().GetAtoms()[0]).Scan(&bad)
	}))
	before := f.cp.App.Capacity.Engine.Deltas()
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO node_conditions (node_id, type, status, reason, message, update_time)
			VALUES ($1, $2, 'true', 'XID79', 'fell off the bus', compute_now())`, node, "GpuQuarantined/"+bad); err != nil {
			return err
		}
		return f.cp.App.Capacity.Hooks().NodeChanged(ctx, tx, node)
	}))
	r := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 6, DurationSeconds: 3600})
	require.NotEqual(t, "pending", r.GetState())
	require.NotContains(t, r.GetPlacement().GetAtoms(), bad)
	require.Greater(t, f.cp.App.Capacity.Engine.Deltas(), before, "the change came as a delta")
	one := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 1, DurationSeconds: 3600})
	require.Equal(t, "pending", one.GetState(), "the quarantined GPU is all that is left")
}
