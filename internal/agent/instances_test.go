package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/agent/hypervisor"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

// gatedRunner is an InstanceRunner whose create of instance "a" waits for
// gate; it records the order commands were applied in.
type gatedRunner struct {
	gate chan struct{}
	mu   sync.Mutex
	log  []string
}

func (g *gatedRunner) Apply(ctx context.Context, kind string, params []byte) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var p struct {
		InstanceID string `json:"instance_id"`
	}
	_ = json.Unmarshal(params, &p)
	if kind == vmcmd.KindInstanceCreate && p.InstanceID == "a" {
		select {
		case <-g.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	g.mu.Lock()
	g.log = append(g.log, kind+" "+p.InstanceID)
	g.mu.Unlock()
	if p.InstanceID == "bad" {
		return nil, &hypervisor.Error{Code: vmcmd.FailImage, Err: errors.New(`guest image "x" is not on this host`)}
	}
	if kind == vmcmd.KindInstanceList {
		return vmcmd.ListResult{Instances: []vmcmd.Status{}}, nil
	}
	return vmcmd.Status{InstanceID: p.InstanceID, State: vmcmd.StateRunning, Degraded: []string{"huge_pages"}}, nil
}

func (g *gatedRunner) Capabilities() []string { return []string{vmcmd.CapInstances, vmcmd.CapVolumes} }

func (g *gatedRunner) applied() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.log...)
}

// TestInstanceCommandsRunAsideInOrder: a create that boots a guest holds
// up neither the node's other commands nor another instance's, while the
// commands for its own instance wait their turn; results and failure
// codes come back as the hypervisor gave them.
func TestInstanceCommandsRunAsideInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	hv := &gatedRunner{gate: make(chan struct{})}
	a := b.newAgent(t, func(c *agent.Config) { c.Instances = hv })
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	run(t, a)
	hello := b.gw.hello(t)
	require.Subset(t, hello.GetCapabilities(), []string{vmcmd.CapInstances, vmcmd.CapVolumes})
	require.NotContains(t, hello.GetCapabilities(), vmcmd.CapSnapshot)

	ref := func(id string) map[string]any { return map[string]any{"instance_id": id} }
	b.gw.command(&agentv1.Command{Id: "c1", Seq: 1, Kind: vmcmd.KindInstanceCreate, Params: params(t, ref("a"))})
	b.gw.command(&agentv1.Command{Id: "c2", Seq: 2, Kind: vmcmd.KindInstanceDelete, Params: params(t, ref("a"))})
	b.gw.command(&agentv1.Command{Id: "c3", Seq: 3, Kind: agent.KindInventoryRefresh})
	b.gw.command(&agentv1.Command{Id: "c4", Seq: 4, Kind: vmcmd.KindInstanceCreate, Params: params(t, ref("b"))})
	b.gw.command(&agentv1.Command{Id: "c5", Seq: 5, Kind: vmcmd.KindInstanceList})
	b.gw.command(&agentv1.Command{Id: "c6", Seq: 6, Kind: vmcmd.KindInstanceStart, Params: params(t, ref("bad"))})

	// Commands 3-6 end in any order while 1 (and so 2) waits.
	finals := map[uint64]*agentv1.CommandUpdate{}
	for len(finals) < 4 {
		m := b.gw.await(t, "final updates of 3-6", func(m *agentv1.AgentMessage) bool {
			u := m.GetCommandUpdate()
			return u.GetSeq() >= 3 && u.GetState() != agentv1.CommandState_COMMAND_STATE_RUNNING
		})
		finals[m.GetCommandUpdate().GetSeq()] = m.GetCommandUpdate()
	}
	for _, seq := range []uint64{3, 4, 5} {
		require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, finals[seq].GetState(), "seq %d: %s", seq, finals[seq].GetMessage())
	}
	u := finals[6]
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_FAILED, u.GetState())
	require.Equal(t, vmcmd.FailImage, u.GetFailureCode())
	require.Contains(t, u.GetMessage(), `guest image "x" is not on this host`)
	require.NotContains(t, hv.applied(), vmcmd.KindInstanceDelete+" a", "the delete waits for the create of its instance")

	close(hv.gate)
	u, _ = b.gw.finalUpdate(t, 1)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	require.Equal(t, map[string]any{"instance_id": "a", "state": "running", "degraded": []any{"huge_pages"}}, u.GetResult().AsMap())
	u, _ = b.gw.finalUpdate(t, 2)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	got := hv.applied()
	require.Less(t, indexOf(got, vmcmd.KindInstanceCreate+" a"), indexOf(got, vmcmd.KindInstanceDelete+" a"))
	require.EqualValues(t, 6, a.LastAppliedSeq())
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// TestInstanceCommandsWithoutHypervisor: a bcd that runs no instances
// says so in the failure code, and does not advertise instance.run.
func TestInstanceCommandsWithoutHypervisor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.newAgent(t)
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	run(t, a)
	require.NotContains(t, b.gw.hello(t).GetCapabilities(), vmcmd.CapInstances)
	b.gw.command(&agentv1.Command{Id: "c1", Seq: 1, Kind: vmcmd.KindInstanceCreate, Params: params(t, map[string]any{"instance_id": "a"})})
	u, _ := b.gw.finalUpdate(t, 1)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_FAILED, u.GetState())
	require.Equal(t, vmcmd.FailNoRuntime, u.GetFailureCode())
	require.Contains(t, u.GetMessage(), "runs no instances")
}

// An instance command that was running when bcd died (its record is in the
// command log's running list) is reported INTERRUPTED by the next bcd and
// not applied again: the control plane resends it, and it converges.
func TestInstanceCommandInterruptedByACrash(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.newAgent(t)
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	p := filepath.Join(b.stateDir, "commands.json")
	require.NoError(t, os.WriteFile(p, []byte(`{"last_applied_seq":1,"execs":[{"seq":1,"id":"c1","kind":"instance.create"}],"log":[]}`), 0o600))
	hv := &gatedRunner{gate: make(chan struct{})}
	a2 := b.newAgent(t, func(c *agent.Config) { c.Instances = hv })
	run(t, a2)
	require.EqualValues(t, 1, b.gw.hello(t).GetLastAppliedSeq())
	u, ran := b.gw.finalUpdate(t, 1)
	require.False(t, ran)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_FAILED, u.GetState())
	require.Equal(t, agent.FailInterrupted, u.GetFailureCode())
	require.Equal(t, "bcd restarted while applying this command", u.GetMessage())
	require.Empty(t, hv.applied())
}

// A running instance command, and one waiting for its turn behind it, can
// be canceled; the next command for the instance then runs.
func TestInstanceCommandCancel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	hv := &gatedRunner{gate: make(chan struct{})}
	a := b.newAgent(t, func(c *agent.Config) { c.Instances = hv })
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	run(t, a)
	b.gw.hello(t)
	ref := params(t, map[string]any{"instance_id": "a"})
	b.gw.command(&agentv1.Command{Id: "c1", Seq: 1, Kind: vmcmd.KindInstanceCreate, Params: ref})
	b.gw.await(t, "c1 running", func(m *agentv1.AgentMessage) bool {
		return m.GetCommandUpdate().GetSeq() == 1 && m.GetCommandUpdate().GetState() == agentv1.CommandState_COMMAND_STATE_RUNNING
	})
	b.gw.command(&agentv1.Command{Id: "c2", Seq: 2, Kind: vmcmd.KindInstanceStop, Params: ref})
	b.gw.send(&agentv1.GatewayMessage{Msg: &agentv1.GatewayMessage_Cancel{Cancel: &agentv1.CancelCommand{CommandId: "c2", Seq: 2}}})
	u, _ := b.gw.finalUpdate(t, 2)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_CANCELED, u.GetState(), u.GetMessage())
	b.gw.send(&agentv1.GatewayMessage{Msg: &agentv1.GatewayMessage_Cancel{Cancel: &agentv1.CancelCommand{CommandId: "c1", Seq: 1}}})
	u, _ = b.gw.finalUpdate(t, 1)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_CANCELED, u.GetState(), u.GetMessage())
	b.gw.command(&agentv1.Command{Id: "c3", Seq: 3, Kind: vmcmd.KindInstanceDelete, Params: ref})
	u, _ = b.gw.finalUpdate(t, 3)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	require.Equal(t, []string{vmcmd.KindInstanceDelete + " a"}, hv.applied())
}
