package budget_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	"github.com/better-compute/better-compute/client/webhook"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/store"
)

type svcFixture struct {
	cp    *bctest.ControlPlane
	admin *client.Client // platform admin
	keys  map[string]*client.Client
	acme  string
}

func setupService(t *testing.T, opts ...bctest.ControlPlaneOption) *svcFixture {
	t.Helper()
	cp := bctest.NewControlPlane(t, opts...)
	ctx := context.Background()
	f := &svcFixture{cp: cp, admin: cp.Admin(), keys: map[string]*client.Client{}}
	for _, name := range []string{"acme", "other"} {
		tn, err := f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: name}))
		require.NoError(t, err)
		if name == "acme" {
			f.acme = tn.Msg.GetTenant().GetId()
		}
		_, err = f.admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: name, Name: "default"}))
		require.NoError(t, err)
	}
	for _, role := range []string{"admin", "member", "viewer", "agent"} {
		k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: role}))
		require.NoError(t, err)
		f.keys[role] = cp.Client(k.Msg.GetSecret())
	}
	k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "other", Role: "admin"}))
	require.NoError(t, err)
	f.keys["evil"] = cp.Client(k.Msg.GetSecret())
	return f
}

func (f *svcFixture) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM `+table).Scan(&n)
	}))
	return n
}

func TestBudgetLifecycle(t *testing.T) {
	t.Parallel()
	f := setupService(t)
	ctx := context.Background()

	// Bad input names each field and writes nothing.
	audits := f.count(t, "audit_log")
	_, err := f.admin.Budgets.Set(ctx, connect.NewRequest(&apiv1.SetBudgetRequest{Tenant: "acme", Period: "year", Amount: "-5",
		Enforcement: "strict", Thresholds: []int32{80, 0, 80}}))
	require.Equal(t, "INVALID_ARGUMENT", client.Code(err), "%v", err)
	var fields []string
	for _, v := range client.Detail(err).GetViolations() {
		fields = append(fields, v.GetField())
	}
	require.ElementsMatch(t, []string{"period", "amount", "enforcement", "thresholds", "thresholds"}, fields)
	for _, amount := range []string{"0", "1.1234567", "1e6", ""} {
		_, err := f.admin.Budgets.Set(ctx, connect.NewRequest(&apiv1.SetBudgetRequest{Tenant: "acme", Period: "month", Amount: amount}))
		require.Equal(t, "INVALID_ARGUMENT", client.Code(err), "%q: %v", amount, err)
		require.Equal(t, "amount", client.Detail(err).GetViolations()[0].GetField())
	}
	require.Zero(t, f.count(t, "budgets"))
	require.Equal(t, audits, f.count(t, "audit_log"))

	// A tenant's admins set it; members, viewers and agents read it.
	for _, role := range []string{"member", "viewer", "agent"} {
		_, err := f.keys[role].Budgets.Set(ctx, connect.NewRequest(&apiv1.SetBudgetRequest{Tenant: "acme", Period: "month", Amount: "10"}))
		require.Equal(t, "PERMISSION_DENIED", client.Code(err), "%s: %v", role, err)
	}
	set, err := f.keys["admin"].Budgets.Set(ctx, connect.NewRequest(&apiv1.SetBudgetRequest{Tenant: "acme", Period: "week", Amount: "250.5"}))
	require.NoError(t, err)
	b := set.Msg.GetBudget()
	require.Equal(t, f.acme, b.GetTenantId())
	require.Equal(t, "250.50", b.GetAmount())
	require.Equal(t, "hard", b.GetEnforcement(), "hard by default")
	require.Equal(t, []int32{50, 80, 100}, b.GetThresholds())
	require.Equal(t, "0.00", b.GetCommitted())
	require.Equal(t, time.Monday, b.GetPeriodStart().AsTime().Weekday())
	require.Equal(t, 7*24*time.Hour, b.GetPeriodEnd().AsTime().Sub(b.GetPeriodStart().AsTime()))

	// Set replaces it, keeping its id.
	again, err := f.admin.Budgets.Set(ctx, connect.NewRequest(&apiv1.SetBudgetRequest{Tenant: f.acme, Period: "month", Amount: "1000",
		Enforcement: "soft", Thresholds: []int32{90, 25}}))
	require.NoError(t, err)
	require.Equal(t, b.GetId(), again.Msg.GetBudget().GetId())
	require.Equal(t, []int32{25, 90}, again.Msg.GetBudget().GetThresholds())
	for _, role := range []string{"member", "viewer", "agent"} {
		got, err := f.keys[role].Budgets.Get(ctx, connect.NewRequest(&apiv1.GetBudgetRequest{Tenant: "acme"}))
		require.NoError(t, err, role)
		require.Equal(t, "soft", got.Msg.GetBudget().GetEnforcement())
		list, err := f.keys[role].Budgets.List(ctx, connect.NewRequest(&apiv1.ListBudgetsRequest{Tenant: "acme"}))
		require.NoError(t, err, role)
		require.Len(t, list.Msg.GetBudgets(), 1)
	}
	all, err := f.admin.Budgets.List(ctx, connect.NewRequest(&apiv1.ListBudgetsRequest{}))
	require.NoError(t, err)
	require.Len(t, all.Msg.GetBudgets(), 1)

	// Another tenant's admin neither reads, lists, sets nor deletes it.
	evil := f.keys["evil"]
	_, err = evil.Budgets.Get(ctx, connect.NewRequest(&apiv1.GetBudgetRequest{Tenant: "acme"}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err), "%v", err)
	_, err = evil.Budgets.List(ctx, connect.NewRequest(&apiv1.ListBudgetsRequest{Tenant: f.acme}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err), "%v", err)
	_, err = evil.Budgets.List(ctx, connect.NewRequest(&apiv1.ListBudgetsRequest{}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err), "%v", err)
	_, err = evil.Budgets.Set(ctx, connect.NewRequest(&apiv1.SetBudgetRequest{Tenant: "acme", Period: "day", Amount: "1"}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err), "%v", err)
	_, err = evil.Budgets.Delete(ctx, connect.NewRequest(&apiv1.DeleteBudgetRequest{Tenant: "acme"}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err), "%v", err)
	got, err := f.admin.Budgets.Get(ctx, connect.NewRequest(&apiv1.GetBudgetRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Equal(t, "1000.00", got.Msg.GetBudget().GetAmount(), "untouched")
	// Its own tenant has none.
	_, err = evil.Budgets.Get(ctx, connect.NewRequest(&apiv1.GetBudgetRequest{Tenant: "other"}))
	require.Equal(t, "NOT_FOUND", client.Code(err), "%v", err)

	// Members do not delete it; admins do, once.
	_, err = f.keys["member"].Budgets.Delete(ctx, connect.NewRequest(&apiv1.DeleteBudgetRequest{Tenant: "acme"}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err), "%v", err)
	_, err = f.keys["admin"].Budgets.Delete(ctx, connect.NewRequest(&apiv1.DeleteBudgetRequest{Tenant: "acme"}))
	require.NoError(t, err)
	_, err = f.keys["admin"].Budgets.Delete(ctx, connect.NewRequest(&apiv1.DeleteBudgetRequest{Tenant: "acme"}))
	require.Equal(t, "NOT_FOUND", client.Code(err), "%v", err)
	require.Zero(t, f.count(t, "budgets"))
}

func TestPoolPricesAreValidated(t *testing.T) {
	t.Parallel()
	f := setupService(t)
	ctx := context.Background()
	_, err := f.admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "h100", Policy: &apiv1.PoolPolicy{
		Prices: &apiv1.PoolPrices{GpuHour: map[string]string{"H100": "2.5.1"}, VcpuHour: "-1", InstanceHour: map[string]string{"big": "1e3"}}}}))
	require.Equal(t, "INVALID_ARGUMENT", client.Code(err), "%v", err)
	var fields []string
	for _, v := range client.Detail(err).GetViolations() {
		fields = append(fields, v.GetField())
	}
	require.ElementsMatch(t, []string{"policy.prices.gpu_hour[H100]", "policy.prices.vcpu_hour", "policy.prices.instance_hour[big]"}, fields)
	require.Zero(t, f.count(t, "pools"))
}

// receiver is a webhook endpoint that verifies every request's signature
// at the time it claims (the test moves no clock, but the sender may be a
// second behind).
type receiver struct {
	srv    *httptest.Server
	mu     sync.Mutex
	secret string
	got    []map[string]any
	bad    []string
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		defer r.mu.Unlock()
		if err := webhook.Verify(r.secret, req.Header, body); err != nil {
			r.bad = append(r.bad, err.Error())
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		var ev map[string]any
		if err := json.Unmarshal(body, &ev); err != nil {
			r.bad = append(r.bad, err.Error())
		}
		r.got = append(r.got, ev)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// thresholds are the percents of the budget.threshold events received.
func (r *receiver) thresholds() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []int
	for _, ev := range r.got {
		if ev["type"] != "budget.threshold" {
			continue
		}
		data, _ := ev["data"].(map[string]any)
		if p, ok := data["percent"].(float64); ok {
			out = append(out, int(p))
		}
	}
	slices.Sort(out)
	return out
}

// TestReserveUntilSpendLimit is the acceptance of budgets: a tenant with a
// 100 GPU-hour hard budget (its pool charges 1.00 a GPU-hour) reserves
// until it is refused with SPEND_LIMIT_REACHED, and a receiver gets the
// 50, 80 and 100 % threshold events, signed.
func TestReserveUntilSpendLimit(t *testing.T) {
	t.Parallel()
	f := setupService(t, func(c *app.Config) { c.UnreachableAfter, c.LostAfter = 1000*time.Hour, 2000*time.Hour })
	ctx := context.Background()

	rcv := newReceiver(t)
	bctest.WaitFor(t, "the setup's events below the outbox horizon", func() bool {
		return f.count(t, "events") == f.count(t, "events_visible")
	})
	wh, err := f.admin.Webhooks.Create(ctx, connect.NewRequest(&apiv1.CreateWebhookRequest{Tenant: "acme", Url: rcv.srv.URL + "/hooks",
		Types: []string{"budget.*"}}))
	require.NoError(t, err)
	rcv.mu.Lock()
	rcv.secret = wh.Msg.GetSecret()
	rcv.mu.Unlock()

	sim, err := bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		Template: bctest.FakeDaemonConfig{Gateway: f.cp.GatewayAddr}, Root: t.TempDir(), N: 1,
		Token: func(ctx context.Context, i int) (string, error) {
			tok, err := f.admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "default"}))
			return tok.Msg.GetToken(), err
		},
	})
	require.NoError(t, err)
	t.Cleanup(sim.Stop)
	_, err = f.admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "h100",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}},
		Policy:   &apiv1.PoolPolicy{Prices: &apiv1.PoolPrices{GpuHour: map[string]string{"H100": "1"}}}}))
	require.NoError(t, err)
	bctest.WaitFor(t, "the node's 8 GPUs in the pool", func() bool {
		var n int
		require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT COUNT(*) FROM atoms a JOIN node_pools np ON np.node_id = a.node_id WHERE a.kind = 'gpu'`).Scan(&n)
		}))
		return n == 8
	})
	_, err = f.keys["admin"].Budgets.Set(ctx, connect.NewRequest(&apiv1.SetBudgetRequest{Tenant: "acme", Period: "month", Amount: "100"}))
	require.NoError(t, err)

	// Windows of the next month, so that all of them fall in one period
	// whatever the day the test runs: 4 GPUs for 5 hours, two side by side.
	now := f.cp.Clock.Now().UTC()
	month := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC).AddDate(0, 1, 0)
	member := f.keys["member"]
	req := func(i int) *apiv1.CreateReservationRequest {
		return &apiv1.CreateReservationRequest{Tenant: "acme", Project: "default", Pool: "h100", Gpus: 4, Binding: "none",
			StartTime: timestamppb.New(month.Add(time.Duration(i/2) * 5 * time.Hour)), DurationSeconds: 5 * 3600}
	}
	booked, first := 0, ""
	for ; booked < 10; booked++ {
		if booked == 4 {
			// Preview says what the next one costs and what it leaves.
			pv, err := member.Reservations.Preview(ctx, connect.NewRequest(&apiv1.PreviewReservationRequest{Request: req(booked)}))
			require.NoError(t, err)
			be := pv.Msg.GetBudget()
			require.Equal(t, "20.00", be.GetCost())
			require.Equal(t, "4.00", be.GetCostPerHour())
			require.True(t, be.GetHasBudget())
			require.Equal(t, "100.00", be.GetAmount())
			require.Equal(t, "80.00", be.GetCommitted())
			require.Equal(t, "0.00", be.GetLeft())
			require.False(t, be.GetExceeded())
		}
		res, err := member.Reservations.Create(ctx, connect.NewRequest(req(booked)))
		if first == "" && err == nil {
			first = res.Msg.GetReservation().GetId()
		}
		if err != nil {
			require.Equal(t, "SPEND_LIMIT_REACHED", client.Code(err), "%v", err)
			require.Contains(t, err.Error(), "allows 100.00 per month")
			require.Contains(t, err.Error(), "100.00 is committed")
			require.Contains(t, err.Error(), "costs 20.00 more")
			break
		}
	}
	require.Equal(t, 5, booked, "five bookings of 20.00 reach 100.00; the sixth is refused")
	// An extension is a booking too: an hour more of 4 GPUs passes it.
	_, err = member.Reservations.Extend(ctx, connect.NewRequest(&apiv1.ExtendReservationRequest{Tenant: "acme", Reservation: first,
		ExtendSeconds: 3600}))
	require.Equal(t, "SPEND_LIMIT_REACHED", client.Code(err), "%v", err)
	require.Contains(t, err.Error(), "costs 24.00 more", "its whole new window, its old one not counted twice")
	pv, err := member.Reservations.Preview(ctx, connect.NewRequest(&apiv1.PreviewReservationRequest{Request: req(5)}))
	require.NoError(t, err)
	require.True(t, pv.Msg.GetBudget().GetExceeded())
	require.Equal(t, "-20.00", pv.Msg.GetBudget().GetLeft())

	got, err := member.Budgets.Get(ctx, connect.NewRequest(&apiv1.GetBudgetRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Equal(t, "0.00", got.Msg.GetBudget().GetCommitted(), "this month's: all of it is next month's")

	bctest.WaitFor(t, "the 50, 80 and 100 % webhooks", func() bool { return len(rcv.thresholds()) == 3 })
	require.Equal(t, []int{50, 80, 100}, rcv.thresholds())
	rcv.mu.Lock()
	require.Empty(t, rcv.bad, "every request is signed")
	rcv.mu.Unlock()
}

// TestRacingCreatesShareTheBudget: creates racing through the placer (in
// one batch or several) never commit past a hard budget: of 8 creates of
// 20.00 under a budget of 100.00, exactly 5 are booked.
func TestRacingCreatesShareTheBudget(t *testing.T) {
	t.Parallel()
	f := setupService(t, func(c *app.Config) { c.UnreachableAfter, c.LostAfter = 1000*time.Hour, 2000*time.Hour })
	ctx := context.Background()
	sim, err := bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		Template: bctest.FakeDaemonConfig{Gateway: f.cp.GatewayAddr}, Root: t.TempDir(), N: 1,
		Token: func(ctx context.Context, i int) (string, error) {
			tok, err := f.admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "default"}))
			return tok.Msg.GetToken(), err
		},
	})
	require.NoError(t, err)
	t.Cleanup(sim.Stop)
	_, err = f.admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "h100",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}},
		Policy:   &apiv1.PoolPolicy{Prices: &apiv1.PoolPrices{GpuHour: map[string]string{"*": "1"}}}}))
	require.NoError(t, err)
	bctest.WaitFor(t, "the node's 8 GPUs in the pool", func() bool {
		return f.count(t, `atoms a JOIN node_pools np ON np.node_id = a.node_id WHERE a.kind = 'gpu'`) == 8
	})
	_, err = f.admin.Budgets.Set(ctx, connect.NewRequest(&apiv1.SetBudgetRequest{Tenant: "acme", Period: "month", Amount: "100"}))
	require.NoError(t, err)

	now := f.cp.Clock.Now().UTC()
	month := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC).AddDate(0, 1, 0)
	const n = 8
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			// Each in a window of its own: capacity never decides.
			_, errs[i] = f.keys["member"].Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: "acme",
				Project: "default", Pool: "h100", Gpus: 4, Binding: "none", DurationSeconds: 5 * 3600,
				StartTime: timestamppb.New(month.Add(time.Duration(i) * 5 * time.Hour))}))
		}()
	}
	close(start)
	wg.Wait()
	won := 0
	for i, err := range errs {
		if err == nil {
			won++
			continue
		}
		require.Equal(t, "SPEND_LIMIT_REACHED", client.Code(err), "create %d: %v", i, err)
	}
	require.Equal(t, 5, won)
	require.Equal(t, 5, f.count(t, "reservations"))
}
