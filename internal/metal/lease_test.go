package metal_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/imagesig"
	"github.com/better-compute/better-compute/internal/metal"
)

const rootKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl root@lessee"

// leaseFixture: acme owns a commissioned IPMI machine at a site whose
// simulated agent signs its BMC steps; beta is the lessee with an image of
// its own, signed by a key on its own allowlist; globex is a stranger.
type leaseFixture struct {
	*fixture
	sm     *bctest.SimMachine
	beta   *client.Client
	globex *client.Client
	img    *apiv1.Image
}

func tenantAdmin(t *testing.T, f *fixture, name string) *client.Client {
	t.Helper()
	ctx := context.Background()
	_, err := f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: name}))
	require.NoError(t, err)
	k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: name, Role: "admin"}))
	require.NoError(t, err)
	return f.cp.Client(k.Msg.GetSecret())
}

// signedImage pushes and signs a raw image in c's tenant.
func signedImage(t *testing.T, c *client.Client, tenant, name string) *apiv1.Image {
	t.Helper()
	ctx := context.Background()
	b := []byte("lessee disk image " + name)
	sum := sha256.Sum256(b)
	res, err := c.PushImage(ctx, &apiv1.PushImageHeader{Tenant: tenant, Name: name, Kind: "raw",
		Sha256: hex.EncodeToString(sum[:]), SizeBytes: int64(len(b))}, bytes.NewReader(b), "")
	require.NoError(t, err)
	s, _, err := imagesig.GenerateKey(imagesig.AlgEd25519)
	require.NoError(t, err)
	_, err = c.SignerKeys.Add(ctx, connect.NewRequest(&apiv1.AddSignerKeyRequest{Tenant: tenant, Name: "key-" + name, PublicKey: s.Public.PEM()}))
	require.NoError(t, err)
	img := res.GetImage()
	sig, err := s.Sign(imagesig.Payload(img.GetName(), img.GetKind(), img.GetSha256()))
	require.NoError(t, err)
	_, err = c.Images.Sign(ctx, connect.NewRequest(&apiv1.SignImageRequest{Tenant: tenant, Image: img.GetId(),
		KeyFingerprint: s.Public.Fingerprint, Signature: sig}))
	require.NoError(t, err)
	return img
}

func setupLease(t *testing.T, signSite bool) *leaseFixture {
	t.Helper()
	f := &leaseFixture{fixture: setup(t)}
	if signSite {
		f.sim.SignSiteReports(t, f.cp)
	}
	f.sm = f.sim.AddIPMIMachine(t, "m1")
	_, err := f.admin.Machines.Enroll(context.Background(), connect.NewRequest(&apiv1.EnrollMachineRequest{Tenant: "acme",
		Site: "dc1", Name: "m1", BmcDriver: "ipmi", BmcAddress: f.sm.BMCAddress, BmcUsername: f.sm.Username,
		BmcPassword: f.sm.Password, Mac: f.sm.MAC, HardwareProfile: "sim-8xh100"}))
	require.NoError(t, err)
	_, err = f.admin.Machines.Commission(context.Background(), connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	m := f.waitIdle(t, "m1")
	require.Equal(t, "ready", m.GetState(), "%s: %s", m.GetFailedStep(), m.GetFailureReason())
	f.beta = tenantAdmin(t, f.fixture, "beta")
	f.globex = tenantAdmin(t, f.fixture, "globex")
	f.img = signedImage(t, f.beta, "beta", "beta-os")
	return f
}

// offerAccept leases m1 to beta and waits for its deploy.
func (f *leaseFixture) offerAccept(t *testing.T) *apiv1.MachineLease {
	t.Helper()
	ctx := context.Background()
	res, err := f.admin.Machines.Lease(ctx, connect.NewRequest(&apiv1.LeaseMachineRequest{Tenant: "acme", Machine: "m1", Lessee: "beta"}))
	require.NoError(t, err)
	l := res.Msg.GetLease()
	require.Equal(t, metal.LeaseOffered, l.GetState())
	require.Equal(t, metal.BindingMachine, l.GetBinding())
	acc, err := f.beta.Machines.AcceptLease(ctx, connect.NewRequest(&apiv1.AcceptMachineLeaseRequest{Tenant: "beta", Lease: l.GetId(),
		Image: "beta-os", SshKey: rootKey}))
	require.NoError(t, err)
	require.Equal(t, metal.LeaseDeploying, acc.Msg.GetLease().GetState())
	m := f.waitIdle(t, "m1")
	require.Equal(t, "deployed", m.GetState(), "%s: %s", m.GetFailedStep(), m.GetFailureReason())
	require.Equal(t, l.GetId(), m.GetLeaseId())
	return f.lease(t, f.beta, "beta", l.GetId())
}

func (f *leaseFixture) lease(t *testing.T, c *client.Client, tenant, id string) *apiv1.MachineLease {
	t.Helper()
	res, err := c.Machines.GetLease(context.Background(), connect.NewRequest(&apiv1.GetMachineLeaseRequest{Tenant: tenant, Lease: id}))
	require.NoError(t, err)
	return res.Msg.GetLease()
}

func (f *leaseFixture) release(t *testing.T, c *client.Client, tenant, id string) *apiv1.Machine {
	t.Helper()
	res, err := c.Machines.ReleaseLease(context.Background(), connect.NewRequest(&apiv1.ReleaseMachineLeaseRequest{Tenant: tenant, Lease: id}))
	require.NoError(t, err)
	require.Equal(t, metal.LeaseReleasing, res.Msg.GetLease().GetState())
	return f.waitIdle(t, "m1")
}

func evidence(l *apiv1.MachineLease) map[string]*apiv1.MachineLeaseEvidence {
	out := map[string]*apiv1.MachineLeaseEvidence{}
	for _, e := range l.GetEvidence() {
		out[e.GetStep()] = e
	}
	return out
}

// TestDedicatedLeaseLifecycle: a whole machine is offered to beta, which
// deploys its own signed image with root by its own key and no platform
// join token; the owner can do nothing else with the machine meanwhile;
// beta's release runs the teardown — fence, ramdisk, firmware, attested
// erase, diagnostics, power off, BMC rotation — and only with every step's
// signed evidence verified is the machine ready again, its lease returned,
// its BMC password new.
func TestDedicatedLeaseLifecycle(t *testing.T) {
	t.Parallel()
	f := setupLease(t, true)
	ctx := context.Background()
	before := f.get(t, "m1")
	tokens := f.count(t, `SELECT COUNT(*) FROM join_tokens`)

	l := f.offerAccept(t)
	require.Equal(t, metal.LeaseActive, l.GetState())
	require.Equal(t, f.img.GetSha256(), f.sm.Image(), "the lessee's image is on the disk")
	require.Equal(t, f.img.GetId(), l.GetImageId())
	require.Contains(t, l.GetSshKeyFingerprint(), "SHA256:")
	require.Equal(t, tokens, f.count(t, `SELECT COUNT(*) FROM join_tokens`), "the lessee's OS gets no platform join token")
	require.Zero(t, f.count(t, `SELECT COUNT(*) FROM nodes WHERE labels LIKE $1 AND mode = 'node'`, "%"+before.GetId()+"%"),
		"no platform node for the leased machine")

	// The owner runs nothing on a leased machine.
	_, err := f.admin.Machines.Release(ctx, connect.NewRequest(&apiv1.ReleaseMachineRequest{Tenant: "acme", Machine: "m1"}))
	refused(t, err, "FAILED_PRECONDITION", "machine", "under lease "+l.GetId())
	_, err = f.admin.Machines.Power(ctx, connect.NewRequest(&apiv1.PowerMachineRequest{Tenant: "acme", Machine: "m1", Action: "off"}))
	refused(t, err, "FAILED_PRECONDITION", "machine", "under lease")
	_, err = f.admin.Machines.RotateBMCPassword(ctx, connect.NewRequest(&apiv1.RotateBMCPasswordRequest{Tenant: "acme", Machine: "m1"}))
	refused(t, err, "FAILED_PRECONDITION", "machine", "under lease")
	_, err = f.admin.Machines.Retire(ctx, connect.NewRequest(&apiv1.RetireMachineRequest{Tenant: "acme", Machine: "m1"}))
	refused(t, err, "FAILED_PRECONDITION", "machine", "under lease")

	m := f.release(t, f.beta, "beta", l.GetId())
	require.Equal(t, "ready", m.GetState(), "%s: %s", m.GetFailedStep(), m.GetFailureReason())
	require.Empty(t, m.GetLeaseId())
	require.Empty(t, m.GetMaintenanceReason())
	require.Empty(t, m.GetImageId(), "the lessee's image is unpinned")
	require.Empty(t, f.sm.Image(), "the disk was erased")
	require.NotEqual(t, before.GetBmcCredentialRef(), m.GetBmcCredentialRef(), "the BMC password was rotated")
	require.Equal(t, 1, f.sm.Rotations())
	require.Equal(t, 1, f.sim.MaxApplied(), "no step applied twice")

	for _, got := range []*apiv1.MachineLease{f.lease(t, f.beta, "beta", l.GetId()), f.lease(t, f.admin, "acme", l.GetId())} {
		require.Equal(t, metal.LeaseReturned, got.GetState())
		require.NotNil(t, got.GetEndTime())
		ev := evidence(got)
		require.Len(t, ev, len(metal.TeardownSteps))
		for _, step := range metal.TeardownSteps {
			e := ev[step]
			require.NotNil(t, e, step)
			require.True(t, e.GetVerified(), "%s: %s", step, e.GetDetail())
			require.Len(t, e.GetDigest(), 64, step)
			require.NotEmpty(t, e.GetSigner(), step)
		}
		require.Contains(t, ev["fence"].GetSigner(), "node/")
		require.Contains(t, ev["rotate-bmc"].GetSigner(), "node/")
		require.Contains(t, ev["erase"].GetSigner(), "ramdisk key")
		require.Contains(t, ev["firmware"].GetDetail(), "matches the commissioning baseline")
	}
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM events WHERE type = 'machine_lease.returned'`))

	// Ready again, the machine can be leased anew.
	l2 := f.offerAccept(t)
	require.NotEqual(t, l.GetId(), l2.GetId())
}

// TestLeaseTeardownQuarantines: a teardown whose evidence is not all there
// keeps the machine out of the pool — failed, in maintenance, under its
// quarantined lease — for drifted firmware, a forged erase, or BMC steps
// the site agent did not sign. Fixed, a second release returns it.
func TestLeaseTeardownQuarantines(t *testing.T) {
	t.Parallel()
	t.Run("firmware drift", func(t *testing.T) {
		t.Parallel()
		f := setupLease(t, true)
		l := f.offerAccept(t)
		f.sm.SetFirmware(map[string]any{"bios_vendor": "SimBIOS", "bios_version": "6.6.6-lessee", "bios_date": "01/01/2026",
			"board_vendor": "Sim", "board_name": "SIM-8XH100", "product_name": "sim-8xh100"})
		m := f.release(t, f.beta, "beta", l.GetId())
		require.Equal(t, "failed", m.GetState())
		require.Equal(t, l.GetId(), m.GetLeaseId(), "the machine stays under the lease")
		require.Contains(t, m.GetMaintenanceReason(), "firmware drifted")
		got := f.lease(t, f.beta, "beta", l.GetId())
		require.Equal(t, metal.LeaseQuarantined, got.GetState())
		ev := evidence(got)
		require.False(t, ev["firmware"].GetVerified())
		require.Contains(t, ev["firmware"].GetDetail(), `bios_version "1.0.0" → "6.6.6-lessee"`)
		require.True(t, ev["erase"].GetVerified())
		require.True(t, ev["rotate-bmc"].GetVerified(), "the rotation itself went through")

		// Nothing else runs on it: not a commission, not a new lease.
		_, err := f.admin.Machines.Commission(context.Background(), connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1"}))
		refused(t, err, "FAILED_PRECONDITION", "machine", "under lease")
		_, err = f.admin.Machines.Lease(context.Background(), connect.NewRequest(&apiv1.LeaseMachineRequest{Tenant: "acme", Machine: "m1", Lessee: "globex"}))
		require.Equal(t, "FAILED_PRECONDITION", client.Code(err))

		// The firmware put back, the teardown runs again and returns it.
		f.sm.SetFirmware(nil)
		m = f.release(t, f.admin, "acme", l.GetId())
		require.Equal(t, "ready", m.GetState(), m.GetMaintenanceReason())
		require.Empty(t, m.GetMaintenanceReason())
		require.Equal(t, metal.LeaseReturned, f.lease(t, f.beta, "beta", l.GetId()).GetState())
	})
	t.Run("forged erase", func(t *testing.T) {
		t.Parallel()
		f := setupLease(t, true)
		l := f.offerAccept(t)
		f.sim.ForgeWipes(true)
		m := f.release(t, f.beta, "beta", l.GetId())
		require.Equal(t, "failed", m.GetState())
		require.Contains(t, m.GetMaintenanceReason(), "erase: the wipe result was refused")
		ev := evidence(f.lease(t, f.beta, "beta", l.GetId()))
		require.False(t, ev["erase"].GetVerified())
		require.Equal(t, metal.LeaseQuarantined, f.lease(t, f.beta, "beta", l.GetId()).GetState())
	})
	t.Run("erase step fails", func(t *testing.T) {
		t.Parallel()
		f := setupLease(t, true)
		l := f.offerAccept(t)
		f.sim.FailNext(metal.KindDiskWipe, "nvme sanitize: device busy")
		m := f.release(t, f.beta, "beta", l.GetId())
		require.Equal(t, "failed", m.GetState())
		require.Contains(t, m.GetMaintenanceReason(), "the teardown failed at erase")
		got := f.lease(t, f.beta, "beta", l.GetId())
		require.Equal(t, metal.LeaseQuarantined, got.GetState())
		require.False(t, evidence(got)["rotate-bmc"].GetVerified(), "later steps never ran")
		require.Equal(t, f.get(t, "m1").GetBmcCredentialRef(), m.GetBmcCredentialRef())
		require.Empty(t, m.GetBmcPendingCredentialRef(), "the pending password is discarded")
	})
	t.Run("unsigned site reports", func(t *testing.T) {
		t.Parallel()
		f := setupLease(t, false)
		l := f.offerAccept(t)
		m := f.release(t, f.beta, "beta", l.GetId())
		require.Equal(t, "failed", m.GetState())
		ev := evidence(f.lease(t, f.beta, "beta", l.GetId()))
		require.False(t, ev["fence"].GetVerified())
		require.Contains(t, ev["fence"].GetDetail(), "no verified site agent report")
		require.False(t, ev["rotate-bmc"].GetVerified())
		require.True(t, ev["erase"].GetVerified(), "the ramdisk's own evidence still verifies")
	})
}

// TestLeaseIsolation: a stranger cannot see, accept or release a lease, by
// naming its own tenant or the lessee's; the lessee cannot see the
// machine; the owner cannot accept on the lessee's behalf.
func TestLeaseIsolation(t *testing.T) {
	t.Parallel()
	f := setupLease(t, true)
	ctx := context.Background()
	res, err := f.admin.Machines.Lease(ctx, connect.NewRequest(&apiv1.LeaseMachineRequest{Tenant: "acme", Machine: "m1", Lessee: "beta"}))
	require.NoError(t, err)
	id := res.Msg.GetLease().GetId()

	_, err = f.admin.Machines.AcceptLease(ctx, connect.NewRequest(&apiv1.AcceptMachineLeaseRequest{Tenant: "acme", Lease: id,
		Image: "beta-os", SshKey: rootKey}))
	refused(t, err, "FAILED_PRECONDITION", "tenant", "not the lease's lessee")

	for _, tenant := range []string{"globex", "beta"} {
		want := "NOT_FOUND"
		if tenant == "beta" {
			want = "PERMISSION_DENIED"
		}
		_, err = f.globex.Machines.GetLease(ctx, connect.NewRequest(&apiv1.GetMachineLeaseRequest{Tenant: tenant, Lease: id}))
		require.Equal(t, want, client.Code(err), tenant)
		_, err = f.globex.Machines.ReleaseLease(ctx, connect.NewRequest(&apiv1.ReleaseMachineLeaseRequest{Tenant: tenant, Lease: id}))
		require.Equal(t, want, client.Code(err), tenant)
		_, err = f.globex.Machines.AcceptLease(ctx, connect.NewRequest(&apiv1.AcceptMachineLeaseRequest{Tenant: tenant, Lease: id,
			Image: "beta-os", SshKey: rootKey}))
		require.Equal(t, want, client.Code(err), tenant)
	}
	// A made-up id answers the same as the real one.
	_, err = f.globex.Machines.GetLease(ctx, connect.NewRequest(&apiv1.GetMachineLeaseRequest{Tenant: "globex", Lease: "mls_00000000000000000000000000"}))
	require.Equal(t, "NOT_FOUND", client.Code(err))
	_, err = f.beta.Machines.Get(ctx, connect.NewRequest(&apiv1.GetMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err), "the lessee does not see the owner's machine")
	// The lessee's image stays its own: globex cannot deploy it on a lease.
	require.Equal(t, metal.LeaseOffered, f.lease(t, f.beta, "beta", id).GetState())

	// A withdrawn offer ends at once; nothing ran on the machine.
	_, err = f.admin.Machines.ReleaseLease(ctx, connect.NewRequest(&apiv1.ReleaseMachineLeaseRequest{Tenant: "acme", Lease: id}))
	require.NoError(t, err)
	require.Equal(t, metal.LeaseReturned, f.lease(t, f.beta, "beta", id).GetState())
	m := f.get(t, "m1")
	require.Equal(t, "ready", m.GetState())
	require.Empty(t, m.GetLeaseId())
}

// TestLeaseBadInput: bad requests are refused with their code and field,
// are audited past authorization, and write nothing.
func TestLeaseBadInput(t *testing.T) {
	t.Parallel()
	f := setupLease(t, true)
	ctx := context.Background()
	rf := f.sim.AddMachine(t, "rf1") // a Redfish BMC: no rotation
	f.enroll(t, rf)
	_, err := f.admin.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "rf1"}))
	require.NoError(t, err)
	f.waitIdle(t, "rf1")
	lease := func(machine, lessee string) error {
		_, err := f.admin.Machines.Lease(ctx, connect.NewRequest(&apiv1.LeaseMachineRequest{Tenant: "acme", Machine: machine, Lessee: lessee}))
		return err
	}
	before := f.rows(t)
	leases := f.count(t, `SELECT COUNT(*) FROM machine_leases`)
	refused(t, lease("m1", ""), "INVALID_ARGUMENT", "lessee", "is required")
	refused(t, lease("m1", "no such"), "INVALID_ARGUMENT", "lessee", "")
	refused(t, lease("m1", "nobody"), "NOT_FOUND", "lessee", "no such tenant")
	refused(t, lease("rf1", "beta"), "FAILED_PRECONDITION", "machine", "does not set passwords")
	refused(t, lease("nope", "beta"), "NOT_FOUND", "", `machine "nope" not found`)
	require.Equal(t, before, f.rows(t))
	require.Equal(t, leases, f.count(t, `SELECT COUNT(*) FROM machine_leases`))
	require.Positive(t, f.audited(t, "machines.lease", "FAILED_PRECONDITION"))

	res, err := f.admin.Machines.Lease(ctx, connect.NewRequest(&apiv1.LeaseMachineRequest{Tenant: "acme", Machine: "m1", Lessee: "beta"}))
	require.NoError(t, err)
	id := res.Msg.GetLease().GetId()
	refused(t, lease("m1", "globex"), "FAILED_PRECONDITION", "", "already under lease")
	accept := func(lease, image, key string) error {
		_, err := f.beta.Machines.AcceptLease(ctx, connect.NewRequest(&apiv1.AcceptMachineLeaseRequest{Tenant: "beta", Lease: lease,
			Image: image, SshKey: key}))
		return err
	}
	unsigned, err := f.beta.PushImage(ctx, &apiv1.PushImageHeader{Tenant: "beta", Name: "unsigned", Kind: "raw",
		Sha256: hex.EncodeToString(make([]byte, 32)), SizeBytes: 0}, bytes.NewReader(nil), "")
	if err == nil {
		refused(t, accept(id, unsigned.GetImage().GetName(), rootKey), "IMAGE_UNTRUSTED", "image", "")
	}
	before = f.rows(t)
	refused(t, accept(id, "", rootKey), "INVALID_ARGUMENT", "image", "is required")
	refused(t, accept(id, "beta-os", ""), "INVALID_ARGUMENT", "ssh_key", "is required")
	refused(t, accept(id, "beta-os", "ssh-ed25519 bm90IGEga2V5"), "INVALID_ARGUMENT", "ssh_key", "OpenSSH public key")
	refused(t, accept("mls_", "beta-os", rootKey), "INVALID_ARGUMENT", "lease", "")
	refused(t, accept(id, "no-such-image", rootKey), "NOT_FOUND", "", "")
	require.Equal(t, before, f.rows(t))
	require.Equal(t, metal.LeaseOffered, f.lease(t, f.beta, "beta", id).GetState())
	_, err = f.beta.Machines.ReleaseLease(ctx, connect.NewRequest(&apiv1.ReleaseMachineLeaseRequest{Tenant: "beta", Lease: id}))
	require.NoError(t, err)
	_, err = f.beta.Machines.ReleaseLease(ctx, connect.NewRequest(&apiv1.ReleaseMachineLeaseRequest{Tenant: "beta", Lease: id}))
	refused(t, err, "FAILED_PRECONDITION", "", "is returned")
}
