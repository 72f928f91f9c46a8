package iam

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cedar-policy/cedar-go"
	"github.com/cedar-policy/cedar-go/x/exp/ast"
	"github.com/cedar-policy/cedar-go/x/exp/schema/validate"
	"github.com/stretchr/testify/require"
)

// mapSource is a PolicySource over a map, the shape the real store has.
type mapSource struct {
	mu       sync.Mutex
	policies map[string][]TenantPolicy
	err      error
}

func (s *mapSource) TenantPolicies(_ context.Context, tenantID string) ([]TenantPolicy, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.policies[tenantID]), s.err
}

func (s *mapSource) set(tenantID string, ps ...TenantPolicy) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.policies[tenantID] = ps
}

func newCedar(t *testing.T, src PolicySource) *Cedar {
	t.Helper()
	c, err := NewCedar(src)
	require.NoError(t, err)
	return c
}

var principals = map[Role]Principal{
	RolePlatformAdmin: {ID: "root", Kind: KindUser, Role: RolePlatformAdmin},
	RoleAdmin:         {ID: "alice", Kind: KindUser, TenantID: "t1", Role: RoleAdmin},
	RoleMember:        {ID: "bob", Kind: KindUser, TenantID: "t1", Role: RoleMember},
	RoleViewer:        {ID: "carol", Kind: KindService, TenantID: "t1", Role: RoleViewer},
	RoleAgent:         {ID: "claude", Kind: KindAgent, TenantID: "t1", Role: RoleAgent},
}

type outcome string

const (
	allow   outcome = "allow"
	deny    outcome = "deny"
	confirm outcome = "confirm"
)

func outcomeOf(d Decision) outcome {
	switch {
	case d.Allowed:
		return allow
	case d.ConfirmationRequired:
		return confirm
	default:
		return deny
	}
}

// resourceFor is the resource the envelope would send for action in tenant.
func resourceFor(action, tenant string) Resource {
	switch action {
	case "tenants.create":
		return Resource{Type: "Tenant"}
	case "tenants.get", "tenants.suspend", "tenants.resume", "tenants.delete":
		return Resource{Type: "Tenant", ID: tenant, TenantID: tenant}
	case "tenants.list":
		return Resource{Type: "Platform"}
	case "projects.create":
		return Resource{Type: "Project", TenantID: tenant, Attrs: map[string]any{"name": "web"}}
	case "projects.get", "projects.delete":
		return Resource{Type: "Project", ID: "p1", TenantID: tenant, ProjectID: "p1"}
	case "apiKeys.create":
		return Resource{Type: "ApiKey", TenantID: tenant, ProjectID: "p1"}
	case "apiKeys.revoke":
		return Resource{Type: "ApiKey", ID: "k1", TenantID: tenant}
	case "policies.get", "policies.put":
		return Resource{Type: "Policy", ID: "pol1", TenantID: tenant}
	case "confirmations.approve":
		return Resource{Type: "Confirmation", ID: "c1", TenantID: tenant}
	case "audit.list", "audit.prove":
		return Resource{Type: "AuditLog", ID: "audit", TenantID: tenant}
	case "audit.check":
		return Resource{Type: "Platform"}
	case "events.watch", "events.list":
		return Resource{Type: "EventStream", ID: "events", TenantID: tenant}
	case "nodes.get", "nodes.drain", "nodes.undrain", "nodes.delete", "inventory.get", "health.get", "gpus.quarantine", "gpus.lift":
		return Resource{Type: "Node", ID: "n1", TenantID: tenant, ProjectID: "p1", Attrs: map[string]any{"name": "gpu-1", "pool": "a100", "state": "active"}}
	case "commands.run", "commands.get", "commands.cancel":
		return Resource{Type: "Command", ID: "c1", TenantID: tenant, ProjectID: "p1", Attrs: map[string]any{"kind": "inventory.refresh"}}
	case "commands.list":
		return Resource{Type: "Node", ID: "n1", TenantID: tenant, ProjectID: "p1"}
	case "commandBatches.create", "commandBatches.get", "commandBatches.approve", "commandBatches.cancel", "commandBatches.run":
		return Resource{Type: "CommandBatch", ID: "cbt1", TenantID: tenant, Attrs: map[string]any{"state": "pending"}}
	case "approverSets.put", "approverSets.get":
		return Resource{Type: "ApproverSet", ID: tenant, TenantID: tenant}
	case "joinTokens.create", "joinTokens.revoke":
		return Resource{Type: "JoinToken", ID: "jt1", TenantID: tenant, ProjectID: "p1", Attrs: map[string]any{"pool": "a100"}}
	case "pools.create":
		return Resource{Type: "Pool", ID: DraftID, TenantID: tenant, Attrs: map[string]any{"name": "h100"}}
	case "pools.update", "pools.get", "pools.archive", "pools.offer", "pools.health", "pools.resetBreaker":
		return Resource{Type: "Pool", ID: "pool1", TenantID: tenant, Attrs: map[string]any{"name": "h100", "state": "active"}}
	case "trustAnchors.create", "trustAnchors.delete":
		return Resource{Type: "TrustAnchor", ID: "tra1", TenantID: tenant, Attrs: map[string]any{"attestor": "tpm"}}
	case "joinRequests.approve", "joinRequests.reject":
		return Resource{Type: "JoinRequest", ID: "jr1", TenantID: tenant}
	case "reservations.create", "reservations.preview", "reservations.get", "reservations.extend",
		"reservations.release", "reservations.cancel", "reservations.exec":
		return Resource{Type: "Reservation", ID: "rsv1", TenantID: tenant, ProjectID: "p1",
			Attrs: map[string]any{"pool": "gpu", "gpus": 4, "lifetimeSeconds": 3600}}
	case "quotas.set", "quotas.get":
		return Resource{Type: "Quota", ID: "quo1", TenantID: tenant, ProjectID: "p1", Attrs: map[string]any{"scope": "project"}}
	case "budgets.set", "budgets.get", "budgets.delete":
		return Resource{Type: "Budget", ID: "bud1", TenantID: tenant}
	case "capacity.timeline":
		return Resource{Type: "Pool", ID: "pool1", TenantID: tenant, Attrs: map[string]any{"name": "h100", "state": "active"}}
	case "capacity.rebuild", "rollouts.create", "rollouts.get", "rollouts.list", "rollouts.pause", "rollouts.resume", "rollouts.abort":
		return Resource{Type: "Platform", ID: "platform"}
	case "images.push":
		return Resource{Type: "Image", ID: DraftID, TenantID: tenant, Attrs: map[string]any{"name": "debian", "kind": "raw"}}
	case "images.get", "images.pull", "images.sign", "images.promote", "images.delete":
		return Resource{Type: "Image", ID: "img1", TenantID: tenant, Attrs: map[string]any{"name": "debian", "kind": "raw", "visibility": "private"}}
	case "releases.create", "releases.get", "releases.delete":
		return Resource{Type: "Release", ID: "v1.4.0", TenantID: tenant, Attrs: map[string]any{"version": "v1.4.0"}}
	case "signerKeys.add", "signerKeys.remove":
		return Resource{Type: "SignerKey", ID: "skey1", TenantID: tenant, Attrs: map[string]any{"name": "ci"}}
	case "webhooks.create":
		return Resource{Type: "Webhook", ID: DraftID, TenantID: tenant}
	case "webhooks.get", "webhooks.update", "webhooks.delete", "webhooks.test", "webhooks.rotateSecret",
		"webhooks.listDeliveries", "webhooks.redeliver":
		return Resource{Type: "Webhook", ID: "whk1", TenantID: tenant}
	case "secrets.put":
		return Resource{Type: "Secret", ID: DraftID, TenantID: tenant, Attrs: map[string]any{"name": "token"}}
	case "secrets.get", "secrets.delete":
		return Resource{Type: "Secret", ID: "sec1", TenantID: tenant, Attrs: map[string]any{"name": "token"}}
	case "fleetMarks.set":
		return Resource{Type: "ManagedMark", ID: DraftID, TenantID: tenant, Attrs: map[string]any{"name": "h100", "kind": "Pool"}}
	case "fleetMarks.delete":
		return Resource{Type: "ManagedMark", ID: "fmk1", TenantID: tenant, Attrs: map[string]any{"name": "h100", "kind": "Pool"}}
	case "providerAccounts.create":
		return Resource{Type: "ProviderAccount", ID: DraftID, TenantID: tenant, Attrs: map[string]any{"name": "hc", "type": "hetzner-cloud"}}
	case "providerAccounts.get", "providerAccounts.delete":
		return Resource{Type: "ProviderAccount", ID: "pac1", TenantID: tenant, Attrs: map[string]any{"name": "hc", "type": "hetzner-cloud"}}
	case "profiles.create":
		return Resource{Type: "Profile", ID: DraftID, TenantID: tenant, Attrs: map[string]any{"name": "gpu-deploy", "kind": "DeployProfile"}}
	case "profiles.get", "profiles.update", "profiles.delete":
		return Resource{Type: "Profile", ID: "prf1", TenantID: tenant, Attrs: map[string]any{"name": "gpu-deploy", "kind": "DeployProfile"}}
	case "flavors.create":
		return Resource{Type: "Flavor", ID: DraftID, TenantID: tenant, Attrs: map[string]any{"name": "small", "vcpus": int64(2), "gpus": int64(0)}}
	case "flavors.get", "flavors.delete":
		return Resource{Type: "Flavor", ID: "flv1", TenantID: tenant, Attrs: map[string]any{"name": "small", "vcpus": int64(2), "gpus": int64(0)}}
	case "ipPools.create":
		return Resource{Type: "IPPool", ID: DraftID, TenantID: tenant, Attrs: map[string]any{"name": "lan", "cidr": "10.0.0.0/24"}}
	case "ipPools.get", "ipPools.listLeases", "ipPools.delete":
		return Resource{Type: "IPPool", ID: "ipp1", TenantID: tenant, Attrs: map[string]any{"name": "lan", "cidr": "10.0.0.0/24"}}
	case "sites.create":
		return Resource{Type: "Site", ID: DraftID, TenantID: tenant, Attrs: map[string]any{"name": "dc1"}}
	case "sites.get", "sites.update", "sites.delete", "sites.listDrivers":
		return Resource{Type: "Site", ID: "site1", TenantID: tenant, Attrs: map[string]any{"name": "dc1"}}
	case "machines.enroll":
		return Resource{Type: "Machine", ID: DraftID, TenantID: tenant, Attrs: map[string]any{"name": "m1"}}
	case "machines.get", "machines.inspect", "machines.commission", "machines.deploy", "machines.release",
		"machines.retire", "machines.rescue", "machines.power", "machines.abort", "machines.powerStatus", "machines.getWorkflow", "machines.rotateBMC",
		"machines.lease", "machines.pauseWorkflow", "machines.resumeWorkflow", "machines.retryWorkflow", "machines.abortWorkflow":
		return Resource{Type: "Machine", ID: "mch1", TenantID: tenant, Attrs: map[string]any{"name": "m1", "site": "site1", "state": "ready"}}
	case "machines.acceptLease", "machines.releaseLease", "machines.getLease":
		return Resource{Type: "MachineLease", ID: "mls1", TenantID: tenant, Attrs: map[string]any{"machine": "mch1", "state": "active"}}
	case "instances.create":
		return Resource{Type: "Instance", ID: DraftID, TenantID: tenant, ProjectID: "p1", Attrs: map[string]any{"name": "vm1", "flavor": "small"}}
	case "instances.get", "instances.start", "instances.stop", "instances.reboot", "instances.delete", "instances.ssh":
		return Resource{Type: "Instance", ID: "ins1", TenantID: tenant, ProjectID: "p1", Attrs: map[string]any{"name": "vm1", "state": "running"}}
	case "volumes.create":
		return Resource{Type: "Volume", ID: DraftID, TenantID: tenant, Attrs: map[string]any{"name": "data", "sizeGiB": int64(10)}}
	case "volumes.get", "volumes.attach", "volumes.detach", "volumes.delete":
		return Resource{Type: "Volume", ID: "vol1", TenantID: tenant, Attrs: map[string]any{"name": "data", "sizeGiB": int64(10)}}
	case "sandboxTemplates.create":
		return Resource{Type: "SandboxTemplate", ID: DraftID, TenantID: tenant, Attrs: map[string]any{"name": "t1", "warmMax": int64(2)}}
	case "sandboxTemplates.get", "sandboxTemplates.delete":
		return Resource{Type: "SandboxTemplate", ID: "sbt1", TenantID: tenant, Attrs: map[string]any{"name": "t1", "warmMax": int64(2)}}
	case "sandboxes.create":
		return Resource{Type: "Sandbox", ID: DraftID, TenantID: tenant, Attrs: map[string]any{"template": "t1", "lifetimeSeconds": int64(600)}}
	case "sandboxes.get", "sandboxes.extend", "sandboxes.delete", "sandboxes.snapshot", "sandboxes.exec", "sandboxes.restore",
		"sandboxes.deleteSnapshot", "workloadTokens.issue":
		return Resource{Type: "Sandbox", ID: "sbx1", TenantID: tenant, Attrs: map[string]any{"template": "t1", "lifetimeSeconds": int64(600)}}
	default: // every other list is on its tenant
		return Resource{Type: "Tenant", ID: tenant, TenantID: tenant}
	}
}

func TestCedarMatrix(t *testing.T) {
	t.Parallel()
	c := newCedar(t, nil)

	reads := []string{"tenants.get", "projects.get", "projects.list", "policies.get", "policies.list",
		"confirmations.list", "audit.list", "audit.prove", "events.watch", "events.list",
		"nodes.list", "nodes.get", "commands.get", "commands.list", "commandBatches.get", "commandBatches.list", "approverSets.get",
		"joinRequests.list", "inventory.get", "health.get", "health.listFindings", "health.listRemediations", "pools.health",
		"pools.get", "pools.list", "reservations.preview", "reservations.get", "reservations.list",
		"reservations.watch", "quotas.get", "quotas.list", "budgets.get", "budgets.list", "capacity.summary", "capacity.byPool",
		"capacity.byConsumer", "capacity.timeline", "usage.list", "usage.export", "images.get", "images.list", "images.pull", "signerKeys.list",
		"releases.get", "releases.list",
		"webhooks.get", "webhooks.list", "webhooks.listDeliveries",
		"sites.get", "sites.list", "sites.listDrivers", "machines.get", "machines.list", "machines.powerStatus", "machines.listWorkflows",
		"machines.getWorkflow", "machines.getLease",
		"flavors.get", "flavors.list", "ipPools.get", "ipPools.list", "ipPools.listLeases",
		"instances.get", "instances.list", "instances.watch", "volumes.get", "volumes.list", "secrets.get", "secrets.list",
		"fleetMarks.list", "providerAccounts.get", "providerAccounts.list", "providerAccounts.listTypes",
		"profiles.get", "profiles.list", "profiles.validate",
		"sandboxTemplates.get", "sandboxTemplates.list", "sandboxes.get", "sandboxes.list", "sandboxes.listSnapshots"}
	books := []string{"reservations.create", "reservations.extend", "reservations.release", "reservations.cancel", "reservations.exec",
		"instances.create", "instances.start", "instances.stop", "instances.reboot", "volumes.create", "volumes.attach", "volumes.detach",
		"sandboxes.create", "sandboxes.extend", "sandboxes.snapshot", "instances.ssh", "sandboxes.exec", "sandboxes.restore",
		"workloadTokens.issue"}
	// want[role][action] in the principal's own tenant; absent means deny.
	// In another tenant every role but platform-admin is denied. Join tokens
	// are credentials: only admins mint, list or revoke them.
	want := map[Role]map[string]outcome{
		RolePlatformAdmin: {},
		RoleAdmin:         {},
		RoleMember:        {"projects.create": allow, "projects.delete": allow, "commands.run": allow, "commands.cancel": allow},
		RoleViewer:        {},
		RoleAgent:         {"projects.create": allow, "projects.delete": confirm, "commands.run": allow, "commandBatches.create": allow},
	}
	// Members propose, approve (the key is what counts), cancel and run
	// batches; an agent only proposes.
	for _, a := range []string{"commandBatches.create", "commandBatches.approve", "commandBatches.cancel", "commandBatches.run"} {
		want[RoleMember][a] = allow
	}
	for _, a := range books {
		want[RoleMember][a] = allow
		want[RoleAgent][a] = allow
	}
	// Members delete their guests and volumes; an agent's delete waits for
	// a human.
	for _, a := range []string{"instances.delete", "volumes.delete", "sandboxes.delete", "sandboxes.deleteSnapshot"} {
		want[RoleMember][a] = allow
		want[RoleAgent][a] = confirm
	}
	for _, a := range Actions() {
		want[RolePlatformAdmin][a] = allow
		if a != "tenants.create" && a != "tenants.list" && a != "capacity.rebuild" && a != "images.promote" && a != "audit.check" &&
			a != "releases.create" && a != "releases.delete" &&
			a != "tenants.suspend" && a != "tenants.resume" && a != "tenants.delete" && !strings.HasPrefix(a, "rollouts.") {
			want[RoleAdmin][a] = allow
		}
	}
	// Deleting a tenant waits for a human even for the platform.
	want[RolePlatformAdmin]["tenants.delete"] = confirm
	for _, a := range reads {
		want[RoleMember][a] = allow
		want[RoleViewer][a] = allow
		want[RoleAgent][a] = allow
	}

	for role, p := range principals {
		for _, action := range Actions() {
			for _, tenant := range []string{"t1", "t2"} {
				expect := cmpOr(want[role][action], deny)
				if tenant != p.TenantID && role != RolePlatformAdmin {
					expect = deny
				}
				if (action == "capacity.rebuild" || action == "images.promote" || action == "releases.create" || action == "releases.delete") &&
					role != RolePlatformAdmin {
					expect = deny
				}
				t.Run(string(role)+"/"+action+"/"+tenant, func(t *testing.T) {
					t.Parallel()
					got, err := c.Authorize(context.Background(), Request{
						Principal: p, Action: action, Resource: resourceFor(action, tenant),
					})
					require.NoError(t, err)
					require.Equal(t, expect, outcomeOf(got), "reasons: %v", got.Reasons)
				})
			}
		}
	}
}

func cmpOr(o, def outcome) outcome {
	if o == "" {
		return def
	}
	return o
}

func TestCedarAgentConfirmation(t *testing.T) {
	t.Parallel()
	c := newCedar(t, nil)
	agent := principals[RoleAgent]

	tests := []struct {
		name      string
		action    string
		confirmed bool
		want      outcome
	}{
		{"delete unconfirmed asks a human", "projects.delete", false, confirm},
		{"delete confirmed proceeds", "projects.delete", true, allow},
		// Confirming would not help: no permit lets agents revoke keys.
		{"revoke is a plain deny", "apiKeys.revoke", false, deny},
		{"revoke confirmed still denied", "apiKeys.revoke", true, deny},
		{"create needs no confirmation", "projects.create", false, allow},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := c.Authorize(context.Background(), Request{
				Principal: agent, Action: tt.action, Resource: resourceFor(tt.action, "t1"),
				Context: map[string]any{ContextConfirmed: tt.confirmed},
			})
			require.NoError(t, err)
			require.Equal(t, tt.want, outcomeOf(got), "reasons: %v", got.Reasons)
			if tt.want == confirm {
				require.Equal(t, []string{"agent-delete-needs-human"}, got.Reasons)
			}
		})
	}

	// An agent given the admin role may run machines, but whatever
	// destroys a machine's disk waits for a human; inspecting does not.
	for _, tt := range []struct {
		action string
		want   outcome
	}{
		{"machines.deploy", confirm}, {"machines.release", confirm}, {"machines.commission", confirm},
		{"machines.retire", confirm}, {"sites.delete", confirm}, {"machines.inspect", allow},
		{"machines.power", confirm}, {"machines.abort", confirm},
		{"machines.retryWorkflow", confirm}, {"machines.abortWorkflow", confirm}, {"machines.pauseWorkflow", allow},
		{"flavors.delete", confirm}, {"ipPools.delete", confirm}, {"ipPools.create", allow},
	} {
		t.Run("admin agent "+tt.action, func(t *testing.T) {
			t.Parallel()
			p := agent
			p.Role = RoleAdmin
			got, err := c.Authorize(context.Background(), Request{
				Principal: p, Action: tt.action, Resource: resourceFor(tt.action, "t1"),
				Context: map[string]any{ContextConfirmed: false},
			})
			require.NoError(t, err)
			require.Equal(t, tt.want, outcomeOf(got), "reasons: %v", got.Reasons)
		})
	}

	t.Run("agent with admin role still confirms deletes", func(t *testing.T) {
		t.Parallel()
		p := agent
		p.Role = RoleAdmin
		got, err := c.Authorize(context.Background(), Request{
			Principal: p, Action: "apiKeys.revoke", Resource: resourceFor("apiKeys.revoke", "t1"),
		})
		require.NoError(t, err)
		require.Equal(t, confirm, outcomeOf(got))
	})
}

func TestCedarTenantPolicies(t *testing.T) {
	t.Parallel()
	src := &mapSource{policies: map[string][]TenantPolicy{
		"t1": {
			{ID: "no-deletes", Text: `@id("no-deletes") forbid (principal, action == BC::Action::"projects.delete", resource);`},
			{ID: "gpu-cap", Text: `forbid (principal, action == BC::Action::"projects.create", resource)
				when { resource has gpus && resource.gpus > 8 };`},
			{ID: "members-see-keys", Text: `permit (principal, action == BC::Action::"apiKeys.list", resource)
				when { principal.role == "member" };`},
			// Would be a disaster unconfined.
			{ID: "everything", Text: `permit (principal, action, resource) when { principal.role == "viewer" };`},
		},
	}}
	c := newCedar(t, src)
	member := principals[RoleMember]
	member2 := Principal{ID: "dave", Kind: KindUser, TenantID: "t2", Role: RoleMember}
	viewer := principals[RoleViewer]

	tests := []struct {
		name     string
		p        Principal
		action   string
		resource Resource
		want     outcome
	}{
		{"forbid applies in its tenant", member, "projects.delete", resourceFor("projects.delete", "t1"), deny},
		{"forbid does not leak to other tenants", member2, "projects.delete", resourceFor("projects.delete", "t2"), allow},
		{"tenant policies do not bind platform admins", principals[RolePlatformAdmin], "projects.delete", resourceFor("projects.delete", "t1"), allow},
		{"attribute forbid", member, "projects.create", Resource{Type: "Project", TenantID: "t1", Attrs: map[string]any{"gpus": int64(16)}}, deny},
		{"attribute forbid below cap", member, "projects.create", Resource{Type: "Project", TenantID: "t1", Attrs: map[string]any{"gpus": 4}}, allow},
		{"tenant permit extends within tenant", member, "apiKeys.list", resourceFor("apiKeys.list", "t1"), allow},
		{"broad tenant permit stays in tenant", viewer, "projects.delete", resourceFor("projects.delete", "t1"), deny},
		{"broad tenant permit does not reach other tenants", viewer, "projects.get", resourceFor("projects.get", "t2"), deny},
		{"broad tenant permit does not reach the platform", viewer, "tenants.list", resourceFor("tenants.list", ""), deny},
		{"broad tenant permit works inside", viewer, "policies.put", resourceFor("policies.put", "t1"), allow},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := c.Authorize(context.Background(), Request{Principal: tt.p, Action: tt.action, Resource: tt.resource})
			require.NoError(t, err)
			require.Equal(t, tt.want, outcomeOf(got), "reasons: %v", got.Reasons)
		})
	}
}

func TestCedarTenantPolicyConfinement(t *testing.T) {
	t.Parallel()
	// Loading already skips foreign tenants; the added condition is the
	// second wall, so test it on its own.
	pm, err := parseTenantPolicies("t1", []TenantPolicy{{ID: "all", Text: `permit (principal, action, resource);`}})
	require.NoError(t, err)
	c := newCedar(t, nil)
	for _, tc := range []struct {
		tenant string
		want   outcome
	}{{"t1", allow}, {"t2", deny}} {
		p := Principal{ID: "x", Kind: KindUser, TenantID: tc.tenant, Role: "nobody"}
		proj, err := c.model.project(Request{Principal: p, Resource: resourceFor("projects.get", tc.tenant)})
		require.NoError(t, err)
		rctx, err := requestContext(nil, nil)
		require.NoError(t, err)
		dec, _ := cedar.Authorize(pm, proj.entities, cedar.Request{
			Principal: proj.principal, Action: actionUID("projects.get"), Resource: proj.resource, Context: rctx,
		})
		require.Equal(t, tc.want == allow, bool(dec), tc.tenant)
	}
}

func TestCedarTenantPolicyChangesAndErrors(t *testing.T) {
	t.Parallel()
	src := &mapSource{policies: map[string][]TenantPolicy{}}
	c := newCedar(t, src)
	req := Request{Principal: principals[RoleMember], Action: "projects.get", Resource: resourceFor("projects.get", "t1")}
	ctx := context.Background()

	got, err := c.Authorize(ctx, req)
	require.NoError(t, err)
	require.True(t, got.Allowed)

	// An edit is seen on the next request despite the cache.
	src.set("t1", TenantPolicy{ID: "lock", Text: `forbid (principal, action, resource);`})
	got, err = c.Authorize(ctx, req)
	require.NoError(t, err)
	require.False(t, got.Allowed)
	require.Equal(t, []string{"tenant/t1/lock"}, got.Reasons)

	src.set("t1")
	got, err = c.Authorize(ctx, req)
	require.NoError(t, err)
	require.True(t, got.Allowed)

	// A stored policy that no longer parses fails closed.
	src.set("t1", TenantPolicy{ID: "broken", Text: `forbid (`})
	got, err = c.Authorize(ctx, req)
	require.Error(t, err)
	require.False(t, got.Allowed)

	src.mu.Lock()
	src.err = errors.New("db down")
	src.mu.Unlock()
	got, err = c.Authorize(ctx, req)
	require.ErrorContains(t, err, "db down")
	require.False(t, got.Allowed)
}

func TestCedarRequestErrors(t *testing.T) {
	t.Parallel()
	c := newCedar(t, nil)
	admin := principals[RolePlatformAdmin]
	tests := []struct {
		name    string
		req     Request
		wantErr string
	}{
		{"unknown action", Request{Principal: admin, Action: "projects.explode", Resource: resourceFor("projects.get", "t1")}, "unknown action"},
		{"action group is not requestable", Request{Principal: admin, Action: "read", Resource: resourceFor("projects.get", "t1")}, "unknown action"},
		{"unknown resource type", Request{Principal: admin, Action: "projects.get", Resource: Resource{Type: "Spaceship"}}, "unknown resource type"},
		{"resource type the action does not apply to", Request{Principal: admin, Action: "projects.create", Resource: resourceFor("projects.list", "t1")}, "does not apply"},
		{"unsupported attribute", Request{Principal: admin, Action: "projects.create", Resource: Resource{Type: "Project", TenantID: "t1", Attrs: map[string]any{"x": 1.5}}}, "unsupported attribute type"},
		{"confirmed must be bool", Request{Principal: admin, Action: "projects.get", Resource: resourceFor("projects.get", "t1"), Context: map[string]any{"confirmed": "yes"}}, "must be a bool"},
		{"node principal is denied without error", Request{Principal: Principal{ID: "n1", Kind: KindNode, Role: RolePlatformAdmin}, Action: "projects.get", Resource: resourceFor("projects.get", "t1")}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := c.Authorize(context.Background(), tt.req)
			require.False(t, got.Allowed)
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestCedarValidate(t *testing.T) {
	t.Parallel()
	c := newCedar(t, nil)
	tests := []struct {
		name      string
		text      string
		wantField string // "" means valid
		wantIn    string
	}{
		{"valid forbid", `@id("x") forbid (principal, action == BC::Action::"projects.delete", resource is BC::Project);`, "", ""},
		{"valid with group and attrs", `permit (principal is BC::User, action in BC::Action::"read", resource)
			when { resource in BC::Tenant::"t1" && context.confirmed };`, "", ""},
		{"valid fleet attribute", `forbid (principal, action == BC::Action::"commands.run", resource is BC::Command)
			when { resource has kind && resource.kind == "node.drain" };`, "", ""},
		{"valid confirm", `@confirm("human") forbid (principal, action == BC::Action::"projects.create", resource) unless { context.confirmed };`, "", ""},
		{"bad syntax", "permit (principal, action, resource)\nwhen { 1 + };", "text:line 2", "parse error"},
		{"empty", "  // nothing\n", "text", "no policy statements"},
		{"unknown entity type in scope", `permit (principal is BC::Robot, action, resource);`, "text:line 1", "unknown entity type BC::Robot"},
		{"un-namespaced entity type", "\n\npermit (principal, action, resource) when { resource is Project };", "text:line 3", "unknown entity type Project"},
		{"unknown entity type in literal", `forbid (principal, action, resource) when { resource in BC::Org::"o" };`, "text:line 1", "unknown entity type BC::Org"},
		{"unknown action", `permit (principal, action == BC::Action::"projects.explode", resource);`, "text:line 1", "unknown action"},
		{"unknown action in set", `permit (principal, action in [BC::Action::"projects.get", BC::Action::"nope"], resource);`, "text:line 1", "unknown action"},
		{"unknown action in condition", `permit (principal, action, resource) when { action == BC::Action::"nope" };`, "text:line 1", "unknown action"},
		{"unknown annotation", `@confim("human") forbid (principal, action, resource);`, "text:line 1", "unknown annotation @confim"},
		{"confirm on permit", `@confirm("human") permit (principal, action, resource);`, "text:line 1", "forbid"},
		{"confirm by whom", `@confirm("robot") forbid (principal, action, resource);`, "text:line 1", "human"},
		{"second statement reported by line", "permit (principal, action, resource);\npermit (principal, action == BC::Action::\"x\", resource);", "text:line 2", "unknown action"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := c.Validate("p1", tt.text)
			if tt.wantField == "" {
				require.NoError(t, err)
				return
			}
			var ve *ValidationError
			require.ErrorAs(t, err, &ve)
			require.Equal(t, tt.wantField, ve.Field)
			require.Contains(t, ve.Reason, tt.wantIn)
		})
	}
}

// The shipped policies must type-check strictly against the shipped schema:
// a typo in an attribute name would otherwise make a permit silently inert.
func TestDefaultPoliciesTypeCheck(t *testing.T) {
	t.Parallel()
	c := newCedar(t, nil)
	v := validate.New(c.model.schema, validate.WithStrict())
	require.NotEmpty(t, c.defaults)
	for id, p := range c.defaults {
		require.NoError(t, v.Policy(string(id), (*ast.Policy)(p.AST())), id)
	}
}

func TestActions(t *testing.T) {
	t.Parallel()
	want := []string{
		"apiKeys.create", "apiKeys.list", "apiKeys.revoke", "approverSets.get", "approverSets.put", "audit.check", "audit.list", "audit.prove",
		"budgets.delete", "budgets.get", "budgets.list", "budgets.set",
		"capacity.byConsumer", "capacity.byPool", "capacity.rebuild", "capacity.summary", "capacity.timeline",
		"commandBatches.approve", "commandBatches.cancel", "commandBatches.create", "commandBatches.get", "commandBatches.list", "commandBatches.run",
		"commands.cancel", "commands.get", "commands.list", "commands.run",
		"confirmations.approve", "confirmations.list", "events.list", "events.watch",
		"flavors.create", "flavors.delete", "flavors.get", "flavors.list",
		"fleetMarks.delete", "fleetMarks.list", "fleetMarks.set",
		"gpus.lift", "gpus.quarantine", "health.get", "health.listFindings", "health.listRemediations",
		"images.delete", "images.get", "images.list", "images.promote", "images.pull", "images.push", "images.sign",
		"instances.create", "instances.delete", "instances.get", "instances.list", "instances.reboot", "instances.ssh", "instances.start",
		"instances.stop", "instances.watch",
		"inventory.get", "ipPools.create", "ipPools.delete", "ipPools.get", "ipPools.list", "ipPools.listLeases",
		"joinRequests.approve", "joinRequests.list", "joinRequests.reject",
		"joinTokens.create", "joinTokens.list", "joinTokens.revoke",
		"machines.abort", "machines.abortWorkflow", "machines.acceptLease", "machines.commission", "machines.deploy", "machines.enroll",
		"machines.get", "machines.getLease", "machines.getWorkflow", "machines.inspect", "machines.lease", "machines.list",
		"machines.listWorkflows", "machines.pauseWorkflow", "machines.power", "machines.powerStatus", "machines.release",
		"machines.releaseLease", "machines.rescue", "machines.resumeWorkflow", "machines.retire", "machines.retryWorkflow",
		"machines.rotateBMC",
		"nodes.delete", "nodes.drain", "nodes.get", "nodes.list", "nodes.undrain",
		"policies.get", "policies.list", "policies.put",
		"pools.archive", "pools.create", "pools.get", "pools.health", "pools.list", "pools.offer", "pools.resetBreaker", "pools.update",
		"profiles.create", "profiles.delete", "profiles.get", "profiles.list", "profiles.update", "profiles.validate",
		"projects.create", "projects.delete", "projects.get", "projects.list",
		"providerAccounts.create", "providerAccounts.delete", "providerAccounts.get", "providerAccounts.list", "providerAccounts.listTypes",
		"quotas.get", "quotas.list", "quotas.set",
		"releases.create", "releases.delete", "releases.get", "releases.list",
		"reservations.cancel", "reservations.create", "reservations.exec", "reservations.extend", "reservations.get",
		"reservations.list", "reservations.preview", "reservations.release", "reservations.watch",
		"rollouts.abort", "rollouts.create", "rollouts.get", "rollouts.list", "rollouts.pause", "rollouts.resume",
		"sandboxTemplates.create", "sandboxTemplates.delete", "sandboxTemplates.get", "sandboxTemplates.list",
		"sandboxes.create", "sandboxes.delete", "sandboxes.deleteSnapshot", "sandboxes.exec", "sandboxes.extend", "sandboxes.get", "sandboxes.list",
		"sandboxes.listSnapshots", "sandboxes.restore", "sandboxes.snapshot",
		"secrets.delete", "secrets.get", "secrets.list", "secrets.put",
		"signerKeys.add", "signerKeys.list", "signerKeys.remove",
		"sites.create", "sites.delete", "sites.get", "sites.list", "sites.listDrivers", "sites.update",
		"tenants.create", "tenants.delete", "tenants.get", "tenants.list", "tenants.resume", "tenants.suspend", "trustAnchors.create", "trustAnchors.delete", "trustAnchors.list",
		"usage.export", "usage.list",
		"volumes.attach", "volumes.create", "volumes.delete", "volumes.detach", "volumes.get", "volumes.list",
		"webhooks.create", "webhooks.delete", "webhooks.get", "webhooks.list", "webhooks.listDeliveries",
		"webhooks.redeliver", "webhooks.rotateSecret", "webhooks.test", "webhooks.update",
		"workloadTokens.issue",
	}
	require.Equal(t, want, Actions())
	// A copy: callers cannot corrupt the shared list.
	Actions()[0] = "x"
	require.Equal(t, want, Actions())
}

func TestCounting(t *testing.T) {
	t.Parallel()
	c := NewCounting(newCedar(t, nil))
	ctx := context.Background()
	p := principals[RoleMember]
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = c.Authorize(ctx, Request{Principal: p, Action: "projects.get", Resource: resourceFor("projects.get", "t1")})
		}()
	}
	wg.Wait()
	d, err := c.Authorize(ctx, Request{Principal: p, Action: "projects.create", Resource: resourceFor("projects.create", "t1")})
	require.NoError(t, err)
	require.True(t, d.Allowed, "decision passes through")
	require.Equal(t, 11, c.Calls())
	require.Equal(t, 10, c.CallsFor("projects.get"))
	require.Equal(t, 1, c.CallsFor("projects.create"))
	require.Equal(t, 0, c.CallsFor("projects.delete"))
	c.Reset()
	require.Equal(t, 0, c.Calls())
	require.Equal(t, 0, c.CallsFor("projects.get"))
}
