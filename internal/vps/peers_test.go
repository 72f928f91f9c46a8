package vps_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vps"
)

// TestInstancePeersPushed: a private guest's peer list follows the
// tenant's instances on its IP pool — a third instance that starts running
// is added on the two already running, a deleted one is taken off — with
// one instance.peers per guest per change.
func TestInstancePeersPushed(t *testing.T) {
	t.Parallel()
	h := setupHosts(t, 1)
	ctx := context.Background()
	ins := map[string]*apiv1.Instance{}
	create := func(name, policy string) {
		t.Helper()
		_, err := h.acme.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: name, Flavor: "small",
			Image: "debian-12", IpPool: "dev", NetworkPolicy: policy}))
		require.NoError(t, err)
		ins[name] = waitState(t, h.acme, name, vps.StateRunning)
	}
	hv := h.sim.Daemons[0].Hypervisor()
	// waitPeers waits until the host admits exactly want for the guest.
	waitPeers := func(name string, want ...string) {
		t.Helper()
		bctest.WaitFor(t, name+"'s peers "+joinOr(want), func() bool {
			got, ok := hv.Peers(vps.HostID(ins[name].GetId()))
			require.True(t, ok)
			return equalSet(got, want)
		})
	}
	peersSent := func(name string) int {
		return h.count(t, `SELECT COUNT(*) FROM commands WHERE kind = 'instance.peers' AND params LIKE $1`,
			`%"`+vps.HostID(ins[name].GetId())+`"%`)
	}
	addr := func(name string) string { return ins[name].GetAddress() }

	create("vm1", "private")
	create("vm2", "private")
	// vm2 got vm1 with its create; vm1 hears of vm2 once vm2 runs.
	waitPeers("vm2", addr("vm1"))
	waitPeers("vm1", addr("vm2"))

	create("vm3", "private")
	waitPeers("vm1", addr("vm2"), addr("vm3"))
	waitPeers("vm2", addr("vm1"), addr("vm3"))
	waitPeers("vm3", addr("vm1"), addr("vm2"))
	require.Equal(t, 2, peersSent("vm1"), "one per change: vm2 ran, vm3 ran")
	require.Equal(t, 1, peersSent("vm2"))
	require.Zero(t, peersSent("vm3"), "vm3's list came with its create")

	_, err := h.acme.Instances.Delete(ctx, connect.NewRequest(&apiv1.DeleteInstanceRequest{Tenant: "acme", Instance: "vm2"}))
	require.NoError(t, err)
	waitState(t, h.acme, ins["vm2"].GetId(), vps.StateDeleted)
	waitPeers("vm1", addr("vm3"))
	waitPeers("vm3", addr("vm1"))
	require.Equal(t, 3, peersSent("vm1"))
	require.Equal(t, 1, peersSent("vm3"))

	// An egress instance of the tenant is a peer too (private admits the
	// tenant's guests); it gets no list of its own.
	create("web", "")
	waitPeers("vm1", addr("vm3"), addr("web"))
	waitPeers("vm3", addr("vm1"), addr("web"))
	require.Zero(t, peersSent("web"))
	bctest.WaitFor(t, "every instance.peers answered", func() bool {
		return h.count(t, `SELECT COUNT(*) FROM commands WHERE kind = 'instance.peers' AND state <> 'succeeded'`) == 0
	})
	require.Empty(t, getInstance(t, h.acme, "vm1").GetMessage())
}

func equalSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	seen := map[string]int{}
	for _, s := range a {
		seen[s]++
	}
	for _, s := range b {
		if seen[s] == 0 {
			return false
		}
		seen[s]--
	}
	return true
}

func joinOr(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	out := s[0]
	for _, x := range s[1:] {
		out += "," + x
	}
	return out
}

// TestInstancePeersLost: when a host is lost, the tenant's private guests
// on another host stop admitting the guests it took, in one push.
func TestInstancePeersLost(t *testing.T) {
	t.Parallel()
	h := setupHosts(t, 2)
	ctx := context.Background()
	// Pool gpu keeps host h1; pool h0 takes the other (pools share no node).
	_, err := h.admin.Pools.Update(ctx, connect.NewRequest(&apiv1.UpdatePoolRequest{Tenant: "acme", Pool: "gpu",
		Selector: &apiv1.PoolSelector{Requirements: []*apiv1.SelectorRequirement{{Key: "host", Operator: "In", Values: []string{"h1"}}}}}))
	require.NoError(t, err)
	_, err = h.admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "h0",
		Selector: []*apiv1.SelectorRequirement{{Key: "host", Operator: "In", Values: []string{"h0"}}}}))
	require.NoError(t, err)
	ins := map[string]*apiv1.Instance{}
	for _, c := range []struct{ name, pool string }{{"a1", "h0"}, {"a2", "h0"}, {"b1", "gpu"}, {"b2", "gpu"}} {
		_, err := h.acme.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: c.name, Flavor: "small",
			Image: "debian-12", IpPool: "dev", Pool: c.pool, NetworkPolicy: "private"}))
		require.NoError(t, err)
		ins[c.name] = waitState(t, h.acme, c.name, vps.StateRunning)
	}
	require.Equal(t, ins["a1"].GetNodeId(), ins["a2"].GetNodeId())
	require.Equal(t, ins["b1"].GetNodeId(), ins["b2"].GetNodeId())
	require.NotEqual(t, ins["a1"].GetNodeId(), ins["b1"].GetNodeId())
	kept := h.daemon(ins["b1"].GetNodeId())
	for _, n := range []string{"b1", "b2"} {
		bctest.WaitFor(t, n+" admits the three others", func() bool {
			got, _ := kept.Hypervisor().Peers(vps.HostID(ins[n].GetId()))
			return len(got) == 3
		})
	}

	require.NoError(t, h.daemon(ins["a1"].GetNodeId()).Stop())
	h.cp.Clock.Advance(6 * time.Minute)
	// The kept host went on beating through those minutes (its beats run
	// on the wall clock, not the test's).
	require.NoError(t, h.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE nodes SET last_heartbeat = $1 WHERE id = $2`, h.cp.Clock.Now(), kept.NodeID())
		return err
	}))
	_, _, err = h.cp.App.Gateway.SweepLiveness(ctx)
	require.NoError(t, err)
	require.Equal(t, vps.StateLost, getInstance(t, h.acme, "a1").GetState())
	require.Equal(t, vps.StateLost, getInstance(t, h.acme, "a2").GetState())
	require.Equal(t, vps.StateRunning, getInstance(t, h.acme, "b1").GetState())
	for n, other := range map[string]string{"b1": "b2", "b2": "b1"} {
		bctest.WaitFor(t, n+" admits only "+other, func() bool {
			got, ok := kept.Hypervisor().Peers(vps.HostID(ins[n].GetId()))
			require.True(t, ok)
			return equalSet(got, []string{ins[other].GetAddress()})
		})
		require.Equal(t, 1, h.count(t, `SELECT COUNT(*) FROM commands WHERE kind = 'instance.peers' AND params LIKE $1 AND create_time = $2`,
			`%"`+vps.HostID(ins[n].GetId())+`"%`, h.cp.Clock.Now()), "one push for both guests the host took")
	}
}
