// Package cgroups applies allocation limits as cgroup v2 children of one
// root bcd owns (by default /sys/fs/cgroup/bettercompute). Tests point the
// root at a temporary directory; the same writes then land in plain files.
//
// It must never write outside its root, and never remove a cgroup it did
// not name (allocation ids are validated as single path elements).
package cgroups

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

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

// State is whether a limit is in force.
type State int

// States of a Result.
const (
	// Applied: the kernel enforces it.
	Applied State = iota + 1
	// NotApplied: asked for, but the controller is not available to
	// bcd's cgroups; Result.Detail says why.
	NotApplied
	// Simulated: written to a plain directory (a simulated node), where
	// nothing enforces it.
	Simulated
	// NotRequested: the allocation asked for no such limit.
	NotRequested
)

// Result is what one resource's limit came to.
type Result struct {
	// Resource is "cpu", "memory" or "cpuset".
	Resource string
	State    State
	// Detail is what was written, or why nothing was.
	Detail string
}

// Controllers are the cgroup v2 controllers whose limits Apply writes.
var Controllers = []string{"cpu", "memory", "cpuset"}

// Real reports whether the root is (or will be made) on cgroup2: writes
// there are enforced. Otherwise it is a simulated node's plain directory.
func (m Manager) Real() bool {
	return IsCgroup2(filepath.Dir(m.Root)) || IsCgroup2(m.Root)
}

// Delegate makes the root and enables the controllers for the root's
// children where the host allows it: in the parent's and the root's
// cgroup.subtree_control. It returns, per controller, why it is not
// available to allocation cgroups ("" when it is). A controller the host
// keeps on cgroup v1 (a hybrid layout) is not listed in cgroup.controllers
// and cannot be enabled; neither can one below a parent that holds
// processes (the "no internal processes" rule).
func (m Manager) Delegate() (map[string]string, error) {
	if err := os.MkdirAll(m.Root, 0o755); err != nil {
		return nil, fmt.Errorf("create cgroup root: %w", err)
	}
	why := map[string]string{}
	if !m.Real() {
		for _, c := range Controllers {
			why[c] = ""
		}
		return why, nil
	}
	parent := filepath.Dir(m.Root)
	for _, c := range Controllers {
		var err error
		if IsCgroup2(parent) {
			err = enable(parent, c)
		}
		if err == nil {
			err = enable(m.Root, c)
		}
		if err != nil {
			why[c] = err.Error()
		} else {
			why[c] = ""
		}
	}
	return why, nil
}

// Apply creates (or updates) the allocation's cgroup and writes the limits
// it asks for, each where its controller is available (Delegate). A limit
// whose controller is missing is reported NotApplied with the reason; a
// write the kernel refuses on an available controller is an error.
func (m Manager) Apply(allocationID string, l Limits) (string, []Result, error) {
	dir, err := m.Path(allocationID)
	if err != nil {
		return "", nil, err
	}
	why, err := m.Delegate()
	if err != nil {
		return "", nil, err
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", nil, fmt.Errorf("create cgroup: %w", err)
	}
	real := m.Real()
	have := map[string]bool{}
	if real {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
		if err != nil {
			return "", nil, fmt.Errorf("read controllers of %s: %w", dir, err)
		}
		for _, c := range strings.Fields(string(b)) {
			have[c] = true
		}
	}
	period := l.CPUPeriodUS
	if period <= 0 {
		period = 100000
	}
	type write struct{ file, value string }
	limits := []struct {
		resource string
		writes   []write
	}{
		{"cpu", nil}, {"memory", nil}, {"cpuset", nil},
	}
	if l.CPUQuotaUS > 0 {
		limits[0].writes = []write{{"cpu.max", strconv.FormatInt(l.CPUQuotaUS, 10) + " " + strconv.FormatInt(period, 10)}}
	}
	if l.MemoryMaxBytes > 0 {
		limits[1].writes = []write{{"memory.max", strconv.FormatUint(l.MemoryMaxBytes, 10)}}
	}
	// An empty cpuset value must not be written: it would mean "no CPUs".
	if l.CPUs != "" {
		limits[2].writes = append(limits[2].writes, write{"cpuset.cpus", l.CPUs})
	}
	if l.Mems != "" {
		limits[2].writes = append(limits[2].writes, write{"cpuset.mems", l.Mems})
	}
	results := make([]Result, 0, len(limits))
	for _, lim := range limits {
		res := Result{Resource: lim.resource}
		switch {
		case len(lim.writes) == 0:
			res.State, res.Detail = NotRequested, "no "+lim.resource+" limit asked for"
		case real && !have[lim.resource]:
			res.State = NotApplied
			res.Detail = fmt.Sprintf("the %s controller is not enabled for %s", lim.resource, m.Root)
			if w := why[lim.resource]; w != "" {
				res.Detail += ": " + w
			}
		default:
			var done []string
			for _, w := range lim.writes {
				if err := writeFile(filepath.Join(dir, w.file), w.value, real); err != nil {
					return "", nil, err
				}
				done = append(done, w.file+"="+w.value)
			}
			res.State, res.Detail = Applied, strings.Join(done, " ")
			if !real {
				res.State = Simulated
			}
		}
		results = append(results, res)
	}
	return dir, results, nil
}

// Release kills every process left in the allocation's cgroup (and its
// descendants), waits until they are gone, and removes the cgroup. It
// reports how many processes it killed. A missing cgroup is not an error.
// It writes cgroup.kill (Linux 5.14+); where the kernel lacks it, it sends
// SIGKILL to each pid in cgroup.procs until none is left, so a process
// that forks while being killed is caught on the next pass.
func (m Manager) Release(ctx context.Context, allocationID string) (int, error) {
	dir, err := m.Path(allocationID)
	if err != nil {
		return 0, err
	}
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	killed := 0
	if IsCgroup2(dir) {
		if killed, err = kill(ctx, dir); err != nil {
			return killed, err
		}
	}
	return killed, m.Remove(allocationID)
}

// killFile kills every process of a cgroup when "1" is written to it; a
// test names a missing file to take the fallback.
var killFile = "cgroup.kill"

// kill empties a real cgroup and returns how many processes were in it.
func kill(ctx context.Context, dir string) (int, error) {
	pids, err := procs(dir)
	if err != nil || len(pids) == 0 {
		return 0, err
	}
	seen := map[int]bool{}
	for _, p := range pids {
		seen[p] = true
	}
	err = writeFile(filepath.Join(dir, killFile), "1", true)
	useKill := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, err
	}
	// The kernel delivers the SIGKILLs at once, but a process leaves the
	// cgroup only when it has exited: wait for that, briefly backing off.
	wait := time.Millisecond
	for {
		if !useKill {
			for _, p := range pids {
				if err := unix.Kill(p, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
					return len(seen), fmt.Errorf("kill %d in %s: %w", p, dir, err)
				}
			}
		}
		if pids, err = procs(dir); err != nil {
			return len(seen), err
		}
		if len(pids) == 0 {
			return len(seen), nil
		}
		for _, p := range pids {
			seen[p] = true
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return len(seen), fmt.Errorf("%d processes still in %s: %w", len(pids), dir, ctx.Err())
		case <-t.C:
		}
		wait = min(wait*2, 100*time.Millisecond)
	}
}

// procs lists the pids in dir's cgroup and every cgroup below it.
func procs(dir string) ([]int, error) {
	var pids []int
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s/cgroup.procs: %w", p, err)
		}
		for _, f := range strings.Fields(string(b)) {
			n, err := strconv.Atoi(f)
			if err != nil {
				return fmt.Errorf("%s/cgroup.procs: bad pid %q", p, f)
			}
			pids = append(pids, n)
		}
		return nil
	})
	return pids, err
}

// Remove deletes the allocation's cgroup; a missing one is not an error.
// On cgroupfs the cgroups below it are removed first (rmdir, deepest
// first): a cgroup with children cannot be removed.
func (m Manager) Remove(allocationID string) error {
	dir, err := m.Path(allocationID)
	if err != nil {
		return err
	}
	if IsCgroup2(dir) {
		var dirs []string
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("list cgroup %s: %w", dir, err)
		}
		// A cgroup directory is removed with rmdir; its interface files go
		// with it. It fails while processes remain.
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := rmdirCgroup(dirs[i]); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("remove cgroup %s: %w", dirs[i], err)
			}
		}
		return nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove cgroup %s: %w", dir, err)
	}
	return nil
}

// rmdirCgroup removes one cgroup directory. A task killed a moment ago can
// have left cgroup.procs while the kernel still counts it in the cgroup
// until it has finished exiting, and rmdir answers EBUSY meanwhile: that
// is retried, backing off, for up to two seconds (a loaded host was seen
// to need it), and any other answer is final.
func rmdirCgroup(dir string) error {
	wait := time.Millisecond
	deadline := time.Now().Add(2 * time.Second)
	for {
		err := unix.Rmdir(dir)
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(wait)
		wait = min(wait*2, 100*time.Millisecond)
	}
}

// enable enables one controller for dir's children, unless it already is.
func enable(dir, controller string) error {
	avail, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("read controllers of %s: %w", dir, err)
	}
	if !slices.Contains(strings.Fields(string(avail)), controller) {
		return fmt.Errorf("%s/cgroup.controllers does not list %s (%q): the host does not delegate it on cgroup v2", dir, controller, strings.TrimSpace(string(avail)))
	}
	on, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return fmt.Errorf("read subtree_control of %s: %w", dir, err)
	}
	if slices.Contains(strings.Fields(string(on)), controller) {
		return nil
	}
	return writeFile(filepath.Join(dir, "cgroup.subtree_control"), "+"+controller, true)
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
