package app_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// TestListsHonourProjectForbid: a tenant policy forbidding project secret
// hides its rows from every list of project-scoped rows (projects, nodes,
// commands, join tokens, quotas), not only from Get; a list that names the
// project is refused. The platform admin, whom tenant policies do not
// bind, still sees everything.
func TestListsHonourProjectForbid(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	projects := map[string]string{}
	for _, name := range []string{"default", "secret"} {
		p, err := admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: name}))
		require.NoError(t, err)
		projects[name] = p.Msg.GetProject().GetId()
	}
	// One node joins each project.
	sim, err := bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		Template: bctest.FakeDaemonConfig{Gateway: cp.GatewayAddr}, Root: t.TempDir(), N: 2,
		Token: func(ctx context.Context, i int) (string, error) {
			tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: []string{"default", "secret"}[i]}))
			return tok.Msg.GetToken(), err
		},
	})
	require.NoError(t, err)
	defer sim.Stop()
	nodeOf := map[string]string{}
	eventually(t, "a node in each project", func() bool {
		for name := range projects {
			ns, err := admin.Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{Tenant: "acme", Project: name}))
			require.NoError(t, err)
			if len(ns.Msg.GetNodes()) != 1 {
				return false
			}
			nodeOf[name] = ns.Msg.GetNodes()[0].GetId()
		}
		return true
	})
	for name := range projects {
		_, err := admin.Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{Tenant: "acme", Node: nodeOf[name], Kind: "inventory.refresh"}))
		require.NoError(t, err)
		_, err = admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: name}))
		require.NoError(t, err)
		_, err = admin.Quotas.Set(ctx, connect.NewRequest(&apiv1.SetQuotaRequest{Tenant: "acme", Project: name, Gpus: ptr(int32(8))}))
		require.NoError(t, err)
	}
	k, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "admin"}))
	require.NoError(t, err)
	tenantAdmin := cp.Client(k.Msg.GetSecret())
	_, err = admin.Policies.Put(ctx, connect.NewRequest(&apiv1.PutPolicyRequest{Tenant: "acme", Id: "hide-secret",
		Text: fmt.Sprintf(`@id("hide-secret")
forbid (principal, action in BC::Action::"read", resource in BC::Project::%q);`, projects["secret"])}))
	require.NoError(t, err)

	// lists returns, per list, the project ids of the rows c sees.
	lists := func(c *client.Client) map[string][]string {
		got := map[string][]string{}
		ps, err := c.Projects.List(ctx, connect.NewRequest(&apiv1.ListProjectsRequest{Tenant: "acme"}))
		require.NoError(t, err)
		for _, p := range ps.Msg.GetProjects() {
			got["projects"] = append(got["projects"], p.GetId())
		}
		ns, err := c.Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{Tenant: "acme"}))
		require.NoError(t, err)
		for _, n := range ns.Msg.GetNodes() {
			got["nodes"] = append(got["nodes"], n.GetProjectId())
		}
		cs, err := c.Commands.List(ctx, connect.NewRequest(&apiv1.ListCommandsRequest{Tenant: "acme"}))
		require.NoError(t, err)
		for _, cmd := range cs.Msg.GetCommands() {
			for name, id := range nodeOf {
				if cmd.GetNodeId() == id {
					got["commands"] = append(got["commands"], projects[name])
				}
			}
		}
		ts, err := c.JoinTokens.List(ctx, connect.NewRequest(&apiv1.ListJoinTokensRequest{Tenant: "acme", IncludeInactive: true}))
		require.NoError(t, err)
		for _, jt := range ts.Msg.GetJoinTokens() {
			got["join tokens"] = append(got["join tokens"], jt.GetProjectId())
		}
		qs, err := c.Quotas.List(ctx, connect.NewRequest(&apiv1.ListQuotasRequest{Tenant: "acme"}))
		require.NoError(t, err)
		for _, q := range qs.Msg.GetQuotas() {
			got["quotas"] = append(got["quotas"], q.GetProjectId())
		}
		return got
	}
	seen := lists(tenantAdmin)
	for _, what := range []string{"projects", "nodes", "commands", "join tokens", "quotas"} {
		// assert, not require: every list that leaks is reported.
		assert.NotEmpty(t, seen[what], what)
		assert.NotContains(t, seen[what], projects["secret"], "%s shows rows of the forbidden project", what)
	}
	for what, ids := range lists(admin) {
		require.Contains(t, ids, projects["secret"], "the platform admin sees %s of every project", what)
	}

	denied := map[string]error{}
	_, denied["nodes"] = tenantAdmin.Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{Tenant: "acme", Project: "secret"}))
	_, denied["quotas"] = tenantAdmin.Quotas.List(ctx, connect.NewRequest(&apiv1.ListQuotasRequest{Tenant: "acme", Project: "secret"}))
	_, denied["project"] = tenantAdmin.Projects.Get(ctx, connect.NewRequest(&apiv1.GetProjectRequest{Tenant: "acme", Project: "secret"}))
	for what, err := range denied {
		require.Equal(t, "PERMISSION_DENIED", client.Code(err), "%s: %v", what, err)
	}
}

func ptr[T any](v T) *T { return &v }

// TestEventsWatchRechecks: an event stream open across a policy change that
// forbids it ends with PERMISSION_DENIED at the next re-check, rather than
// streaming on the decision it started with.
func TestEventsWatchRechecks(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := cp.Admin()
	_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	k, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "viewer"}))
	require.NoError(t, err)
	viewer := cp.Client(k.Msg.GetSecret())

	stream, err := viewer.Events.Watch(ctx, connect.NewRequest(&apiv1.WatchEventsRequest{Tenant: "acme", After: "0"}))
	require.NoError(t, err)
	defer func() { _ = stream.Close() }()
	_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "default"}))
	require.NoError(t, err)
	for stream.Receive() {
		if stream.Msg().GetEvent().GetType() == "project.created" {
			break
		}
	}
	require.NoError(t, stream.Err())

	_, err = admin.Policies.Put(ctx, connect.NewRequest(&apiv1.PutPolicyRequest{Tenant: "acme", Id: "no-events",
		Text: `@id("no-events")
forbid (principal, action == BC::Action::"events.watch", resource);`}))
	require.NoError(t, err)
	cp.Clock.Advance(30 * time.Second)
	for stream.Receive() {
	}
	require.Equal(t, connect.CodePermissionDenied, connect.CodeOf(stream.Err()), "%v", stream.Err())
}
