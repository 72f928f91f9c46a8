package agent_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/kubebind"
)

// kubeGPUs are the fake machine's GPUs by index (newAgent seeds it with
// t.Name()).
func kubeGPUs(t *testing.T) map[int32]string { return gpuUUIDs(t, t.Name()) }

func withKube(set *kubebind.Set, holders <-chan struct{}) func(*agent.Config) {
	return func(c *agent.Config) { c.Kube, c.KubeHolders = set, holders }
}

// barrier runs a node.drain and waits for its final update, failing if an
// AllocationReleased comes first: everything the agent sent before it has
// arrived.
func barrier(t *testing.T, g *fakeGateway, seq uint64) {
	t.Helper()
	g.command(&agentv1.Command{Id: fmt.Sprintf("barrier-%d", seq), Seq: seq, Kind: agent.KindNodeDrain})
	g.await(t, "the barrier's final update", func(m *agentv1.AgentMessage) bool {
		require.Nil(t, m.GetAllocationReleased(), "released while a pod holds the GPUs")
		u := m.GetCommandUpdate()
		return u.GetSeq() == seq && u.GetState() != agentv1.CommandState_COMMAND_STATE_RUNNING
	})
}

// waitSet waits for the offer to satisfy ok.
func waitSet(t *testing.T, set *kubebind.Set, ok func([]kubebind.Device) bool) {
	t.Helper()
	deadline := bctest.Deadline(t)
	for {
		ch := set.Changed()
		if ok(set.Devices()) {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("offer never got there: %v", set.Devices())
		}
	}
}

func TestKubernetesBindOffersAndReleaseWaitsForPodsAcrossRestart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	gpus := kubeGPUs(t)
	set := kubebind.New()
	a := b.newAgent(t, withKube(set, nil))
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	stop := run(t, a)
	b.gw.hello(t)

	b.gw.command(&agentv1.Command{Id: "bind", Seq: 1, Kind: agent.KindAllocationBind, Params: params(t, map[string]any{
		"allocation_id": "a1", "gpu_uuids": []any{gpus[0], gpus[1]}, "binding": "kubernetes", "memory_max_bytes": 1 << 30,
	})})
	u, _ := b.gw.finalUpdate(t, 1)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	require.Equal(t, "kubernetes", u.GetResult().GetFields()["binding"].GetStringValue())
	bound := b.gw.await(t, "bound", func(m *agentv1.AgentMessage) bool { return m.GetAllocationBound() != nil }).GetAllocationBound()
	require.Equal(t, "a1", bound.GetAllocationId())
	require.Empty(t, bound.GetCgroup(), "no cgroup: the kubelet hands the GPUs over")
	require.Len(t, bound.GetEnforced(), 1)
	require.Equal(t, "devices", bound.GetEnforced()[0].GetResource())
	require.Contains(t, bound.GetEnforced()[0].GetDetail(), "the kubelet hands them over")
	require.NoDirExists(t, b.cgRoot+"/a1")

	devs := set.Devices()
	require.Len(t, devs, 2)
	for _, d := range devs {
		require.Equal(t, "a1", d.AllocationID)
		require.True(t, d.Healthy)
		require.NotEmpty(t, d.Model)
		require.Positive(t, d.MemoryMiB)
		require.Equal(t, "nvlink-0", d.NVLinkIsland, "a DGX's GPUs share one NVSwitch island")
		require.Contains(t, d.Paths, "/dev/nvidiactl")
		require.Equal(t, "/dev/nvidia", d.Paths[0][:len("/dev/nvidia")])
	}

	// A pod holds one of them: the release succeeds, held by pods, and
	// AllocationReleased waits.
	set.SetHolders("pod/", map[string][]string{"default/train": {gpus[0]}})
	b.gw.command(&agentv1.Command{Id: "release", Seq: 2, Kind: agent.KindAllocationRelease, Params: params(t, map[string]any{"allocation_id": "a1"})})
	u, _ = b.gw.finalUpdate(t, 2)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	require.True(t, u.GetResult().GetFields()["held_by_pods"].GetBoolValue())
	require.Empty(t, set.Devices(), "released GPUs are offered no more")
	barrier(t, b.gw, 3)

	// bcd restarts while the pod runs: a new process, a new offer that
	// knows no holder until the kubelet is asked.
	stop()
	set2 := kubebind.New()
	holders := make(chan struct{})
	a2 := b.newAgent(t, withKube(set2, holders))
	require.Len(t, set2.Devices(), 2, "offered again, to wait for its pods")
	for _, d := range set2.Devices() {
		require.False(t, d.Healthy, "unhealthy: the kubelet places nothing new on a released GPU")
	}
	run(t, a2)
	b.gw.hello(t)
	barrier(t, b.gw, 4)
	set2.SetHolders("pod/", map[string][]string{"default/train": {gpus[0]}})
	close(holders)
	waitSet(t, set2, func(d []kubebind.Device) bool { return len(d) == 0 })
	barrier(t, b.gw, 5)

	// The pod ends while the session is down: the release is reported on
	// the next one, answering the release command.
	a2.DropSession()
	set2.SetHolders("pod/", nil)
	rel := b.gw.await(t, "released", func(m *agentv1.AgentMessage) bool { return m.GetAllocationReleased() != nil }).GetAllocationReleased()
	require.Equal(t, "a1", rel.GetAllocationId())
	require.Equal(t, "release", rel.GetCommandId())
}

func TestKubernetesReleaseOfFreeGPUsIsImmediate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	gpus := kubeGPUs(t)
	set := kubebind.New()
	a := b.newAgent(t, withKube(set, nil))
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	run(t, a)
	b.gw.hello(t)
	b.gw.command(&agentv1.Command{Id: "bind", Seq: 1, Kind: agent.KindAllocationBind, Params: params(t, map[string]any{
		"allocation_id": "a1", "gpu_uuids": []any{gpus[2]}, "binding": "kubernetes",
	})})
	u, _ := b.gw.finalUpdate(t, 1)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())

	// Health quarantines a GPU: the kubelet is told at once.
	a.ReportHealthEvent(&agentv1.HealthEvent{Kind: "gpu.xid", Device: gpus[2], Code: 13})
	d, ok := set.Device(gpus[2])
	require.True(t, ok)
	require.True(t, d.Healthy, "XID 13 is not fatal")
	a.ReportHealthEvent(&agentv1.HealthEvent{Kind: "gpu.xid", Device: gpus[2], Code: 79})
	d, _ = set.Device(gpus[2])
	require.False(t, d.Healthy, "XID 79 quarantines the GPU")

	b.gw.command(&agentv1.Command{Id: "release", Seq: 2, Kind: agent.KindAllocationRelease, Params: params(t, map[string]any{"allocation_id": "a1"})})
	u, _ = b.gw.finalUpdate(t, 2)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	require.False(t, u.GetResult().GetFields()["held_by_pods"].GetBoolValue())
	rel := b.gw.await(t, "released", func(m *agentv1.AgentMessage) bool { return m.GetAllocationReleased() != nil }).GetAllocationReleased()
	require.Equal(t, "release", rel.GetCommandId())
	require.Empty(t, set.Devices())
}

func TestKubernetesBindNeedsKubeAndCapabilityFollowsRegistration(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.newAgent(t)
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	stop := run(t, a)
	require.NotContains(t, b.gw.hello(t).GetCapabilities(), agent.CapKubernetes)
	b.gw.command(&agentv1.Command{Id: "bind", Seq: 1, Kind: agent.KindAllocationBind, Params: params(t, map[string]any{
		"allocation_id": "a1", "gpu_uuids": []any{kubeGPUs(t)[0]}, "binding": "kubernetes",
	})})
	u, _ := b.gw.finalUpdate(t, 1)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_FAILED, u.GetState())
	require.Equal(t, agent.FailNoKubernetes, u.GetFailureCode(), u.GetMessage())
	stop()

	set := kubebind.New()
	a2 := b.newAgent(t, withKube(set, nil))
	run(t, a2)
	require.NotContains(t, b.gw.hello(t).GetCapabilities(), agent.CapKubernetes, "no plugin registered yet")
	set.SetRegistered("deviceplugin", true)
	b.gw.dropSession()
	caps := b.gw.hello(t).GetCapabilities()
	require.True(t, slices.Contains(caps, agent.CapKubernetes), "%v", caps)
}
