package vps_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/usage"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vmcmd"
	"github.com/better-compute/better-compute/internal/vps"
)

const testKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGqL6xRVEXhP4Se+YuNJyr0Z5mDN3j0pHHs2cEXbQu5h test@bc"

// hosts is a control plane with tenant acme, one simulated host of acme's
// in pool gpu (running the fake hypervisor), the platform's flavor small
// and IP pool dev.
type hosts struct {
	*fixture
	sim *bctest.FleetSim
}

func setupHosts(t testing.TB, n int) *hosts {
	t.Helper()
	f := setup(t)
	ctx := context.Background()
	_, err := f.admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "default"}))
	require.NoError(t, err)
	sim, err := bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		Template: bctest.FakeDaemonConfig{Gateway: f.cp.GatewayAddr}, Root: t.TempDir(), N: n,
		Token: func(ctx context.Context, i int) (string, error) {
			// host=hN lets a test pool one host alone.
			tok, err := f.admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "default",
				Labels: map[string]string{"host": fmt.Sprintf("h%d", i)}}))
			return tok.Msg.GetToken(), err
		},
	})
	require.NoError(t, err)
	t.Cleanup(sim.Stop)
	bctest.WaitFor(t, "the hosts' GPUs", func() bool { return f.count(t, `SELECT COUNT(*) FROM gpus`) == 8*n })
	_, err = f.admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "gpu",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}}}))
	require.NoError(t, err)
	_, err = f.admin.Flavors.Create(ctx, connect.NewRequest(&apiv1.CreateFlavorRequest{Name: "small", Vcpus: 2, MemoryMib: 2048, DiskGib: 20}))
	require.NoError(t, err)
	_, err = f.admin.IPPools.Create(ctx, connect.NewRequest(&apiv1.CreateIPPoolRequest{Name: "dev", Cidr: "10.100.0.0/24", Dns: []string{"10.100.0.53"}}))
	require.NoError(t, err)
	return &hosts{fixture: f, sim: sim}
}

func (h *hosts) daemon(nodeID string) *bctest.FakeDaemon {
	for _, d := range h.sim.Daemons {
		if d.NodeID() == nodeID {
			return d
		}
	}
	return nil
}

func getInstance(t testing.TB, c *client.Client, ref string) *apiv1.Instance {
	t.Helper()
	g, err := c.Instances.Get(context.Background(), connect.NewRequest(&apiv1.GetInstanceRequest{Tenant: "acme", Instance: ref}))
	require.NoError(t, err)
	return g.Msg.GetInstance()
}

func waitState(t testing.TB, c *client.Client, ref, state string) *apiv1.Instance {
	t.Helper()
	var in *apiv1.Instance
	bctest.WaitFor(t, "instance "+ref+" "+state, func() bool {
		in = getInstance(t, c, ref)
		return in.GetState() == state
	})
	return in
}

// TestInstanceLifecycle: an instance is placed through capacity (a
// binding-instance reservation with no GPU), leases its address, is
// created on its host by bcd's contract through the real gateway, and
// converges from the answers: running, stopped, running again, deleted —
// when its address, booking and volume go back. One decision per mutation.
func TestInstanceLifecycle(t *testing.T) {
	t.Parallel()
	h := setupHosts(t, 1)
	ctx := context.Background()

	h.cp.Authz.Reset()
	res, err := h.acme.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: "vm1", Flavor: "small",
		Image: "debian-12", IpPool: "dev", SshKeys: []string{testKey}, UserData: "#cloud-config\n",
		Volumes: []*apiv1.InstanceVolumeSpec{{Name: "data", SizeGib: 10}}}))
	require.NoError(t, err)
	require.EqualValues(t, 1, h.cp.Authz.Calls(), "one decision covers the instance and its booking")
	in := res.Msg.GetInstance()
	require.Equal(t, vps.StateBooting, in.GetState())
	require.Equal(t, "10.100.0.2", in.GetAddress())
	require.Equal(t, "10.100.0.1", in.GetGateway())
	require.Equal(t, []string{"10.100.0.53"}, in.GetDns())
	require.Equal(t, "egress", in.GetNetworkPolicy())
	require.NotEmpty(t, in.GetReservationId())
	require.Len(t, in.GetVolumeIds(), 1)
	require.Equal(t, 1, h.count(t, `SELECT COUNT(*) FROM reservations WHERE id = $1 AND binding = 'instance' AND gpus = 0 AND vcpu = 2
		AND memory_gib = 2 AND state = 'active' AND flavor = 'small'`, in.GetReservationId()), "an active GPU-less booking")
	require.Equal(t, 1, h.count(t, `SELECT COUNT(*) FROM audit_log WHERE action = 'instances.create'`), "one audit row")

	// The platform's flavor and IP pool show in the tenant's listings, and
	// the flavor cannot go while an instance uses it.
	ipp, err := h.acme.IPPools.List(ctx, connect.NewRequest(&apiv1.ListIPPoolsRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Len(t, ipp.Msg.GetIpPools(), 1)
	require.Equal(t, "dev", ipp.Msg.GetIpPools()[0].GetName())
	_, err = h.admin.Flavors.Delete(ctx, connect.NewRequest(&apiv1.DeleteFlavorRequest{Flavor: "small"}))
	require.Equal(t, "FAILED_PRECONDITION", client.Code(err), "err: %v", err)
	require.Contains(t, err.Error(), "used by 1 instance")

	in = waitState(t, h.acme, "vm1", vps.StateRunning)
	require.Equal(t, "tcg", in.GetAccel())
	require.NotEmpty(t, in.GetSshAddress())
	conn, err := net.Dial("tcp", in.GetSshAddress())
	require.NoError(t, err, "the guest's sshd answers")
	_ = conn.Close()
	d := h.daemon(in.GetNodeId())
	require.NotNil(t, d)
	p, state, ok := d.Hypervisor().Guest(vps.HostID(in.GetId()))
	require.True(t, ok)
	require.Equal(t, vmcmd.StateRunning, state)
	require.Equal(t, "10.100.0.2/24", p.Network.Address)
	require.Equal(t, in.GetMac(), p.Network.MAC)
	require.Equal(t, []string{testKey}, p.Seed.AuthorizedKeys)
	require.Equal(t, "vm1", p.Seed.Hostname)
	require.Len(t, p.Volumes, 1)
	require.Equal(t, 10*1024, p.Volumes[0].SizeMiB)
	require.Empty(t, p.Placement.HostCPUs, "a shared flavor is not pinned")

	h.cp.Authz.Reset()
	_, err = h.acme.Instances.Stop(ctx, connect.NewRequest(&apiv1.StopInstanceRequest{Tenant: "acme", Instance: "vm1"}))
	require.NoError(t, err)
	require.EqualValues(t, 1, h.cp.Authz.Calls())
	waitState(t, h.acme, "vm1", vps.StateStopped)
	_, err = h.acme.Instances.Reboot(ctx, connect.NewRequest(&apiv1.RebootInstanceRequest{Tenant: "acme", Instance: "vm1"}))
	require.Equal(t, "FAILED_PRECONDITION", client.Code(err), "a stopped guest does not reboot")
	_, err = h.acme.Instances.Start(ctx, connect.NewRequest(&apiv1.StartInstanceRequest{Tenant: "acme", Instance: "vm1"}))
	require.NoError(t, err)
	waitState(t, h.acme, "vm1", vps.StateRunning)
	_, err = h.acme.Instances.Reboot(ctx, connect.NewRequest(&apiv1.RebootInstanceRequest{Tenant: "acme", Instance: "vm1"}))
	require.NoError(t, err)

	list, err := h.acme.Instances.List(ctx, connect.NewRequest(&apiv1.ListInstancesRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Len(t, list.Msg.GetInstances(), 1)

	h.cp.Authz.Reset()
	del, err := h.acme.Instances.Delete(ctx, connect.NewRequest(&apiv1.DeleteInstanceRequest{Tenant: "acme", Instance: "vm1"}))
	require.NoError(t, err)
	require.EqualValues(t, 1, h.cp.Authz.Calls())
	require.Equal(t, vps.StateDeleting, del.Msg.GetInstance().GetState())
	waitState(t, h.acme, in.GetId(), vps.StateDeleted)
	_, _, ok = d.Hypervisor().Guest(vps.HostID(in.GetId()))
	require.False(t, ok, "the host removed the guest")
	require.Zero(t, h.count(t, `SELECT COUNT(*) FROM ip_leases`), "the address went back to the pool")
	require.Equal(t, 1, h.count(t, `SELECT COUNT(*) FROM reservations WHERE id = $1 AND state = 'released'`, in.GetReservationId()))
	require.Zero(t, h.count(t, `SELECT COUNT(*) FROM bookings WHERE reservation_id = $1 AND ends_at > $2`, in.GetReservationId(), h.cp.Clock.Now()))
	vol, err := h.acme.Volumes.Get(ctx, connect.NewRequest(&apiv1.GetVolumeRequest{Tenant: "acme", Volume: "data"}))
	require.NoError(t, err)
	require.Equal(t, vps.VolumeAvailable, vol.Msg.GetVolume().GetState(), "the volume stays on the host, detached")
	_, err = h.acme.Volumes.Delete(ctx, connect.NewRequest(&apiv1.DeleteVolumeRequest{Tenant: "acme", Volume: "data"}))
	require.NoError(t, err)
	bctest.WaitFor(t, "volume deleted", func() bool {
		v, err := h.acme.Volumes.Get(ctx, connect.NewRequest(&apiv1.GetVolumeRequest{Tenant: "acme", Volume: vol.Msg.GetVolume().GetId()}))
		require.NoError(t, err)
		return v.Msg.GetVolume().GetState() == vps.VolumeDeleted
	})
	require.Empty(t, d.Hypervisor().Volumes())

	// Deleting twice changes nothing; the name is free again.
	_, err = h.acme.Instances.Delete(ctx, connect.NewRequest(&apiv1.DeleteInstanceRequest{Tenant: "acme", Instance: in.GetId()}))
	require.NoError(t, err)
	_, err = h.acme.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: "vm1", Flavor: "small",
		Image: "debian-12", IpPool: "dev"}))
	require.NoError(t, err)
}

// TestInstancePlacement: a pinned flavor gets dedicated host CPUs from its
// booking; a hugepage flavor books 1 GiB hugepages, and a host that cannot
// apply them marks the instance PlacementDegraded.
func TestInstancePlacement(t *testing.T) {
	t.Parallel()
	h := setupHosts(t, 1)
	ctx := context.Background()
	_, err := h.acme.Flavors.Create(ctx, connect.NewRequest(&apiv1.CreateFlavorRequest{Tenant: "acme", Name: "pinned", Vcpus: 4,
		MemoryMib: 4096, DiskGib: 10, Pinned: true, Hugepages: true}))
	require.NoError(t, err)
	h.sim.Daemons[0].Hypervisor().SetDegraded("huge_pages")
	web, err := h.acme.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: "web", Flavor: "small",
		Image: "debian-12", IpPool: "dev"}))
	require.NoError(t, err)
	res, err := h.acme.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: "db", Flavor: "pinned",
		Image: "debian-12", IpPool: "dev", NetworkPolicy: "private"}))
	require.NoError(t, err)
	in := res.Msg.GetInstance()
	require.NotEmpty(t, in.GetCpuset(), "dedicated CPUs")
	require.Equal(t, 1, h.count(t, `SELECT COUNT(*) FROM reservations WHERE id = $1 AND hugepages_1gi = 4 AND memory_gib = 0`, in.GetReservationId()))
	in = waitState(t, h.acme, "db", vps.StateRunning)
	degraded := false
	for _, c := range in.GetConditions() {
		degraded = degraded || (c.GetType() == vps.CondPlacementDegraded && c.GetStatus() == "true")
	}
	require.True(t, degraded, "conditions: %v", in.GetConditions())
	p, _, ok := h.sim.Daemons[0].Hypervisor().Guest(vps.HostID(in.GetId()))
	require.True(t, ok)
	require.Len(t, p.Placement.HostCPUs, 4)
	require.True(t, p.Placement.HugePages)
	require.Equal(t, "private", p.Network.Policy)
	require.Equal(t, []string{web.Msg.GetInstance().GetAddress()}, p.Network.Peers, "private admits the tenant's guests")
}

// TestInstanceNodeLost: the host stops answering; the fleet marks it lost,
// the instance is lost and its booking released, without a decision.
func TestInstanceNodeLost(t *testing.T) {
	t.Parallel()
	h := setupHosts(t, 1)
	ctx := context.Background()
	res, err := h.acme.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: "vm1", Flavor: "small",
		Image: "debian-12", IpPool: "dev"}))
	require.NoError(t, err)
	in := waitState(t, h.acme, "vm1", vps.StateRunning)
	require.NoError(t, h.sim.Daemons[0].Stop())
	h.cp.Authz.Reset()
	h.cp.Clock.Advance(6 * time.Minute)
	_, _, err = h.cp.App.Gateway.SweepLiveness(ctx)
	require.NoError(t, err)
	require.Zero(t, h.cp.Authz.Calls())
	in = getInstance(t, h.acme, in.GetId())
	require.Equal(t, vps.StateLost, in.GetState())
	require.Equal(t, 1, h.count(t, `SELECT COUNT(*) FROM reservations WHERE id = $1 AND state = 'released'`, res.Msg.GetInstance().GetReservationId()))
	// A lost instance is deleted at once: no host to ask.
	del, err := h.acme.Instances.Delete(ctx, connect.NewRequest(&apiv1.DeleteInstanceRequest{Tenant: "acme", Instance: "vm1"}))
	require.NoError(t, err)
	require.Equal(t, vps.StateDeleted, del.Msg.GetInstance().GetState())
	require.Zero(t, h.count(t, `SELECT COUNT(*) FROM ip_leases`))
}

// TestInstanceRefusals: bad input is refused with its field and writes
// nothing — no instance, booking, lease, command or event.
func TestInstanceRefusals(t *testing.T) {
	t.Parallel()
	h := setupHosts(t, 1)
	ctx := context.Background()
	_, err := h.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "other"}))
	require.NoError(t, err)
	for _, f := range []*apiv1.CreateFlavorRequest{
		{Tenant: "acme", Name: "huge", Vcpus: 1024, MemoryMib: 4096, DiskGib: 10},
		{Tenant: "acme", Name: "hugemem", Vcpus: 2, MemoryMib: 64 << 10, DiskGib: 10, Hugepages: true},
		{Tenant: "other", Name: "theirs", Vcpus: 1, MemoryMib: 1024, DiskGib: 10},
	} {
		_, err := h.admin.Flavors.Create(ctx, connect.NewRequest(f))
		require.NoError(t, err)
	}
	_, err = h.admin.IPPools.Create(ctx, connect.NewRequest(&apiv1.CreateIPPoolRequest{Tenant: "acme", Name: "tiny", Cidr: "10.9.0.0/30"}))
	require.NoError(t, err)
	_, err = h.admin.IPPools.Create(ctx, connect.NewRequest(&apiv1.CreateIPPoolRequest{Tenant: "other", Name: "theirs", Cidr: "10.8.0.0/24"}))
	require.NoError(t, err)
	// tiny's one address goes to a first instance.
	_, err = h.acme.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: "first", Flavor: "small",
		Image: "debian-12", IpPool: "tiny"}))
	require.NoError(t, err)
	waitState(t, h.acme, "first", vps.StateRunning)

	written := func() map[string]int {
		out := map[string]int{}
		for _, tbl := range []string{"instances", "volumes", "reservations", "cpu_bookings", "ip_leases", "commands", "events"} {
			out[tbl] = h.count(t, `SELECT COUNT(*) FROM `+tbl)
		}
		return out
	}
	ok := &apiv1.CreateInstanceRequest{Tenant: "acme", Name: "vm", Flavor: "small", Image: "debian-12", IpPool: "dev"}
	for _, c := range []struct {
		name, code, field string
		change            func(r *apiv1.CreateInstanceRequest)
	}{
		{"flavor bigger than any host", "NO_CAPACITY", "", func(r *apiv1.CreateInstanceRequest) { r.Flavor = "huge" }},
		{"more hugepages than any host", "NO_CAPACITY", "", func(r *apiv1.CreateInstanceRequest) { r.Flavor = "hugemem" }},
		{"pool exhausted", "RESOURCE_EXHAUSTED", "ip_pool", func(r *apiv1.CreateInstanceRequest) { r.IpPool = "tiny" }},
		{"unknown image", "INVALID_ARGUMENT", "image", func(r *apiv1.CreateInstanceRequest) { r.Image = "windows-11" }},
		{"bad policy", "INVALID_ARGUMENT", "network_policy", func(r *apiv1.CreateInstanceRequest) { r.NetworkPolicy = "open" }},
		{"bad key", "INVALID_ARGUMENT", "ssh_keys[0]", func(r *apiv1.CreateInstanceRequest) { r.SshKeys = []string{"not a key"} }},
		{"bad volume", "INVALID_ARGUMENT", "volumes[0].size_gib", func(r *apiv1.CreateInstanceRequest) {
			r.Volumes = []*apiv1.InstanceVolumeSpec{{Name: "d", SizeGib: 0}}
		}},
		{"another tenant's flavor", "NOT_FOUND", "", func(r *apiv1.CreateInstanceRequest) { r.Flavor = "theirs" }},
		{"another tenant's ip pool", "NOT_FOUND", "", func(r *apiv1.CreateInstanceRequest) { r.IpPool = "theirs" }},
		{"name taken", "ALREADY_EXISTS", "", func(r *apiv1.CreateInstanceRequest) { r.Name = "first" }},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := written()
			req := &apiv1.CreateInstanceRequest{Tenant: ok.Tenant, Name: ok.Name, Flavor: ok.Flavor, Image: ok.Image, IpPool: ok.IpPool}
			c.change(req)
			_, err := h.acme.Instances.Create(ctx, connect.NewRequest(req))
			require.Error(t, err)
			require.Equal(t, c.code, client.Code(err), "%v", err)
			if c.field != "" {
				require.Contains(t, fields(err), c.field)
			}
			after := written()
			// A refusal past the decision keeps its audit row only.
			require.Equal(t, before, after, "nothing written")
		})
	}
}

// fields lists the fields an error's violations name.
func fields(err error) []string {
	var out []string
	for _, v := range client.Detail(err).GetViolations() {
		out = append(out, v.GetField())
	}
	return out
}

// TestInstanceWatchUsageVolumes: a watch sees the instance's events as
// they happen; usage meters instance.<flavor>.hours from its booking; a
// volume created on an instance's host goes creating → available and is
// deleted from the host.
func TestInstanceWatchUsageVolumes(t *testing.T) {
	t.Parallel()
	h := setupHosts(t, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := h.acme.Instances.Watch(ctx, connect.NewRequest(&apiv1.WatchInstancesRequest{Tenant: "acme", Cursor: "0"}))
	require.NoError(t, err)
	defer func() { _ = stream.Close() }()
	res, err := h.acme.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: "vm1", Flavor: "small",
		Image: "debian-12", IpPool: "dev"}))
	require.NoError(t, err)
	id := res.Msg.GetInstance().GetId()
	var types []string
	for stream.Receive() {
		msg := stream.Msg()
		if msg.GetInstance() == nil {
			continue
		}
		require.Equal(t, id, msg.GetInstance().GetId())
		types = append(types, msg.GetType())
		if msg.GetType() == "instance.running" {
			break
		}
	}
	require.NoError(t, stream.Err())
	require.Equal(t, []string{"instance.created", "instance.running"}, types)

	// A rollup two hours on meters the closed hour per flavor (the clock
	// stays: the host must not turn unreachable).
	require.NoError(t, h.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := usage.Rollup(ctx, tx, h.cp.Clock.Now().Add(2*time.Hour), nil)
		return err
	}))
	require.Positive(t, h.count(t, `SELECT COUNT(*) FROM usage_windows WHERE metric = 'instance.small.hours' AND reservation_id = $1 AND quantity > 0`,
		res.Msg.GetInstance().GetReservationId()))

	vol, err := h.acme.Volumes.Create(ctx, connect.NewRequest(&apiv1.CreateVolumeRequest{Tenant: "acme", Name: "scratch", SizeGib: 5, Format: "raw",
		Instance: "vm1"}))
	require.NoError(t, err)
	require.Equal(t, vps.VolumeCreating, vol.Msg.GetVolume().GetState())
	volState := func() string {
		v, err := h.acme.Volumes.Get(ctx, connect.NewRequest(&apiv1.GetVolumeRequest{Tenant: "acme", Volume: vol.Msg.GetVolume().GetId()}))
		require.NoError(t, err)
		return v.Msg.GetVolume().GetState()
	}
	bctest.WaitFor(t, "volume available", func() bool { return volState() == vps.VolumeAvailable })
	hv := h.sim.Daemons[0].Hypervisor()
	require.Equal(t, []string{vps.HostID(vol.Msg.GetVolume().GetId())}, hv.Volumes())
	_, err = h.acme.Volumes.Create(ctx, connect.NewRequest(&apiv1.CreateVolumeRequest{Tenant: "acme", Name: "scratch", SizeGib: 5, Instance: "vm1"}))
	require.Equal(t, "ALREADY_EXISTS", client.Code(err))
	_, err = h.acme.Volumes.Create(ctx, connect.NewRequest(&apiv1.CreateVolumeRequest{Tenant: "acme", Name: "big", SizeGib: 0, Instance: "vm1"}))
	require.Equal(t, "INVALID_ARGUMENT", client.Code(err))
	require.Contains(t, fields(err), "size_gib")
	_, err = h.acme.Volumes.Delete(ctx, connect.NewRequest(&apiv1.DeleteVolumeRequest{Tenant: "acme", Volume: "scratch"}))
	require.NoError(t, err)
	bctest.WaitFor(t, "volume deleted", func() bool { return volState() == vps.VolumeDeleted })
	require.Empty(t, hv.Volumes())
}

// TestInstanceCreateExpired: a create whose host never answered before the
// command's deadline fails the instance and gives its booking back (the
// gateway's command sweep reports the expiry in its transaction).
func TestInstanceCreateExpired(t *testing.T) {
	t.Parallel()
	h := setupHosts(t, 1)
	ctx := context.Background()
	res, err := h.acme.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: "vm1", Flavor: "small",
		Image: "debian-12", IpPool: "dev"}))
	require.NoError(t, err)
	in := waitState(t, h.acme, "vm1", vps.StateRunning)
	// As if the answer had never come.
	require.NoError(t, h.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE instances SET state = 'booting' WHERE id = $1`, in.GetId())
		return err
	}))
	var cmd fleet.Command
	require.NoError(t, h.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT id, node_id, kind, params FROM commands WHERE kind = 'instance.create'`).Scan(&cmd.ID, &cmd.NodeID,
			&cmd.Kind, &cmd.Params)
	}))
	require.NoError(t, h.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return h.cp.App.Instances.CommandsExpired(ctx, tx, []fleet.Command{cmd})
	}))
	in = getInstance(t, h.acme, in.GetId())
	require.Equal(t, vps.StateFailed, in.GetState())
	require.Contains(t, in.GetMessage(), "deadline")
	require.Equal(t, 1, h.count(t, `SELECT COUNT(*) FROM reservations WHERE id = $1 AND state = 'released'`, res.Msg.GetInstance().GetReservationId()))
	// Its delete still goes to the host, which may hold part of a guest.
	_, err = h.acme.Instances.Delete(ctx, connect.NewRequest(&apiv1.DeleteInstanceRequest{Tenant: "acme", Instance: "vm1"}))
	require.NoError(t, err)
	waitState(t, h.acme, in.GetId(), vps.StateDeleted)
	require.Empty(t, h.sim.Daemons[0].Hypervisor().Guests())
	require.Zero(t, h.count(t, `SELECT COUNT(*) FROM ip_leases`))
}

// TestInstanceOtherReplica: with several replicas (PostgreSQL), a create or
// delete that reaches a replica not owning the pool's placer is forwarded
// to the one that does.
func TestInstanceOtherReplica(t *testing.T) {
	if os.Getenv(bctest.PostgresURLEnv) == "" {
		t.Skip("several replicas need PostgreSQL: on SQLite one process owns every pool")
	}
	t.Parallel()
	h := setupHosts(t, 1)
	ctx := context.Background()
	_, err := h.acme.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: "vm1", Flavor: "small",
		Image: "debian-12", IpPool: "dev"}))
	require.NoError(t, err, "the first create makes this replica the pool's owner")
	b := h.cp.NewReplica(t).Admin()
	res, err := b.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: "vm2", Flavor: "small",
		Image: "debian-12", IpPool: "dev"}))
	require.NoError(t, err, "the other replica forwards the create")
	waitState(t, h.acme, "vm2", vps.StateRunning)
	_, err = b.Instances.Delete(ctx, connect.NewRequest(&apiv1.DeleteInstanceRequest{Tenant: "acme", Instance: "vm2"}))
	require.NoError(t, err, "and the delete")
	waitState(t, h.acme, res.Msg.GetInstance().GetId(), vps.StateDeleted)
}

// TestInstanceReconcile: hosts are asked which guests they run. A guest
// its host no longer runs fails the instance and frees its booking; a guest
// the control plane no longer holds (its host came back after being marked
// lost) is a stray and is deleted on the host.
func TestInstanceReconcile(t *testing.T) {
	t.Parallel()
	h := setupHosts(t, 1)
	ctx := context.Background()
	var ids []string
	for _, name := range []string{"vm1", "vm2"} {
		_, err := h.acme.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: name, Flavor: "small",
			Image: "debian-12", IpPool: "dev"}))
		require.NoError(t, err)
		ids = append(ids, waitState(t, h.acme, name, vps.StateRunning).GetId())
	}
	h.sim.Daemons[0].Hypervisor().Drop(vps.HostID(ids[1]))
	h.cp.Clock.Advance(time.Second) // the list is newer than what the instances last heard

	// A list someone else runs is only an answer: it converges nothing.
	var cmdID string
	require.NoError(t, h.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		var tenant string
		if err := tx.QueryRow(ctx, `SELECT tenant_id FROM nodes WHERE id = $1`, h.sim.Daemons[0].NodeID()).Scan(&tenant); err != nil {
			return err
		}
		cmdID, err = fleet.SendSystemCommand(ctx, tx, h.cp.App.Gateway, fleet.SystemCommand{TenantID: tenant,
			NodeID: h.sim.Daemons[0].NodeID(), Kind: vmcmd.KindInstanceList, Params: map[string]any{}, IdempotencyKey: "ops-list",
			CreatedBy: "ops", TTL: time.Hour, Time: h.cp.Clock.Now(), Signer: h.cp.App.CommandSigner()})
		return err
	}))
	bctest.WaitFor(t, "the operator's list answered", func() bool {
		return h.count(t, `SELECT COUNT(*) FROM commands WHERE id = $1 AND state = 'succeeded'`, cmdID) == 1
	})
	require.Equal(t, vps.StateRunning, getInstance(t, h.acme, "vm2").GetState(), "an operator's list converges nothing")
	n, err := h.cp.App.Instances.SendLists(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	in := waitState(t, h.acme, "vm2", vps.StateFailed)
	require.Contains(t, in.GetMessage(), "no longer runs")
	require.Equal(t, 1, h.count(t, `SELECT COUNT(*) FROM reservations WHERE id = $1 AND state = 'released'`, in.GetReservationId()))
	require.Equal(t, vps.StateRunning, getInstance(t, h.acme, "vm1").GetState(), "a guest its host runs is left alone")

	// The host is lost, then comes back with vm1 still running on it.
	require.NoError(t, h.sim.Daemons[0].Stop())
	h.cp.Clock.Advance(6 * time.Minute)
	_, _, err = h.cp.App.Gateway.SweepLiveness(ctx)
	require.NoError(t, err)
	require.Equal(t, vps.StateLost, getInstance(t, h.acme, ids[0]).GetState())
	d, err := h.sim.Daemons[0].Restart()
	require.NoError(t, err)
	h.sim.Daemons[0] = d
	require.Len(t, d.Hypervisor().Guests(), 1, "the guest outlived the lost session")
	bctest.WaitFor(t, "the host ready again", func() bool {
		return h.count(t, `SELECT COUNT(*) FROM nodes WHERE id = $1 AND liveness = 'ready'`, d.NodeID()) == 1
	})
	h.cp.Clock.Advance(time.Second)
	_, err = h.cp.App.Instances.SendLists(ctx)
	require.NoError(t, err)
	bctest.WaitFor(t, "the stray deleted on its host", func() bool { return len(d.Hypervisor().Guests()) == 0 })
}
