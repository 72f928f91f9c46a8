package bctest

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// UniqueSleep is a sleep command line ("sleep N", N days long) no other
// test runs, so its processes can be found on the host by their command
// line: a confined process's $$ is its pid in its own PID namespace, not
// the host's.
func UniqueSleep() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return fmt.Sprintf("sleep %d", 1000000+(int(b[0])<<16|int(b[1])<<8|int(b[2])))
}

// PIDAlive reports whether the host pid runs: a killed process whose
// parent died too stays a zombie until init reaps it, and counts as gone.
func PIDAlive(pid int) bool {
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

// PIDsWith are the host pids of running processes whose command line
// holds token; bcd's confinement helper, whose command line repeats the
// command's, is left out.
func PIDsWith(token string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || bytes.HasPrefix(b, []byte("bc-confine-init\x00")) {
			continue
		}
		if strings.Contains(string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})), token) && PIDAlive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// WaitPIDs waits until n processes run whose command line holds token and
// returns their host pids.
func WaitPIDs(t testing.TB, token string, n int) []int {
	t.Helper()
	var pids []int
	WaitFor(t, fmt.Sprintf("%d processes running %q", n, token), func() bool {
		pids = PIDsWith(token)
		return len(pids) == n
	})
	return pids
}
