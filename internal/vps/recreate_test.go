package vps_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vps"
)

func condition(in *apiv1.Instance, typ string) *apiv1.InstanceCondition {
	for _, c := range in.GetConditions() {
		if c.GetType() == typ {
			return c
		}
	}
	return nil
}

// loseHost stops a host's daemon and declares it lost while the other
// hosts go on beating.
func (h *hosts) loseHost(t *testing.T, nodeID string) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, h.daemon(nodeID).Stop())
	h.cp.Clock.Advance(6 * time.Minute)
	// The kept hosts beat on the wall clock, not the test's.
	require.NoError(t, h.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE nodes SET last_heartbeat = $1 WHERE id <> $2`, h.cp.Clock.Now(), nodeID)
		return err
	}))
	_, _, err := h.cp.App.Gateway.SweepLiveness(ctx)
	require.NoError(t, err)
}

// TestInstanceRecreateOnHostLost: an instance created with on_host_lost
// recreate comes back running on the other host when its host is lost,
// with the same id, name, address and SSH keys, a new booking (the old one
// released) and its volume left behind, marked failed; one with the
// default policy on the same host stays lost. The recreate is the job the
// lost host's transaction queued; running it again changes nothing.
func TestInstanceRecreateOnHostLost(t *testing.T) {
	t.Parallel()
	h := setupHosts(t, 2)
	ctx := context.Background()
	res, err := h.acme.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: "phoenix", Flavor: "small",
		Image: "debian-12", IpPool: "dev", SshKeys: []string{testKey}, OnHostLost: vps.OnHostLostRecreate,
		Volumes: []*apiv1.InstanceVolumeSpec{{Name: "scratch", SizeGib: 1}}}))
	require.NoError(t, err)
	require.Equal(t, vps.OnHostLostRecreate, res.Msg.GetInstance().GetOnHostLost())
	before := waitState(t, h.acme, "phoenix", vps.StateRunning)
	// The placer packs GPU-less guests: keeper lands on phoenix's host.
	_, err = h.acme.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: "keeper", Flavor: "small",
		Image: "debian-12", IpPool: "dev"}))
	require.NoError(t, err)
	keeper := waitState(t, h.acme, "keeper", vps.StateRunning)
	require.Equal(t, before.GetNodeId(), keeper.GetNodeId())
	require.Equal(t, vps.OnHostLostKeep, keeper.GetOnHostLost(), "keep is the default")

	h.loseHost(t, before.GetNodeId())
	after := waitState(t, h.acme, "phoenix", vps.StateRunning)
	require.Equal(t, before.GetId(), after.GetId())
	require.NotEqual(t, before.GetNodeId(), after.GetNodeId(), "placed on the other host")
	require.Equal(t, before.GetAddress(), after.GetAddress(), "the address followed it")
	require.Equal(t, before.GetSshKeys(), after.GetSshKeys())
	require.Equal(t, before.GetFlavor(), after.GetFlavor())
	require.NotEqual(t, before.GetReservationId(), after.GetReservationId())
	require.Equal(t, 1, h.count(t, `SELECT COUNT(*) FROM reservations WHERE id = $1 AND state = 'released'`, before.GetReservationId()))
	require.Equal(t, 1, h.count(t, `SELECT COUNT(*) FROM reservations WHERE id = $1 AND state = 'active' AND node_id = $2`,
		after.GetReservationId(), after.GetNodeId()))
	c := condition(after, vps.CondRecreated)
	require.NotNil(t, c)
	require.Equal(t, "true", c.GetStatus())
	require.Contains(t, c.GetMessage(), "scratch")
	require.Empty(t, after.GetVolumeIds(), "the volume stayed on the lost host")
	require.Equal(t, 1, h.count(t, `SELECT COUNT(*) FROM volumes WHERE name = 'scratch' AND state = 'failed' AND instance_id = ''`))
	require.Equal(t, 1, h.count(t, `SELECT COUNT(*) FROM events WHERE type = 'instance.recreated' AND resource_id = $1`, after.GetId()))
	_, _, ok := h.daemon(after.GetNodeId()).Hypervisor().Guest(vps.HostID(after.GetId()))
	require.True(t, ok, "the new host runs the guest")
	require.Equal(t, vps.StateLost, getInstance(t, h.acme, "keeper").GetState(), "the default policy stays lost")

	// Again (a second replica's job, the sweep): nothing more happens.
	require.NoError(t, h.cp.App.Instances.Recreate(ctx, after.GetId()))
	n, err := h.cp.App.Instances.RecreateWaiting(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, 1, h.count(t, `SELECT COUNT(*) FROM commands WHERE kind = 'instance.create' AND idempotency_key LIKE $1`,
		after.GetId()+"/recreate/%"))
	require.Equal(t, 1, h.count(t, `SELECT COUNT(*) FROM reservations WHERE tenant_id = $1 AND state = 'active'`, after.GetTenantId()),
		"one booking: the recreated instance's")
}

// TestInstanceRecreateWaitsForCapacity: with no other host to take it, a
// recreate instance waits (placing, its Recreated condition saying why)
// instead of failing, and is deleted at once if asked: no host holds it.
func TestInstanceRecreateWaitsForCapacity(t *testing.T) {
	t.Parallel()
	h := setupHosts(t, 1)
	ctx := context.Background()
	_, err := h.acme.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: "phoenix", Flavor: "small",
		Image: "debian-12", IpPool: "dev", OnHostLost: vps.OnHostLostRecreate}))
	require.NoError(t, err)
	in := waitState(t, h.acme, "phoenix", vps.StateRunning)
	h.loseHost(t, in.GetNodeId())
	bctest.WaitFor(t, "the recreate waiting for a host", func() bool {
		in = getInstance(t, h.acme, "phoenix")
		c := condition(in, vps.CondRecreated)
		return c != nil && c.GetReason() == "NO_CAPACITY"
	})
	require.Equal(t, vps.StatePlacing, in.GetState())
	require.Equal(t, "false", condition(in, vps.CondRecreated).GetStatus())
	n, err := h.cp.App.Instances.RecreateWaiting(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the sweep tries it again")
	require.Equal(t, vps.StatePlacing, getInstance(t, h.acme, "phoenix").GetState())

	del, err := h.acme.Instances.Delete(ctx, connect.NewRequest(&apiv1.DeleteInstanceRequest{Tenant: "acme", Instance: "phoenix"}))
	require.NoError(t, err)
	require.Equal(t, vps.StateDeleted, del.Msg.GetInstance().GetState())
	require.Zero(t, h.count(t, `SELECT COUNT(*) FROM ip_leases`))
	n, err = h.cp.App.Instances.RecreateWaiting(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a deleted instance is not recreated")
}

// TestInstanceOnHostLostRefusals: a bad policy is refused with its field
// and writes nothing; another tenant neither sees the instance nor
// creates one with the policy in acme's name.
func TestInstanceOnHostLostRefusals(t *testing.T) {
	t.Parallel()
	h := setupHosts(t, 1)
	ctx := context.Background()
	before := h.count(t, `SELECT COUNT(*) FROM instances`)
	_, err := h.acme.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: "vm", Flavor: "small",
		Image: "debian-12", IpPool: "dev", OnHostLost: "resurrect"}))
	refused(t, err, "INVALID_ARGUMENT", "on_host_lost", "keep or recreate")
	require.Equal(t, before, h.count(t, `SELECT COUNT(*) FROM instances`))

	_, err = h.acme.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: "vm", Flavor: "small",
		Image: "debian-12", IpPool: "dev", OnHostLost: vps.OnHostLostRecreate}))
	require.NoError(t, err)
	_, err = h.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "other"}))
	require.NoError(t, err)
	k, err := h.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "other", Role: "admin"}))
	require.NoError(t, err)
	other := h.cp.Client(k.Msg.GetSecret())
	_, err = other.Instances.Get(ctx, connect.NewRequest(&apiv1.GetInstanceRequest{Tenant: "acme", Instance: "vm"}))
	require.Error(t, err)
	require.Contains(t, []string{"NOT_FOUND", "PERMISSION_DENIED"}, client.Code(err))
	_, err = other.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: "theirs", Flavor: "small",
		Image: "debian-12", IpPool: "dev", OnHostLost: vps.OnHostLostRecreate}))
	require.Error(t, err)
	require.Contains(t, []string{"NOT_FOUND", "PERMISSION_DENIED"}, client.Code(err))
	require.Equal(t, before+1, h.count(t, `SELECT COUNT(*) FROM instances`))
}
