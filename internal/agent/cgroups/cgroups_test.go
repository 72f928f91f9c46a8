package cgroups

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func read(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	return string(b)
}

func TestApplyRemoveTempRoot(t *testing.T) {
	t.Parallel()
	m := Manager{Root: filepath.Join(t.TempDir(), "bettercompute")}
	require.False(t, m.Real())
	tests := []struct {
		name  string
		l     Limits
		want  map[string]string
		state map[string]State
	}{
		{"limited", Limits{CPUQuotaUS: 200000, CPUPeriodUS: 100000, MemoryMaxBytes: 1 << 30, CPUs: "0-3", Mems: "0"},
			map[string]string{"cpu.max": "200000 100000", "memory.max": "1073741824", "cpuset.cpus": "0-3", "cpuset.mems": "0"},
			map[string]State{"cpu": Simulated, "memory": Simulated, "cpuset": Simulated}},
		{"unlimited", Limits{}, map[string]string{},
			map[string]State{"cpu": NotRequested, "memory": NotRequested, "cpuset": NotRequested}},
	}
	for _, tt := range tests {
		dir, results, err := m.Apply("alloc-"+tt.name, tt.l)
		require.NoError(t, err)
		require.Equal(t, filepath.Join(m.Root, "alloc-"+tt.name), dir)
		for f, want := range tt.want {
			require.Equal(t, want, read(t, filepath.Join(dir, f)), tt.name+"/"+f)
		}
		got := map[string]State{}
		for _, r := range results {
			got[r.Resource] = r.State
			require.NotEmpty(t, r.Detail, "%s/%s says what it did", tt.name, r.Resource)
		}
		require.Equal(t, tt.state, got, tt.name)
		killed, err := m.Release(context.Background(), "alloc-"+tt.name)
		require.NoError(t, err)
		require.Zero(t, killed, "a plain directory holds no processes")
		require.NoDirExists(t, dir)
		killed, err = m.Release(context.Background(), "alloc-"+tt.name)
		require.NoError(t, err, "releasing twice is fine")
		require.Zero(t, killed)
	}
}

func TestInvalidIDs(t *testing.T) {
	t.Parallel()
	m := Manager{Root: t.TempDir()}
	for _, id := range []string{"", "..", "../x", "a/b", ".hidden"} {
		_, _, err := m.Apply(id, Limits{})
		require.ErrorIs(t, err, ErrInvalidID, id)
		require.ErrorIs(t, m.Remove(id), ErrInvalidID, id)
		_, err = m.Release(context.Background(), id)
		require.ErrorIs(t, err, ErrInvalidID, id)
	}
}

// TestIDNamesNoInterfaceFile: an allocation id must not name one of the
// root cgroup's interface files. On a test root Remove("cgroup.procs")
// deleted the file; on a real one Apply would have written limits below it.
func TestIDNamesNoInterfaceFile(t *testing.T) {
	t.Parallel()
	m := Manager{Root: t.TempDir()}
	for _, id := range []string{"cgroup.procs", "cgroup.subtree_control", "cpu.max", "memory.max", "cpuset.cpus", "io.weight"} {
		file := filepath.Join(m.Root, id)
		require.NoError(t, os.WriteFile(file, []byte("1\n"), 0o644))
		_, _, err := m.Apply(id, Limits{})
		require.ErrorIs(t, err, ErrInvalidID, id)
		require.ErrorContains(t, err, "cgroup interface file", id)
		require.ErrorIs(t, m.Remove(id), ErrInvalidID, id)
		require.FileExists(t, file, "the interface file %s must be left alone", id)
		got, err := m.Path(id)
		require.ErrorIs(t, err, ErrInvalidID, id)
		require.Empty(t, got)
	}
}

// realRoot is a fresh cgroup root under the host's cgroup2 mount, or a
// skip where the host cannot have one.
func realRoot(t *testing.T) Manager {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creating cgroups under the cgroup2 mount")
	}
	mount := Cgroup2Mount()
	if mount == "" {
		t.Skip("no cgroup2 mount on this host (see /proc/self/mounts)")
	}
	root, err := os.MkdirTemp(mount, "bc-cgroups-test-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Rmdir(root) })
	return Manager{Root: root}
}

// TestRealCgroup writes a real child cgroup. Each limit is applied where
// the host delegates its controller on cgroup v2 and reported not applied,
// naming the controller, where it does not (DESIGN §7a: this workplace
// keeps cpu and memory on cgroup v1).
func TestRealCgroup(t *testing.T) {
	m := realRoot(t)
	require.True(t, m.Real())
	why, err := m.Delegate()
	require.NoError(t, err)
	dir, results, err := m.Apply("real-test", Limits{CPUQuotaUS: 50000, CPUPeriodUS: 100000, MemoryMaxBytes: 256 << 20, CPUs: "0"})
	require.NoError(t, err)
	files := map[string]string{"cpu": "cpu.max", "memory": "memory.max", "cpuset": "cpuset.cpus"}
	want := map[string]string{"cpu": "50000 100000\n", "memory": "268435456\n", "cpuset": "0\n"}
	require.Len(t, results, 3)
	for _, r := range results {
		if why[r.Resource] == "" {
			require.Equal(t, Applied, r.State, r.Resource)
			require.Equal(t, want[r.Resource], read(t, filepath.Join(dir, files[r.Resource])))
		} else {
			require.Equal(t, NotApplied, r.State, r.Resource)
			require.Contains(t, r.Detail, "the "+r.Resource+" controller is not enabled")
			require.Contains(t, r.Detail, why[r.Resource])
			require.NoFileExists(t, filepath.Join(dir, files[r.Resource]))
		}
		t.Logf("%s: %v %s", r.Resource, r.State, r.Detail)
	}
	killed, err := m.Release(context.Background(), "real-test")
	require.NoError(t, err)
	require.Zero(t, killed)
	require.NoDirExists(t, dir)
}

// TestReleaseKillsLeftovers: a process left in the allocation's cgroup
// (and one in a cgroup below it) is killed by Release, which then removes
// the cgroup.
func TestReleaseKillsLeftovers(t *testing.T) {
	releaseKillsLeftovers(t)
}

// TestReleaseFallbackKillsLeftovers: on a kernel without cgroup.kill
// (before 5.14) Release sends SIGKILL to each process instead.
func TestReleaseFallbackKillsLeftovers(t *testing.T) {
	old := killFile
	killFile = "cgroup.kill-absent"
	t.Cleanup(func() { killFile = old })
	releaseKillsLeftovers(t)
}

func releaseKillsLeftovers(t *testing.T) {
	m := realRoot(t)
	dir, _, err := m.Apply("leftovers", Limits{})
	require.NoError(t, err)
	sub := filepath.Join(dir, "job")
	require.NoError(t, os.Mkdir(sub, 0o755))
	start := func(cg string) *exec.Cmd {
		fd, err := unix.Open(cg, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		require.NoError(t, err)
		defer func() { _ = unix.Close(fd) }()
		cmd := exec.Command("sleep", "1000")
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill() })
		return cmd
	}
	cmds := []*exec.Cmd{start(dir), start(sub)}
	pids, err := procs(dir)
	require.NoError(t, err)
	require.ElementsMatch(t, []int{cmds[0].Process.Pid, cmds[1].Process.Pid}, pids)

	killed, err := m.Release(context.Background(), "leftovers")
	require.NoError(t, err)
	require.Equal(t, 2, killed)
	require.NoDirExists(t, dir)
	for _, c := range cmds {
		err := c.Wait()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee)
		ws := ee.Sys().(syscall.WaitStatus)
		require.True(t, ws.Signaled(), "sleep ended by a signal")
		require.Equal(t, syscall.SIGKILL, ws.Signal())
	}
}

func TestCheckRoot(t *testing.T) {
	t.Parallel()
	tmp := t.TempDir()
	for _, root := range []string{tmp, filepath.Join(tmp, "not", "yet", "made")} {
		err := CheckRoot(root)
		require.ErrorIs(t, err, ErrNotCgroup2, root)
		require.ErrorContains(t, err, tmp, "names the directory it looked at")
	}
	require.Error(t, CheckRoot(""))
	// Where the host has a cgroup2 mount (DESIGN §7a: /sys/fs/cgroup/unified
	// on the reference machine), a root below it passes without being made.
	if m := Cgroup2Mount(); m != "" {
		root := filepath.Join(m, "bettercompute-checkroot-test-never-created")
		require.NoError(t, CheckRoot(root))
		require.NoDirExists(t, root)
		require.ErrorContains(t, CheckRoot(tmp), m, "the error points at the cgroup2 mount")
	} else {
		t.Log("no cgroup2 mount on this host: only the refusals were checked")
	}
}
