package migauto_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/atoms"
	"github.com/better-compute/better-compute/internal/capacity/migauto"
	"github.com/better-compute/better-compute/internal/capacity/migplan"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/store"
)

var split1g = []string{"1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"}

type node struct {
	tenant string
	d      *bctest.FakeDaemon
}

type bundle struct {
	cp *bctest.ControlPlane
}

func setup(t *testing.T) *bundle {
	t.Helper()
	return &bundle{cp: bctest.NewControlPlane(t)}
}

// tenant creates a tenant with one H100 node whose GPUs are all split into
// 7×1g, and a pool of it with gpu_sharing mig and mig auto.
func (b *bundle) tenant(t *testing.T, name string) node {
	t.Helper()
	return b.tenantWith(t, name, &apiv1.PoolPolicy{GpuSharing: "mig", Mig: "auto"})
}

func (b *bundle) tenantWith(t *testing.T, name string, policy *apiv1.PoolPolicy) node {
	t.Helper()
	ctx := context.Background()
	admin := b.cp.Admin()
	_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: name}))
	require.NoError(t, err)
	_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: name, Name: "gpu"}))
	require.NoError(t, err)
	tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: name, Project: "gpu"}))
	require.NoError(t, err)
	d, err := bctest.NewFakeDaemon(bctest.FakeDaemonConfig{Gateway: b.cp.GatewayAddr, StateDir: filepath.Join(t.TempDir(), name)})
	require.NoError(t, err)
	require.NoError(t, d.Join(ctx, tok.Msg.GetToken()))
	d.Start()
	t.Cleanup(func() { _ = d.Stop() })
	n := node{tenant: name, d: d}
	bctest.WaitFor(t, name+"'s node with its GPUs", func() bool { return len(b.layouts(t, n)) == 8 })
	// Every GPU split into 7×1g, as an operator would have it.
	require.NoError(t, b.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		for uuid := range b.layouts(t, n) {
			if _, err := fleet.SendSystemCommand(ctx, tx, b.cp.App.Gateway, fleet.SystemCommand{
				TenantID: tenantID(t, b.cp, d.NodeID()), NodeID: d.NodeID(), Kind: "gpu.mig.configure",
				Params: map[string]any{"gpu": uuid, "profiles": []any{"1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"}},
				Time:   b.cp.Clock.Now(), Signer: b.cp.App.CommandSigner(), CreatedBy: "test",
			}); err != nil {
				return err
			}
		}
		return nil
	}))
	bctest.WaitFor(t, name+"'s GPUs all 7×1g", func() bool {
		for _, l := range b.layouts(t, n) {
			if migplan.Key(l) != migplan.Key(split1g) {
				return false
			}
		}
		return true
	})
	_, err = admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: name, Name: "mig",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}},
		Policy:   policy}))
	require.NoError(t, err)
	return n
}

func tenantID(t *testing.T, cp *bctest.ControlPlane, nodeID string) string {
	t.Helper()
	var id string
	require.NoError(t, cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		n, err := fleet.NodeStatusGet(ctx, tx, nodeID)
		id = n.TenantID
		return err
	}))
	return id
}

// layouts is the node's MIG layout per GPU, as its inventory says.
func (b *bundle) layouts(t *testing.T, n node) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	require.NoError(t, b.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		gpus, err := fleet.GPUList(ctx, tx, n.d.NodeID())
		if err != nil {
			return err
		}
		mig, err := fleet.MigInstanceList(ctx, tx, n.d.NodeID())
		if err != nil {
			return err
		}
		for _, g := range gpus {
			out[g.UUID] = nil
		}
		for _, m := range mig {
			out[m.GPUUUID] = append(out[m.GPUUUID], m.Profile)
		}
		return nil
	}))
	return out
}

// pending lists the node's GPUs whose GpuPartitionPending condition holds.
func (b *bundle) pending(t *testing.T, n node) []string {
	t.Helper()
	var out []string
	require.NoError(t, b.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		conds, err := fleet.NodeConditionList(ctx, tx, n.d.NodeID())
		for _, c := range conds[n.d.NodeID()] {
			if u, ok := strings.CutPrefix(c.Type, atoms.ConditionGPUPartitionPending); ok && c.Status == "true" {
				out = append(out, u)
			}
		}
		return err
	}))
	return out
}

func (b *bundle) reservation(t *testing.T, tenant, id string) *apiv1.Reservation {
	t.Helper()
	g, err := b.cp.Admin().Reservations.Get(context.Background(), connect.NewRequest(&apiv1.GetReservationRequest{Tenant: tenant, Reservation: id}))
	require.NoError(t, err)
	return g.Msg.GetReservation()
}

// TestQueued7gGetsAGPU: in a pool with mig auto whose GPUs are all split
// into 1g, a 7g request waits (it is not refused), one round of the
// repartitioner freezes one idle GPU and asks the node for 7g; the node's
// new inventory clears the freeze and the placer books the request. The
// other tenant's pool, with no demand of its own, keeps its layouts.
func TestQueued7gGetsAGPU(t *testing.T) {
	t.Parallel()
	b := setup(t)
	acme := b.tenant(t, "acme")
	globex := b.tenant(t, "globex")
	ctx := context.Background()

	var id string
	bctest.WaitFor(t, "a 7g reservation queued", func() bool {
		res, err := b.cp.Admin().Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{
			Tenant: "acme", Pool: "mig", Gpus: 1, MigProfile: "7g.80gb", DurationSeconds: 3600}))
		if err != nil {
			require.NotEqual(t, connect.CodeInvalidArgument, connect.CodeOf(err), "a mig auto pool must queue a profile a repartition could offer: %v", err)
			return false // the pool's nodes are not indexed yet
		}
		id = res.Msg.GetReservation().GetId()
		return true
	})
	require.Equal(t, "pending", b.reservation(t, "acme", id).GetState())

	res, err := b.cp.App.MIG.Round(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, res.Pools)
	require.Equal(t, 1, res.Moved, "one 7g asks for one GPU")

	bctest.WaitFor(t, "the 7g reservation placed", func() bool {
		s := b.reservation(t, "acme", id).GetState()
		t.Logf("7g reservation: %s", s)
		return s != "pending"
	})
	var sevens []string
	for uuid, l := range b.layouts(t, acme) {
		if migplan.Key(l) == "7g.80gb" {
			sevens = append(sevens, uuid)
		}
	}
	require.Len(t, sevens, 1, "exactly one GPU repartitioned")
	require.Empty(t, b.pending(t, acme), "the freeze is cleared once the layout shows")
	r := b.reservation(t, "acme", id)
	require.Contains(t, r.GetPlacement().GetAtoms(), sevens[0]+"/mig/7g.80gb/0")

	// Another round with the same (now met) demand moves nothing.
	res, err = b.cp.App.MIG.Round(ctx)
	require.NoError(t, err)
	require.Zero(t, res.Moved)

	// The booked GPU cannot be frozen: the check runs in the freezing
	// transaction.
	err = b.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return b.cp.App.Capacity.Engine.Reconciler.FreezeGPU(ctx, tx, acme.d.NodeID(), sevens[0], []string{"3g.40gb", "3g.40gb"}, b.cp.Clock.Now())
	})
	require.ErrorIs(t, err, atoms.ErrGPUBusy)
	require.Empty(t, b.pending(t, acme))

	// A freeze whose layout never shows is thawed after FreezeTimeout.
	var idle string
	for uuid := range b.layouts(t, acme) {
		if uuid != sevens[0] {
			idle = uuid
			break
		}
	}
	require.NoError(t, b.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return b.cp.App.Capacity.Engine.Reconciler.FreezeGPU(ctx, tx, acme.d.NodeID(), idle, []string{"3g.40gb", "3g.40gb"}, b.cp.Clock.Now())
	}))
	require.Equal(t, []string{idle}, b.pending(t, acme))
	res, err = b.cp.App.MIG.Round(ctx)
	require.NoError(t, err)
	require.Zero(t, res.Thawed, "not before the timeout")
	b.cp.Clock.Advance(migauto.DefaultFreezeTimeout + time.Minute)
	res, err = b.cp.App.MIG.Round(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Thawed)
	require.Empty(t, b.pending(t, acme))

	// globex's pool was never touched by acme's demand.
	for uuid, l := range b.layouts(t, globex) {
		require.Equal(t, migplan.Key(split1g), migplan.Key(l), "globex GPU %s", uuid)
	}
	require.Empty(t, b.pending(t, globex))
}

// TestRefused7gCountsAsDemand: in a pool where nothing waits (max_pending
// -1), a refused 7g create is counted, the next round repartitions a GPU
// for it, and the create asked again fits.
func TestRefused7gCountsAsDemand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	acme := b.tenantWith(t, "acme", &apiv1.PoolPolicy{GpuSharing: "mig", Mig: "auto", MaxPending: -1})
	ctx := context.Background()
	create := func(profile string) (*apiv1.Reservation, error) {
		res, err := b.cp.Admin().Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{
			Tenant: "acme", Pool: "mig", Gpus: 1, MigProfile: profile, DurationSeconds: 3600}))
		if err != nil {
			return nil, err
		}
		return res.Msg.GetReservation(), nil
	}
	bctest.WaitFor(t, "the pool indexed: a 1g fits", func() bool {
		_, err := create("1g.10gb")
		return err == nil
	})
	_, err := create("7g.80gb")
	require.Error(t, err)
	require.Contains(t, err.Error(), "queue is full")

	res, err := b.cp.App.MIG.Round(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Moved, "the refusal is demand")
	bctest.WaitFor(t, "the 7g layout landed", func() bool { return len(b.pending(t, acme)) == 0 })
	r, err := create("7g.80gb")
	require.NoError(t, err)
	require.NotEqual(t, "pending", r.GetState())

	// The refusal is still in the window, but now met: nothing moves.
	res, err = b.cp.App.MIG.Round(ctx)
	require.NoError(t, err)
	require.Zero(t, res.Moved)
}
