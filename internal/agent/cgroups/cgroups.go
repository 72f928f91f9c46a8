// Package cgroups applies allocation limits as cgroup v2 children of one
// root bcd owns (by default /sys/fs/cgroup/bettercompute). Tests point the
// root at a temporary directory; the same writes then land in plain files.
//
// It must never write outside its root, and never remove a cgroup it did
// not name (allocation ids are validated as single path elements).
package cgroups

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Limits are what one allocation's cgroup enforces.
type Limits struct {
	// CPUQuotaUS is the cpu.max quota per period; 0 means unlimited.
	CPUQuotaUS  int64
	CPUPeriodUS int64
	// MemoryMaxBytes is memory.max; 0 means unlimited.
	MemoryMaxBytes uint64
	CPUs           string
	Mems           string
}

// Manager creates and removes allocation cgroups below Root.
type Manager struct {
	Root string
}

// validID admits no dot: every cgroup v2 interface file is named
// "<controller>.<file>" (cgroup.procs, cpu.max, memory.max, …), so an id
// with one could name a file of the root (Remove would delete it on a test
// root; Apply would write limits below it) instead of a child cgroup.
var validID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$`)

// ErrInvalidID is returned for an allocation id that is not a safe single
// path element.
var ErrInvalidID = errors.New("invalid allocation id")

// IsCgroup2 reports whether path is on a cgroup v2 filesystem.
func IsCgroup2(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return st.Type == unix.CGROUP2_SUPER_MAGIC
}

// ErrNotCgroup2 is returned by CheckRoot for a root that is not on a
// cgroup v2 filesystem: limits written there would be plain files nothing
// enforces.
var ErrNotCgroup2 = errors.New("not on a cgroup v2 filesystem")

// CheckRoot checks that root is, or would be created, on a cgroup v2
// filesystem: the root itself or, when it does not exist yet, its nearest
// existing parent (every directory made below a cgroup2 directory is a
// cgroup). The error names where cgroup2 is mounted, when it is; the
// caller names root.
func CheckRoot(root string) error {
	if root == "" {
		return errors.New("empty cgroup root")
	}
	dir := filepath.Clean(root)
	for {
		var st unix.Statfs_t
		err := unix.Statfs(dir, &st)
		if err == nil {
			if st.Type == unix.CGROUP2_SUPER_MAGIC {
				return nil
			}
			hint := ""
			if m := Cgroup2Mount(); m != "" {
				hint = fmt.Sprintf("; cgroup2 is mounted at %s, e.g. use %s", m, filepath.Join(m, "bettercompute"))
			}
			return fmt.Errorf("%s is %w (filesystem type %#x)%s", dir, ErrNotCgroup2, st.Type, hint)
		}
		if !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("statfs %s: %w", dir, err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return fmt.Errorf("statfs %s: %w", dir, err)
		}
		dir = parent
	}
}

// Cgroup2Mount is the first cgroup2 mount point in /proc/self/mounts, or ""
// when there is none (or it cannot be read).
func Cgroup2Mount() string {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[2] == "cgroup2" {
			return f[1]
		}
	}
	return ""
}

// Version returns "v2", "v1" or "" for the host cgroup layout under
// mount (usually /sys/fs/cgroup).
func Version(mount string) string {
	if IsCgroup2(mount) {
		return "v2"
	}
	if _, err := os.Stat(filepath.Join(mount, "cpu")); err == nil {
		return "v1"
	}
	return ""
}

// Writable reports whether the root exists (or can be created) and accepts
// a child directory.
func (m Manager) Writable() bool {
	if err := os.MkdirAll(m.Root, 0o755); err != nil {
		return false
	}
	probe, err := os.MkdirTemp(m.Root, ".probe-")
	if err != nil {
		return false
	}
	_ = os.Remove(probe)
	return true
}

// Path is the cgroup directory of an allocation.
func (m Manager) Path(allocationID string) (string, error) {
	if strings.Contains(allocationID, ".") {
		return "", fmt.Errorf("%w: %q contains '.', so it could name a cgroup interface file (like cgroup.procs) instead of a cgroup", ErrInvalidID, allocationID)
	}
	if !validID.MatchString(allocationID) {
		return "", fmt.Errorf("%w: %q must be 1-128 letters, digits, '_' or '-', starting with a letter or digit", ErrInvalidID, allocationID)
	}
	return filepath.Join(m.Root, allocationID), nil
}

// Apply creates (or updates) the allocation's cgroup and writes its limits.
// On a real cgroupfs the controllers are first enabled in the parents'
// cgroup.subtree_control, as the kernel requires.
func (m Manager) Apply(allocationID string, l Limits) (string, error) {
	dir, err := m.Path(allocationID)
	if err != nil {
		return "", err
	}
	real := IsCgroup2(filepath.Dir(m.Root)) || IsCgroup2(m.Root)
	if err := os.MkdirAll(m.Root, 0o755); err != nil {
		return "", fmt.Errorf("create cgroup root: %w", err)
	}
	if real {
		controllers := []string{"cpu", "memory", "cpuset"}
		if IsCgroup2(filepath.Dir(m.Root)) {
			if err := enable(filepath.Dir(m.Root), controllers); err != nil {
				return "", err
			}
		}
		if err := enable(m.Root, controllers); err != nil {
			return "", err
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("create cgroup: %w", err)
	}
	period := l.CPUPeriodUS
	if period <= 0 {
		period = 100000
	}
	quota := "max"
	if l.CPUQuotaUS > 0 {
		quota = strconv.FormatInt(l.CPUQuotaUS, 10)
	}
	mem := "max"
	if l.MemoryMaxBytes > 0 {
		mem = strconv.FormatUint(l.MemoryMaxBytes, 10)
	}
	writes := [][2]string{
		{"cpu.max", quota + " " + strconv.FormatInt(period, 10)},
		{"memory.max", mem},
	}
	// cpuset.mems before cpuset.cpus is not required by the kernel, but an
	// empty value must not be written: it would mean "no CPUs".
	if l.CPUs != "" {
		writes = append(writes, [2]string{"cpuset.cpus", l.CPUs})
	}
	if l.Mems != "" {
		writes = append(writes, [2]string{"cpuset.mems", l.Mems})
	}
	for _, w := range writes {
		if err := writeFile(filepath.Join(dir, w[0]), w[1], real); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// Remove deletes the allocation's cgroup; a missing one is not an error.
func (m Manager) Remove(allocationID string) error {
	dir, err := m.Path(allocationID)
	if err != nil {
		return err
	}
	if IsCgroup2(dir) {
		// A cgroup directory is removed with rmdir; its interface files go
		// with it. It fails while processes remain.
		if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		return nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove cgroup %s: %w", dir, err)
	}
	return nil
}

func enable(dir string, controllers []string) error {
	avail, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("read controllers of %s: %w", dir, err)
	}
	have := strings.Fields(string(avail))
	var want []string
	for _, c := range controllers {
		for _, h := range have {
			if h == c {
				want = append(want, "+"+c)
			}
		}
	}
	if len(want) == 0 {
		return nil
	}
	if err := writeFile(filepath.Join(dir, "cgroup.subtree_control"), strings.Join(want, " "), true); err != nil {
		return err
	}
	return nil
}

func writeFile(path, value string, real bool) error {
	flags := os.O_WRONLY
	if !real {
		flags |= os.O_CREATE | os.O_TRUNC
	}
	f, err := os.OpenFile(path, flags, 0o644)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	if _, err := f.WriteString(value); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %q to %s: %w", value, path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
