package cli

import (
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// TestReserveKubernetesWithoutKubelet: against a real control plane whose
// only node does not advertise binding.kubernetes, reserve --binding
// kubernetes fails with the API's refusal, the field binding named.
func TestReserveKubernetesWithoutKubelet(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "web"}))
	require.NoError(t, err)
	key, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "member"}))
	require.NoError(t, err)
	sim, err := bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		Template: bctest.FakeDaemonConfig{Gateway: cp.GatewayAddr}, Root: t.TempDir(), N: 1,
		Token: func(ctx context.Context, i int) (string, error) {
			tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "web"}))
			return tok.Msg.GetToken(), err
		},
	})
	require.NoError(t, err)
	t.Cleanup(sim.Stop)
	bctest.WaitFor(t, "the node's GPUs in inventory", func() bool {
		n, err := admin.Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{Tenant: "acme"}))
		require.NoError(t, err)
		return len(n.Msg.GetNodes()) == 1 && n.Msg.GetNodes()[0].GetGpuCount() == 8
	})
	_, err = admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "h100",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}}}))
	require.NoError(t, err)

	home := t.TempDir()
	env := map[string]string{envConfig: home + "/config.yaml", envServer: cp.URL, envToken: key.Msg.GetSecret(), "HOME": home}
	a := newApp("test", func(k string) (string, bool) { v, ok := env[k]; return v, ok && v != "" })
	var out, errb strings.Builder
	code := run(t.Context(), a, []string{"reserve", "--pool", "h100", "--gpus", "1", "--for", "1h", "--binding", "kubernetes"},
		strings.NewReader(""), &out, &errb)
	require.Equal(t, 1, code, "stdout: %s", out.String())
	require.Empty(t, out.String())
	require.Contains(t, errb.String(), "Error: NO_CAPACITY: pool h100 can never hold this request: no node of pool h100 advertises binding.kubernetes")
	require.Contains(t, errb.String(), "\n  --binding: no node of pool h100 advertises binding.kubernetes (bcd's Kubernetes device plugin or DRA driver is not registered on any node)\n")
}
