package devfilter

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// helperEnv makes the test binary, run again inside a filtered cgroup,
// open the paths in its arguments and print what each open answered.
const helperEnv = "BC_DEVFILTER_OPEN_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		for _, p := range os.Args[1:] {
			f, err := os.OpenFile(p, os.O_RDWR, 0)
			var errno syscall.Errno
			switch {
			case err == nil:
				_ = f.Close()
				fmt.Printf("%s ok\n", p)
			case errors.As(err, &errno):
				fmt.Printf("%s %s\n", p, unix.ErrnoName(errno))
			default:
				fmt.Printf("%s %v\n", p, err)
			}
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// realCgroup makes a fresh cgroup under the host's cgroup2 mount, or skips
// where the host cannot have one.
func realCgroup(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creating a cgroup and attaching a BPF device program need CAP_SYS_ADMIN and CAP_BPF")
	}
	mount := cgroup2Mount()
	if mount == "" {
		t.Skip("no cgroup2 mount on this host (see /proc/self/mounts): BPF device filters exist only on cgroup v2")
	}
	dir, err := os.MkdirTemp(mount, "bc-devfilter-test-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Rmdir(dir) })
	return dir
}

func cgroup2Mount() string {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[2] == "cgroup2" {
			return f[1]
		}
	}
	return ""
}

// openIn runs the helper inside dir (clone3 with CLONE_INTO_CGROUP, so it
// is filtered from its first instruction) and returns each path's answer.
func openIn(t *testing.T, dir string, paths ...string) map[string]string {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer func() { _ = unix.Close(fd) }()
	cmd := exec.Command(os.Args[0], paths...)
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Run(), out.String())
	got := map[string]string{}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		if p, res, ok := strings.Cut(sc.Text(), " "); ok {
			got[p] = res
		}
	}
	return got
}

// TestFilterOnRealCgroup attaches a filter allowing /dev/null but not
// /dev/zero to a real cgroup, and has a process in it open both.
func TestFilterOnRealCgroup(t *testing.T) {
	dir := realCgroup(t)
	before := openIn(t, dir, "/dev/null", "/dev/zero")
	require.Equal(t, map[string]string{"/dev/null": "ok", "/dev/zero": "ok"}, before, "without a filter both open")

	require.NoError(t, BPF{}.Attach(dir, []Rule{{Char, 1, 3, AccessRead | AccessWrite, "/dev/null"}}))
	got := openIn(t, dir, "/dev/null", "/dev/zero")
	require.Equal(t, map[string]string{"/dev/null": "ok", "/dev/zero": "EPERM"}, got)

	// Attaching again replaces the program (a resent bind): now the
	// pseudo-devices, /dev/zero among them, open again.
	require.NoError(t, BPF{}.Attach(dir, Pseudo()))
	got = openIn(t, dir, "/dev/null", "/dev/zero")
	require.Equal(t, map[string]string{"/dev/null": "ok", "/dev/zero": "ok"}, got)

	// Read-only access is granted by a read rule; read-write is not.
	require.NoError(t, BPF{}.Attach(dir, []Rule{{Char, 1, Wildcard, AccessRead, "mem read-only"}}))
	got = openIn(t, dir, "/dev/null")
	require.Equal(t, "EPERM", got["/dev/null"], "O_RDWR asks for write too")
}

func TestAttachToNonCgroupFails(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root to load a BPF program")
	}
	err := BPF{}.Attach(t.TempDir(), Pseudo())
	require.Error(t, err, "a plain directory is not a cgroup")
}

func TestInstructionsRefuseBadRules(t *testing.T) {
	t.Parallel()
	for _, r := range []Rule{
		{Type: 'x', Major: 1, Minor: 3, Access: AccessRead, Name: "type"},
		{Type: Char, Major: -2, Minor: 3, Access: AccessRead, Name: "major"},
		{Type: Char, Major: 1, Minor: 1 << 33, Access: AccessRead, Name: "minor"},
		{Type: Char, Major: 1, Minor: 3, Access: 0, Name: "no access"},
		{Type: Char, Major: 1, Minor: 3, Access: 8, Name: "unknown access"},
	} {
		_, err := Instructions([]Rule{r})
		require.ErrorContains(t, err, r.Name, r.Name)
	}
	insns, err := Instructions(nil)
	require.NoError(t, err)
	require.NotEmpty(t, insns, "no rules is a program that denies everything")
}

func TestRuleString(t *testing.T) {
	t.Parallel()
	tests := []struct {
		r    Rule
		want string
	}{
		{GPU(3), "c 195:3 rw"},
		{Rule{Char, 136, Wildcard, AccessAll, "pts"}, "c 136:* rwm"},
		{Rule{Block, Wildcard, Wildcard, AccessMknod, "mknod"}, "b *:* m"},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, tt.r.String())
	}
}

func TestNvidiaControl(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	withUVM := filepath.Join(dir, "devices")
	require.NoError(t, os.WriteFile(withUVM, []byte("Character devices:\n  1 mem\n195 nvidia-frontend\n195 nvidia\n510 nvidia-uvm\n\nBlock devices:\n  8 sd\n511 nvidia-uvm\n"), 0o644))
	rules, err := NvidiaControl(withUVM)
	require.NoError(t, err)
	var got []string
	for _, r := range rules {
		got = append(got, r.String()+" "+r.Name)
	}
	require.Equal(t, []string{
		"c 195:255 rw /dev/nvidiactl", "c 195:254 rw /dev/nvidia-modeset",
		"c 510:0 rw /dev/nvidia-uvm", "c 510:1 rw /dev/nvidia-uvm-tools",
	}, got, "the uvm major comes from the character devices only")

	rules, err = NvidiaControl(filepath.Join(dir, "missing"))
	require.NoError(t, err)
	require.Len(t, rules, 2, "no driver: no uvm device to allow")

	bad := filepath.Join(dir, "bad")
	require.NoError(t, os.WriteFile(bad, []byte("Character devices:\nxx nvidia-uvm\n"), 0o644))
	_, err = NvidiaControl(bad)
	require.ErrorContains(t, err, "bad major")
}

func TestSimulatedWritesTheAllowList(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, Simulated{}.Attach(dir, []Rule{GPU(2), Pseudo()[0]}))
	b, err := os.ReadFile(filepath.Join(dir, SimulatedFile))
	require.NoError(t, err)
	require.Equal(t, "c 195:2 rw /dev/nvidia2\nc 1:3 rw /dev/null\n", string(b))
	require.Error(t, Simulated{}.Attach(dir, []Rule{{Type: 'x', Access: AccessRead, Name: "bad"}}))
}
