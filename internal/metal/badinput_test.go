package metal_test

import (
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// refused checks a refusal: its machine code, the field it names and a
// word of its reason.
func refused(t *testing.T, err error, code, field, reason string) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, code, client.Code(err), "err: %v", err)
	d := client.Detail(err)
	if field == "" {
		require.Contains(t, d.GetMessage(), reason)
		return
	}
	for _, v := range d.GetViolations() {
		if v.GetField() == field {
			require.Contains(t, v.GetReason(), reason)
			return
		}
	}
	t.Fatalf("no violation of %s in %v", field, d.GetViolations())
}

// rows counts what a refused request must not have written.
func (f *fixture) rows(t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, tbl := range []string{"machines", "provision_workflows", "provision_steps", "image_refs", "sites", "events"} {
		out[tbl] = f.count(t, `SELECT COUNT(*) FROM `+tbl)
	}
	return out
}

func (f *fixture) audited(t *testing.T, action, result string) int {
	t.Helper()
	return f.count(t, `SELECT COUNT(*) FROM audit_log WHERE action = $1 AND result = $2`, action, result)
}

// TestMachineBadInput: each bad request is refused with its code, field and
// reason, is audited, and writes nothing else.
func TestMachineBadInput(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	sm := f.sim.AddMachine(t, "m1")
	f.enroll(t, sm)

	enroll := func(name, addr, mac string) error {
		_, err := f.admin.Machines.Enroll(ctx, connect.NewRequest(&apiv1.EnrollMachineRequest{Tenant: "acme", Site: "dc1", Name: name,
			BmcDriver: "redfish", BmcAddress: addr, BmcUsername: "admin", BmcPassword: "pw", Mac: mac}))
		return err
	}

	t.Run("bmc outside the site's networks", func(t *testing.T) {
		before := f.rows(t)
		refused(t, enroll("m-out", "http://10.9.9.9:8000", "02:00:00:00:01:01"), "INVALID_ARGUMENT", "bmc_address", "outside site dc1")
		require.Equal(t, before, f.rows(t))
		require.Equal(t, 1, f.audited(t, "machines.enroll", "INVALID_ARGUMENT"))
	})
	t.Run("bmc named by a host name", func(t *testing.T) {
		refused(t, enroll("m-dns", "https://bmc.example:443", "02:00:00:00:01:02"), "INVALID_ARGUMENT", "bmc_address", "IP address")
	})
	t.Run("mac already enrolled", func(t *testing.T) {
		before := f.rows(t)
		refused(t, enroll("m-dup", "http://127.0.0.3:8000", strings.ToUpper(sm.MAC)), "ALREADY_EXISTS", "mac", "already enrolled")
		require.Equal(t, before, f.rows(t))
		require.Equal(t, 1, f.audited(t, "machines.enroll", "ALREADY_EXISTS"))
	})
	t.Run("bad fields", func(t *testing.T) {
		_, err := f.admin.Machines.Enroll(ctx, connect.NewRequest(&apiv1.EnrollMachineRequest{Tenant: "acme", Site: "dc1", Name: "x",
			BmcDriver: "plugin:/bin/sh", Mac: "01:00:5e:00:00:01"}))
		refused(t, err, "INVALID_ARGUMENT", "bmc_driver", "must be one of")
		refused(t, err, "INVALID_ARGUMENT", "mac", "multicast")
		refused(t, err, "INVALID_ARGUMENT", "bmc_password", "required")
	})
	t.Run("a driver the site's agents do not report", func(t *testing.T) {
		// A name an external driver could have, but no agent of dc1
		// reported it: the machine could never be driven.
		before := f.rows(t)
		_, err := f.admin.Machines.Enroll(ctx, connect.NewRequest(&apiv1.EnrollMachineRequest{Tenant: "acme", Site: "dc1", Name: "m-ext",
			BmcDriver: "acme-bmc", BmcAddress: "127.0.0.9:623", BmcUsername: "admin", BmcPassword: "pw", Mac: "02:00:00:00:01:09"}))
		refused(t, err, "INVALID_ARGUMENT", "bmc_driver", `site dc1 has no driver "acme-bmc": its agents report ipmi, redfish`)
		require.Equal(t, before, f.rows(t))
	})

	// m1 is commissioned, so it is ready for a deploy.
	_, err := f.admin.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	require.Equal(t, "ready", f.waitIdle(t, "m1").GetState())

	deploy := func(image string) error {
		_, err := f.admin.Machines.Deploy(ctx, connect.NewRequest(&apiv1.DeployMachineRequest{Tenant: "acme", Machine: "m1", Image: image}))
		return err
	}
	t.Run("deploy an unsigned image", func(t *testing.T) {
		f.image(t, "unsigned", false)
		before := f.rows(t)
		refused(t, deploy("unsigned"), "IMAGE_UNTRUSTED", "image", "no signature by a key on its tenant's or the platform's signer allowlist")
		require.Equal(t, before, f.rows(t))
		require.Equal(t, 1, f.audited(t, "machines.deploy", "IMAGE_UNTRUSTED"))
		m := f.get(t, "m1")
		require.Equal(t, "ready", m.GetState())
		require.Empty(t, m.GetWorkflowId())
	})
	t.Run("deploy an image whose signer left the allowlist", func(t *testing.T) {
		_, s := f.image(t, "orphan", true)
		_, err := f.admin.SignerKeys.Remove(ctx, connect.NewRequest(&apiv1.RemoveSignerKeyRequest{Tenant: "acme", Key: s.Public.Fingerprint}))
		require.NoError(t, err)
		before := f.rows(t)
		refused(t, deploy("orphan"), "IMAGE_UNTRUSTED", "image", "allowlist")
		require.Equal(t, before, f.rows(t))
	})
	t.Run("deploy another tenant's private image", func(t *testing.T) {
		_, err := f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "rival"}))
		require.NoError(t, err)
		b := []byte("rival disk")
		img, err := f.admin.PushImage(ctx, &apiv1.PushImageHeader{Tenant: "rival", Name: "rival-os", Kind: "raw",
			Sha256: sha(b), SizeBytes: int64(len(b))}, strings.NewReader(string(b)), "")
		require.NoError(t, err)
		before := f.rows(t)
		refused(t, deploy(img.GetImage().GetId()), "NOT_FOUND", "", "image")
		require.Equal(t, before, f.rows(t))
	})
	t.Run("deploy a machine that is not ready", func(t *testing.T) {
		sm2 := f.sim.AddMachine(t, "m2")
		f.enroll(t, sm2)
		f.image(t, "signed", true)
		before := f.rows(t)
		_, err := f.admin.Machines.Deploy(ctx, connect.NewRequest(&apiv1.DeployMachineRequest{Tenant: "acme", Machine: "m2", Image: "signed"}))
		refused(t, err, "FAILED_PRECONDITION", "", "machine m2 is enrolled: deploy starts from ready")
		require.Equal(t, before, f.rows(t))
	})
	t.Run("rescue without a key or for too long", func(t *testing.T) {
		_, err := f.admin.Machines.Rescue(ctx, connect.NewRequest(&apiv1.RescueMachineRequest{Tenant: "acme", Machine: "m1",
			SshPublicKey: "ssh-ed25519 bm90IGEga2V5", DurationSeconds: 7200}))
		refused(t, err, "INVALID_ARGUMENT", "ssh_public_key", "not a ssh-ed25519 key")
		refused(t, err, "INVALID_ARGUMENT", "duration_seconds", "between 1 and 3600")
		// Seconds that overflow a time.Duration into a small or negative
		// one are refused, not let through the bound.
		key := "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl ops@example"
		for _, secs := range []int64{9_223_372_037, 18_446_744_074, 1 << 62} {
			before := f.rows(t)
			_, err = f.admin.Machines.Rescue(ctx, connect.NewRequest(&apiv1.RescueMachineRequest{Tenant: "acme", Machine: "m1",
				SshPublicKey: key, DurationSeconds: secs}))
			refused(t, err, "INVALID_ARGUMENT", "duration_seconds", "between 1 and 3600")
			require.Equal(t, before, f.rows(t), "nothing written for %d", secs)
		}
	})
}

// TestMachineBusy: a machine runs one workflow at a time; a second is
// refused with FAILED_PRECONDITION naming the active one, and nothing of it
// is written.
func TestMachineBusy(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	// A site whose agent is not connected: the first step cannot be sent,
	// so the workflow waits out its backoff on the simulated clock, which
	// this test never moves.
	_, err := f.admin.Sites.Create(ctx, connect.NewRequest(&apiv1.CreateSiteRequest{Tenant: "acme", Name: "dark",
		Networks: []string{"127.0.0.0/8"}, DhcpMode: "proxy"}))
	require.NoError(t, err)
	_, err = f.admin.Machines.Enroll(ctx, connect.NewRequest(&apiv1.EnrollMachineRequest{Tenant: "acme", Site: "dark", Name: "m1",
		BmcDriver: "ipmi", BmcAddress: "127.0.0.5", BmcUsername: "admin", BmcPassword: "pw", Mac: "02:00:00:00:02:01"}))
	require.NoError(t, err)
	res, err := f.admin.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	wf := res.Msg.GetMachine().GetWorkflowId()
	bctest.WaitFor(t, "the first step to fail for want of a site agent", func() bool {
		return f.count(t, `SELECT COUNT(*) FROM provision_steps WHERE workflow_id = $1 AND error LIKE '%no connected site agent%'`, wf) > 0
	})

	before := f.rows(t)
	_, err = f.admin.Machines.Inspect(ctx, connect.NewRequest(&apiv1.InspectMachineRequest{Tenant: "acme", Machine: "m1"}))
	refused(t, err, "FAILED_PRECONDITION", "", "machine m1 is commissioning: workflow "+wf+" (commission) is active")
	_, err = f.admin.Machines.Retire(ctx, connect.NewRequest(&apiv1.RetireMachineRequest{Tenant: "acme", Machine: "m1"}))
	refused(t, err, "FAILED_PRECONDITION", "", "is active")
	require.Equal(t, before, f.rows(t))
	require.Equal(t, 1, f.audited(t, "machines.inspect", "FAILED_PRECONDITION"))
	m := f.get(t, "m1")
	require.Equal(t, "commissioning", m.GetState())
	require.Equal(t, wf, m.GetWorkflowId())
}

// TestMachineFailure: a failed step leaves the machine failed with the
// operation, the step, the reason and its last logs; commissioning again
// recovers it.
func TestMachineFailure(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	sm := f.sim.AddMachine(t, "m1")
	f.enroll(t, sm)
	f.sim.FailNext("disk.wipe", "nvme format: device busy")
	_, err := f.admin.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	m := f.waitIdle(t, "m1")
	require.Equal(t, "failed", m.GetState())
	require.Equal(t, "commission", m.GetFailedOperation())
	require.Equal(t, "wipe", m.GetFailedStep())
	require.Contains(t, m.GetFailureReason(), "device busy")
	require.Contains(t, m.GetFailureLogs(), "step wipe gave up")
	require.Positive(t, f.count(t, `SELECT COUNT(*) FROM events WHERE resource_id = $1 AND type = 'machine.failed'`, m.GetId()))

	_, err = f.admin.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	m = f.waitIdle(t, "m1")
	require.Equal(t, "ready", m.GetState())
	require.Empty(t, m.GetFailedStep())
	require.Empty(t, m.GetFailureReason())

	// A deploy that fails keeps its image pinned (its bytes may be on the
	// disk) until a wipe: commissioning again unpins it.
	f.image(t, "debian", true)
	f.sim.FailNext("image.write", "short write: no space left on device")
	_, err = f.admin.Machines.Deploy(ctx, connect.NewRequest(&apiv1.DeployMachineRequest{Tenant: "acme", Machine: "m1", Image: "debian"}))
	require.NoError(t, err)
	m = f.waitIdle(t, "m1")
	require.Equal(t, "failed", m.GetState())
	require.Equal(t, "deploy", m.GetFailedOperation())
	require.Equal(t, "write-image", m.GetFailedStep())
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM image_refs WHERE ref_id = $1`, m.GetId()))
	_, err = f.admin.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	m = f.waitIdle(t, "m1")
	require.Equal(t, "ready", m.GetState())
	require.Empty(t, m.GetImageId())
	require.Zero(t, f.count(t, `SELECT COUNT(*) FROM image_refs WHERE ref_id = $1`, m.GetId()))
}

// TestMachineOneWorkflowUnderConcurrency: many callers start workflows on
// one idle machine at once; exactly one wins, every other is refused as
// busy, and the machine has one workflow.
func TestMachineOneWorkflowUnderConcurrency(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	// No site agent: the winner's workflow stays active (its first step
	// waits out a backoff on the simulated clock).
	_, err := f.admin.Sites.Create(ctx, connect.NewRequest(&apiv1.CreateSiteRequest{Tenant: "acme", Name: "dark", Networks: []string{"127.0.0.0/8"}}))
	require.NoError(t, err)
	res, err := f.admin.Machines.Enroll(ctx, connect.NewRequest(&apiv1.EnrollMachineRequest{Tenant: "acme", Site: "dark", Name: "m1",
		BmcDriver: "ipmi", BmcAddress: "127.0.0.6", BmcUsername: "admin", BmcPassword: "pw", Mac: "02:00:00:00:03:01"}))
	require.NoError(t, err)
	id := res.Msg.GetMachine().GetId()

	const callers = 8
	errs := make(chan error, callers)
	start := make(chan struct{})
	for i := range callers {
		go func() {
			<-start
			var err error
			if i%2 == 0 {
				_, err = f.admin.Machines.Inspect(ctx, connect.NewRequest(&apiv1.InspectMachineRequest{Tenant: "acme", Machine: "m1"}))
			} else {
				_, err = f.admin.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1"}))
			}
			errs <- err
		}()
	}
	close(start)
	won := 0
	for range callers {
		err := bctest.Receive(t, "a caller's answer", errs)
		if err == nil {
			won++
			continue
		}
		require.Equal(t, "FAILED_PRECONDITION", client.Code(err), "err: %v", err)
		require.Contains(t, client.Detail(err).GetMessage(), "is active")
	}
	require.Equal(t, 1, won)
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM provision_workflows WHERE target_id = $1`, id))
}
