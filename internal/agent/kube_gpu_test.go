package agent_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/agent/hw/nvml"
	"github.com/better-compute/better-compute/internal/kubebind"
)

// TestKubernetesOfferOnRealGPU: on a machine with an NVIDIA GPU and driver
// (BC_TEST_NVML=1; the device check in docs/testing.md), a kubernetes bind
// of every GPU offers each to the kubelet with its own /dev/nvidiaN and the
// control nodes — device nodes that exist on the host as character devices
// — and NVML's model and memory; the release with no pod holding them
// reports AllocationReleased at once.
func TestKubernetesOfferOnRealGPU(t *testing.T) {
	if os.Getenv("BC_TEST_NVML") == "" {
		t.Skip("set BC_TEST_NVML=1 on a machine with an NVIDIA GPU and driver")
	}
	hw, err := nvml.New()
	require.NoError(t, err)
	inv, err := hw.Inventory(context.Background())
	require.NoError(t, err)
	require.NotEmpty(t, inv.GetGpus())
	var uuids []any
	for _, g := range inv.GetGpus() {
		uuids = append(uuids, g.GetUuid())
	}
	b := setup(t)
	set := kubebind.New()
	// The host's own /proc/devices and /dev; a machine identity of the
	// test's (a container may show no DMI).
	a := b.newAgent(t, withKube(set, nil), func(c *agent.Config) { c.Hardware, c.SysfsRoot = identified{hw}, "/" })
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	stop := run(t, a)
	defer stop()
	b.gw.hello(t)

	b.gw.command(&agentv1.Command{Id: "bind", Seq: 1, Kind: agent.KindAllocationBind, Params: params(t, map[string]any{
		"allocation_id": "a1", "gpu_uuids": uuids, "binding": "kubernetes",
	})})
	u, _ := b.gw.finalUpdate(t, 1)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	devs := set.Devices()
	require.Len(t, devs, len(uuids))
	for _, d := range devs {
		i := slices.IndexFunc(inv.GetGpus(), func(g *agentv1.Gpu) bool { return g.GetUuid() == d.UUID })
		require.GreaterOrEqual(t, i, 0, d.UUID)
		g := inv.GetGpus()[i]
		require.Equal(t, g.GetModel(), d.Model)
		require.Equal(t, int64(g.GetMemoryMib()), d.MemoryMiB)
		require.Contains(t, d.Paths, "/dev/nvidiactl")
		require.True(t, strings.HasPrefix(d.Paths[0], "/dev/nvidia"), d.Paths)
		for _, p := range d.Paths {
			st, err := os.Stat(p)
			require.NoError(t, err, "%s offers %s", d.UUID, p)
			require.NotZero(t, st.Mode()&os.ModeCharDevice, "%s is a character device", p)
		}
		t.Logf("offered %s (%s, %d MiB, island %q): %v", d.UUID, d.Model, d.MemoryMiB, d.NVLinkIsland, d.Paths)
	}

	b.gw.command(&agentv1.Command{Id: "release", Seq: 2, Kind: agent.KindAllocationRelease, Params: params(t, map[string]any{"allocation_id": "a1"})})
	u, _ = b.gw.finalUpdate(t, 2)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	rel := b.gw.await(t, "released", func(m *agentv1.AgentMessage) bool { return m.GetAllocationReleased() != nil }).GetAllocationReleased()
	require.Equal(t, "a1", rel.GetAllocationId())
	require.Empty(t, set.Devices())
}

// identified gives a real backend a machine identity.
type identified struct{ *nvml.Backend }

func (identified) Identity() *agentv1.HardwareIdentity {
	return &agentv1.HardwareIdentity{DmiProductUuid: "6a1f0c3e-4d2b-4e8a-9c1d-0b5e7f9a2c4d", DmiProductSerial: "gpu-check", Hostname: "gpu-check"}
}
