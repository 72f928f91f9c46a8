package vps_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/vps"
)

// TestInstanceChurn is the seed's churn test on the control plane's side:
// 200 instances, a third with a volume, created and deleted in a random
// order by four clients at once on two hosts whose agents run the fake
// hypervisor. When it ends no guest or volume is left on a host, and no
// lease, live booking, attached volume or live instance in the database.
// (A real QEMU churn at this size does not fit TCG on CI; the real
// runtime's delete leaving no process, tap or file is TestGuestAgentRunsInstances.)
func TestInstanceChurn(t *testing.T) {
	t.Parallel()
	const total, clients = 200, 4
	h := setupHosts(t, 2)
	ctx := context.Background()
	_, err := h.acme.Flavors.Create(ctx, connect.NewRequest(&apiv1.CreateFlavorRequest{Tenant: "acme", Name: "tiny", Vcpus: 1,
		MemoryMib: 512, DiskGib: 1}))
	require.NoError(t, err)
	_, err = h.acme.IPPools.Create(ctx, connect.NewRequest(&apiv1.CreateIPPoolRequest{Tenant: "acme", Name: "churn", Cidr: "10.66.0.0/16"}))
	require.NoError(t, err)

	var (
		mu      sync.Mutex
		live    []string // created, not yet deleted
		volumes []string
		wg      sync.WaitGroup
	)
	next := make(chan int)
	for c := range clients {
		rng := rand.New(rand.NewPCG(uint64(c), 42))
		wg.Go(func() {
			for i := range next {
				req := &apiv1.CreateInstanceRequest{Tenant: "acme", Name: fmt.Sprintf("churn-%d", i), Flavor: "tiny",
					Image: "debian-12", IpPool: "churn"}
				if i%3 == 0 {
					req.Volumes = []*apiv1.InstanceVolumeSpec{{Name: fmt.Sprintf("vol-%d", i), SizeGib: 1}}
				}
				res, err := h.acme.Instances.Create(ctx, connect.NewRequest(req))
				if !assertNoErr(t, err, "create %d", i) {
					return
				}
				mu.Lock()
				live = append(live, res.Msg.GetInstance().GetId())
				if i%3 == 0 {
					volumes = append(volumes, fmt.Sprintf("vol-%d", i))
				}
				// Delete a random live one about half the time.
				var victim string
				if rng.IntN(2) == 0 && len(live) > 0 {
					k := rng.IntN(len(live))
					victim = live[k]
					live = append(live[:k], live[k+1:]...)
				}
				mu.Unlock()
				if victim != "" {
					_, err := h.acme.Instances.Delete(ctx, connect.NewRequest(&apiv1.DeleteInstanceRequest{Tenant: "acme", Instance: victim}))
					if !assertNoErr(t, err, "delete %s", victim) {
						return
					}
				}
			}
		})
	}
	for i := range total {
		next <- i
	}
	close(next)
	wg.Wait()
	require.False(t, t.Failed())

	for _, id := range live {
		_, err := h.acme.Instances.Delete(ctx, connect.NewRequest(&apiv1.DeleteInstanceRequest{Tenant: "acme", Instance: id}))
		require.NoError(t, err)
	}
	require.Equal(t, total, h.count(t, `SELECT COUNT(*) FROM instances`))
	bctest.WaitFor(t, "every instance deleted", func() bool {
		return h.count(t, `SELECT COUNT(*) FROM instances WHERE state <> $1`, vps.StateDeleted) == 0
	})
	for _, v := range volumes {
		_, err := h.acme.Volumes.Delete(ctx, connect.NewRequest(&apiv1.DeleteVolumeRequest{Tenant: "acme", Volume: v}))
		require.NoError(t, err, v)
	}
	bctest.WaitFor(t, "every volume deleted", func() bool {
		return h.count(t, `SELECT COUNT(*) FROM volumes WHERE state <> $1`, vps.VolumeDeleted) == 0
	})
	for _, d := range h.sim.Daemons {
		require.Empty(t, d.Hypervisor().Guests(), "no guest left on a host")
		require.Empty(t, d.Hypervisor().Volumes(), "no volume left on a host")
	}
	require.Zero(t, h.count(t, `SELECT COUNT(*) FROM ip_leases`), "no lease left")
	require.Zero(t, h.count(t, `SELECT COUNT(*) FROM reservations WHERE state IN ('pending', 'placed', 'binding', 'active')`),
		"no live booking left")
}

func assertNoErr(t *testing.T, err error, format string, args ...any) bool {
	t.Helper()
	if err != nil {
		t.Errorf(format+": %v", append(args, err)...)
		return false
	}
	return true
}
