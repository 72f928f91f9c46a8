package metal_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/imagesig"
	"github.com/better-compute/better-compute/internal/metal"
	"github.com/better-compute/better-compute/internal/store"
)

type fixture struct {
	cp    *bctest.ControlPlane
	admin *client.Client
	site  *apiv1.Site
	sim   *bctest.SimSite
}

// setup starts a control plane with tenant acme, its site dc1 on loopback
// (where the simulated BMCs listen) and a simulated site agent for it.
func setup(t *testing.T) *fixture {
	t.Helper()
	cp := bctest.NewControlPlane(t)
	f := &fixture{cp: cp, admin: cp.Admin()}
	ctx := context.Background()
	_, err := f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	s, err := f.admin.Sites.Create(ctx, connect.NewRequest(&apiv1.CreateSiteRequest{Tenant: "acme", Name: "dc1",
		Networks: []string{"127.0.0.0/8"}}))
	require.NoError(t, err)
	f.site = s.Msg.GetSite()
	f.sim = bctest.NewSimSite(t, cp.App.Metal, f.site.GetId())
	return f
}

func (f *fixture) enroll(t *testing.T, m *bctest.SimMachine) *apiv1.Machine {
	t.Helper()
	res, err := f.admin.Machines.Enroll(context.Background(), connect.NewRequest(&apiv1.EnrollMachineRequest{Tenant: "acme",
		Site: "dc1", Name: m.Name, BmcDriver: "redfish", BmcAddress: m.BMCAddress, BmcUsername: m.Username,
		BmcPassword: m.Password, Mac: m.MAC, HardwareProfile: "sim-8xh100"}))
	require.NoError(t, err)
	return res.Msg.GetMachine()
}

func (f *fixture) get(t *testing.T, name string) *apiv1.Machine {
	t.Helper()
	res, err := f.admin.Machines.Get(context.Background(), connect.NewRequest(&apiv1.GetMachineRequest{Tenant: "acme", Machine: name}))
	require.NoError(t, err)
	return res.Msg.GetMachine()
}

// waitIdle waits until the machine's workflow ended and returns it.
func (f *fixture) waitIdle(t *testing.T, name string) *apiv1.Machine {
	t.Helper()
	var m *apiv1.Machine
	bctest.WaitFor(t, name+"'s workflow to end", func() bool {
		m = f.get(t, name)
		return m.GetWorkflowId() == ""
	})
	return m
}

// image pushes a raw image to acme; signed, it carries a signature by a
// key on acme's allowlist.
func (f *fixture) image(t *testing.T, name string, signed bool) (*apiv1.Image, imagesig.Signer) {
	t.Helper()
	ctx := context.Background()
	b := []byte("disk image " + name)
	sum := sha256.Sum256(b)
	res, err := f.admin.PushImage(ctx, &apiv1.PushImageHeader{Tenant: "acme", Name: name, Kind: "raw",
		Sha256: hex.EncodeToString(sum[:]), SizeBytes: int64(len(b))}, bytes.NewReader(b), "")
	require.NoError(t, err)
	s, _, err := imagesig.GenerateKey(imagesig.AlgEd25519)
	require.NoError(t, err)
	if !signed {
		return res.GetImage(), s
	}
	_, err = f.admin.SignerKeys.Add(ctx, connect.NewRequest(&apiv1.AddSignerKeyRequest{Tenant: "acme", Name: "key-" + name, PublicKey: s.Public.PEM()}))
	require.NoError(t, err)
	img := res.GetImage()
	sig, err := s.Sign(imagesig.Payload(img.GetName(), img.GetKind(), img.GetSha256()))
	require.NoError(t, err)
	_, err = f.admin.Images.Sign(ctx, connect.NewRequest(&apiv1.SignImageRequest{Tenant: "acme", Image: img.GetId(),
		KeyFingerprint: s.Public.Fingerprint, Signature: sig}))
	require.NoError(t, err)
	return img, s
}

func (f *fixture) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, query, args...).Scan(&n)
	}))
	return n
}

// TestMachineLifecycle runs a simulated machine through its whole life:
// enroll → inspect → commission → ready → deploy → deployed → release →
// ready → rescue → release → retire, each transition a workflow whose
// power steps go through the real Redfish driver to the emulator.
func TestMachineLifecycle(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	sm := f.sim.AddMachine(t, "m1")
	m := f.enroll(t, sm)
	require.Equal(t, "enrolled", m.GetState())
	require.Equal(t, f.site.GetId(), m.GetSiteId())
	require.True(t, strings.HasPrefix(m.GetBmcCredentialRef(), metal.CredentialIDPrefix+"_"))

	// Inspect: inventory from the ramdisk; a machine never commissioned
	// stays enrolled.
	res, err := f.admin.Machines.Inspect(ctx, connect.NewRequest(&apiv1.InspectMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	require.Equal(t, "inspecting", res.Msg.GetMachine().GetState())
	require.NotEmpty(t, res.Msg.GetMachine().GetWorkflowId())
	m = f.waitIdle(t, "m1")
	require.Equal(t, "enrolled", m.GetState(), "failure: %s %s", m.GetFailedStep(), m.GetFailureReason())
	require.EqualValues(t, 64, m.GetInventory().GetFields()["cpus"].GetNumberValue())
	on, err := sm.Power.IsOn(ctx)
	require.NoError(t, err)
	require.False(t, on, "inspect ends with the machine off")

	// Commission: inventory, wipe (erase record), burn-in on request.
	cres, err := f.admin.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1", BurnIn: true}))
	require.NoError(t, err)
	require.Equal(t, "commissioning", cres.Msg.GetMachine().GetState())
	m = f.waitIdle(t, "m1")
	require.Equal(t, "ready", m.GetState(), "failure: %s %s", m.GetFailedStep(), m.GetFailureReason())
	require.Equal(t, 1, sm.Wipes())
	drives := m.GetEraseRecord().GetFields()["drives"].GetListValue().GetValues()
	require.Len(t, drives, 1)
	require.Equal(t, "nvme-format", drives[0].GetStructValue().GetFields()["method"].GetStringValue())

	// Deploy a signed image: written to the disk, booted from it.
	img, _ := f.image(t, "debian", true)
	dres, err := f.admin.Machines.Deploy(ctx, connect.NewRequest(&apiv1.DeployMachineRequest{Tenant: "acme", Machine: "m1", Image: "debian"}))
	require.NoError(t, err)
	require.Equal(t, "deploying", dres.Msg.GetMachine().GetState())
	m = f.waitIdle(t, "m1")
	require.Equal(t, "deployed", m.GetState(), "failure: %s %s", m.GetFailedStep(), m.GetFailureReason())
	require.Equal(t, img.GetId(), m.GetImageId())
	require.Equal(t, img.GetSha256(), sm.Image())
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM image_refs WHERE image_id = $1 AND ref_id = $2`, img.GetId(), m.GetId()))
	// The image is in use: it cannot be deleted while deployed.
	_, err = f.admin.Images.Delete(ctx, connect.NewRequest(&apiv1.DeleteImageRequest{Tenant: "acme", Image: "debian"}))
	require.Equal(t, "IMAGE_IN_USE", client.Code(err))

	// Release: wiped, ready again, the image unpinned.
	_, err = f.admin.Machines.Release(ctx, connect.NewRequest(&apiv1.ReleaseMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	m = f.waitIdle(t, "m1")
	require.Equal(t, "ready", m.GetState(), "failure: %s %s", m.GetFailedStep(), m.GetFailureReason())
	require.Empty(t, m.GetImageId())
	require.Empty(t, sm.Image())
	require.Equal(t, 2, sm.Wipes())
	require.Zero(t, f.count(t, `SELECT COUNT(*) FROM image_refs WHERE ref_id = $1`, m.GetId()))

	// Rescue: the ramdisk with an SSH key, for at most an hour.
	key := "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl ops@example"
	_, err = f.admin.Machines.Rescue(ctx, connect.NewRequest(&apiv1.RescueMachineRequest{Tenant: "acme", Machine: "m1",
		SshPublicKey: key, DurationSeconds: 1800}))
	require.NoError(t, err)
	m = f.waitIdle(t, "m1")
	require.Equal(t, "rescue", m.GetState(), "failure: %s %s", m.GetFailedStep(), m.GetFailureReason())
	require.Equal(t, f.cp.Clock.Now().Unix()+1800, m.GetRescueExpireTime().AsTime().Unix())
	_, err = f.admin.Machines.Release(ctx, connect.NewRequest(&apiv1.ReleaseMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	m = f.waitIdle(t, "m1")
	require.Equal(t, "ready", m.GetState())
	require.Nil(t, m.GetRescueExpireTime())

	require.Equal(t, []string{"ramdisk", "ramdisk", "ramdisk", "disk", "ramdisk", "rescue", "ramdisk"}, sm.Booted())
	require.Equal(t, 1, f.sim.MaxApplied(), "no step was applied twice")

	// Retire: out of service; its MAC may be enrolled again.
	rres, err := f.admin.Machines.Retire(ctx, connect.NewRequest(&apiv1.RetireMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	require.Equal(t, "retired", rres.Msg.GetMachine().GetState())

	// Events tell the story.
	require.Positive(t, f.count(t, `SELECT COUNT(*) FROM events WHERE resource_id = $1 AND type = 'machine.deployed'`, m.GetId()))

	// The BMC password never comes back, in any answer.
	list, err := f.admin.Machines.List(ctx, connect.NewRequest(&apiv1.ListMachinesRequest{Tenant: "acme"}))
	require.NoError(t, err)
	b, err := protojson.Marshal(list.Msg)
	require.NoError(t, err)
	require.NotContains(t, string(b), sm.Password)
	require.Equal(t, 0, f.count(t, `SELECT COUNT(*) FROM events WHERE CAST(data AS TEXT) LIKE $1`, "%"+sm.Password+"%"))
}

func sha(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// TestRescueExpires: a rescue ends on its own once it expires — a machine
// without an image powers off and is ready again; a deployed one boots
// its disk and is deployed again, its image untouched.
func TestRescueExpires(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	sm := f.sim.AddMachine(t, "m1")
	f.enroll(t, sm)
	_, err := f.admin.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	require.Equal(t, "ready", f.waitIdle(t, "m1").GetState())
	key := "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl ops@example"
	rescue := func(secs int64) {
		t.Helper()
		_, err := f.admin.Machines.Rescue(ctx, connect.NewRequest(&apiv1.RescueMachineRequest{Tenant: "acme", Machine: "m1",
			SshPublicKey: key, DurationSeconds: secs}))
		require.NoError(t, err)
		require.Equal(t, "rescue", f.waitIdle(t, "m1").GetState())
	}

	// expire sweeps once by hand. The leader's periodic sweep may run
	// first (its run-on-start can land after the clock moved on a busy
	// machine), so what must hold is that exactly one expiry per rescue
	// happened, by whichever sweep got there first.
	expire := func(total int) {
		t.Helper()
		n, err := f.cp.App.Metal.ExpireRescues(ctx)
		require.NoError(t, err)
		require.LessOrEqual(t, n, 1)
		m := f.waitIdle(t, "m1")
		require.Equal(t, total, f.count(t, `SELECT COUNT(*) FROM events WHERE resource_id = $1 AND type = 'machine.rescue_expired'`, m.GetId()))
	}

	rescue(600)
	n, err := f.cp.App.Metal.ExpireRescues(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "not yet")
	f.cp.Clock.Advance(11 * time.Minute)
	expire(1)
	m := f.waitIdle(t, "m1")
	require.Equal(t, "ready", m.GetState(), "failure: %s %s", m.GetFailedStep(), m.GetFailureReason())
	require.Nil(t, m.GetRescueExpireTime())
	on, err := sm.Power.IsOn(ctx)
	require.NoError(t, err)
	require.False(t, on)

	img, _ := f.image(t, "debian", true)
	_, err = f.admin.Machines.Deploy(ctx, connect.NewRequest(&apiv1.DeployMachineRequest{Tenant: "acme", Machine: "m1", Image: "debian"}))
	require.NoError(t, err)
	require.Equal(t, "deployed", f.waitIdle(t, "m1").GetState())
	rescue(0) // the default: an hour
	f.cp.Clock.Advance(61 * time.Minute)
	expire(2)
	m = f.waitIdle(t, "m1")
	require.Equal(t, "deployed", m.GetState(), "failure: %s %s", m.GetFailedStep(), m.GetFailureReason())
	require.Equal(t, img.GetId(), m.GetImageId())
	require.Equal(t, img.GetSha256(), sm.Image(), "a rescue leaves the disk alone")
	booted := sm.Booted()
	require.Equal(t, []string{"rescue", "disk"}, booted[len(booted)-2:])
}

// TestForgedWipeRefused: a wipe record signed with a key other than the
// one the machine's ramdisk joined with is refused: the machine fails
// instead of becoming ready, keeps no erase record, and the refusal is
// audited. Its discovery tokens are gone with the workflow.
func TestForgedWipeRefused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	sm := f.sim.AddMachine(t, "m1")
	m := f.enroll(t, sm)
	f.sim.ForgeWipes(true)
	_, err := f.admin.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	got := f.waitIdle(t, "m1")
	require.Equal(t, "failed", got.GetState())
	require.Equal(t, "wipe", got.GetFailedStep())
	require.Contains(t, got.GetFailureReason(), "the wipe result was refused")
	require.Contains(t, got.GetFailureReason(), "signature does not verify")
	require.Nil(t, got.GetEraseRecord())
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM audit_log WHERE action = 'machines.attestWipe' AND resource_id = $1 AND decision = 'deny'`, m.GetId()))
	require.Zero(t, f.count(t, `SELECT COUNT(*) FROM machine_discovery_tokens WHERE machine_id = $1`, m.GetId()))

	// An honest ramdisk's wipe takes it to ready, with the attested record.
	f.sim.ForgeWipes(false)
	_, err = f.admin.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	got = f.waitIdle(t, "m1")
	require.Equal(t, "ready", got.GetState(), "failure: %s %s", got.GetFailedStep(), got.GetFailureReason())
	rec := got.GetEraseRecord().GetFields()
	require.True(t, rec["attested"].GetBoolValue())
	require.NotEmpty(t, rec["signature"].GetStringValue())
	require.Equal(t, m.GetId(), rec["machine_id"].GetStringValue())
}
