package agent_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/agent/hw/fake"
)

// TestConfigureMIG: gpu.mig.configure repartitions the GPU through the
// backend and sends the new inventory before its final update; a bad
// layout, a busy GPU and bad params fail with their own codes.
func TestConfigureMIG(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var backend *fake.Backend
	a := b.newAgent(t, func(c *agent.Config) { backend = c.Hardware.(*fake.Backend) })
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	run(t, a)
	b.gw.hello(t)
	inv, err := backend.Inventory(context.Background())
	require.NoError(t, err)
	uuid := inv.GetGpus()[5].GetUuid()

	b.gw.command(&agentv1.Command{Id: "m1", Seq: 1, Kind: agent.KindGPUMIGConfigure, Params: params(t, map[string]any{
		"gpu": uuid, "profiles": []any{"7g.80gb"},
	})})
	// The inventory with the new layout comes before the final update.
	var gpus agentv1.GpuInventory
	b.gw.await(t, "gpus section with the new layout", func(m *agentv1.AgentMessage) bool {
		sec := m.GetInventory()
		if sec.GetName() != agent.SectionGPUs {
			return false
		}
		require.NoError(t, proto.Unmarshal(sec.GetData(), &gpus))
		return len(gpus.GetGpus()[5].GetMigInstances()) == 1
	})
	require.Equal(t, "7g.80gb", gpus.GetGpus()[5].GetMigInstances()[0].GetProfile())
	require.Equal(t, "enabled", gpus.GetGpus()[5].GetMigMode())
	u, _ := b.gw.finalUpdate(t, 1)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	require.Equal(t, uuid, u.GetResult().GetFields()["gpu"].GetStringValue())
	require.NotEmpty(t, u.GetResult().GetFields()["inventory_digest"].GetStringValue())

	backend.SetBusy(uuid, true)
	for i, tt := range []struct {
		params map[string]any
		code   string
	}{
		{map[string]any{"gpu": uuid, "profiles": []any{"3g.40gb", "3g.40gb"}}, agent.FailGPUBusy},
		{map[string]any{"gpu": inv.GetGpus()[0].GetUuid(), "profiles": []any{"4g.40gb", "4g.40gb"}}, agent.FailMIGLayout},
		{map[string]any{"gpu": "GPU-not-here", "profiles": []any{"7g.80gb"}}, agent.FailMIGLayout},
		{map[string]any{"gpu": uuid}, agent.FailInvalidParams},
		{map[string]any{"profiles": []any{"7g.80gb"}}, agent.FailInvalidParams},
		{map[string]any{"gpu": uuid, "profiles": []any{7}}, agent.FailInvalidParams},
	} {
		seq := uint64(i + 2)
		b.gw.command(&agentv1.Command{Id: "m" + string(rune('a'+i)), Seq: seq, Kind: agent.KindGPUMIGConfigure, Params: params(t, tt.params)})
		u, _ := b.gw.finalUpdate(t, seq)
		require.Equal(t, agentv1.CommandState_COMMAND_STATE_FAILED, u.GetState(), "%v", tt.params)
		require.Equal(t, tt.code, u.GetFailureCode(), "%v: %s", tt.params, u.GetMessage())
	}
	inv, err = backend.Inventory(context.Background())
	require.NoError(t, err)
	require.Len(t, inv.GetGpus()[5].GetMigInstances(), 1, "a refused change leaves the layout")
}
