package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent/cgroups"
	"github.com/better-compute/better-compute/internal/agent/confine"
)

// Output caps of one process.exec: beyond them output is dropped (and
// counted), so a noisy process cannot flood the gateway.
const (
	// ExecOutputRate is how many bytes per second (stdout and stderr
	// together) are sent.
	ExecOutputRate = 1 << 20
	// ExecOutputTotal is how many bytes are sent in all.
	ExecOutputTotal = 64 << 20
	// execChunk is the largest ProcessOutput.data.
	execChunk = 32 << 10
	// execDrain bounds how long output is still read after the process
	// and its group are gone (a child that left the group may hold the
	// pipe open).
	execDrain = 2 * time.Second
)

// execPath is the PATH a process.exec gets: it inherits nothing from bcd's
// environment, which may hold secrets.
const execPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// processExec decodes Command.params, the JSON form of a ProcessExec.
func processExec(p *structpb.Struct) (*agentv1.ProcessExec, error) {
	if p == nil {
		return nil, errors.New("process.exec needs params")
	}
	b, err := protojson.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("params: %w", err)
	}
	pe := &agentv1.ProcessExec{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, pe); err != nil {
		return nil, fmt.Errorf("params are not a ProcessExec: %w", err)
	}
	switch {
	case pe.GetAllocationId() == "":
		return nil, errors.New("params: allocation_id is required")
	case len(pe.GetArgv()) == 0 || pe.GetArgv()[0] == "":
		return nil, errors.New("params: argv needs a program")
	}
	for i, a := range pe.GetArgv() {
		if strings.IndexByte(a, 0) >= 0 {
			return nil, fmt.Errorf("params: argv[%d] contains a NUL byte", i)
		}
	}
	return pe, nil
}

// outputCap admits output within ExecOutputRate per second and
// ExecOutputTotal in all, and counts what it drops.
type outputCap struct {
	mu          sync.Mutex
	now         func() time.Time
	rate, total int64
	window      time.Time
	inWindow    int64
	sent        int64
	dropped     uint64
}

// admit returns how many of n bytes may be sent now.
func (o *outputCap) admit(n int) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.now()
	if now.Sub(o.window) >= time.Second || now.Before(o.window) {
		o.window, o.inWindow = now, 0
	}
	keep := int64(n)
	keep = min(keep, o.rate-o.inWindow, o.total-o.sent)
	keep = max(keep, 0)
	o.inWindow += keep
	o.sent += keep
	o.dropped += uint64(int64(n) - keep)
	return int(keep)
}

// lost counts bytes admitted but not sent (no session).
func (o *outputCap) lost(n int) {
	o.mu.Lock()
	o.dropped += uint64(n)
	o.mu.Unlock()
}

func (o *outputCap) droppedBytes() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.dropped
}

// exec runs a process.exec: the process in the allocation's cgroup (where
// the cgroup root is cgroup v2), in a process group of its own, with the
// allocation's GPUs in its environment, and confined (package confine: the
// allocation's own uid/gid and namespaces) wherever the start-up probe
// found confinement works. Its output goes out as
// ProcessOutput chunks while it runs; the result says how it ended. When
// ctx ends (a cancel, the deadline, bcd stopping) the whole process group
// is killed; when the process exits, what it left in its group is killed
// too.
func (a *Agent) exec(ctx context.Context, c *agentv1.Command) (outcome, error) {
	pe, err := processExec(c.GetParams())
	if err != nil {
		return outcome{}, fail(FailInvalidParams, err)
	}
	dir, err := a.cg.Path(pe.GetAllocationId())
	if err != nil {
		return outcome{}, fail(FailInvalidParams, err)
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return outcome{}, fail(FailNotBound, fmt.Errorf("allocation %s is not bound on this node (no cgroup at %s)", pe.GetAllocationId(), dir))
	}
	confined := a.iso.execErr == nil
	home := "/"
	if confined {
		// The allocation's own /tmp is the one place it may write.
		home = "/tmp"
	}
	env := []string{"PATH=" + execPath, "HOME=" + home, "LANG=C.UTF-8", "BC_ALLOCATION_ID=" + pe.GetAllocationId()}
	if !pe.GetOmitGpuEnv() {
		devs, err := a.visibleDevices(ctx, pe.GetGpuUuids())
		if err != nil {
			return outcome{}, fail(FailInvalidParams, err)
		}
		// Indexes in PCI bus order, as nvidia-smi numbers GPUs; CUDA's
		// own default order (fastest first) would name other GPUs.
		env = append(env, "NVIDIA_VISIBLE_DEVICES="+devs, "CUDA_VISIBLE_DEVICES="+devs, "CUDA_DEVICE_ORDER=PCI_BUS_ID")
	}

	attr := &syscall.SysProcAttr{Setpgid: true}
	entered, note := false, ""
	if cgroups.IsCgroup2(dir) {
		fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return outcome{}, fail(FailExecStart, fmt.Errorf("open cgroup %s: %w", dir, err))
		}
		defer func() { _ = unix.Close(fd) }()
		// clone3 with CLONE_INTO_CGROUP: the process is in the cgroup from
		// its first instruction, so nothing it forks escapes the limits.
		attr.UseCgroupFD, attr.CgroupFD, entered = true, fd, true
	} else {
		note = dir + " is not on a cgroup v2 filesystem (a simulated node's plain directory): the process runs in bcd's own cgroup, without the allocation's limits"
	}

	prog, err := lookPath(pe.GetArgv()[0])
	if err != nil {
		return outcome{}, fail(FailExecStart, err)
	}
	cmd := &exec.Cmd{Path: prog, Args: pe.GetArgv(), Env: env, Dir: "/", SysProcAttr: attr}
	result := map[string]any{"cgroup": dir, "cgroup_entered": entered, "confined": confined}
	if confined {
		cmd, err = a.confined(pe.GetAllocationId(), prog, pe.GetArgv(), entered, result)
		if err != nil {
			return outcome{}, err
		}
		cmd.Env = env
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = attr.UseCgroupFD, attr.CgroupFD
	} else {
		result["confine_note"] = "the process runs as bcd's user, in bcd's namespaces: " + a.iso.execErr.Error()
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return outcome{}, fail(FailExecStart, err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		_ = outR.Close()
		_ = outW.Close()
		return outcome{}, fail(FailExecStart, err)
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	if note != "" {
		result["cgroup_note"] = note
	}
	var helper *confine.Process
	if confined {
		helper, err = confine.Start(cmd)
	} else {
		err = cmd.Start()
	}
	if err != nil {
		for _, f := range []*os.File{outR, outW, errR, errW} {
			_ = f.Close()
		}
		if entered && errors.Is(err, unix.ENOSYS) {
			return outcome{}, fail(FailExecStart, fmt.Errorf("start %q in cgroup %s (clone3 with CLONE_INTO_CGROUP unavailable): %w", pe.GetArgv()[0], dir, err))
		}
		return outcome{}, fail(FailExecStart, fmt.Errorf("start %q: %w", pe.GetArgv()[0], err))
	}
	_ = outW.Close()
	_ = errW.Close()
	pid := cmd.Process.Pid
	result["pid"] = float64(pid)
	a.log.Info("process.exec started", "command", c.GetId(), "allocation", pe.GetAllocationId(), "pid", pid, "cgroup_entered", entered)

	oc := &outputCap{now: time.Now, rate: ExecOutputRate, total: ExecOutputTotal}
	var readers sync.WaitGroup
	var sendMu sync.Mutex // one chunk at a time, so the two streams interleave whole
	for _, p := range []struct {
		name string
		r    *os.File
	}{{"stdout", outR}, {"stderr", errR}} {
		readers.Go(func() { a.pump(c, p.name, p.r, oc, &sendMu) })
	}

	// Wait for the exit without reaping, so the group id cannot be
	// reused before its leftovers are killed.
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		var info unix.Siginfo
		for {
			if err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil); !errors.Is(err, unix.EINTR) {
				return
			}
		}
	}()
	var stopped error
	select {
	case <-exited:
	case <-ctx.Done():
		stopped = ctx.Err()
		_ = unix.Kill(-pid, unix.SIGKILL)
		<-exited
	}
	_ = unix.Kill(-pid, unix.SIGKILL)
	// Its error only restates the exit status, read from ProcessState.
	_ = cmd.Wait()

	drained := make(chan struct{})
	go func() { readers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(execDrain):
		// Closing the read ends ends the pumps.
		_ = outR.Close()
		_ = errR.Close()
		<-drained
	}
	_ = outR.Close()
	_ = errR.Close()

	code, sig := exitOf(cmd.ProcessState)
	if helper != nil {
		// The helper repeats the command's end; it reports nothing when
		// it was killed (a cancel), and then its own end is the answer.
		if st, ok := helper.Status(); ok {
			if st.StartError != "" {
				return outcome{}, fail(FailExecStart, fmt.Errorf("start %q confined: %s", pe.GetArgv()[0], st.StartError))
			}
			code, sig = st.ExitCode, st.Signal
		}
	}
	result["exit_code"] = float64(code)
	if sig != "" {
		result["signal"] = sig
	}
	result["dropped_bytes"] = float64(oc.droppedBytes())
	res, _ := structpb.NewStruct(result)
	a.log.Info("process.exec ended", "command", c.GetId(), "pid", pid, "exit_code", code, "signal", sig, "stopped", stopped)
	if stopped != nil {
		return outcome{result: res}, stopped
	}
	return outcome{result: res}, nil
}

// confined prepares the confinement helper for an allocation's process:
// the allocation's uid/gid, its /tmp, bcd's state directory (and a
// simulated node's plain cgroup directories) hidden. It notes the uid in
// result.
func (a *Agent) confined(allocationID, prog string, argv []string, inCgroup bool, result map[string]any) (*exec.Cmd, error) {
	id, err := a.ids.get(allocationID)
	if err != nil {
		return nil, fail(FailExecStart, fmt.Errorf("no process id for allocation %s: %w", allocationID, err))
	}
	tmp, err := a.allocationTmp(allocationID, id)
	if err != nil {
		return nil, fail(FailExecStart, err)
	}
	hide := append([]string{a.cfg.StateDir}, a.cfg.ExecHide...)
	cg2 := ""
	if inCgroup {
		// Mounted again in the process's cgroup namespace, the cgroup
		// tree shows only its own cgroup: other allocations' are gone.
		cg2 = cgroups.Cgroup2Mount()
	} else {
		hide = append(hide, a.cfg.CgroupRoot)
	}
	// The helper takes absolute paths only (a --state-dir may be relative).
	for i, p := range hide {
		if hide[i], err = filepath.Abs(p); err != nil {
			return nil, fail(FailExecStart, err)
		}
	}
	cmd, err := confine.Command(confine.Spec{Path: prog, Argv: argv, UID: id, GID: id, Tmp: tmp, Hide: hide, Cgroup2: cg2})
	if err != nil {
		return nil, fail(FailExecStart, err)
	}
	result["uid"] = float64(id)
	return cmd, nil
}

// lookPath finds a program in execPath (the process's PATH, not bcd's); a
// name with a slash is taken as it is.
func lookPath(name string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	for _, dir := range strings.Split(execPath, ":") {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q not found in PATH %s", name, execPath)
}

// exitOf is a finished process's exit code (-1 when a signal ended it)
// and the signal's name.
func exitOf(ps *os.ProcessState) (int, string) {
	if ps == nil {
		return -1, ""
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -1, unix.SignalName(ws.Signal())
	}
	return ps.ExitCode(), ""
}

// pump reads one output stream to its end and sends it in chunks within
// the caps.
func (a *Agent) pump(c *agentv1.Command, stream string, r io.Reader, oc *outputCap, sendMu *sync.Mutex) {
	buf := make([]byte, execChunk)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if keep := oc.admit(n); keep > 0 {
				m := &agentv1.AgentMessage{Msg: &agentv1.AgentMessage_ProcessOutput{ProcessOutput: &agentv1.ProcessOutput{
					CommandId: c.GetId(), Seq: c.GetSeq(), Stream: stream, Data: slices.Clone(buf[:keep]), DroppedBytes: oc.droppedBytes(),
				}}}
				sendMu.Lock()
				ok := a.sendOrLog(m)
				sendMu.Unlock()
				if !ok {
					oc.lost(keep)
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// visibleDevices names the allocation's GPUs by their index on this node,
// comma-separated in index order; a MIG instance UUID is passed as it is.
func (a *Agent) visibleDevices(ctx context.Context, uuids []string) (string, error) {
	if len(uuids) == 0 {
		return "", nil
	}
	inv, err := a.gpus(ctx)
	if err != nil {
		return "", err
	}
	byUUID := map[string]int32{}
	for _, g := range inv.GetGpus() {
		byUUID[g.GetUuid()] = g.GetIndex()
	}
	var idx []int
	var mig []string
	for _, u := range uuids {
		if strings.HasPrefix(u, "MIG-") {
			mig = append(mig, u)
			continue
		}
		i, ok := byUUID[u]
		if !ok {
			return "", fmt.Errorf("GPU %s is not on this node", u)
		}
		if !slices.Contains(idx, int(i)) {
			idx = append(idx, int(i))
		}
	}
	slices.Sort(idx)
	out := make([]string, 0, len(idx)+len(mig))
	for _, i := range idx {
		out = append(out, strconv.Itoa(i))
	}
	return strings.Join(append(out, mig...), ","), nil
}
