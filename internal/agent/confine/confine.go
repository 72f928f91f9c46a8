// Package confine starts a tenant's process on a node confined: as an
// unprivileged uid/gid of its own, in new user, mount, PID, IPC and cgroup
// namespaces, with no_new_privs, a private /tmp, /proc mounted for its PID
// namespace, and host paths (bcd's state directory, other tenants'
// directories) covered by empty mounts. bcd runs as root, so the process is
// started through a small init helper: the running binary re-executed
// (/proc/self/exe) in the new mount, PID and IPC namespaces, where, still
// host root, it makes the mounts and then starts the command in a user
// namespace that maps only the process's own id.
//
// It must never start the command with root mapped into its user
// namespace, with a capability, or after a step of the confinement
// failed: a helper that cannot confine reports why and runs nothing.
package confine

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// initArg0 is argv[0] of the helper: a process started with it runs the
// helper (see init) instead of the program's main.
const initArg0 = "bc-confine-init"

// Spec is one confined process.
type Spec struct {
	// Path is the program (an absolute host path) and Argv its arguments,
	// Argv[0] included.
	Path string   `json:"path"`
	Argv []string `json:"argv"`
	// UID and GID are the host ids the process runs as; its user namespace
	// maps them, and only them, to themselves.
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
	// Dir is the working directory ("" is /). A Dir under a hidden path
	// stays reachable: it is mounted back at its own path.
	Dir string `json:"dir,omitempty"`
	// Tmp is a host directory mounted at /tmp and /var/tmp (it should
	// belong to UID); "" gives a fresh tmpfs that goes with the process.
	Tmp string `json:"tmp,omitempty"`
	// Hide are host paths covered by an empty tmpfs.
	Hide []string `json:"hide,omitempty"`
	// Cgroup2 is the host's cgroup2 mount point: it is mounted again in
	// the process's cgroup namespace, so it shows only the process's own
	// cgroup and below, read-only. "" leaves the host's mount (a process
	// outside any allocation cgroup).
	Cgroup2 string `json:"cgroup2,omitempty"`
}

// Status is what the helper reports on its status pipe when the command
// ended (or never started).
type Status struct {
	// StartError says why the command did not start: a confinement step
	// failed, or the program could not be executed.
	StartError string `json:"start_error,omitempty"`
	ExitCode   int    `json:"exit_code"`
	// Signal names the signal that ended the command ("" when it exited).
	Signal string `json:"signal,omitempty"`
}

// Process is a started helper.
type Process struct {
	Cmd    *exec.Cmd
	status *os.File
}

// Command prepares the helper for s. The caller sets Stdout and Stderr
// (and may add UseCgroupFD to SysProcAttr, so the helper and the command
// start in a cgroup), then calls Start. The helper is the leader of a
// process group of its own: killing the group kills the command, and the
// command's PID namespace goes with the helper.
func Command(s Spec) (*exec.Cmd, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	return &exec.Cmd{
		Path: "/proc/self/exe",
		Args: []string{initArg0, string(b)},
		Dir:  "/",
		SysProcAttr: &syscall.SysProcAttr{
			Setpgid:    true,
			Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC,
		},
	}, nil
}

// Start starts cmd (from Command) with a status pipe: Wait reads it once
// the helper is gone.
func Start(cmd *exec.Cmd) (*Process, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.ExtraFiles = []*os.File{w}
	err = cmd.Start()
	_ = w.Close()
	if err != nil {
		_ = r.Close()
		return nil, err
	}
	return &Process{Cmd: cmd, status: r}, nil
}

// Status reads the helper's report. Call it after the helper exited; ok is
// false when it wrote none (it was killed).
func (p *Process) Status() (st Status, ok bool) {
	defer func() { _ = p.status.Close() }()
	b, err := io.ReadAll(io.LimitReader(p.status, 64<<10))
	if err != nil || len(b) == 0 {
		return st, false
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return Status{StartError: fmt.Sprintf("unreadable status from the confinement helper: %q", b)}, true
	}
	return st, true
}

func (s Spec) validate() error {
	switch {
	case !filepath.IsAbs(s.Path):
		return fmt.Errorf("confine: program %q is not an absolute path", s.Path)
	case len(s.Argv) == 0:
		return errors.New("confine: argv is empty")
	case s.UID == 0 || s.GID == 0:
		// The point is not to be root: refuse rather than map it.
		return errors.New("confine: uid and gid must not be 0")
	}
	for _, p := range append([]string{s.Dir, s.Tmp, s.Cgroup2}, s.Hide...) {
		if p != "" && !filepath.IsAbs(p) {
			return fmt.Errorf("confine: path %q is not absolute", p)
		}
	}
	return nil
}

func init() {
	if len(os.Args) == 2 && os.Args[0] == initArg0 {
		// Everything the helper does (unshare, prctl, the fork of the
		// command) must happen on one thread: namespaces and
		// no_new_privs are per thread until the fork copies them.
		runtime.LockOSThread()
		os.Exit(helper(os.Args[1]))
	}
}

// statusFD is the helper's status pipe (ExtraFiles[0]).
const statusFD = 3

// helper is the init of the confined process's PID namespace: it makes
// the mounts, starts the command as s.UID in its own user namespace,
// reaps whatever is orphaned to it and reports the command's end. Its
// exit code repeats the command's (128+n for signal n).
func helper(arg string) int {
	status := os.NewFile(statusFD, "status")
	unix.CloseOnExec(statusFD)
	report := func(st Status) {
		if status != nil {
			b, _ := json.Marshal(st)
			_, _ = status.Write(b)
			_ = status.Close()
		}
	}
	var s Spec
	if err := json.Unmarshal([]byte(arg), &s); err != nil {
		report(Status{StartError: "confine: bad spec: " + err.Error()})
		return 126
	}
	if err := s.validate(); err != nil {
		report(Status{StartError: err.Error()})
		return 126
	}
	if err := setup(&s); err != nil {
		report(Status{StartError: "confine: " + err.Error()})
		_, _ = fmt.Fprintf(os.Stderr, "confine: %v\n", err)
		return 126
	}
	cmd := &exec.Cmd{
		Path: s.Path, Args: s.Argv, Env: os.Environ(), Dir: "/",
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: unix.CLONE_NEWUSER,
			// Only the process's own ids: root of the namespace is
			// unmapped, so it holds no capability after execve and
			// setuid(0) fails.
			UidMappings:                []syscall.SysProcIDMap{{ContainerID: int(s.UID), HostID: int(s.UID), Size: 1}},
			GidMappings:                []syscall.SysProcIDMap{{ContainerID: int(s.GID), HostID: int(s.GID), Size: 1}},
			GidMappingsEnableSetgroups: false,
			Credential:                 &syscall.Credential{Uid: s.UID, Gid: s.GID, NoSetGroups: true},
			Pdeathsig:                  unix.SIGKILL,
		},
	}
	if s.Dir != "" {
		cmd.Dir = s.Dir
	}
	if err := cmd.Start(); err != nil {
		report(Status{StartError: fmt.Sprintf("start %q: %v", s.Argv[0], err)})
		return 127
	}
	pid := cmd.Process.Pid
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			report(Status{StartError: "confine: wait: " + err.Error()})
			return 126
		}
		if got != pid {
			continue // an orphan of the command, reaped by its init
		}
		if ws.Signaled() {
			report(Status{ExitCode: -1, Signal: unix.SignalName(ws.Signal())})
			return 128 + int(ws.Signal())
		}
		report(Status{ExitCode: ws.ExitStatus()})
		return ws.ExitStatus()
	}
}

// setup makes the helper's mounts and settings; it runs as host root in
// the new mount, PID and IPC namespaces.
func setup(s *Spec) error {
	// Nothing mounted here may reach the host's namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	// Opened before anything is hidden: they may lie under a hidden path.
	var tmpFD, dirFD = -1, -1
	var err error
	if s.Tmp != "" {
		if tmpFD, err = unix.Open(s.Tmp, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
			return fmt.Errorf("open %s: %w", s.Tmp, err)
		}
		defer func() { _ = unix.Close(tmpFD) }()
	}
	if s.Dir != "" {
		if dirFD, err = unix.Open(s.Dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
			return fmt.Errorf("open %s: %w", s.Dir, err)
		}
		defer func() { _ = unix.Close(dirFD) }()
	}
	// The host's /proc still answers /proc/self/fd for the binds below;
	// the new one is mounted last.
	const hidden = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	for _, p := range s.Hide {
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := unix.Mount("tmpfs", p, "tmpfs", hidden, "mode=0755,size=64k"); err != nil {
			return fmt.Errorf("hide %s: %w", p, err)
		}
	}
	for _, p := range []string{"/tmp", "/var/tmp"} {
		if _, err := os.Stat(p); err != nil {
			continue
		}
		if tmpFD >= 0 {
			if err := bindFD(tmpFD, p); err != nil {
				return err
			}
			continue
		}
		if err := unix.Mount("tmpfs", p, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
			return fmt.Errorf("mount a private %s: %w", p, err)
		}
	}
	// POSIX shared memory is files in /dev/shm: the host's is shared by
	// everyone.
	if _, err := os.Stat("/dev/shm"); err == nil {
		if err := unix.Mount("tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
			return fmt.Errorf("mount a private /dev/shm: %w", err)
		}
	}
	if dirFD >= 0 {
		// Under a hidden path the directory is gone from view: it is
		// made again (in the covering tmpfs) and mounted back.
		if err := os.MkdirAll(s.Dir, 0o755); err != nil {
			return fmt.Errorf("make %s: %w", s.Dir, err)
		}
		if err := bindFD(dirFD, s.Dir); err != nil {
			return err
		}
	}
	// The cgroup namespace is rooted at the cgroup the helper is in now
	// (the allocation's, where the caller cloned it into one).
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("new cgroup namespace: %w", err)
	}
	if s.Cgroup2 != "" {
		// The same superblock cannot be mounted twice at one place:
		// the host's mount goes first (in this mount namespace only).
		if err := unix.Unmount(s.Cgroup2, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount the host's cgroup2 at %s: %w", s.Cgroup2, err)
		}
		if err := unix.Mount("cgroup2", s.Cgroup2, "cgroup2", hidden|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("mount cgroup2 at %s for the cgroup namespace: %w", s.Cgroup2, err)
		}
	}
	if err := unix.Mount("proc", "/proc", "proc", hidden, ""); err != nil {
		return fmt.Errorf("mount /proc for the PID namespace: %w", err)
	}
	// Supplementary groups are inherited from bcd (root's): none stay.
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("drop supplementary groups: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	return nil
}

// bindFD mounts the directory open as fd at target, without set-id
// programs or device nodes.
func bindFD(fd int, target string) error {
	src := fmt.Sprintf("/proc/self/fd/%d", fd)
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("mount %s at %s: %w", strings.TrimSpace(src), target, err)
	}
	if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("remount %s nosuid,nodev: %w", target, err)
	}
	return nil
}

// probes remembers Probe's answers: they depend on this process and its
// kernel only, and a test process starts many simulated nodes.
var probes sync.Map // probeKey → error (nil stored as errProbeOK)

type probeKey struct {
	uid, gid uint32
	cgroup2  string
}

var errProbeOK = errors.New("ok")

// Probe starts a confined true (from PATH) as uid/gid and says why that
// does not work here; nil means every step of the confinement was made
// (the helper runs nothing otherwise). cgroup2 is passed as Spec.Cgroup2.
// The answer is remembered for the process.
func Probe(uid, gid uint32, cgroup2 string) error {
	k := probeKey{uid, gid, cgroup2}
	if v, ok := probes.Load(k); ok {
		if err := v.(error); !errors.Is(err, errProbeOK) {
			return err
		}
		return nil
	}
	err := probe(uid, gid, cgroup2)
	v := err
	if v == nil {
		v = errProbeOK
	}
	probes.Store(k, v)
	return err
}

func probe(uid, gid uint32, cgroup2 string) error {
	if os.Geteuid() != 0 {
		return errors.New("bcd is not root: it cannot run processes as another uid")
	}
	prog, err := exec.LookPath("true")
	if err != nil {
		return fmt.Errorf("no true program to probe with: %w", err)
	}
	cmd, err := Command(Spec{Path: prog, Argv: []string{"true"}, UID: uid, GID: gid, Cgroup2: cgroup2})
	if err != nil {
		return err
	}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	p, err := Start(cmd)
	if err != nil {
		return fmt.Errorf("start the confinement helper (new mount, PID and IPC namespaces): %w", err)
	}
	err = cmd.Wait()
	st, ok := p.Status()
	switch {
	case ok && st.StartError != "":
		return errors.New(st.StartError)
	case err != nil:
		return fmt.Errorf("confined true: %w (%s)", err, strings.TrimSpace(out.String()))
	}
	return nil
}
