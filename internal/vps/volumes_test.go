package vps_test

import (
	"context"
	"errors"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vmcmd"
	"github.com/better-compute/better-compute/internal/vps"
)

// TestVolumeHotAttach: a volume attaches to a running instance of its host
// through volume.attach (attaching → attached, in the instance's
// volume_ids and in the guest) and detaches through volume.detach
// (detaching → available), both idempotent; a stopped instance takes one
// too. Each refusal names its field and writes nothing; another tenant's
// ids are not found; bcd's failures leave the volume where it was, with
// the host's message.
func TestVolumeHotAttach(t *testing.T) {
	t.Parallel()
	h := setupHosts(t, 2)
	ctx := context.Background()
	// Pool gpu keeps host h1; pool h0 takes the other.
	_, err := h.admin.Pools.Update(ctx, connect.NewRequest(&apiv1.UpdatePoolRequest{Tenant: "acme", Pool: "gpu",
		Selector: &apiv1.PoolSelector{Requirements: []*apiv1.SelectorRequirement{{Key: "host", Operator: "In", Values: []string{"h1"}}}}}))
	require.NoError(t, err)
	_, err = h.admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "h0",
		Selector: []*apiv1.SelectorRequirement{{Key: "host", Operator: "In", Values: []string{"h0"}}}}))
	require.NoError(t, err)
	ins := map[string]*apiv1.Instance{}
	for _, c := range []struct{ name, pool string }{{"vm1", "h0"}, {"vm2", "h0"}, {"gone", "h0"}, {"far", "gpu"}} {
		_, err := h.acme.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: c.name, Flavor: "small",
			Image: "debian-12", IpPool: "dev", Pool: c.pool}))
		require.NoError(t, err)
		ins[c.name] = waitState(t, h.acme, c.name, vps.StateRunning)
	}
	require.Equal(t, ins["vm1"].GetNodeId(), ins["vm2"].GetNodeId())
	require.NotEqual(t, ins["vm1"].GetNodeId(), ins["far"].GetNodeId())
	hv := h.daemon(ins["vm1"].GetNodeId()).Hypervisor()
	_, err = h.acme.Instances.Delete(ctx, connect.NewRequest(&apiv1.DeleteInstanceRequest{Tenant: "acme", Instance: "gone"}))
	require.NoError(t, err)
	waitState(t, h.acme, ins["gone"].GetId(), vps.StateDeleted)

	getVol := func(ref string) *apiv1.Volume {
		t.Helper()
		g, err := h.acme.Volumes.Get(ctx, connect.NewRequest(&apiv1.GetVolumeRequest{Tenant: "acme", Volume: ref}))
		require.NoError(t, err)
		return g.Msg.GetVolume()
	}
	waitVol := func(ref, state string) *apiv1.Volume {
		t.Helper()
		var v *apiv1.Volume
		bctest.WaitFor(t, "volume "+ref+" "+state, func() bool {
			v = getVol(ref)
			return v.GetState() == state
		})
		return v
	}
	vols := map[string]*apiv1.Volume{}
	for _, c := range []struct{ name, on string }{{"data", "vm1"}, {"spare", "vm1"}, {"lost", "vm1"}, {"farvol", "far"}} {
		v, err := h.acme.Volumes.Create(ctx, connect.NewRequest(&apiv1.CreateVolumeRequest{Tenant: "acme", Name: c.name, SizeGib: 1, Instance: c.on}))
		require.NoError(t, err)
		vols[c.name] = waitVol(v.Msg.GetVolume().GetId(), vps.VolumeAvailable)
	}
	attach := func(vol, in string) (*apiv1.Volume, error) {
		r, err := h.acme.Volumes.Attach(ctx, connect.NewRequest(&apiv1.AttachVolumeRequest{Tenant: "acme", Volume: vol, Instance: in}))
		if err != nil {
			return nil, err
		}
		return r.Msg.GetVolume(), nil
	}
	detach := func(vol string) (*apiv1.Volume, error) {
		r, err := h.acme.Volumes.Detach(ctx, connect.NewRequest(&apiv1.DetachVolumeRequest{Tenant: "acme", Volume: vol}))
		if err != nil {
			return nil, err
		}
		return r.Msg.GetVolume(), nil
	}
	sent := func(kind string) int {
		return h.count(t, `SELECT COUNT(*) FROM commands WHERE kind = $1`, kind)
	}
	events := func(typ, id string) int {
		return h.count(t, `SELECT COUNT(*) FROM events WHERE type = $1 AND resource_id = $2`, typ, id)
	}
	dataID := vols["data"].GetId()
	vm1Host := vps.HostID(ins["vm1"].GetId())

	// Attach to a running instance.
	h.cp.Authz.Reset()
	v, err := attach("data", "vm1")
	require.NoError(t, err)
	require.EqualValues(t, 1, h.cp.Authz.Calls(), "one decision")
	require.Equal(t, vps.VolumeAttaching, v.GetState())
	require.Equal(t, ins["vm1"].GetId(), v.GetInstanceId())
	waitVol(dataID, vps.VolumeAttached)
	require.Equal(t, []string{dataID}, getInstance(t, h.acme, "vm1").GetVolumeIds())
	require.Equal(t, []string{vps.HostID(dataID)}, hv.GuestVolumes(vm1Host))
	require.Equal(t, 1, events("volume.attached", dataID))
	// Again: attached already, nothing sent.
	v, err = attach(dataID, ins["vm1"].GetId())
	require.NoError(t, err)
	require.Equal(t, vps.VolumeAttached, v.GetState())
	require.Equal(t, 1, sent(vmcmd.KindVolumeAttach))

	// Another tenant's instance and volume, on the same host.
	_, err = h.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "other"}))
	require.NoError(t, err)
	var theirIn vps.Instance
	var theirVol vps.Volume
	require.NoError(t, h.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		other, err := otherTenant(ctx, tx)
		if err != nil {
			return err
		}
		if theirIn, err = vps.InstanceByID(ctx, tx, ins["vm2"].GetId(), ""); err != nil {
			return err
		}
		now := h.cp.Clock.Now()
		theirIn.ID, theirIn.TenantID, theirIn.Name = envelope.NewID(vps.InstanceIDPrefix, now), other, "theirs"
		theirVol = vps.Volume{ID: envelope.NewID(vps.VolumeIDPrefix, now), TenantID: other, Name: "theirs", SizeGiB: 1, Format: "qcow2",
			State: vps.VolumeAvailable, NodeID: theirIn.NodeID, CreateTime: now, UpdateTime: now}
		return errors.Join(vps.InstanceInsert(ctx, tx, &theirIn), vps.VolumeInsert(ctx, tx, &theirVol))
	}))

	written := func() [3]int {
		return [3]int{h.count(t, `SELECT COUNT(*) FROM commands`), h.count(t, `SELECT COUNT(*) FROM events`),
			h.count(t, `SELECT COUNT(*) FROM volumes WHERE state IN ('attaching', 'detaching')`)}
	}
	for _, c := range []struct {
		name, vol, in, code, field, reason string
	}{
		{"attached elsewhere", "data", "vm2", "FAILED_PRECONDITION", "volume", "detach it first"},
		{"another host", "spare", "far", "FAILED_PRECONDITION", "instance", ins["far"].GetNodeId()},
		{"instance deleted", "spare", ins["gone"].GetId(), "FAILED_PRECONDITION", "instance", "is deleted"},
		{"another tenant's instance", "spare", theirIn.ID, "NOT_FOUND", "", "not found"},
		{"another tenant's volume", theirVol.ID, "vm2", "NOT_FOUND", "", "not found"},
		{"unknown instance", "spare", "nope", "NOT_FOUND", "", "not found"},
		{"no instance", "spare", "", "INVALID_ARGUMENT", "instance", "required"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := written()
			_, err := attach(c.vol, c.in)
			refused(t, err, c.code, c.field, c.reason)
			require.Equal(t, before, written(), "nothing written")
		})
	}
	_, err = attach("spare", "far")
	require.ErrorContains(t, err, ins["vm1"].GetNodeId(), "the refusal names both hosts")
	_, err = h.acme.Volumes.Detach(ctx, connect.NewRequest(&apiv1.DetachVolumeRequest{Tenant: "acme", Volume: theirVol.ID}))
	refused(t, err, "NOT_FOUND", "", "not found")

	// Detach from the running instance.
	v, err = detach("data")
	require.NoError(t, err)
	require.Equal(t, vps.VolumeDetaching, v.GetState())
	v = waitVol(dataID, vps.VolumeAvailable)
	require.Empty(t, v.GetInstanceId())
	require.Empty(t, getInstance(t, h.acme, "vm1").GetVolumeIds())
	require.Empty(t, hv.GuestVolumes(vm1Host))
	require.Equal(t, 1, events("volume.detached", dataID))
	v, err = detach("data")
	require.NoError(t, err)
	require.Equal(t, vps.VolumeAvailable, v.GetState())
	require.Equal(t, 1, sent(vmcmd.KindVolumeDetach), "detaching a detached volume sends nothing")

	// A stopped instance takes a volume for its next start.
	_, err = h.acme.Instances.Stop(ctx, connect.NewRequest(&apiv1.StopInstanceRequest{Tenant: "acme", Instance: "vm2"}))
	require.NoError(t, err)
	waitState(t, h.acme, "vm2", vps.StateStopped)
	_, err = attach("spare", "vm2")
	require.NoError(t, err)
	waitVol("spare", vps.VolumeAttached)
	require.Equal(t, []string{vps.HostID(vols["spare"].GetId())}, hv.GuestVolumes(vps.HostID(ins["vm2"].GetId())))

	// A guest that keeps the device: the detach fails, the volume stays
	// attached with the host's message.
	_, err = h.acme.Instances.Start(ctx, connect.NewRequest(&apiv1.StartInstanceRequest{Tenant: "acme", Instance: "vm2"}))
	require.NoError(t, err)
	waitState(t, h.acme, "vm2", vps.StateRunning)
	hv.HoldVolume(vps.HostID(vols["spare"].GetId()), true)
	_, err = detach("spare")
	require.NoError(t, err)
	v = waitVol("spare", vps.VolumeAttached)
	require.Contains(t, v.GetMessage(), vmcmd.FailBusy)
	require.Equal(t, ins["vm2"].GetId(), v.GetInstanceId())

	// bcd cannot attach a volume whose file went: it stays available,
	// with the message.
	hv.DropVolume(vps.HostID(vols["lost"].GetId()))
	_, err = attach("lost", "vm1")
	require.NoError(t, err)
	v = waitVol("lost", vps.VolumeAvailable)
	require.Contains(t, v.GetMessage(), "attach failed")
	require.Contains(t, v.GetMessage(), vmcmd.FailNotFound)
	require.Empty(t, v.GetInstanceId())
	require.Equal(t, 1, events("volume.attach_failed", vols["lost"].GetId()))

	// A volume being attached is not detached under it; the instance's
	// delete frees every volume it holds.
	require.NoError(t, h.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE volumes SET state = 'attaching', instance_id = $1 WHERE id = $2`, ins["vm1"].GetId(), dataID)
		return err
	}))
	_, err = detach("data")
	refused(t, err, "FAILED_PRECONDITION", "volume", "still attaching")
	_, err = h.acme.Instances.Delete(ctx, connect.NewRequest(&apiv1.DeleteInstanceRequest{Tenant: "acme", Instance: "vm1"}))
	require.NoError(t, err)
	waitState(t, h.acme, ins["vm1"].GetId(), vps.StateDeleted)
	v = getVol("data")
	require.Equal(t, vps.VolumeAvailable, v.GetState())
	require.Empty(t, v.GetInstanceId())
}

// otherTenant is the id of tenant other.
func otherTenant(ctx context.Context, tx store.Tx) (string, error) {
	var id string
	err := tx.QueryRow(ctx, `SELECT id FROM tenants WHERE name = 'other'`).Scan(&id)
	return id, err
}
