package agent_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/agent/hw/fake"
	"github.com/better-compute/better-compute/internal/gpuhealth"
)

// healthSetup is a joined, running agent on a fake machine the test
// injects faults into.
func healthSetup(t *testing.T, opts ...func(*agent.Config)) (*bundle, *agent.Agent, *fake.Backend) {
	t.Helper()
	b := setup(t)
	hw, err := fake.New(fake.Options{Model: "dgxh100", Seed: t.Name()})
	require.NoError(t, err)
	a, _ := b.joined(t, append([]func(*agent.Config){func(c *agent.Config) { c.Hardware = hw }}, opts...)...)
	return b, a, hw
}

// awaitStatus returns the next status report that ok accepts.
func (b *bundle) awaitStatus(t *testing.T, what string, ok func(*agentv1.StatusReport) bool) *agentv1.StatusReport {
	t.Helper()
	return b.gw.await(t, what, func(m *agentv1.AgentMessage) bool { return m.GetStatus() != nil && ok(m.GetStatus()) }).GetStatus()
}

func kinds(fs []*agentv1.HealthEvent) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.GetKind())
	}
	return out
}

// A session opens with the complete (empty) set of findings; a finding
// injected on the machine comes with the next poll, GPU, severity and
// first-seen time included, and the node reports degraded; cleared, the
// next poll reports the complete set without it and the node is ok again.
func TestHealthFindingsReported(t *testing.T) {
	t.Parallel()
	b, a, hw := healthSetup(t)
	r := b.awaitStatus(t, "opening status", func(r *agentv1.StatusReport) bool { return r.GetFindingsComplete() })
	require.Empty(t, r.GetFindings())
	require.Equal(t, "ok", r.GetHealth())

	hw.InjectFinding(gpuhealth.KindECCUncorrectable, 2, 4)
	require.NoError(t, a.PollHealth(context.Background()))
	r = b.awaitStatus(t, "status with the finding", func(r *agentv1.StatusReport) bool { return len(r.GetFindings()) > 0 })
	require.True(t, r.GetFindingsComplete())
	require.Equal(t, "degraded", r.GetHealth())
	require.Len(t, r.GetFindings(), 1)
	f := r.GetFindings()[0]
	require.Equal(t, gpuhealth.KindECCUncorrectable, f.GetKind())
	require.Equal(t, hw.Identity().GetGpuUuids()[2], f.GetDevice())
	require.EqualValues(t, 2, f.GetGpuIndex())
	require.EqualValues(t, 4, f.GetCode())
	require.Equal(t, gpuhealth.SeverityError, f.GetSeverity())
	require.NotNil(t, f.GetTime())
	since := f.GetTime().AsTime()

	// A second finding: the first keeps the time it was first seen.
	hw.InjectFinding(gpuhealth.KindThrottle, 0, 0)
	require.NoError(t, a.PollHealth(context.Background()))
	r = b.awaitStatus(t, "status with both", func(r *agentv1.StatusReport) bool { return len(r.GetFindings()) == 2 })
	require.Equal(t, []string{gpuhealth.KindThrottle, gpuhealth.KindECCUncorrectable}, kinds(r.GetFindings()))
	require.Equal(t, since, r.GetFindings()[1].GetTime().AsTime())

	hw.ClearFinding(gpuhealth.KindECCUncorrectable, 2)
	hw.ClearFinding(gpuhealth.KindThrottle, 0)
	require.NoError(t, a.PollHealth(context.Background()))
	r = b.awaitStatus(t, "status without findings", func(r *agentv1.StatusReport) bool {
		return r.GetFindingsComplete() && len(r.GetFindings()) == 0
	})
	require.Equal(t, "ok", r.GetHealth())
}

// An XID the driver raises reaches the gateway at once as a health event
// of the status report, with the GPU and the process running on it.
func TestXIDReported(t *testing.T) {
	t.Parallel()
	b, _, hw := healthSetup(t)
	hw.InjectXID(4, 79, int64(os.Getpid()))
	r := b.awaitStatus(t, "status with the XID", func(r *agentv1.StatusReport) bool { return len(r.GetEvents()) > 0 })
	require.Equal(t, "degraded", r.GetHealth())
	ev := r.GetEvents()[0]
	require.Equal(t, gpuhealth.KindXID, ev.GetKind())
	require.Equal(t, hw.Identity().GetGpuUuids()[4], ev.GetDevice())
	require.EqualValues(t, 79, ev.GetCode())
	require.EqualValues(t, 4, ev.GetGpuIndex())
	require.EqualValues(t, os.Getpid(), ev.GetPid())
	require.NotEmpty(t, ev.GetProcessName())
}

// gpu.reset is refused while an allocation holds the GPU; released, the
// reset clears the pending remap (not the failed one) and the node
// reports the findings left.
func TestGPUReset(t *testing.T) {
	t.Parallel()
	b, a, hw := healthSetup(t)
	uuid := hw.Identity().GetGpuUuids()[1]
	hw.InjectFinding(gpuhealth.KindRowRemapPending, 1, 0)
	hw.InjectFinding(gpuhealth.KindRowRemapFailed, 3, 0)
	require.NoError(t, a.PollHealth(context.Background()))
	b.awaitStatus(t, "status with the remaps", func(r *agentv1.StatusReport) bool { return len(r.GetFindings()) == 2 })

	u, _ := bind(t, b, 1, "alloc-reset", map[string]any{"gpu_uuids": []any{uuid}})
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	b.gw.command(&agentv1.Command{Id: "reset-1", Seq: 2, Kind: agent.KindGPUReset, Params: params(t, map[string]any{"gpu": uuid})})
	u, _ = b.gw.finalUpdate(t, 2)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_FAILED, u.GetState())
	require.Equal(t, agent.FailGPUInUse, u.GetFailureCode())
	require.Contains(t, u.GetMessage(), "alloc-reset")

	b.gw.command(&agentv1.Command{Id: "release-1", Seq: 3, Kind: agent.KindAllocationRelease, Params: params(t, map[string]any{"allocation_id": "alloc-reset"})})
	u, _ = b.gw.finalUpdate(t, 3)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	b.gw.command(&agentv1.Command{Id: "reset-2", Seq: 4, Kind: agent.KindGPUReset, Params: params(t, map[string]any{"gpu": uuid})})
	r := b.awaitStatus(t, "status after the reset", func(r *agentv1.StatusReport) bool { return len(r.GetFindings()) == 1 })
	require.Equal(t, []string{gpuhealth.KindRowRemapFailed}, kinds(r.GetFindings()))
	require.True(t, r.GetFindingsComplete())
	u, _ = b.gw.finalUpdate(t, 4)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())

	for i, p := range []map[string]any{{}, {"gpu": "GPU-00000000-0000-4000-8000-000000000000"}} {
		seq := uint64(5 + i)
		b.gw.command(&agentv1.Command{Id: fmt.Sprintf("reset-bad-%d", seq), Seq: seq, Kind: agent.KindGPUReset, Params: params(t, p)})
		u, _ = b.gw.finalUpdate(t, seq)
		require.Equal(t, agent.FailInvalidParams, u.GetFailureCode(), "%v", p)
	}
}

// node.reboot succeeds, then reboots through Config.Reboot once its
// update went out; the node comes back with a new session whose opening
// status has the findings the reboot left (a failed remap is hardware).
func TestNodeReboot(t *testing.T) {
	t.Parallel()
	// The agent and machine are the test's, read by the reboot: atomics,
	// for the race detector does not see the gRPC hop between them.
	var agentP atomic.Pointer[agent.Agent]
	var hwP atomic.Pointer[fake.Backend]
	var reboots atomic.Int32
	b, a, hw := healthSetup(t, func(c *agent.Config) {
		c.Reboot = func(context.Context) error {
			reboots.Add(1)
			hwP.Load().Reboot()
			agentP.Load().DropSession()
			return nil
		}
	})
	agentP.Store(a)
	hwP.Store(hw)
	hw.InjectFinding(gpuhealth.KindRowRemapFailed, 0, 0)
	hw.InjectFinding(gpuhealth.KindNVLinkDown, 6, 3)
	require.NoError(t, a.PollHealth(context.Background()))
	b.awaitStatus(t, "status with the findings", func(r *agentv1.StatusReport) bool { return len(r.GetFindings()) == 2 })

	b.gw.command(&agentv1.Command{Id: "reboot-1", Seq: 1, Kind: agent.KindNodeReboot})
	u, _ := b.gw.finalUpdate(t, 1)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	b.gw.hello(t) // the node came back
	r := b.awaitStatus(t, "status after the reboot", func(r *agentv1.StatusReport) bool {
		return r.GetFindingsComplete() && len(r.GetFindings()) == 1
	})
	require.Equal(t, []string{gpuhealth.KindRowRemapFailed}, kinds(r.GetFindings()))
	require.EqualValues(t, 1, reboots.Load())
}

// The test kit's fake daemon injects findings and XIDs into its machine,
// and node.reboot power-cycles it: the node comes back with a new session
// whose findings are what the reboot left (a failed remap).
func TestFakeDaemonHealthAndReboot(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	d, err := bctest.NewFakeDaemon(bctest.FakeDaemonConfig{Gateway: b.gw.addr, StateDir: b.stateDir})
	require.NoError(t, err)
	require.NoError(t, d.Join(ctx, b.gw.token))
	d.Start()
	t.Cleanup(func() { _ = d.Stop() })
	b.gw.hello(t)

	d.InjectFinding(gpuhealth.KindRowRemapFailed, 0, 0)
	d.InjectFinding(gpuhealth.KindNVLinkDegraded, 1, 2)
	require.NoError(t, d.PollHealth(ctx))
	r := b.awaitStatus(t, "status with the findings", func(r *agentv1.StatusReport) bool { return len(r.GetFindings()) == 2 })
	require.Equal(t, []string{gpuhealth.KindRowRemapFailed, gpuhealth.KindNVLinkDegraded}, kinds(r.GetFindings()))
	d.InjectXID(3, 48, 0)
	b.awaitStatus(t, "status with the XID", func(r *agentv1.StatusReport) bool {
		return len(r.GetEvents()) == 1 && r.GetEvents()[0].GetCode() == 48
	})
	d.ClearFinding(gpuhealth.KindNVLinkDegraded, 1)
	require.NoError(t, d.PollHealth(ctx))
	b.awaitStatus(t, "status without the cleared one", func(r *agentv1.StatusReport) bool { return len(r.GetFindings()) == 1 })

	// Every status from here to the reboot carries the ECC finding: one
	// without it comes from after.
	d.InjectFinding(gpuhealth.KindECCUncorrectable, 4, 1)
	require.NoError(t, d.PollHealth(ctx))
	b.awaitStatus(t, "status with the ECC", func(r *agentv1.StatusReport) bool { return len(r.GetFindings()) == 2 })
	b.gw.command(&agentv1.Command{Id: "reboot-1", Seq: 1, Kind: agent.KindNodeReboot})
	u, _ := b.gw.finalUpdate(t, 1)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	b.gw.hello(t)
	b.awaitStatus(t, "status after the reboot", func(r *agentv1.StatusReport) bool {
		return r.GetFindingsComplete() && slices.Equal(kinds(r.GetFindings()), []string{gpuhealth.KindRowRemapFailed})
	})
	got, err := d.Hardware().Findings(ctx)
	require.NoError(t, err)
	require.Len(t, got, 1, "the machine itself: only the failed remap is left")
}
