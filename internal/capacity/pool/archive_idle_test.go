package pool_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/capmodel"
)

// idleFixture is the pool fixture with one simulated H100 node of acme.
type idleFixture struct {
	*fixture
}

func setupIdle(t *testing.T) idleFixture {
	t.Helper()
	f := setup(t)
	ctx := context.Background()
	_, err := f.admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "nodes"}))
	require.NoError(t, err)
	sim, err := bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		Template: bctest.FakeDaemonConfig{Gateway: f.cp.GatewayAddr}, Root: t.TempDir(), N: 1,
		Token: func(ctx context.Context, i int) (string, error) {
			tok, err := f.admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "nodes"}))
			return tok.Msg.GetToken(), err
		},
	})
	require.NoError(t, err)
	t.Cleanup(sim.Stop)
	bctest.WaitFor(t, "the node's GPUs in inventory", func() bool {
		n, err := f.admin.Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{Tenant: "acme"}))
		require.NoError(t, err)
		return len(n.Msg.GetNodes()) == 1 && n.Msg.GetNodes()[0].GetGpuCount() > 0
	})
	return idleFixture{f}
}

// h100Pool creates an active pool selecting the node.
func (f idleFixture) h100Pool(t *testing.T, name string) {
	t.Helper()
	_, err := f.keys["admin"].Pools.Create(context.Background(), connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: name,
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}}}))
	require.NoError(t, err)
}

// releaseAll releases the reservations and waits until none is live.
func (f idleFixture) releaseAll(t *testing.T, ids []string) {
	t.Helper()
	ctx := context.Background()
	for _, id := range ids {
		_, err := f.admin.Reservations.Release(ctx, connect.NewRequest(&apiv1.ReleaseReservationRequest{Tenant: "acme", Reservation: id}))
		require.NoError(t, err)
	}
	for _, id := range ids {
		bctest.WaitFor(t, "reservation "+id+" to end", func() bool {
			g, err := f.admin.Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "acme", Reservation: id}))
			require.NoError(t, err)
			return !capmodel.Live(g.Msg.GetReservation().GetState())
		})
	}
}

func archiveIfIdle(c *client.Client, pool string) (*connect.Response[apiv1.ArchivePoolResponse], error) {
	return c.Pools.Archive(context.Background(), connect.NewRequest(&apiv1.ArchivePoolRequest{Tenant: "acme", Pool: pool, IfIdle: true}))
}

// TestArchiveIfIdle: with if_idle the server refuses to archive a pool that
// has a live reservation, naming how many and one; another tenant cannot
// archive it; once the reservation ended, the archive goes through.
func TestArchiveIfIdle(t *testing.T) {
	t.Parallel()
	f := setupIdle(t)
	ctx := context.Background()
	f.h100Pool(t, "h100")
	res, err := f.keys["admin"].Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Gpus: 1, DurationSeconds: 3600}))
	require.NoError(t, err)
	resv := res.Msg.GetReservation().GetId()

	_, err = archiveIfIdle(f.keys["admin"], "h100")
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "pool h100 has 1 live reservation ("+resv+" is one)")
	p, err := f.admin.Pools.Get(ctx, connect.NewRequest(&apiv1.GetPoolRequest{Tenant: "acme", Pool: "h100"}))
	require.NoError(t, err)
	require.Equal(t, "active", p.Msg.GetPool().GetState(), "nothing is written by a refused archive")

	_, err = f.keys["evil"].Pools.Archive(ctx, connect.NewRequest(&apiv1.ArchivePoolRequest{Tenant: "acme", Pool: p.Msg.GetPool().GetId(), IfIdle: true}))
	require.Error(t, err, "another tenant's key archives nothing")
	require.Contains(t, []connect.Code{connect.CodeNotFound, connect.CodePermissionDenied}, connect.CodeOf(err))

	f.releaseAll(t, []string{resv})
	a, err := archiveIfIdle(f.keys["admin"], "h100")
	require.NoError(t, err)
	require.Equal(t, "archived", a.Msg.GetPool().GetState())
	a, err = archiveIfIdle(f.keys["admin"], "h100")
	require.NoError(t, err, "archiving an archived pool changes nothing")
	require.Equal(t, "archived", a.Msg.GetPool().GetState())
}

// TestArchiveIfIdleRace starts reservation creates and an archive with
// if_idle on one pool at once, several rounds. The check is made in the
// archive's transaction under the pool's row lock, so the outcome is one
// of two: the archive went through and no create did, or the archive was
// refused and at least one create went through. A check made before the
// archive's transaction (the client's) would let both go through.
func TestArchiveIfIdleRace(t *testing.T) {
	t.Parallel()
	f := setupIdle(t)
	ctx := context.Background()
	c := f.keys["admin"]
	const creators = 4
	for round := range 3 {
		name := fmt.Sprintf("race%d", round)
		f.h100Pool(t, name)
		start := make(chan struct{})
		var (
			wg         sync.WaitGroup
			mu         sync.Mutex
			created    []string
			archiveErr error
		)
		for range creators {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				r, err := c.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: "acme", Pool: name, Gpus: 1, DurationSeconds: 3600}))
				if err == nil {
					mu.Lock()
					created = append(created, r.Msg.GetReservation().GetId())
					mu.Unlock()
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, archiveErr = archiveIfIdle(c, name)
		}()
		close(start)
		wg.Wait()

		p, err := f.admin.Pools.Get(ctx, connect.NewRequest(&apiv1.GetPoolRequest{Tenant: "acme", Pool: name}))
		require.NoError(t, err)
		t.Logf("round %d: %d of %d creates went through; archive: %v", round, len(created), creators, archiveErr)
		if archiveErr == nil {
			require.Empty(t, created, "round %d: the pool was archived while reservations were made in it", round)
			require.Equal(t, "archived", p.Msg.GetPool().GetState())
			continue
		}
		require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(archiveErr), "round %d: %v", round, archiveErr)
		require.NotEmpty(t, created, "round %d: refused with no reservation made: %v", round, archiveErr)
		require.Equal(t, "active", p.Msg.GetPool().GetState())
		f.releaseAll(t, created)
		_, err = archiveIfIdle(c, name)
		require.NoError(t, err, "round %d", round)
	}
}
