package reservation_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/store"
)

// offerFixture: tenant operator owns two simulated DGX H100 nodes in pool
// gpus; acme, globex and stranger are consumers-to-be, each with a member
// key; operator has an admin key.
type offerFixture struct {
	cp      *bctest.ControlPlane
	admin   *client.Client
	owner   *client.Client
	members map[string]*client.Client
	ids     map[string]string
	poolID  string
	nodes   []string
}

func setupOffers(t *testing.T) *offerFixture {
	t.Helper()
	cp := bctest.NewControlPlane(t, func(c *app.Config) { c.UnreachableAfter, c.LostAfter = 1000*time.Hour, 2000*time.Hour })
	ctx := context.Background()
	f := &offerFixture{cp: cp, admin: cp.Admin(), members: map[string]*client.Client{}, ids: map[string]string{}}
	for _, name := range []string{"operator", "acme", "globex", "stranger"} {
		tn, err := f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: name}))
		require.NoError(t, err)
		f.ids[name] = tn.Msg.GetTenant().GetId()
		_, err = f.admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: name, Name: "default"}))
		require.NoError(t, err)
		k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: name, Role: "member"}))
		require.NoError(t, err)
		f.members[name] = cp.Client(k.Msg.GetSecret())
	}
	k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "operator", Role: "admin"}))
	require.NoError(t, err)
	f.owner = cp.Client(k.Msg.GetSecret())
	sim, err := bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		Template: bctest.FakeDaemonConfig{Gateway: cp.GatewayAddr}, Root: t.TempDir(), N: 2,
		Token: func(ctx context.Context, i int) (string, error) {
			tok, err := f.admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "operator", Project: "default"}))
			return tok.Msg.GetToken(), err
		},
	})
	require.NoError(t, err)
	t.Cleanup(sim.Stop)
	bctest.WaitFor(t, "the nodes' GPUs", func() bool { return f.count(t, `SELECT COUNT(*) FROM gpus`) == 16 })
	pl, err := f.owner.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "operator", Name: "gpus",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}}}))
	require.NoError(t, err)
	f.poolID = pl.Msg.GetPool().GetId()
	require.NoError(t, cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id FROM nodes ORDER BY name`)
		if err != nil {
			return err
		}
		f.nodes, err = store.Strings(rows, nil)
		return err
	}))
	require.Len(t, f.nodes, 2)
	return f
}

func (f *offerFixture) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, query, args...).Scan(&n)
	}))
	return n
}

func (f *offerFixture) reserve(tenant string, gpus int32) (*apiv1.Reservation, error) {
	res, err := f.members[tenant].Reservations.Create(context.Background(), connect.NewRequest(&apiv1.CreateReservationRequest{
		Tenant: tenant, Pool: "gpus", Gpus: gpus, DurationSeconds: 3600, Binding: reservation.BindingNone}))
	if err != nil {
		return nil, err
	}
	return res.Msg.GetReservation(), nil
}

func (f *offerFixture) releaseAll(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for tenant, c := range f.members {
		res, err := c.Reservations.List(ctx, connect.NewRequest(&apiv1.ListReservationsRequest{Tenant: tenant, State: "placed,binding,active"}))
		require.NoError(t, err)
		for _, r := range res.Msg.GetReservations() {
			_, err := c.Reservations.Release(ctx, connect.NewRequest(&apiv1.ReleaseReservationRequest{Tenant: tenant, Reservation: r.GetId()}))
			require.NoError(t, err)
		}
	}
}

// label replaces a node's labels the way an agent's report does, and lets
// the atoms reconciler follow.
func (f *offerFixture) label(t *testing.T, nodeID, labels string) {
	t.Helper()
	require.NoError(t, f.cp.App.DB.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE nodes SET labels = $1 WHERE id = $2`, labels, nodeID); err != nil {
			return err
		}
		return f.cp.App.Capacity.Hooks().NodeChanged(ctx, tx, nodeID)
	}))
}

// TestOffers is the acceptance, on the store the run uses: the
// operator offers its pool to acme and globex, each gets a quota, both
// reserve at once, neither sees the other, the owner sees both, a
// dedicated taint keeps a node for acme and a single-tenant offer never
// mixes them on a node.
func TestOffers(t *testing.T) {
	t.Parallel()
	f := setupOffers(t)
	ctx := context.Background()

	// Private: a consumer cannot tell the pool exists.
	_, err := f.reserve("acme", 1)
	require.Equal(t, "NOT_FOUND", client.Code(err), "%v", err)
	_, err = f.members["acme"].Pools.Get(ctx, connect.NewRequest(&apiv1.GetPoolRequest{Tenant: "acme", Pool: "operator/gpus"}))
	require.Equal(t, "NOT_FOUND", client.Code(err), "%v", err)

	// Bad offers write nothing.
	events := f.count(t, `SELECT COUNT(*) FROM events`)
	_, err = f.owner.Pools.Offer(ctx, connect.NewRequest(&apiv1.OfferPoolRequest{Tenant: "operator", Pool: "gpus", To: []string{"acme", "nope"}}))
	require.Equal(t, "NOT_FOUND", client.Code(err), "%v", err)
	require.Contains(t, err.Error(), "nope")
	_, err = f.owner.Pools.Offer(ctx, connect.NewRequest(&apiv1.OfferPoolRequest{Tenant: "operator", Pool: "gpus", To: []string{"all", "acme"}}))
	require.Equal(t, "INVALID_ARGUMENT", client.Code(err), "%v", err)
	require.Contains(t, err.Error(), "to")
	_, err = f.owner.Pools.Offer(ctx, connect.NewRequest(&apiv1.OfferPoolRequest{Tenant: "operator", Pool: "gpus", To: []string{"operator"}}))
	require.Equal(t, "INVALID_ARGUMENT", client.Code(err), "%v", err)
	_, err = f.members["operator"].Pools.Offer(ctx, connect.NewRequest(&apiv1.OfferPoolRequest{Tenant: "operator", Pool: "gpus", To: []string{"acme"}}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err), "a member does not offer: %v", err)
	require.Zero(t, f.count(t, `SELECT COUNT(*) FROM pool_offers`))
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM pools WHERE offer = 'private'`))
	require.Equal(t, events, f.count(t, `SELECT COUNT(*) FROM events`), "refused offers emit nothing")

	off, err := f.owner.Pools.Offer(ctx, connect.NewRequest(&apiv1.OfferPoolRequest{Tenant: "operator", Pool: "gpus", To: []string{"globex", "acme"}}))
	require.NoError(t, err)
	require.Equal(t, "tenants", off.Msg.GetPool().GetOffer().GetScope())
	require.Equal(t, []string{"acme", "globex"}, off.Msg.GetPool().GetOffer().GetTenants())

	// Consumers list it with its owner; a stranger does not.
	ls, err := f.members["acme"].Pools.List(ctx, connect.NewRequest(&apiv1.ListPoolsRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Len(t, ls.Msg.GetPools(), 1)
	require.Equal(t, "operator", ls.Msg.GetPools()[0].GetOwner())
	ls, err = f.members["stranger"].Pools.List(ctx, connect.NewRequest(&apiv1.ListPoolsRequest{Tenant: "stranger"}))
	require.NoError(t, err)
	require.Empty(t, ls.Msg.GetPools())
	_, err = f.reserve("stranger", 1)
	require.Equal(t, "NOT_FOUND", client.Code(err), "not offered is not found: %v", err)

	// Quotas, set by the platform per consumer on the offered pool.
	for tenant, n := range map[string]int32{"acme": 8, "globex": 4} {
		_, err := f.admin.Quotas.Set(ctx, connect.NewRequest(&apiv1.SetQuotaRequest{Tenant: tenant, Pool: "gpus", Gpus: &n}))
		require.NoError(t, err)
	}

	// Both reserve at once.
	var (
		mu   sync.Mutex
		mine = map[string][]string{}
		wg   sync.WaitGroup
	)
	for _, tenant := range []string{"acme", "acme", "acme", "acme", "globex", "globex"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := f.reserve(tenant, 2)
			if !assertNoError(t, err) {
				return
			}
			mu.Lock()
			mine[tenant] = append(mine[tenant], r.GetId())
			mu.Unlock()
		}()
	}
	wg.Wait()
	require.Len(t, mine["acme"], 4)
	require.Len(t, mine["globex"], 2)
	_, err = f.reserve("globex", 1)
	require.Equal(t, "QUOTA_EXCEEDED", client.Code(err), "globex holds its 4: %v", err)

	// Neither sees the other's.
	for tenant, other := range map[string]string{"acme": "globex", "globex": "acme"} {
		c := f.members[tenant]
		res, err := c.Reservations.List(ctx, connect.NewRequest(&apiv1.ListReservationsRequest{Tenant: tenant}))
		require.NoError(t, err)
		require.Len(t, res.Msg.GetReservations(), len(mine[tenant]))
		for _, r := range res.Msg.GetReservations() {
			require.Equal(t, f.ids[tenant], r.GetTenantId())
		}
		_, err = c.Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: tenant, Reservation: mine[other][0]}))
		require.Equal(t, "NOT_FOUND", client.Code(err), "%v", err)
		_, err = c.Reservations.List(ctx, connect.NewRequest(&apiv1.ListReservationsRequest{Tenant: other}))
		require.Equal(t, "PERMISSION_DENIED", client.Code(err), "%v", err)
		_, err = c.Usage.List(ctx, connect.NewRequest(&apiv1.ListUsageRequest{Tenant: other}))
		require.Equal(t, "PERMISSION_DENIED", client.Code(err), "%v", err)
		_, err = c.Capacity.ByConsumer(ctx, connect.NewRequest(&apiv1.CapacityByConsumerRequest{Tenant: "operator"}))
		require.Equal(t, "PERMISSION_DENIED", client.Code(err), "only the owner sees its consumers: %v", err)
		_, err = c.Reservations.List(ctx, connect.NewRequest(&apiv1.ListReservationsRequest{Tenant: "operator", OnOwnedPools: true}))
		require.Equal(t, "PERMISSION_DENIED", client.Code(err), "%v", err)
		own, err := c.Reservations.List(ctx, connect.NewRequest(&apiv1.ListReservationsRequest{Tenant: tenant, OnOwnedPools: true}))
		require.NoError(t, err)
		require.Empty(t, own.Msg.GetReservations(), "%s owns no pool", tenant)
	}

	// The owner sees both, by name, and what each holds.
	res, err := f.owner.Reservations.List(ctx, connect.NewRequest(&apiv1.ListReservationsRequest{Tenant: "operator", OnOwnedPools: true}))
	require.NoError(t, err)
	byTenant := map[string]int{}
	for _, r := range res.Msg.GetReservations() {
		byTenant[r.GetTenant()]++
	}
	require.Equal(t, map[string]int{"acme": 4, "globex": 2}, byTenant)
	bc, err := f.owner.Capacity.ByConsumer(ctx, connect.NewRequest(&apiv1.CapacityByConsumerRequest{Tenant: "operator"}))
	require.NoError(t, err)
	require.Len(t, bc.Msg.GetRows(), 2)
	require.Equal(t, "acme", bc.Msg.GetRows()[0].GetTenant())
	require.EqualValues(t, 8, bc.Msg.GetRows()[0].GetGpus())
	require.Equal(t, "globex", bc.Msg.GetRows()[1].GetTenant())
	require.EqualValues(t, 4, bc.Msg.GetRows()[1].GetGpus())

	// dedicated=acme keeps the first node for acme.
	f.releaseAll(t)
	f.label(t, f.nodes[0], `{"taint.dedicated":"acme"}`)
	for range 2 {
		r, err := f.reserve("globex", 2)
		require.NoError(t, err)
		require.Equal(t, f.nodes[1], r.GetPlacement().GetNodeId(), "globex stays off acme's node")
	}
	r, err := f.reserve("acme", 8)
	require.NoError(t, err)
	require.Equal(t, f.nodes[0], r.GetPlacement().GetNodeId(), "acme fills its own node")
	f.releaseAll(t)
	f.label(t, f.nodes[0], `{}`)

	// A single-tenant offer never mixes consumers on a node.
	_, err = f.owner.Pools.Offer(ctx, connect.NewRequest(&apiv1.OfferPoolRequest{Tenant: "operator", Pool: "gpus", To: []string{"acme", "globex"}, SingleTenant: true}))
	require.NoError(t, err)
	var wg2 sync.WaitGroup
	for _, tenant := range []string{"acme", "globex", "acme", "globex"} {
		wg2.Add(1)
		go func() {
			defer wg2.Done()
			_, err := f.reserve(tenant, 1)
			assertNoError(t, err)
		}()
	}
	wg2.Wait()
	require.Zero(t, f.count(t, `SELECT COUNT(*) FROM (SELECT node_id FROM reservations
		WHERE state IN ('placed', 'binding', 'active') GROUP BY node_id HAVING COUNT(DISTINCT tenant_id) > 1) mixed`),
		"a node holds one consumer at a time")
	require.Equal(t, 2, f.count(t, `SELECT COUNT(DISTINCT node_id) FROM reservations WHERE state IN ('placed', 'binding', 'active')`))
}

// assertNoError reports err from a goroutine (require would end only it).
func assertNoError(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Errorf("unexpected error: %v", err)
		return false
	}
	return true
}
