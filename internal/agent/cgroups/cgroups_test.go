package cgroups

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
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
	require.True(t, m.Writable())
	tests := []struct {
		name string
		l    Limits
		want map[string]string
	}{
		{"limited", Limits{CPUQuotaUS: 200000, CPUPeriodUS: 100000, MemoryMaxBytes: 1 << 30, CPUs: "0-3", Mems: "0"},
			map[string]string{"cpu.max": "200000 100000", "memory.max": "1073741824", "cpuset.cpus": "0-3", "cpuset.mems": "0"}},
		{"unlimited", Limits{},
			map[string]string{"cpu.max": "max 100000", "memory.max": "max"}},
	}
	for _, tt := range tests {
		dir, err := m.Apply("alloc-"+tt.name, tt.l)
		require.NoError(t, err)
		require.Equal(t, filepath.Join(m.Root, "alloc-"+tt.name), dir)
		for f, want := range tt.want {
			require.Equal(t, want, read(t, filepath.Join(dir, f)), tt.name+"/"+f)
		}
		require.NoError(t, m.Remove("alloc-"+tt.name))
		require.NoDirExists(t, dir)
		require.NoError(t, m.Remove("alloc-"+tt.name), "removing twice is fine")
	}
}

func TestInvalidIDs(t *testing.T) {
	t.Parallel()
	m := Manager{Root: t.TempDir()}
	for _, id := range []string{"", "..", "../x", "a/b", ".hidden"} {
		_, err := m.Apply(id, Limits{})
		require.ErrorIs(t, err, ErrInvalidID, id)
		require.ErrorIs(t, m.Remove(id), ErrInvalidID, id)
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
		_, err := m.Apply(id, Limits{})
		require.ErrorIs(t, err, ErrInvalidID, id)
		require.ErrorContains(t, err, "cgroup interface file", id)
		require.ErrorIs(t, m.Remove(id), ErrInvalidID, id)
		require.FileExists(t, file, "the interface file %s must be left alone", id)
		got, err := m.Path(id)
		require.ErrorIs(t, err, ErrInvalidID, id)
		require.Empty(t, got)
	}
}

// TestRealCgroup writes a real child cgroup; it needs root and a writable
// cgroup2 mount at /sys/fs/cgroup.
func TestRealCgroup(t *testing.T) {
	if os.Getenv("BC_TEST_REAL_CGROUPS") != "1" {
		t.Skip("set BC_TEST_REAL_CGROUPS=1 to write a real cgroup")
	}
	if !IsCgroup2("/sys/fs/cgroup") {
		t.Fatal("BC_TEST_REAL_CGROUPS=1 but /sys/fs/cgroup is not cgroup2")
	}
	m := Manager{Root: "/sys/fs/cgroup/bettercompute-test"}
	t.Cleanup(func() { _ = os.Remove(m.Root) })
	dir, err := m.Apply("real-test", Limits{CPUQuotaUS: 50000, CPUPeriodUS: 100000, MemoryMaxBytes: 256 << 20})
	require.NoError(t, err)
	require.Equal(t, "50000 100000\n", read(t, filepath.Join(dir, "cpu.max")))
	require.Equal(t, "268435456\n", read(t, filepath.Join(dir, "memory.max")))
	require.NoError(t, m.Remove("real-test"))
	require.NoDirExists(t, dir)
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
