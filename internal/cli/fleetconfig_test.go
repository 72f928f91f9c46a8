package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/devrig"
)

// fleetRig is a control plane with what `better-compute dev` makes (tenant
// sim, its project nodes and pool h100 offered to all, the platform's
// flavor small and IP pool dev) and a second tenant, acme, with an admin
// key.
type fleetRig struct {
	cp   *bctest.ControlPlane
	dir  string
	acme string
}

func newFleetRig(t *testing.T) *fleetRig {
	t.Helper()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	for _, name := range []string{"sim", "acme"} {
		display := map[string]string{"sim": "Simulated fleet"}[name] // as dev names it
		_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: name, DisplayName: display}))
		require.NoError(t, err)
	}
	_, err := admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "sim", Name: "nodes"}))
	require.NoError(t, err)
	_, err = admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "sim", Name: devrig.Pool,
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: pool.OpIn, Values: []string{"H100"}}}}))
	require.NoError(t, err)
	_, err = admin.Pools.Offer(ctx, connect.NewRequest(&apiv1.OfferPoolRequest{Tenant: "sim", Pool: devrig.Pool, To: []string{pool.OfferAll}}))
	require.NoError(t, err)
	require.NoError(t, devrig.EnsureInstanceCatalog(ctx, admin))
	// One simulated H100 node, as dev runs: a sandbox template is checked
	// against its pool's hosts.
	sim, err := bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		Template: bctest.FakeDaemonConfig{Gateway: cp.GatewayAddr}, Root: t.TempDir(), N: 1,
		Token: func(ctx context.Context, i int) (string, error) {
			tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "sim", Project: "nodes"}))
			return tok.Msg.GetToken(), err
		},
	})
	require.NoError(t, err)
	t.Cleanup(sim.Stop)
	bctest.WaitFor(t, "the node's GPUs in inventory", func() bool {
		n, err := admin.Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{Tenant: "sim"}))
		require.NoError(t, err)
		return len(n.Msg.GetNodes()) == 1 && n.Msg.GetNodes()[0].GetGpuCount() > 0
	})
	k, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "admin"}))
	require.NoError(t, err)
	return &fleetRig{cp: cp, dir: t.TempDir(), acme: k.Msg.GetSecret()}
}

func (r *fleetRig) run(t *testing.T, tok string, argv ...string) result {
	t.Helper()
	env := map[string]string{envConfig: filepath.Join(r.dir, "config.yaml"), envServer: r.cp.URL, envToken: tok, "HOME": r.dir}
	a := newApp("test", func(k string) (string, bool) { v, ok := env[k]; return v, ok && v != "" })
	a.retryBackoff = time.Millisecond
	var out, errb bytes.Buffer
	code := run(t.Context(), a, argv, strings.NewReader(""), &out, &errb)
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// want runs argv as the platform admin and requires exit code code.
func (r *fleetRig) want(t *testing.T, code int, argv ...string) result {
	t.Helper()
	res := r.run(t, r.cp.AdminKey, argv...)
	require.Equal(t, code, res.code, "%v\nstdout: %s\nstderr: %s", argv, res.stdout, res.stderr)
	return res
}

const exampleFleet = "../../examples/fleet"

// copyExample copies the example fleet into a new directory, dropping the
// documents for which drop returns true.
func copyExample(t *testing.T, drop func(doc string) bool) string {
	t.Helper()
	dir := t.TempDir()
	ents, err := os.ReadDir(exampleFleet)
	require.NoError(t, err)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(exampleFleet, e.Name()))
		require.NoError(t, err)
		var keep []string
		for _, doc := range strings.Split(string(b), "\n---\n") {
			if !drop(doc) {
				keep = append(keep, doc)
			}
		}
		require.NoError(t, os.WriteFile(filepath.Join(dir, e.Name()), []byte(strings.Join(keep, "\n---\n")), 0o600))
	}
	return dir
}

// TestFleetConfigRoundTrip applies the example fleet on dev's state, then
// plans it again (no changes), exports and plans the export (no changes),
// and plans after one quota changed by hand (exactly that field).
func TestFleetConfigRoundTrip(t *testing.T) {
	t.Parallel()
	r := newFleetRig(t)
	ctx := context.Background()

	res := r.want(t, exitPlanChanges, "fleet", "plan", "-f", exampleFleet)
	require.Contains(t, res.stdout, "+ create Pool sim/a100")
	require.Contains(t, res.stdout, "+ create Flavor gpu-h100-1 (platform)")
	require.Contains(t, res.stdout, "+ create IPPool sim/lab")
	require.Contains(t, res.stdout, "+ create Quota sim/project-nodes")
	require.NotContains(t, res.stdout, "Pool sim/h100", "dev's pool h100 matches its document")
	require.NotContains(t, res.stdout, "Flavor small", "dev's flavor matches its document")
	require.NotContains(t, res.stdout, "Tenant sim", "dev's tenant matches its document")
	for _, c := range []string{"+ create Tenant research (platform)", "+ create Project research/default", "+ create Site sim/dc2",
		"+ create SandboxTemplate sim/notebook", "+ create Webhook sim/ops-pager", "+ create IAMPolicy research/no-viewer-deletes"} {
		require.Contains(t, res.stdout, c)
	}
	require.Contains(t, res.stdout, "Plan: 12 to create, 0 to change, 0 to replace, 0 to delete.")
	// A tenant comes before what it owns; pools, flavors and IP pools
	// before the templates that name them.
	require.Less(t, strings.Index(res.stdout, "Tenant research"), strings.Index(res.stdout, "Project research/default"))
	require.Less(t, strings.Index(res.stdout, "IPPool sim/lab"), strings.Index(res.stdout, "SandboxTemplate sim/notebook"))
	// The pool comes before the quota that names it.
	require.Less(t, strings.Index(res.stdout, "Pool sim/a100"), strings.Index(res.stdout, "Quota sim/pool-h100"))

	res = r.want(t, 0, "fleet", "apply", "-f", exampleFleet)
	require.Contains(t, res.stdout, "Applied 12 changes.")
	require.NotContains(t, res.stdout+res.stderr, "whsec_", "a webhook's secret is not printed")
	require.Contains(t, res.stdout, "webhooks rotate-secret")
	res = r.want(t, 0, "fleet", "plan", "-f", exampleFleet)
	require.Contains(t, res.stdout, "No changes")

	// Each change was its own mutation with its own audit row.
	audit, err := r.cp.Admin().Audit.List(ctx, connect.NewRequest(&apiv1.ListAuditRequest{Tenant: "sim"}))
	require.NoError(t, err)
	actions := map[string]bool{}
	for _, e := range audit.Msg.GetEntries() {
		actions[e.GetAction()] = true
	}
	for _, a := range []string{"pools.create", "ipPools.create", "quotas.set", "fleetMarks.set", "sites.create", "sandboxTemplates.create", "webhooks.create"} {
		require.True(t, actions[a], "audit action %s in %v", a, actions)
	}

	// Export the tenant's and the platform's, and plan the export.
	simDir, platDir := filepath.Join(r.dir, "export-sim"), filepath.Join(r.dir, "export-platform")
	researchDir := filepath.Join(r.dir, "export-research")
	r.want(t, 0, "fleet", "export", "--tenant", "sim", "-o", simDir)
	r.want(t, 0, "fleet", "export", "--platform", "-o", platDir)
	r.want(t, 0, "fleet", "export", "--tenant", "research", "-o", researchDir)
	for _, d := range []string{simDir, platDir, researchDir} {
		res = r.want(t, 0, "fleet", "plan", "-f", d)
		require.Contains(t, res.stdout, "No changes", d)
	}
	b, err := os.ReadFile(filepath.Join(simDir, "pools.yaml"))
	require.NoError(t, err)
	require.Contains(t, string(b), "name: a100")
	require.Contains(t, string(b), "gpuSharing: timeslice")
	require.NotContains(t, string(b), "hostReserve", "an empty host reserve is left out")
	b, err = os.ReadFile(filepath.Join(platDir, "flavors.yaml"))
	require.NoError(t, err)
	require.Contains(t, string(b), "name: gpu-h100-1")
	require.NotContains(t, string(b), "tenant:")
	b, err = os.ReadFile(filepath.Join(platDir, "tenants.yaml"))
	require.NoError(t, err)
	require.Contains(t, string(b), "name: research\nspec:\n    displayName: Research lab\n")
	b, err = os.ReadFile(filepath.Join(simDir, "webhooks.yaml"))
	require.NoError(t, err)
	require.Contains(t, string(b), "name: 127-0-0-1-9099-better-compute")
	require.NotContains(t, string(b), "secret")
	b, err = os.ReadFile(filepath.Join(researchDir, "iam-policies.yaml"))
	require.NoError(t, err)
	require.Contains(t, string(b), `forbid (principal, action == BC::Action::"projects.delete", resource)`)
	res = r.want(t, 1, "fleet", "export", "--platform", "--tenant", "sim", "-o", "-")
	require.Contains(t, res.stderr, "platform")
	res = r.want(t, 0, "fleet", "export", "--tenant", "sim", "-o", "-")
	require.Contains(t, res.stdout, "kind: Project\nmetadata:\n    name: nodes\n")
	require.Contains(t, res.stdout, "kind: Quota")
	require.Contains(t, res.stdout, "kind: IPPool")

	// One quota changed by hand: the plan names exactly that field.
	six := int32(6)
	_, err = r.cp.Admin().Quotas.Set(ctx, connect.NewRequest(&apiv1.SetQuotaRequest{Tenant: "sim", Pool: "h100", Gpus: &six}))
	require.NoError(t, err)
	res = r.want(t, exitPlanChanges, "fleet", "plan", "-f", exampleFleet)
	require.Contains(t, res.stdout, "~ change Quota sim/pool-h100")
	require.Contains(t, res.stdout, "    spec.gpus: 6 → 16\n")
	require.Contains(t, res.stdout, "Plan: 0 to create, 1 to change, 0 to replace, 0 to delete.")
	require.Equal(t, 3, strings.Count(res.stdout, "\n"), res.stdout)
	r.want(t, 0, "fleet", "apply", "-f", exampleFleet)
	r.want(t, 0, "fleet", "plan", "-f", simDir)

	// A pool changes in place: its policy by Update, its offer by Offer.
	changed := copyExample(t, func(string) bool { return false })
	pb, err := os.ReadFile(filepath.Join(changed, "pools.yaml"))
	require.NoError(t, err)
	pb = bytes.Replace(pb, []byte("maxPending: 50\n"), []byte("maxPending: 60\n"), 1)
	pb = bytes.Replace(pb, []byte("selector: gpu.model=A100\n"), []byte("selector: gpu.model=A100\n  offerTo: [acme]\n"), 1)
	require.NoError(t, os.WriteFile(filepath.Join(changed, "pools.yaml"), pb, 0o600))
	res = r.want(t, exitPlanChanges, "fleet", "plan", "-f", changed)
	require.Contains(t, res.stdout, "~ change Pool sim/a100")
	require.Contains(t, res.stdout, "    spec.policy.maxPending: 50 → 60\n")
	require.Contains(t, res.stdout, `    spec.offerTo: (unset) → ["acme"]`+"\n")
	require.Contains(t, res.stdout, "Plan: 0 to create, 1 to change, 0 to replace, 0 to delete.")
	r.want(t, 0, "fleet", "apply", "-f", changed)
	r.want(t, 0, "fleet", "plan", "-f", changed)
	p, err := r.cp.Admin().Pools.Get(ctx, connect.NewRequest(&apiv1.GetPoolRequest{Tenant: "sim", Pool: "a100"}))
	require.NoError(t, err)
	require.Equal(t, int32(60), p.Msg.GetPool().GetPolicy().GetMaxPending())
	require.Equal(t, []string{"acme"}, p.Msg.GetPool().GetOffer().GetTenants())
	require.Equal(t, "timeslice", p.Msg.GetPool().GetPolicy().GetGpuSharing(), "the rest of the policy is kept")

	// A flavor cannot change in place: the plan says replace, apply refuses.
	bigger := copyExample(t, func(string) bool { return false })
	fb, err := os.ReadFile(filepath.Join(bigger, "flavors.yaml"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(bigger, "flavors.yaml"), bytes.Replace(fb, []byte("vcpus: 2\n"), []byte("vcpus: 4\n"), 1), 0o600))
	res = r.want(t, exitPlanChanges, "fleet", "plan", "-f", bigger)
	require.Contains(t, res.stdout, "! replace Flavor small (platform)")
	require.Contains(t, res.stdout, "spec.vcpus: 2 → 4")
	res = r.want(t, 1, "fleet", "apply", "-f", bigger)
	require.Contains(t, res.stderr, "REPLACE_REQUIRED on spec.vcpus")
	// The pool's change back to the example comes first (pools before
	// flavors) and stays applied.
	require.Contains(t, res.stderr, "applied before it: 1 of 2 changes\n  change Pool sim/a100\n")
	f, err := r.cp.Admin().Flavors.Get(ctx, connect.NewRequest(&apiv1.GetFlavorRequest{Flavor: "small"}))
	require.NoError(t, err)
	require.Equal(t, int32(2), f.Msg.GetFlavor().GetVcpus())

	// A project is created before the quota that names it, never pruned; a display name changed is a replace.
	withBatch := copyExample(t, func(string) bool { return false })
	pj, err := os.ReadFile(filepath.Join(withBatch, "projects.yaml"))
	require.NoError(t, err)
	pj = append(pj, []byte("---\napiVersion: bettercompute.io/v1\nkind: Project\nmetadata:\n  name: batch\n  tenant: sim\nspec:\n  displayName: Batch jobs\n"+
		"---\napiVersion: bettercompute.io/v1\nkind: Quota\nmetadata:\n  name: batch\n  tenant: sim\nspec:\n  project: batch\n  gpus: 2\n")...)
	require.NoError(t, os.WriteFile(filepath.Join(withBatch, "projects.yaml"), pj, 0o600))
	res = r.want(t, exitPlanChanges, "fleet", "plan", "-f", withBatch)
	require.Contains(t, res.stdout, "+ create Project sim/batch")
	require.Contains(t, res.stdout, "    spec.displayName: Batch jobs\n")
	require.Less(t, strings.Index(res.stdout, "Project sim/batch"), strings.Index(res.stdout, "Quota sim/batch"))
	r.want(t, 0, "fleet", "apply", "-f", withBatch)
	r.want(t, 0, "fleet", "plan", "-f", withBatch)
	gp, err := r.cp.Admin().Projects.Get(ctx, connect.NewRequest(&apiv1.GetProjectRequest{Tenant: "sim", Project: "batch"}))
	require.NoError(t, err)
	require.Equal(t, "Batch jobs", gp.Msg.GetProject().GetDisplayName())
	renamed := bytes.Replace(pj, []byte("displayName: Batch jobs"), []byte("displayName: Batch"), 1)
	require.NoError(t, os.WriteFile(filepath.Join(withBatch, "projects.yaml"), renamed, 0o600))
	res = r.want(t, exitPlanChanges, "fleet", "plan", "-f", withBatch)
	require.Contains(t, res.stdout, "! replace Project sim/batch")
	res = r.want(t, 0, "fleet", "plan", "-f", exampleFleet, "--prune")
	require.Contains(t, res.stdout, "No changes", "projects (and quotas) are never pruned")
}

// TestFleetConfigPrune removes dev's pool h100 (and its quota) from the
// documents: plan --prune lists the pool's delete, apply refuses it while a
// reservation in it is live, and archives it once none is.
func TestFleetConfigPrune(t *testing.T) {
	t.Parallel()
	r := newFleetRig(t)
	ctx := context.Background()
	admin := r.cp.Admin()
	r.want(t, 0, "fleet", "apply", "-f", exampleFleet)
	res, err := admin.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: "sim", Pool: "h100", Gpus: 1, DurationSeconds: 3600}))
	require.NoError(t, err)
	resv := res.Msg.GetReservation().GetId()

	// The pool, its quota, and the sandbox template on it leave the
	// documents.
	noH100 := copyExample(t, func(doc string) bool {
		return strings.Contains(doc, "name: h100\n") || strings.Contains(doc, "pool: h100\n")
	})
	out := r.want(t, 0, "fleet", "plan", "-f", noH100)
	require.Contains(t, out.stdout, "No changes", "without --prune nothing is deleted")
	out = r.want(t, exitPlanChanges, "fleet", "plan", "-f", noH100, "--prune")
	require.Contains(t, out.stdout, "- delete Pool sim/h100")
	require.Contains(t, out.stdout, "- delete SandboxTemplate sim/notebook")
	require.Contains(t, out.stdout, "Plan: 0 to create, 0 to change, 0 to replace, 2 to delete.", "quotas are never pruned")
	require.Less(t, strings.Index(out.stdout, "SandboxTemplate sim/notebook"), strings.Index(out.stdout, "Pool sim/h100"),
		"deletes go in reverse dependency order: the template before its pool")

	out = r.want(t, 1, "fleet", "apply", "-f", noH100, "--prune")
	require.Contains(t, out.stderr, "delete Pool sim/h100 refused: FAILED_PRECONDITION")
	require.Contains(t, out.stderr, resv)
	require.Contains(t, out.stderr, "applied before it: 1 of 2 changes\n  delete SandboxTemplate sim/notebook\n")
	p, err := admin.Pools.Get(ctx, connect.NewRequest(&apiv1.GetPoolRequest{Tenant: "sim", Pool: "h100"}))
	require.NoError(t, err)
	require.Equal(t, "active", p.Msg.GetPool().GetState())

	_, err = admin.Reservations.Release(ctx, connect.NewRequest(&apiv1.ReleaseReservationRequest{Tenant: "sim", Reservation: resv}))
	require.NoError(t, err)
	bctest.WaitFor(t, "the reservation to end", func() bool {
		g, err := admin.Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "sim", Reservation: resv}))
		require.NoError(t, err)
		return !strings.Contains(liveReservationStatesForTest, g.Msg.GetReservation().GetState())
	})
	out = r.want(t, 0, "fleet", "apply", "-f", noH100, "--prune")
	require.Contains(t, out.stdout, "applied: delete Pool sim/h100")
	r.want(t, 0, "fleet", "plan", "-f", noH100, "--prune")
}

// TestFleetConfigDrift applies the example fleet, changes one quota by hand
// with the CLI verb and deletes a flavor: fleet drift names exactly those,
// with the field applied → live, exits 2, and nothing once apply put them
// back. Another tenant's key reads no marks of sim.
func TestFleetConfigDrift(t *testing.T) {
	t.Parallel()
	r := newFleetRig(t)
	ctx := context.Background()
	res := r.want(t, 0, "fleet", "apply", "-f", exampleFleet)
	require.Contains(t, res.stdout, "Applied 12 changes.")
	require.Contains(t, res.stdout, "Marked 5 objects that already matched their documents as managed.", "dev's tenant, project, pool, flavor and IP pool are adopted")
	res = r.want(t, 0, "fleet", "drift", "-f", exampleFleet)
	require.Contains(t, res.stdout, "No drift")
	r.want(t, 0, "fleet", "drift", "--tenant", "sim")

	marks, err := r.cp.Admin().FleetConfig.ListMarks(ctx, connect.NewRequest(&apiv1.ListManagedMarksRequest{Tenant: "sim"}))
	require.NoError(t, err)
	names := map[string]string{}
	for _, m := range marks.Msg.GetMarks() {
		names[m.GetKind()+"/"+m.GetName()] = m.GetDigest()
	}
	require.Len(t, names, 9, "%v", names)
	require.Contains(t, names, "Webhook/http://127.0.0.1:9099/better-compute")
	require.Contains(t, names, "SandboxTemplate/notebook")
	require.Contains(t, names, "Project/nodes")
	require.Contains(t, names, "Quota/pool=h100")
	require.Contains(t, names, "Pool/h100")
	require.True(t, strings.HasPrefix(names["Pool/a100"], "sha256:"))

	r.want(t, 0, "quotas", "set", "--tenant", "sim", "--pool", "h100", "--gpus", "6")
	_, err = r.cp.Admin().Flavors.Delete(ctx, connect.NewRequest(&apiv1.DeleteFlavorRequest{Flavor: "gpu-h100-1"}))
	require.NoError(t, err)
	res = r.want(t, exitPlanChanges, "fleet", "drift", "-f", exampleFleet)
	require.Contains(t, res.stdout, "~ drift Quota sim/pool=h100")
	require.Contains(t, res.stdout, "    spec.gpus: 16 → 6\n")
	require.Contains(t, res.stdout, "- gone Flavor gpu-h100-1 (platform)")
	require.Contains(t, res.stdout, "Drift: 1 changed by hand, 1 gone (applied → live).")
	require.Equal(t, 4, strings.Count(res.stdout, "\n"), res.stdout)
	res = r.want(t, exitPlanChanges, "fleet", "drift", "--tenant", "sim")
	require.Contains(t, res.stdout, "~ drift Quota sim/pool=h100")
	require.NotContains(t, res.stdout, "gpu-h100-1", "the platform's marks only with --platform or -f")

	// Another tenant's key sees none of sim's marks and sets none.
	acme := r.cp.Client(r.acme)
	_, err = acme.FleetConfig.ListMarks(ctx, connect.NewRequest(&apiv1.ListManagedMarksRequest{Tenant: "sim"}))
	require.Contains(t, []connect.Code{connect.CodeNotFound, connect.CodePermissionDenied}, connect.CodeOf(err), "%v", err)
	_, err = acme.FleetConfig.SetMark(ctx, connect.NewRequest(&apiv1.SetManagedMarkRequest{Tenant: "sim", Kind: "Pool", Name: "h100", SpecJson: "{}"}))
	require.Contains(t, []connect.Code{connect.CodeNotFound, connect.CodePermissionDenied}, connect.CodeOf(err), "%v", err)
	_, err = acme.FleetConfig.DeleteMark(ctx, connect.NewRequest(&apiv1.DeleteManagedMarkRequest{Tenant: "sim", Kind: "Pool", Name: "h100"}))
	require.Contains(t, []connect.Code{connect.CodeNotFound, connect.CodePermissionDenied}, connect.CodeOf(err), "%v", err)
	own, err := acme.FleetConfig.ListMarks(ctx, connect.NewRequest(&apiv1.ListManagedMarksRequest{}))
	require.NoError(t, err)
	require.Empty(t, own.Msg.GetMarks())
	// A bad mark is refused with its field.
	_, err = r.cp.Admin().FleetConfig.SetMark(ctx, connect.NewRequest(&apiv1.SetManagedMarkRequest{Tenant: "sim", Kind: "pool", Name: "h100", SpecJson: "[1]"}))
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	require.Contains(t, err.Error(), "kind")
	res = r.want(t, exitPlanChanges, "fleet", "drift", "--tenant", "sim")
	require.Contains(t, res.stdout, "spec.gpus: 16 → 6", "a refused mark changed nothing")

	r.want(t, 0, "fleet", "apply", "-f", exampleFleet)
	res = r.want(t, 0, "fleet", "drift", "-f", exampleFleet)
	require.Contains(t, res.stdout, "No drift")
}

// liveReservationStatesForTest are the states fleetconfig counts as live.
const liveReservationStatesForTest = "pending,placed,binding,active,releasing"

// TestFleetConfigRefusals: bad documents are refused before any call, with
// file and field named; another tenant's key can neither plan nor apply
// sim's objects.
func TestFleetConfigRefusals(t *testing.T) {
	t.Parallel()
	r := newFleetRig(t)
	ctx := context.Background()

	bad := t.TempDir()
	ok := `apiVersion: bettercompute.io/v1
kind: Flavor
metadata: {name: never}
spec: {vcpus: 1, memoryMiB: 512}
`
	require.NoError(t, os.WriteFile(filepath.Join(bad, "a.yaml"), []byte(ok+`---
apiVersion: bettercompute.io/v1
kind: Gadget
metadata: {name: x}
spec: {}
---
apiVersion: bettercompute.io/v1
kind: Pool
metadata: {name: p, tenant: sim}
spec:
  selector: gpu.model=H100
  policy: {gpuSharingg: mig}
`), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(bad, "b.yml"), []byte(`apiVersion: bettercompute.io/v1
kind: Quota
metadata: {tenant: sim}
spec: {gpus: 1}
`), 0o600))
	for _, verb := range []string{"plan", "apply"} {
		res := r.want(t, 1, "fleet", verb, "-f", bad)
		require.Contains(t, res.stderr, filepath.Join(bad, "a.yaml")+`:2: kind: unknown kind "Gadget"`)
		require.Contains(t, res.stderr, filepath.Join(bad, "a.yaml")+":3: spec.policy.gpuSharingg: unknown field (line 16)")
		require.Contains(t, res.stderr, filepath.Join(bad, "b.yml")+":1: metadata.name: is required")
		require.Empty(t, res.stdout)
	}
	_, err := r.cp.Admin().Flavors.Get(ctx, connect.NewRequest(&apiv1.GetFlavorRequest{Flavor: "never"}))
	require.Equal(t, "NOT_FOUND", client.Code(err), "nothing was applied")

	// acme's admin cannot read sim's state, so cannot plan or apply it.
	for _, verb := range []string{"plan", "apply"} {
		res := r.run(t, r.acme, "fleet", verb, "-f", exampleFleet)
		require.Equal(t, 1, res.code, "stdout: %s\nstderr: %s", res.stdout, res.stderr)
		require.Regexp(t, `NOT_FOUND|PERMISSION_DENIED`, res.stderr)
	}
	res := r.run(t, r.acme, "fleet", "export", "--tenant", "sim", "-o", "-")
	require.Equal(t, 1, res.code)
	require.Regexp(t, `NOT_FOUND|PERMISSION_DENIED`, res.stderr)
	// Nor write sim's objects when its documents hold nothing else.
	simOnly := copyExample(t, func(doc string) bool { return !strings.Contains(doc, "tenant: sim") })
	res = r.run(t, r.acme, "fleet", "apply", "-f", simOnly)
	require.Equal(t, 1, res.code)
	_, err = r.cp.Admin().Pools.Get(ctx, connect.NewRequest(&apiv1.GetPoolRequest{Tenant: "sim", Pool: "a100"}))
	require.Equal(t, "NOT_FOUND", client.Code(err))
	// acme's own export is its own (empty) state.
	res = r.run(t, r.acme, "fleet", "export", "-o", "-")
	require.Equal(t, 0, res.code, res.stderr)
	require.NotContains(t, res.stdout, "sim")
}

// writeDocs writes documents into a new directory as one file.
func writeDocs(t *testing.T, docs string) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "docs.yaml"), []byte(docs), 0o600))
	return dir
}

// TestFleetConfigMoreKinds: what changes in place and what is a replace for
// tenants, sites, webhooks, sandbox templates, IAM policies and image
// references; an image a document references but nobody pushed is refused
// at apply, with nothing after it applied.
func TestFleetConfigMoreKinds(t *testing.T) {
	t.Parallel()
	r := newFleetRig(t)
	ctx := context.Background()
	admin := r.cp.Admin()
	r.want(t, 0, "fleet", "apply", "-f", exampleFleet)

	// In place: a tenant suspended, a site's networks, a webhook's types,
	// a policy's text.
	dir := copyExample(t, func(string) bool { return false })
	edit := func(file, old, new string) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, file))
		require.NoError(t, err)
		require.Contains(t, string(b), old)
		require.NoError(t, os.WriteFile(filepath.Join(dir, file), []byte(strings.Replace(string(b), old, new, 1)), 0o600))
	}
	edit("tenants.yaml", "displayName: Research lab\n", "displayName: Research lab\n  suspended: true\n")
	edit("sites.yaml", "networks: [10.102.0.0/24]", "networks: [10.102.0.0/24, 10.103.0.0/24]")
	edit("webhooks.yaml", "types: [pool, health, rollout]", "types: [pool, rollout]")
	edit("iam-policies.yaml", `when { principal.role == "viewer" };`, `when { principal.role == "viewer" || principal.role == "operator" };`)
	res := r.want(t, exitPlanChanges, "fleet", "plan", "-f", dir)
	require.Contains(t, res.stdout, "~ change Tenant research (platform)")
	require.Contains(t, res.stdout, "    spec.suspended: (unset) → true\n")
	require.Contains(t, res.stdout, `    spec.networks: ["10.102.0.0/24"] → ["10.102.0.0/24","10.103.0.0/24"]`)
	require.Contains(t, res.stdout, `~ change Webhook sim/ops-pager`)
	require.Contains(t, res.stdout, `    spec.types: ["health","pool","rollout"] → ["pool","rollout"]`)
	require.Contains(t, res.stdout, "~ change IAMPolicy research/no-viewer-deletes")
	require.Contains(t, res.stdout, "Plan: 0 to create, 4 to change, 0 to replace, 0 to delete.")
	// A suspension refuses the tenant's own principals, not the
	// platform's: the policy is put whatever the order.
	r.want(t, 0, "fleet", "apply", "-f", dir)
	r.want(t, 0, "fleet", "plan", "-f", dir)
	tn, err := admin.Tenants.Get(ctx, connect.NewRequest(&apiv1.GetTenantRequest{Tenant: "research"}))
	require.NoError(t, err)
	require.Equal(t, "suspended", tn.Msg.GetTenant().GetState())
	hooks, err := admin.Webhooks.List(ctx, connect.NewRequest(&apiv1.ListWebhooksRequest{Tenant: "sim"}))
	require.NoError(t, err)
	require.Len(t, hooks.Msg.GetWebhooks(), 1, "changed in place, not created again")
	require.ElementsMatch(t, []string{"pool", "rollout"}, hooks.Msg.GetWebhooks()[0].GetTypes())
	// Back to the example: resumed.
	r.want(t, 0, "fleet", "apply", "-f", exampleFleet)
	tn, err = admin.Tenants.Get(ctx, connect.NewRequest(&apiv1.GetTenantRequest{Tenant: "research"}))
	require.NoError(t, err)
	require.Equal(t, "active", tn.Msg.GetTenant().GetState())

	// Replaces: a tenant's display name, a template's TTL.
	dir = copyExample(t, func(string) bool { return false })
	edit("tenants.yaml", "displayName: Research lab", "displayName: Research")
	edit("sandbox-templates.yaml", "maxTTL: 4h", "maxTTL: 8h")
	res = r.want(t, exitPlanChanges, "fleet", "plan", "-f", dir)
	require.Contains(t, res.stdout, "! replace Tenant research (platform)")
	require.Contains(t, res.stdout, "    spec.displayName: Research lab → Research\n")
	require.Contains(t, res.stdout, "! replace SandboxTemplate sim/notebook")
	require.Contains(t, res.stdout, "    spec.maxTTL: 4h → 8h\n")
	res = r.want(t, 1, "fleet", "apply", "-f", dir)
	require.Contains(t, res.stderr, "REPLACE_REQUIRED on spec.displayName")
	require.Contains(t, res.stderr, "applied before it: 0 of 2 changes")

	// Image references: one pushed matches; one with another digest is a
	// replace; one never pushed is refused at apply, and what precedes it
	// stays applied while what follows it is not made.
	disk := bytes.Repeat([]byte{7}, 4096)
	sum := sha256.Sum256(disk)
	digest := hex.EncodeToString(sum[:])
	_, err = admin.PushImage(ctx, &apiv1.PushImageHeader{Tenant: "sim", Name: "base", Kind: "raw", Sha256: digest, SizeBytes: int64(len(disk))},
		bytes.NewReader(disk), "")
	require.NoError(t, err)
	image := func(name, digest string) string {
		return "apiVersion: bettercompute.io/v1\nkind: Image\nmetadata: {name: " + name + ", tenant: sim}\nspec: {kind: raw, sha256: " + digest + "}\n"
	}
	res = r.want(t, 0, "fleet", "plan", "-f", exampleFleet, "-f", writeDocs(t, image("base", digest)))
	require.Contains(t, res.stdout, "No changes")
	res = r.want(t, 0, "fleet", "export", "--tenant", "sim", "-o", "-")
	require.Contains(t, res.stdout, "kind: Image\nmetadata:\n    name: base\n    tenant: sim\nspec:\n    kind: raw\n    sha256: "+digest+"\n    visibility: private\n")
	other := strings.Repeat("ab", 32)
	res = r.want(t, exitPlanChanges, "fleet", "plan", "-f", writeDocs(t, image("base", other)))
	require.Contains(t, res.stdout, "! replace Image sim/base")
	require.Contains(t, res.stdout, "    spec.sha256: "+digest+" → "+other+"\n")
	site := "---\napiVersion: bettercompute.io/v1\nkind: Site\nmetadata: {name: dc9, tenant: sim}\nspec: {networks: [10.109.0.0/24]}\n" +
		"---\napiVersion: bettercompute.io/v1\nkind: Webhook\nmetadata: {name: late, tenant: sim}\nspec: {url: 'http://127.0.0.1:9098/x'}\n"
	missing := writeDocs(t, image("never-pushed", other)+site)
	res = r.want(t, exitPlanChanges, "fleet", "plan", "-f", missing)
	require.Contains(t, res.stdout, "+ create Image sim/never-pushed")
	require.Contains(t, res.stdout, "push required")
	res = r.want(t, 1, "fleet", "apply", "-f", missing)
	require.Contains(t, res.stderr, "create Image sim/never-pushed refused: PUSH_REQUIRED on spec.sha256")
	require.Contains(t, res.stderr, "applied before it: 1 of 3 changes\n  create Site sim/dc9\n")
	_, err = admin.Sites.Get(ctx, connect.NewRequest(&apiv1.GetSiteRequest{Tenant: "sim", Site: "dc9"}))
	require.NoError(t, err)
	hooks, err = admin.Webhooks.List(ctx, connect.NewRequest(&apiv1.ListWebhooksRequest{Tenant: "sim"}))
	require.NoError(t, err)
	require.Len(t, hooks.Msg.GetWebhooks(), 1, "nothing after the refusal was made")

	// Prune leaves images, tenants and policies alone; it deletes a site.
	res = r.want(t, exitPlanChanges, "fleet", "plan", "-f", exampleFleet, "--prune")
	require.Contains(t, res.stdout, "- delete Site sim/dc9")
	require.NotContains(t, res.stdout, "Image")
	require.Contains(t, res.stdout, "Plan: 0 to create, 0 to change, 0 to replace, 1 to delete.")

	// Bad documents of the new kinds are refused before any call.
	bad := writeDocs(t, image("x", "NOTHEX")+`---
apiVersion: bettercompute.io/v1
kind: Tenant
metadata: {name: t1, tenant: sim}
spec: {}
---
apiVersion: bettercompute.io/v1
kind: SandboxTemplate
metadata: {name: s, tenant: sim}
spec: {flavor: small, defaultTTL: soon}
---
apiVersion: bettercompute.io/v1
kind: Webhook
metadata: {name: w, tenant: sim}
spec: {url: 'ftp://x'}
---
apiVersion: bettercompute.io/v1
kind: Webhook
metadata: {name: w2, tenant: sim}
spec: {url: 'http://127.0.0.1:9099/better-compute'}
---
apiVersion: bettercompute.io/v1
kind: Webhook
metadata: {name: w3, tenant: sim}
spec: {url: 'http://127.0.0.1:9099/better-compute'}
---
apiVersion: bettercompute.io/v1
kind: IAMPolicy
metadata: {name: p, tenant: sim}
spec: {text: "  "}
`)
	res = r.want(t, 1, "fleet", "plan", "-f", bad)
	for _, want := range []string{":1: spec.sha256: is required: 64 lower-case hex digits", ":2: metadata.tenant: a Tenant is the platform's",
		":3: spec.defaultTTL: must be a positive duration", ":4: spec.url: must be an http(s) URL", ":6: metadata.name: the same Webhook as",
		":7: spec.text: is required"} {
		require.Contains(t, res.stderr, want)
	}
	require.Empty(t, res.stdout)

	// Another tenant's key neither reads nor writes sim's new kinds.
	res = r.run(t, r.acme, "fleet", "apply", "-f", writeDocs(t, strings.TrimPrefix(site, "---\n")))
	require.Equal(t, 1, res.code)
	require.Regexp(t, `NOT_FOUND|PERMISSION_DENIED`, res.stderr)
	res = r.run(t, r.acme, "fleet", "apply", "-f", writeDocs(t, "apiVersion: bettercompute.io/v1\nkind: Tenant\nmetadata: {name: evil}\nspec: {}\n"))
	require.Equal(t, 1, res.code)
	require.Contains(t, res.stderr, "create Tenant evil (platform) refused: PERMISSION_DENIED")
	_, err = admin.Tenants.Get(ctx, connect.NewRequest(&apiv1.GetTenantRequest{Tenant: "evil"}))
	require.Equal(t, "NOT_FOUND", client.Code(err))
}
