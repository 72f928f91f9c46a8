package metal_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/capmodel"
	"github.com/better-compute/better-compute/internal/metal"
	"github.com/better-compute/better-compute/internal/store"
)

// machinePool deploys acme's m1 with acme's platform image, joins the OS
// it runs as a node (the sim runs no OS: a simulated bcd joins with a
// token made as the deploy mints one — labelled with the machine, created
// by the lifecycle), and offers acme's pool "metal" holding it to beta.
// It returns the machine's node.
func (f *leaseFixture) machinePool(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	f.image(t, "debian", true)
	_, err := f.admin.Machines.Deploy(ctx, connect.NewRequest(&apiv1.DeployMachineRequest{Tenant: "acme", Machine: "m1", Image: "debian"}))
	require.NoError(t, err)
	m := f.waitIdle(t, "m1")
	require.Equal(t, "deployed", m.GetState(), "%s: %s", m.GetFailedStep(), m.GetFailureReason())

	_, err = f.admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "default"}))
	require.NoError(t, err)
	tok, err := f.admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "default",
		Labels: map[string]string{metal.MachineLabel: m.GetId()}}))
	require.NoError(t, err)
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE join_tokens SET created_by = 'system:metal' WHERE id = $1`, tok.Msg.GetJoinToken().GetId())
		return err
	}))
	sim, err := bctest.StartFleetSim(ctx, bctest.FleetSimConfig{Template: bctest.FakeDaemonConfig{Gateway: f.cp.GatewayAddr},
		Root: t.TempDir(), N: 1, Token: func(context.Context, int) (string, error) { return tok.Msg.GetToken(), nil }})
	require.NoError(t, err)
	t.Cleanup(sim.Stop)
	bctest.WaitFor(t, "the machine's node and its GPUs", func() bool { return f.count(t, `SELECT COUNT(*) FROM gpus`) == 8 })

	_, err = f.admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "metal",
		Selector: []*apiv1.SelectorRequirement{{Key: capmodel.MachineLabel, Operator: "Exists"}}}))
	require.NoError(t, err)
	_, err = f.admin.Pools.Offer(ctx, connect.NewRequest(&apiv1.OfferPoolRequest{Tenant: "acme", Pool: "metal", To: []string{"beta"}}))
	require.NoError(t, err)
	for _, tn := range []struct {
		c    *client.Client
		name string
	}{{f.beta, "beta"}, {f.globex, "globex"}} {
		_, err = tn.c.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: tn.name, Name: "default"}))
		require.NoError(t, err)
	}
	var nodeID string
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT id FROM nodes WHERE mode = 'node'`).Scan(&nodeID)
	}))
	return nodeID
}

func (f *leaseFixture) reservation(t *testing.T, id string) *apiv1.Reservation {
	t.Helper()
	res, err := f.beta.Reservations.Get(context.Background(), connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "beta", Reservation: id}))
	require.NoError(t, err)
	return res.Msg.GetReservation()
}

func condition(r *apiv1.Reservation, typ string) *apiv1.ReservationCondition {
	for _, c := range r.GetConditions() {
		if c.GetType() == typ {
			return c
		}
	}
	return nil
}

// TestReservationLease: a tenant reserves a whole machine from a pool
// offered to it (binding machine). The placer books every GPU of the
// machine's node; the machine is offered to the tenant under a lease that
// only it sees; its acceptance deploys its own image with root by its key,
// retires the platform node and binds the reservation; the lease is let go
// only through the reservation, whose release runs the teardown and gives
// the machine back ready with every step's evidence verified.
func TestReservationLease(t *testing.T) {
	t.Parallel()
	f := setupLease(t, true)
	ctx := context.Background()
	nodeID := f.machinePool(t)

	reserve := func(c *client.Client, tenant string, gpus int32) (*apiv1.Reservation, error) {
		res, err := c.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: tenant, Pool: "metal",
			Gpus: gpus, DurationSeconds: 3600, Binding: "machine"}))
		if err != nil {
			return nil, err
		}
		return res.Msg.GetReservation(), nil
	}
	// Not offered to globex: it cannot tell the pool exists.
	_, err := reserve(f.globex, "globex", 8)
	require.Equal(t, "NOT_FOUND", client.Code(err), "%v", err)
	// A machine is leased whole: part of it never fits.
	_, err = reserve(f.beta, "beta", 4)
	require.Error(t, err)
	require.Contains(t, err.Error(), "GPU count")
	_, err = f.beta.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: "beta", Pool: "metal",
		Slots: 2, DurationSeconds: 3600, Binding: "machine"}))
	refused(t, err, "INVALID_ARGUMENT", "slots", "leases whole GPUs")

	r, err := reserve(f.beta, "beta", 8)
	require.NoError(t, err)
	require.Equal(t, "binding", r.GetState())
	require.Equal(t, nodeID, r.GetPlacement().GetNodeId())
	require.Len(t, r.GetPlacement().GetAtoms(), 8)
	c := condition(r, capmodel.CondMachineLease)
	require.NotNil(t, c)
	require.Equal(t, "Offered", c.GetReason())
	var leaseID string
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT id FROM machine_leases WHERE reservation_id = $1`, r.GetId()).Scan(&leaseID)
	}))
	require.Contains(t, c.GetMessage(), "machines lease-accept "+leaseID)

	// The machine is booked: no second lease of it, not even by beta.
	r2, err := reserve(f.beta, "beta", 8)
	require.NoError(t, err)
	require.Equal(t, "pending", r2.GetState())
	_, err = f.beta.Reservations.Cancel(ctx, connect.NewRequest(&apiv1.CancelReservationRequest{Tenant: "beta", Reservation: r2.GetId()}))
	require.NoError(t, err)

	// Only the lessee (and the machine's owner) see the lease; only the
	// lessee accepts it.
	_, err = f.globex.Machines.GetLease(ctx, connect.NewRequest(&apiv1.GetMachineLeaseRequest{Tenant: "globex", Lease: leaseID}))
	require.Equal(t, "NOT_FOUND", client.Code(err))
	_, err = f.globex.Machines.AcceptLease(ctx, connect.NewRequest(&apiv1.AcceptMachineLeaseRequest{Tenant: "globex", Lease: leaseID,
		Image: "beta-os", SshKey: rootKey}))
	require.Equal(t, "NOT_FOUND", client.Code(err))
	l := f.lease(t, f.beta, "beta", leaseID)
	require.Equal(t, metal.LeaseOffered, l.GetState())

	acc, err := f.beta.Machines.AcceptLease(ctx, connect.NewRequest(&apiv1.AcceptMachineLeaseRequest{Tenant: "beta", Lease: leaseID,
		Image: "beta-os", SshKey: rootKey}))
	require.NoError(t, err)
	require.Equal(t, metal.LeaseDeploying, acc.Msg.GetLease().GetState())
	m := f.waitIdle(t, "m1")
	require.Equal(t, "deployed", m.GetState(), "%s: %s", m.GetFailedStep(), m.GetFailureReason())
	require.Equal(t, f.img.GetSha256(), f.sm.Image(), "the lessee's image is on the disk")
	require.Equal(t, metal.LeaseActive, f.lease(t, f.beta, "beta", leaseID).GetState())
	r = f.reservation(t, r.GetId())
	require.Equal(t, "active", r.GetState())
	require.Equal(t, "Active", condition(r, capmodel.CondMachineLease).GetReason())
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM nodes WHERE id = $1 AND state = 'retired'`, nodeID),
		"the platform's node on the machine is retired")

	// The lease goes with the reservation, not on its own.
	_, err = f.beta.Machines.ReleaseLease(ctx, connect.NewRequest(&apiv1.ReleaseMachineLeaseRequest{Tenant: "beta", Lease: leaseID}))
	refused(t, err, "FAILED_PRECONDITION", "lease", "bound to a live reservation")

	_, err = f.beta.Reservations.Release(ctx, connect.NewRequest(&apiv1.ReleaseReservationRequest{Tenant: "beta", Reservation: r.GetId()}))
	require.NoError(t, err)
	require.Equal(t, "released", f.reservation(t, r.GetId()).GetState())
	m = f.waitIdle(t, "m1")
	require.Equal(t, "ready", m.GetState(), "%s: %s", m.GetFailedStep(), m.GetFailureReason())
	require.Empty(t, f.sm.Image(), "the disk was erased")
	got := f.lease(t, f.beta, "beta", leaseID)
	require.Equal(t, metal.LeaseReturned, got.GetState())
	ev := evidence(got)
	for _, step := range metal.TeardownSteps {
		require.NotNil(t, ev[step], step)
		require.True(t, ev[step].GetVerified(), "%s: %s", step, ev[step].GetDetail())
	}
}

// TestReservationLeaseNotAccepted: an offer the lessee lets lapse fails
// the reservation and is withdrawn, and the machine (never touched) stays
// deployed; a machine that cannot be leased fails the reservation with
// why.
func TestReservationLeaseNotAccepted(t *testing.T) {
	t.Parallel()
	f := setupLease(t, true)
	ctx := context.Background()
	f.machinePool(t)
	r, err := f.beta.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: "beta", Pool: "metal",
		Gpus: 8, DurationSeconds: 3600, Binding: "machine"}))
	require.NoError(t, err)
	id := r.Msg.GetReservation().GetId()
	_, err = f.beta.Reservations.Cancel(ctx, connect.NewRequest(&apiv1.CancelReservationRequest{Tenant: "beta", Reservation: id}))
	require.NoError(t, err)
	var state string
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT state FROM machine_leases WHERE reservation_id = $1`, id).Scan(&state)
	}))
	require.Equal(t, metal.LeaseReturned, state, "the offer is withdrawn")
	m := f.get(t, "m1")
	require.Equal(t, "deployed", m.GetState())
	require.Empty(t, m.GetLeaseId())

	// Without a firmware baseline the machine cannot be leased (its
	// teardown could not check it): the reservation fails, saying so.
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE machines SET firmware_baseline = '{}'`)
		return err
	}))
	r, err = f.beta.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: "beta", Pool: "metal",
		Gpus: 8, DurationSeconds: 3600, Binding: "machine"}))
	require.NoError(t, err)
	c := condition(r.Msg.GetReservation(), capmodel.CondMachineLease)
	require.NotNil(t, c)
	require.Equal(t, "NotLeasable", c.GetReason())
	require.Contains(t, c.GetMessage(), "no firmware baseline")
	f.cp.Clock.Advance(time.Second)
	require.NoError(t, f.cp.App.Capacity.Tick(ctx))
	require.Equal(t, "failed", f.reservation(t, r.Msg.GetReservation().GetId()).GetState())
}
