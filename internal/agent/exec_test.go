package agent_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/better-compute/better-compute/bctest"
	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/agent/cgroups"
	"github.com/better-compute/better-compute/internal/agent/hw/fake"
)

// realCgroupRoot makes a fresh cgroup under the machine's cgroup2 mount for
// the test's allocation cgroups, and removes it (killing what is left in
// them) at cleanup. The machines this project runs on have one (see
// docs/testing.md); without it, this fails rather than pretending.
func realCgroupRoot(t *testing.T) (root, rel string) {
	t.Helper()
	mount := cgroups.Cgroup2Mount()
	require.NotEmpty(t, mount, "this test needs a cgroup2 mount")
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	rel = "/bctest-exec-" + hex.EncodeToString(b)
	root = filepath.Join(mount, rel)
	require.NoError(t, os.Mkdir(root, 0o755), "this test needs a writable cgroup2 mount")
	t.Cleanup(func() {
		entries, _ := os.ReadDir(root)
		for _, e := range entries {
			if e.IsDir() {
				dir := filepath.Join(root, e.Name())
				_ = os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0o644)
				bctest.WaitFor(t, "cgroup "+dir+" empty", func() bool {
					b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
					return err != nil || strings.TrimSpace(string(b)) == ""
				})
				_ = unix.Rmdir(dir)
			}
		}
		_ = unix.Rmdir(root)
	})
	return root, rel
}

// execOutput collects a process.exec's output until its final update.
func execOutput(t *testing.T, b *bundle, seq uint64) (stdout, stderr string, final *agentv1.CommandUpdate) {
	t.Helper()
	var out, errb strings.Builder
	for {
		m := b.gw.await(t, "exec output or update", func(m *agentv1.AgentMessage) bool {
			return m.GetProcessOutput().GetSeq() == seq || m.GetCommandUpdate().GetSeq() == seq
		})
		if o := m.GetProcessOutput(); o != nil {
			if o.GetStream() == "stderr" {
				errb.Write(o.GetData())
			} else {
				out.Write(o.GetData())
			}
			continue
		}
		if u := m.GetCommandUpdate(); u.GetState() != agentv1.CommandState_COMMAND_STATE_RUNNING {
			return out.String(), errb.String(), u
		}
	}
}

func gpuUUIDs(t *testing.T, seed string) map[int32]string {
	t.Helper()
	hw, err := fake.New(fake.Options{Model: "dgxh100", Seed: seed})
	require.NoError(t, err)
	inv, err := hw.Inventory(context.Background())
	require.NoError(t, err)
	out := map[int32]string{}
	for _, g := range inv.GetGpus() {
		out[g.GetIndex()] = g.GetUuid()
	}
	return out
}

func TestExecInARealCgroup(t *testing.T) {
	t.Parallel()
	b := setup(t)
	root, rel := realCgroupRoot(t)
	b.cgRoot = root
	a := b.newAgent(t)
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	run(t, a)
	b.gw.hello(t)
	// The allocation's cgroup, as allocation.bind leaves it.
	require.NoError(t, os.Mkdir(filepath.Join(root, "rsv_1"), 0o755))
	gpus := gpuUUIDs(t, t.Name())

	b.gw.command(&agentv1.Command{Id: "c1", Seq: 1, Kind: agent.KindProcessExec, Params: params(t, map[string]any{
		"allocation_id": "rsv_1", "gpu_uuids": []any{gpus[5], gpus[3]},
		"argv": []any{"sh", "-c", "echo $CUDA_VISIBLE_DEVICES $CUDA_DEVICE_ORDER; cat /proc/self/cgroup; echo self=$$; cat " + cgroups.Cgroup2Mount() + "/cgroup.procs; echo bye >&2; exit 7"},
	})})
	stdout, stderr, u := execOutput(t, b, 1)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.Equal(t, "3,5 PCI_BUS_ID", lines[0])
	// Confined, the process's cgroup namespace is rooted at the cgroup it
	// was cloned into, and the cgroup tree it sees is that cgroup's: the
	// shell is in it, from its start.
	require.Contains(t, lines, "0::/", "the process ran in the root of its cgroup namespace")
	self := ""
	for _, l := range lines {
		if p, ok := strings.CutPrefix(l, "self="); ok {
			self = p
		}
	}
	require.NotEmpty(t, self)
	require.Contains(t, lines[slices.Index(lines, "self="+self)+1:], self, "the allocation's cgroup.procs lists the shell")
	require.Equal(t, true, u.GetResult().AsMap()["confined"])
	_ = rel
	require.Equal(t, "bye\n", stderr)
	res := u.GetResult().AsMap()
	require.Equal(t, true, res["cgroup_entered"])
	require.Equal(t, filepath.Join(root, "rsv_1"), res["cgroup"])
	require.EqualValues(t, 7, res["exit_code"])
	require.NotContains(t, res, "cgroup_note")

	// Not bound: no cgroup, nothing runs.
	b.gw.command(&agentv1.Command{Id: "c2", Seq: 2, Kind: agent.KindProcessExec, Params: params(t, map[string]any{
		"allocation_id": "rsv_2", "argv": []any{"true"}})})
	_, _, u = execOutput(t, b, 2)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_FAILED, u.GetState())
	require.Equal(t, agent.FailNotBound, u.GetFailureCode())
}

// pidAlive reports whether pid runs: a killed process whose parent died too
// stays a zombie until init reaps it, and counts as gone.
func pidAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if errors.Is(err, os.ErrNotExist) {
		return false
	}
	// "pid (comm) S ...": the state follows the last ')'.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z' && s[i+2] != 'X'
	}
	return true
}

func TestExecCancelAndLeftovers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.newAgent(t)
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	run(t, a)
	b.gw.hello(t)
	require.NoError(t, os.MkdirAll(filepath.Join(b.cgRoot, "rsv_1"), 0o755))

	// A long process: the other commands of the node go on meanwhile, and
	// a cancel kills its whole group.
	sleep := bctest.UniqueSleep()
	b.gw.command(&agentv1.Command{Id: "c1", Seq: 1, Kind: agent.KindProcessExec, Params: params(t, map[string]any{
		"allocation_id": "rsv_1", "argv": []any{"sh", "-c", sleep + " & echo $$ $!; wait"}})})
	b.gw.await(t, "the pids", func(m *agentv1.AgentMessage) bool { return m.GetProcessOutput().GetSeq() == 1 })
	pids := bctest.WaitPIDs(t, sleep, 2)
	b.gw.command(&agentv1.Command{Id: "c2", Seq: 2, Kind: agent.KindNodeDrain})
	u, _ := b.gw.finalUpdate(t, 2)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), "a running exec holds up no other command")
	for _, pid := range pids {
		require.True(t, pidAlive(pid), "pid %d runs until the cancel", pid)
	}
	b.gw.send(&agentv1.GatewayMessage{Msg: &agentv1.GatewayMessage_Cancel{Cancel: &agentv1.CancelCommand{CommandId: "c1", Seq: 1}}})
	_, _, u = execOutput(t, b, 1)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_CANCELED, u.GetState(), u.GetMessage())
	require.Equal(t, "SIGKILL", u.GetResult().AsMap()["signal"])
	for _, pid := range pids {
		bctest.WaitFor(t, fmt.Sprintf("pid %d killed with its group", pid), func() bool { return !pidAlive(pid) })
	}
	// The simulated node's root is a plain directory: the result says so.
	require.Equal(t, false, u.GetResult().AsMap()["cgroup_entered"])
	require.Contains(t, u.GetResult().AsMap()["cgroup_note"], "not on a cgroup v2 filesystem")

	// A process that exits leaves nothing running in its group.
	leftover := bctest.UniqueSleep()
	b.gw.command(&agentv1.Command{Id: "c3", Seq: 3, Kind: agent.KindProcessExec, Params: params(t, map[string]any{
		"allocation_id": "rsv_1", "argv": []any{"sh", "-c", leftover + " >/dev/null 2>&1 & echo $!"}})})
	_, _, u = execOutput(t, b, 3)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	bctest.WaitFor(t, "the leftover "+leftover+" killed", func() bool { return len(bctest.PIDsWith(leftover)) == 0 })

	// Redelivered after it ran: the recorded final update, not a second run.
	b.gw.command(&agentv1.Command{Id: "c3", Seq: 3, Kind: agent.KindProcessExec, Params: params(t, map[string]any{
		"allocation_id": "rsv_1", "argv": []any{"sh", "-c", "echo again"}})})
	again, ran := b.gw.finalUpdate(t, 3)
	require.False(t, ran)
	require.Equal(t, u.GetResult().AsMap(), again.GetResult().AsMap())
}

func TestExecOutputIsCapped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.newAgent(t)
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	run(t, a)
	b.gw.hello(t)
	require.NoError(t, os.MkdirAll(filepath.Join(b.cgRoot, "rsv_1"), 0o755))

	// 3 MiB as fast as it can: what the per-second cap leaves out is
	// counted (how much depends on the machine's speed: see outputCap's
	// own test for the arithmetic).
	b.gw.command(&agentv1.Command{Id: "c1", Seq: 1, Kind: agent.KindProcessExec, Params: params(t, map[string]any{
		"allocation_id": "rsv_1", "argv": []any{"head", "-c", strconv.Itoa(3 << 20), "/dev/zero"}})})
	stdout, _, u := execOutput(t, b, 1)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	dropped := u.GetResult().AsMap()["dropped_bytes"].(float64)
	require.EqualValues(t, 3<<20, len(stdout)+int(dropped), "every byte is sent or counted as dropped")
	require.LessOrEqual(t, len(stdout), 3<<20)
}

func TestExecRefusesBadParams(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.newAgent(t)
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	run(t, a)
	b.gw.hello(t)
	require.NoError(t, os.MkdirAll(filepath.Join(b.cgRoot, "rsv_1"), 0o755))
	for i, p := range []map[string]any{
		{"allocation_id": "rsv_1"},
		{"allocation_id": "rsv_1", "argv": []any{""}},
		{"allocation_id": "../x", "argv": []any{"true"}},
		{"argv": []any{"true"}},
		{"allocation_id": "rsv_1", "argv": []any{"true"}, "gpu_uuids": []any{"GPU-not-here"}},
	} {
		seq := uint64(i + 1)
		b.gw.command(&agentv1.Command{Id: fmt.Sprintf("c%d", seq), Seq: seq, Kind: agent.KindProcessExec, Params: params(t, p)})
		u, _ := b.gw.finalUpdate(t, seq)
		require.Equal(t, agentv1.CommandState_COMMAND_STATE_FAILED, u.GetState(), "%v", p)
		require.Equal(t, agent.FailInvalidParams, u.GetFailureCode(), "%v: %s", p, u.GetMessage())
	}
}

func TestExecStopsWithBcd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.newAgent(t)
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	stop := run(t, a)
	b.gw.hello(t)
	require.NoError(t, os.MkdirAll(filepath.Join(b.cgRoot, "rsv_1"), 0o755))
	sleep := bctest.UniqueSleep()
	b.gw.command(&agentv1.Command{Id: "c1", Seq: 1, Kind: agent.KindProcessExec, Params: params(t, map[string]any{
		"allocation_id": "rsv_1", "argv": []any{"sh", "-c", "echo $$; exec " + sleep}})})
	b.gw.await(t, "the pid", func(m *agentv1.AgentMessage) bool { return m.GetProcessOutput().GetSeq() == 1 })
	pid := bctest.WaitPIDs(t, sleep, 1)[0]

	// bcd stops: its processes go with it, and the next bcd reports the
	// command interrupted instead of running it again.
	stop()
	bctest.WaitFor(t, fmt.Sprintf("pid %d gone", pid), func() bool { return !pidAlive(pid) })
	a2 := b.newAgent(t)
	run(t, a2)
	h := b.gw.hello(t)
	require.EqualValues(t, 1, h.GetLastAppliedSeq(), "started counts as applied")
	u, ran := b.gw.finalUpdate(t, 1)
	require.False(t, ran)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_FAILED, u.GetState())
	require.Equal(t, agent.FailInterrupted, u.GetFailureCode())
}
