package console

import (
	"testing"

	"github.com/stretchr/testify/require"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// An event links to its resource's console page where there is one, with
// the tenant named for a platform key.
func TestResourceLink(t *testing.T) {
	t.Parallel()
	tenant := &session{viewer: viewer{TenantID: "tnt_a"}}
	platform := &session{}
	for typ, want := range map[string]string{"Reservation": PathReservations, "Node": PathNodes, "Machine": PathMachines,
		"Instance": PathInstances, "Sandbox": PathSandboxes, "Webhook": ""} {
		ev := &apiv1.Event{ResourceType: typ, ResourceId: "x_1", TenantId: "tnt_a"}
		if want == "" {
			require.Empty(t, resourceLink(tenant, ev), typ)
			continue
		}
		require.Equal(t, want+"/x_1", string(resourceLink(tenant, ev)), typ)
		require.Equal(t, want+"/x_1?tenant=tnt_a", string(resourceLink(platform, ev)), typ)
	}
	require.Empty(t, resourceLink(tenant, &apiv1.Event{ResourceType: "Node"}), "no id, no link")
}
