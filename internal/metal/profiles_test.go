package metal_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/store"
)

// gpuDeploy is a tenant deploy profile with every construct: a fallback
// that is skipped (its step succeeds), a when that skips a step, one that
// runs it, an acceptance check on the inventory, a driver.invoke step and a
// cleanup.
const gpuDeploy = `apiVersion: bettercompute.io/v1
kind: DeployProfile
metadata: {name: gpu-deploy, description: Deploy with checks.}
spec:
  steps:
    - name: boot-ramdisk
      kind: power.cycle
      destructive: true
      params: {boot: ramdisk}
      timeout: 5m
      retries: 2
      backoff: 10s
      fallback:
        driver.invoke: {operation: power.cycle}
    - {name: ramdisk-joined, kind: await.rejoin, timeout: 20m}
    - name: inventory
      kind: inventory.refresh
      acceptance: ["output.cpus >= 1", "machine.bmc_driver == \"redfish\""]
    - {name: burn-in, kind: burnin.run, when: input.burn_in == true}
    - {name: write-image, kind: image.write, destructive: true, timeout: 2h}
    - {name: configure, kind: machine.configure, retries: 2}
    - name: power-on
      when: machine.bmc_driver == "redfish"
      driver.invoke: {operation: power.on}
    - {name: boot-disk, kind: power.cycle, destructive: true, params: {boot: disk}}
    - {name: os-joined, kind: await.rejoin, timeout: 30m}
  cleanup:
    - {name: power-off, kind: power.off, destructive: true}
`

func hardwareDoc(name, driver string) string {
	return "apiVersion: bettercompute.io/v1\nkind: HardwareProfile\nmetadata: {name: " + name + "}\nspec: {driver: " + driver + "}\n"
}

// TestTenantProfiles: a tenant's deploy profile runs a deploy (skips,
// fallback, acceptance, driver.invoke recorded on the workflow); its
// hardware profile's driver is checked at enrolment and holds a delete
// back; another tenant finds none of it, not even to deploy with; a bad
// document writes nothing.
func TestTenantProfiles(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()

	// Hardware profiles: the fixture's machines name sim-8xh100.
	_, err := f.admin.Profiles.Create(ctx, connect.NewRequest(&apiv1.CreateProfileRequest{Tenant: "acme", Document: hardwareDoc("sim-8xh100", "redfish")}))
	require.NoError(t, err)
	_, err = f.admin.Profiles.Create(ctx, connect.NewRequest(&apiv1.CreateProfileRequest{Tenant: "acme", Document: hardwareDoc("needs-ipmi", "ipmi")}))
	require.NoError(t, err)
	sm := f.sim.AddMachine(t, "m1")
	_, err = f.admin.Machines.Enroll(ctx, connect.NewRequest(&apiv1.EnrollMachineRequest{Tenant: "acme", Site: "dc1", Name: "m0",
		BmcDriver: "redfish", BmcAddress: "127.0.0.1:1", BmcUsername: "u", BmcPassword: "p", Mac: "02:00:00:00:99:01",
		HardwareProfile: "needs-ipmi"}))
	require.Equal(t, "INVALID_ARGUMENT", client.Code(err))
	require.Equal(t, "hardware_profile", client.Detail(err).GetViolations()[0].GetField())
	require.Contains(t, err.Error(), `needs BMC driver "ipmi"`)
	f.enroll(t, sm)

	// The deploy profile: validated, stored, run.
	v, err := f.admin.Profiles.Validate(ctx, connect.NewRequest(&apiv1.ValidateProfileRequest{Tenant: "acme", Document: gpuDeploy}))
	require.NoError(t, err)
	require.Equal(t, "boot-ramdisk", v.Msg.GetProfile().GetSteps()[1].GetFallbackFor())
	require.Zero(t, f.count(t, `SELECT COUNT(*) FROM profiles WHERE name = 'gpu-deploy'`), "validate stores nothing")
	created, err := f.admin.Profiles.Create(ctx, connect.NewRequest(&apiv1.CreateProfileRequest{Tenant: "acme", Document: gpuDeploy}))
	require.NoError(t, err)
	require.EqualValues(t, 1, created.Msg.GetProfile().GetVersion())
	profID := created.Msg.GetProfile().GetId()

	// A commission checks the hardware profile again: it may have
	// changed since the enrolment.
	_, err = f.admin.Profiles.Update(ctx, connect.NewRequest(&apiv1.UpdateProfileRequest{Tenant: "acme", Profile: "sim-8xh100",
		Document: hardwareDoc("sim-8xh100", "ipmi")}))
	require.NoError(t, err)
	_, err = f.admin.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.Equal(t, "INVALID_ARGUMENT", client.Code(err))
	require.Equal(t, "hardware_profile", client.Detail(err).GetViolations()[0].GetField())
	_, err = f.admin.Profiles.Update(ctx, connect.NewRequest(&apiv1.UpdateProfileRequest{Tenant: "acme", Profile: "sim-8xh100",
		Document: hardwareDoc("sim-8xh100", "redfish")}))
	require.NoError(t, err)
	_, err = f.admin.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	require.Equal(t, "ready", f.waitIdle(t, "m1").GetState())
	f.image(t, "debian", true)
	res, err := f.admin.Machines.Deploy(ctx, connect.NewRequest(&apiv1.DeployMachineRequest{Tenant: "acme", Machine: "m1", Image: "debian",
		Profile: "gpu-deploy"}))
	require.NoError(t, err)
	wfID := res.Msg.GetMachine().GetWorkflowId()
	// An update now changes only later workflows: this one keeps its steps.
	_, err = f.admin.Profiles.Update(ctx, connect.NewRequest(&apiv1.UpdateProfileRequest{Tenant: "acme", Profile: "gpu-deploy",
		Document: strings.Replace(gpuDeploy, "Deploy with checks.", "Version two.", 1)}))
	require.NoError(t, err)
	m := f.waitIdle(t, "m1")
	require.Equal(t, "deployed", m.GetState(), "failure: %s %s %s", m.GetFailedStep(), m.GetFailureReason(), m.GetFailureLogs())
	g, err := f.admin.Machines.GetWorkflow(ctx, connect.NewRequest(&apiv1.GetMachineWorkflowRequest{Tenant: "acme", Workflow: wfID}))
	require.NoError(t, err)
	wf := g.Msg.GetWorkflow()
	require.Equal(t, "deploy", wf.GetOperation())
	states := map[string]string{}
	errs := map[string]string{}
	for _, s := range wf.GetSteps() {
		states[s.GetName()], errs[s.GetName()] = s.GetState(), s.GetError()
	}
	require.Equal(t, map[string]string{"boot-ramdisk": "succeeded", "boot-ramdisk-fallback": "skipped", "ramdisk-joined": "succeeded",
		"inventory": "succeeded", "burn-in": "skipped", "write-image": "succeeded", "configure": "succeeded", "power-on": "succeeded",
		"boot-disk": "succeeded", "os-joined": "succeeded"}, states)
	require.Equal(t, "when input.burn_in == true is false", errs["burn-in"])
	require.Equal(t, "fallback for boot-ramdisk, which did not fail", errs["boot-ramdisk-fallback"])
	require.Equal(t, 1, f.sim.MaxApplied(), "no step was applied twice")

	// The list pages through the built-ins, then acme's own.
	var names []string
	token := ""
	for {
		page, err := f.admin.Profiles.List(ctx, connect.NewRequest(&apiv1.ListProfilesRequest{Tenant: "acme", PageSize: 4, PageToken: token}))
		require.NoError(t, err)
		require.LessOrEqual(t, len(page.Msg.GetProfiles()), 4)
		for _, p := range page.Msg.GetProfiles() {
			names = append(names, p.GetName())
		}
		if token = page.Msg.GetNextPageToken(); token == "" {
			break
		}
	}
	require.Equal(t, []string{"sim-8xh100", "needs-ipmi", "gpu-deploy"}, names[len(names)-3:], "acme's own, in creation order, after the built-ins")
	require.Contains(t, names, "deploy")
	require.Len(t, names, len(slices.Compact(slices.Sorted(slices.Values(names)))), "no profile twice")

	// A hardware profile a machine names is not deleted; a built-in never.
	_, err = f.admin.Profiles.Delete(ctx, connect.NewRequest(&apiv1.DeleteProfileRequest{Tenant: "acme", Profile: "sim-8xh100"}))
	require.Equal(t, "FAILED_PRECONDITION", client.Code(err))
	require.Contains(t, err.Error(), "machine m1")
	_, err = f.admin.Profiles.Delete(ctx, connect.NewRequest(&apiv1.DeleteProfileRequest{Tenant: "acme", Profile: "deploy"}))
	require.Equal(t, "FAILED_PRECONDITION", client.Code(err))
	_, err = f.admin.Profiles.Create(ctx, connect.NewRequest(&apiv1.CreateProfileRequest{Tenant: "acme",
		Document: strings.Replace(gpuDeploy, "name: gpu-deploy", "name: deploy", 1)}))
	require.Equal(t, "ALREADY_EXISTS", client.Code(err))

	// Another tenant: nothing of acme's is found, by name or by id.
	_, err = f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "other"}))
	require.NoError(t, err)
	k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "other", Role: "admin"}))
	require.NoError(t, err)
	other := f.cp.Client(k.Msg.GetSecret())
	for _, ref := range []string{"gpu-deploy", profID} {
		_, err = other.Profiles.Get(ctx, connect.NewRequest(&apiv1.GetProfileRequest{Profile: ref}))
		require.Equal(t, "NOT_FOUND", client.Code(err), ref)
		_, err = other.Profiles.Update(ctx, connect.NewRequest(&apiv1.UpdateProfileRequest{Profile: ref, Document: gpuDeploy}))
		require.Equal(t, "NOT_FOUND", client.Code(err), ref)
		_, err = other.Profiles.Delete(ctx, connect.NewRequest(&apiv1.DeleteProfileRequest{Profile: ref}))
		require.Equal(t, "NOT_FOUND", client.Code(err), ref)
	}
	list, err := other.Profiles.List(ctx, connect.NewRequest(&apiv1.ListProfilesRequest{}))
	require.NoError(t, err)
	for _, p := range list.Msg.GetProfiles() {
		require.True(t, p.GetBuiltin(), "other lists %s", p.GetName())
	}
	require.NotEmpty(t, list.Msg.GetProfiles(), "the built-ins are everyone's")
	// Nor can it deploy with it: other's machine, acme's profile name.
	_, err = f.admin.Sites.Create(ctx, connect.NewRequest(&apiv1.CreateSiteRequest{Tenant: "other", Name: "dc2", Networks: []string{"127.0.0.0/8"}}))
	require.NoError(t, err)
	m2, err := other.Machines.Enroll(ctx, connect.NewRequest(&apiv1.EnrollMachineRequest{Site: "dc2", Name: "o1", BmcDriver: "redfish",
		BmcAddress: "127.0.0.9:1", BmcUsername: "u", BmcPassword: "p", Mac: "02:00:00:00:99:02", HardwareProfile: "sim-8xh100"}))
	require.NoError(t, err, "acme's hardware profile is no rule of other's")
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE machines SET state = 'ready', commissioned = 1 WHERE id = $1`, m2.Msg.GetMachine().GetId())
		return err
	}))
	_, err = other.Machines.Deploy(ctx, connect.NewRequest(&apiv1.DeployMachineRequest{Machine: "o1", Image: "debian", Profile: "gpu-deploy"}))
	require.Equal(t, "NOT_FOUND", client.Code(err))
	require.Contains(t, err.Error(), "profile")

	// Bad documents: each names its field, and nothing is written.
	before := f.count(t, `SELECT COUNT(*) FROM profiles`)
	events := f.count(t, `SELECT COUNT(*) FROM events WHERE type LIKE 'profile.%'`)
	for field, doc := range map[string]string{
		"spec.steps[3].when":                             strings.Replace(gpuDeploy, "when: input.burn_in == true", "when: input.burn_in ==", 1),
		"spec.steps[2].acceptance[0]":                    strings.Replace(gpuDeploy, `"output.cpus >= 1"`, `"exec(1)"`, 1),
		"spec.steps[0].fallback.driver.invoke.operation": strings.Replace(gpuDeploy, "{operation: power.cycle}", "{operation: firmware.flash}", 1),
		"spec.steps[4].kind":                             strings.Replace(gpuDeploy, "kind: image.write", "kind: image.burn", 1),
		"spec.steps[5].on_failure":                       strings.Replace(gpuDeploy, "retries: 2}", "retries: 2, on_failure: goto write-image}", 1),
		"spec.cleanup[0].on_failure":                     strings.Replace(gpuDeploy, "power.off, destructive: true}", "power.off, on_failure: continue later}", 1),
		"metadata.name":                                  strings.Replace(gpuDeploy, "name: gpu-deploy", "name: GPU", 1),
	} {
		doc := strings.Replace(doc, "gpu-deploy", "gpu-two", 1)
		_, err := f.admin.Profiles.Create(ctx, connect.NewRequest(&apiv1.CreateProfileRequest{Tenant: "acme", Document: doc}))
		require.Equal(t, "INVALID_ARGUMENT", client.Code(err), field)
		var fields []string
		for _, v := range client.Detail(err).GetViolations() {
			fields = append(fields, v.GetField())
		}
		require.Contains(t, fields, field)
		_, err = f.admin.Profiles.Update(ctx, connect.NewRequest(&apiv1.UpdateProfileRequest{Tenant: "acme", Profile: "gpu-deploy",
			Document: strings.Replace(doc, "gpu-two", "gpu-deploy", 1)}))
		require.Equal(t, "INVALID_ARGUMENT", client.Code(err), field)
	}
	require.Equal(t, before, f.count(t, `SELECT COUNT(*) FROM profiles`))
	require.Equal(t, events, f.count(t, `SELECT COUNT(*) FROM events WHERE type LIKE 'profile.%'`))
	got, err := f.admin.Profiles.Get(ctx, connect.NewRequest(&apiv1.GetProfileRequest{Tenant: "acme", Profile: "gpu-deploy"}))
	require.NoError(t, err)
	require.EqualValues(t, 2, got.Msg.GetProfile().GetVersion())
}
