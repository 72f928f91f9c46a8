package agent_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/better-compute/better-compute/bctest"
	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/agent/cgroups"
	"github.com/better-compute/better-compute/internal/agent/devfilter"
)

// failingFilter is a device filter whose attach the kernel refuses.
type failingFilter struct{}

func (failingFilter) Attach(string, []devfilter.Rule) error {
	return errors.New("attach device program: operation not permitted")
}

// joined starts a joined agent on b's gateway and returns it with its Hello.
func (b *bundle) joined(t *testing.T, opts ...func(*agent.Config)) (*agent.Agent, *agentv1.Hello) {
	t.Helper()
	a := b.newAgent(t, opts...)
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	run(t, a)
	return a, b.gw.hello(t)
}

func (b *bundle) gpuUUIDs(t *testing.T) []string {
	t.Helper()
	var uuids []string
	m := b.gw.await(t, "gpus", func(m *agentv1.AgentMessage) bool { return m.GetInventory().GetName() == agent.SectionGPUs })
	var inv agentv1.GpuInventory
	require.NoError(t, proto.Unmarshal(m.GetInventory().GetData(), &inv))
	for _, g := range inv.GetGpus() {
		uuids = append(uuids, g.GetUuid())
	}
	return uuids
}

func bind(t *testing.T, b *bundle, seq uint64, id string, p map[string]any) (*agentv1.CommandUpdate, *agentv1.AllocationBound) {
	t.Helper()
	p["allocation_id"] = id
	cmdID := "bind-" + id
	b.gw.command(&agentv1.Command{Id: cmdID, Seq: seq, Kind: agent.KindAllocationBind, Params: params(t, p)})
	u, _ := b.gw.finalUpdate(t, seq)
	if u.GetState() != agentv1.CommandState_COMMAND_STATE_SUCCEEDED {
		return u, nil
	}
	return u, b.gw.await(t, "bound", func(m *agentv1.AgentMessage) bool {
		return m.GetAllocationBound().GetCommandId() == cmdID
	}).GetAllocationBound()
}

func enforced(bound *agentv1.AllocationBound) map[string]*agentv1.Enforcement {
	out := map[string]*agentv1.Enforcement{}
	for _, e := range bound.GetEnforced() {
		out[e.GetResource()] = e
	}
	return out
}

// TestSimulatedNodeReportsSimulated: a simulated node (plain cgroup
// directory) says so in its capabilities and reports every limit as
// simulated, with the allow list a real node would have attached.
func TestSimulatedNodeReportsSimulated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, hello := b.joined(t)
	require.Subset(t, hello.GetCapabilities(), []string{agent.CapCgroups, agent.CapDevices, agent.CapCPU, agent.CapMemory, agent.CapCPUSet, agent.CapSimulated})
	require.NotContains(t, hello.GetCapabilities(), agent.CapExecIsolated, "a simulated node confines no cgroup or device")
	uuids := b.gpuUUIDs(t)

	u, bound := bind(t, b, 1, "alloc-sim", map[string]any{"gpu_uuids": []any{uuids[2]}, "cpu_quota_us": 200000, "cpuset_cpus": "0-1"})
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	e := enforced(bound)
	require.Len(t, e, 4)
	sim := agentv1.EnforcementState_ENFORCEMENT_STATE_SIMULATED
	require.Equal(t, sim, e["devices"].GetState())
	require.Contains(t, e["devices"].GetDetail(), "/dev/nvidia2")
	require.NotContains(t, e["devices"].GetDetail(), "/dev/nvidia0")
	require.Equal(t, sim, e["cpu"].GetState())
	require.Equal(t, sim, e["cpuset"].GetState())
	require.Equal(t, agentv1.EnforcementState_ENFORCEMENT_STATE_NOT_REQUESTED, e["memory"].GetState())
	allow, err := os.ReadFile(filepath.Join(b.cgRoot, "alloc-sim", devfilter.SimulatedFile))
	require.NoError(t, err)
	require.Contains(t, string(allow), "c 195:2 rw /dev/nvidia2\n")
	require.Contains(t, string(allow), "c 195:255 rw /dev/nvidiactl\n")
	require.NotContains(t, string(allow), "195:0 ")

	b.gw.command(&agentv1.Command{Id: "rel", Seq: 2, Kind: agent.KindAllocationRelease, Params: params(t, map[string]any{"allocation_id": "alloc-sim"})})
	u, _ = b.gw.finalUpdate(t, 2)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	require.EqualValues(t, 0, u.GetResult().GetFields()["killed_processes"].GetNumberValue())
	require.NoDirExists(t, filepath.Join(b.cgRoot, "alloc-sim"))
}

// TestFailedAttachNotAdvertised: where the device program cannot be
// attached, devices.limits is not advertised and a bind reports the
// devices not confined, with the reason.
func TestFailedAttachNotAdvertised(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, hello := b.joined(t, func(c *agent.Config) { c.DeviceFilter = failingFilter{} })
	require.NotContains(t, hello.GetCapabilities(), agent.CapDevices)
	require.NotContains(t, hello.GetCapabilities(), agent.CapExecIsolated, "processes would reach every device")
	require.Contains(t, hello.GetCapabilities(), agent.CapCgroups, "cgroups themselves still work")
	uuids := b.gpuUUIDs(t)

	u, bound := bind(t, b, 1, "alloc-nofilter", map[string]any{"gpu_uuids": []any{uuids[0]}})
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	dev := enforced(bound)["devices"]
	require.Equal(t, agentv1.EnforcementState_ENFORCEMENT_STATE_NOT_APPLIED, dev.GetState())
	require.Contains(t, dev.GetDetail(), "operation not permitted")
	require.NoFileExists(t, filepath.Join(b.cgRoot, "alloc-nofilter", devfilter.SimulatedFile))
}

// TestBindRefusesAForeignGPU: a GPU that is not this node's is a bad
// command, and nothing is written.
func TestBindRefusesAForeignGPU(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.joined(t)
	u, _ := bind(t, b, 1, "alloc-foreign", map[string]any{"gpu_uuids": []any{"GPU-00000000-0000-4000-8000-000000000000"}})
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_FAILED, u.GetState())
	require.Equal(t, agent.FailInvalidParams, u.GetFailureCode())
	require.Contains(t, u.GetMessage(), "gpu_uuids: GPU-00000000-0000-4000-8000-000000000000 is not a GPU of this node")
	require.NoDirExists(t, filepath.Join(b.cgRoot, "alloc-foreign"))
}

// TestRealIsolation runs bcd's bind and release against a real cgroup root
// under the host's cgroup2 mount: the device program is attached (a
// process in the allocation's cgroup opens /dev/null and gets EPERM on
// /dev/kmsg), the capabilities say so, and release kills what is left.
func TestRealIsolation(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creating cgroups and attaching BPF device programs")
	}
	mount := cgroups.Cgroup2Mount()
	if mount == "" {
		t.Skip("no cgroup2 mount on this host (see /proc/self/mounts)")
	}
	root, err := os.MkdirTemp(mount, "bc-agent-test-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Rmdir(root) })
	b := setup(t)
	b.cgRoot = root
	_, hello := b.joined(t, func(c *agent.Config) { c.PlainCgroupDir = false })
	require.Subset(t, hello.GetCapabilities(), []string{agent.CapCgroups, agent.CapDevices})
	require.NotContains(t, hello.GetCapabilities(), agent.CapSimulated)
	uuids := b.gpuUUIDs(t)

	u, bound := bind(t, b, 1, "alloc-real", map[string]any{"gpu_uuids": []any{uuids[1]}, "cpu_quota_us": 100000, "memory_max_bytes": float64(1 << 30)})
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	cg := filepath.Join(root, "alloc-real")
	require.Equal(t, cg, bound.GetCgroup())
	e := enforced(bound)
	require.Equal(t, agentv1.EnforcementState_ENFORCEMENT_STATE_APPLIED, e["devices"].GetState())
	require.Contains(t, e["devices"].GetDetail(), "/dev/nvidia1")
	// cpu and memory are applied exactly where the host delegates them:
	// the capability and the report agree.
	for res, capName := range map[string]string{"cpu": agent.CapCPU, "memory": agent.CapMemory} {
		if slices.Contains(hello.GetCapabilities(), capName) {
			require.Equal(t, agentv1.EnforcementState_ENFORCEMENT_STATE_APPLIED, e[res].GetState(), res)
		} else {
			require.Equal(t, agentv1.EnforcementState_ENFORCEMENT_STATE_NOT_APPLIED, e[res].GetState(), res)
			require.Contains(t, e[res].GetDetail(), "controller is not enabled", res)
		}
		t.Logf("%s: %s %s", res, e[res].GetState(), e[res].GetDetail())
	}

	fd, err := unix.Open(cg, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	probe := exec.Command("sh", "-c", "cat /dev/null && echo null-ok; head -c0 /dev/kmsg && echo kmsg-ok")
	probe.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	var out bytes.Buffer
	probe.Stdout, probe.Stderr = &out, &out
	require.Error(t, probe.Run(), "head fails")
	require.Contains(t, out.String(), "null-ok")
	require.Contains(t, out.String(), "Operation not permitted")
	require.NotContains(t, out.String(), "kmsg-ok")

	// Something left running when the reservation ends.
	sleeper := exec.Command("sleep", "1000")
	sleeper.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	require.NoError(t, sleeper.Start())
	_ = unix.Close(fd)
	t.Cleanup(func() { _ = sleeper.Process.Kill() })

	b.gw.command(&agentv1.Command{Id: "rel", Seq: 2, Kind: agent.KindAllocationRelease, Params: params(t, map[string]any{"allocation_id": "alloc-real"})})
	u, _ = b.gw.finalUpdate(t, 2)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	rel := b.gw.await(t, "released", func(m *agentv1.AgentMessage) bool { return m.GetAllocationReleased() != nil }).GetAllocationReleased()
	require.EqualValues(t, 1, rel.GetKilledProcesses())
	require.NoDirExists(t, cg)
	err = sleeper.Wait()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	require.Equal(t, syscall.SIGKILL, ee.Sys().(syscall.WaitStatus).Signal(), "the leftover was killed")
}

// probeOnlyFilter attaches to the start-up probe's cgroup and fails on
// every allocation's.
type probeOnlyFilter struct{}

func (probeOnlyFilter) Attach(dir string, _ []devfilter.Rule) error {
	if strings.HasPrefix(filepath.Base(dir), "probe-") {
		return nil
	}
	return errors.New("attach device program: no memory for the program")
}

// TestAttachFailureFailsTheBind: on a node that advertises devices.limits
// the control plane places work that needs it, so a bind whose device
// program does not attach fails instead of handing out unconfined GPUs.
func TestAttachFailureFailsTheBind(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, hello := b.joined(t, func(c *agent.Config) { c.DeviceFilter = probeOnlyFilter{} })
	require.Contains(t, hello.GetCapabilities(), agent.CapDevices)
	uuids := b.gpuUUIDs(t)
	u, _ := bind(t, b, 1, "alloc-attach", map[string]any{"gpu_uuids": []any{uuids[0]}})
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_FAILED, u.GetState())
	require.Equal(t, agent.FailDeviceFilter, u.GetFailureCode())
	require.Contains(t, u.GetMessage(), "no memory for the program")
}

// TestExecIsolated is issue 21's acceptance for process.exec, on the real
// kernel as root: from inside an exec of one allocation, reading bcd's
// key, moving itself to the parent cgroup, signalling another allocation's
// process, opening another allocation's GPU and setuid(0) all fail; what it
// writes to /tmp is its allocation's and is gone after release.
func TestExecIsolated(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: bcd confines processes as root (cgroups, BPF, mounts, id maps)")
	}
	if _, err := os.Stat("/proc/self/ns/user"); err != nil {
		t.Skip("this kernel has no user namespaces (no /proc/self/ns/user): processes cannot be confined")
	}
	mount := cgroups.Cgroup2Mount()
	if mount == "" {
		t.Skip("no cgroup2 mount on this host (see /proc/self/mounts)")
	}
	if _, err := exec.LookPath("perl"); err != nil {
		t.Skip("needs perl to call setuid(0) from inside")
	}
	root, err := os.MkdirTemp(mount, "bc-agent-test-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Rmdir(root) })
	b := setup(t)
	b.cgRoot = root
	// Outside /tmp, as bcd's is (/var/lib/bcd): the state directory must be
	// hidden for itself, not only because the process has a /tmp of its own.
	state, err := os.MkdirTemp("/var/lib", "bctest-bcd-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(state) })
	require.NoError(t, os.Chmod(state, 0o755))
	b.stateDir = filepath.Join(state, "state")
	_, hello := b.joined(t, func(c *agent.Config) { c.PlainCgroupDir = false })
	require.Contains(t, hello.GetCapabilities(), agent.CapExecIsolated)
	uuids := b.gpuUUIDs(t)
	for i, id := range []string{"alloc-a", "alloc-b"} {
		u, bound := bind(t, b, uint64(i+1), id, map[string]any{"gpu_uuids": []any{uuids[i]}})
		require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
		require.Contains(t, enforced(bound)["devices"].GetDetail(), fmt.Sprintf("/dev/nvidia%d", i))
	}
	// The two GPUs' device nodes, open to everyone by their mode: only the
	// device filter stands between an allocation and the other's GPU.
	devDir, err := os.MkdirTemp("/dev", "bctest-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(devDir) })
	require.NoError(t, os.Chmod(devDir, 0o755))
	for minor := range 2 {
		p := filepath.Join(devDir, fmt.Sprintf("nvidia%d", minor))
		require.NoError(t, unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(195, uint32(minor)))))
		require.NoError(t, os.Chmod(p, 0o666))
	}

	// Something of alloc-b's runs meanwhile.
	sleep := bctest.UniqueSleep()
	b.gw.command(&agentv1.Command{Id: "b-sleep", Seq: 3, Kind: agent.KindProcessExec, Params: params(t, map[string]any{
		"allocation_id": "alloc-b", "argv": []any{"sh", "-c", "exec " + sleep}})})
	other := bctest.WaitPIDs(t, sleep, 1)[0]

	key := filepath.Join(b.stateDir, "node.key")
	require.FileExists(t, key)
	script := strings.Join([]string{
		"id -u",
		"cat " + key + " && echo LEAK: read the node key",
		"echo $$ > " + filepath.Join(root, "cgroup.procs") + " && echo LEAK: moved to the parent cgroup",
		"echo $$ > " + filepath.Join(mount, "cgroup.procs") + " && echo LEAK: moved to the root cgroup",
		fmt.Sprintf("kill -0 %d && echo LEAK: signalled alloc-b", other),
		"head -c1 " + filepath.Join(devDir, "nvidia1") + " && echo LEAK: opened the GPU of alloc-b",
		"head -c1 " + filepath.Join(devDir, "nvidia0") + "; echo own GPU tried",
		`perl -MPOSIX -e 'POSIX::setuid(0) and print "LEAK: setuid(0)\n"; print "uid $<\n"'`,
		"echo kept > /tmp/mine && echo wrote tmp",
	}, "\n")
	b.gw.command(&agentv1.Command{Id: "a-probe", Seq: 4, Kind: agent.KindProcessExec, Params: params(t, map[string]any{
		"allocation_id": "alloc-a", "argv": []any{"sh", "-c", script}})})
	stdout, stderr, u := execOutput(t, b, 4)
	t.Logf("stdout:\n%s\nstderr:\n%s", stdout, stderr)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	res := u.GetResult().AsMap()
	require.Equal(t, true, res["confined"])
	require.Equal(t, true, res["cgroup_entered"])
	uid := strconv.Itoa(int(res["uid"].(float64)))
	require.NotContains(t, stdout, "LEAK")
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.Equal(t, uid, lines[0], "the allocation's own uid")
	require.NotEqual(t, "0", uid)
	require.Contains(t, lines, "uid "+uid, "setuid(0) failed and left the uid as it was")
	require.Contains(t, lines, "wrote tmp")
	require.Contains(t, stderr, "node.key: No such file or directory", "the state directory is hidden, not only closed")
	require.Regexp(t, `nvidia1\b.*: Operation not permitted`, stderr, "the device filter refuses the other allocation's GPU")
	require.Regexp(t, `nvidia0\b.*: No such device or address`, stderr, "its own GPU passes the filter (this host has no driver behind it)")
	require.True(t, pidAlive(other), "alloc-b's process was not touched")

	// The allocation's /tmp is a directory of its own on the host, and
	// release takes it away.
	var tmpFile string
	require.NoError(t, filepath.WalkDir(b.stateDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "mine" {
			tmpFile = p
		}
		return nil
	}))
	require.NotEmpty(t, tmpFile, "the file written to /tmp is on the host while the allocation lives")
	st, err := os.Stat(tmpFile)
	require.NoError(t, err)
	require.EqualValues(t, res["uid"], st.Sys().(*syscall.Stat_t).Uid, "and belongs to the allocation's uid")
	b.gw.command(&agentv1.Command{Id: "rel-a", Seq: 5, Kind: agent.KindAllocationRelease, Params: params(t, map[string]any{"allocation_id": "alloc-a"})})
	u, _ = b.gw.finalUpdate(t, 5)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	require.NoFileExists(t, tmpFile, "released: its /tmp is gone")
	b.gw.command(&agentv1.Command{Id: "rel-b", Seq: 6, Kind: agent.KindAllocationRelease, Params: params(t, map[string]any{"allocation_id": "alloc-b"})})
	u, _ = b.gw.finalUpdate(t, 6)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	bctest.WaitFor(t, "alloc-b's process killed with its cgroup", func() bool { return !pidAlive(other) })
}
