package confine_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/agent/confine"
)

// needConfinement skips where the kernel or the user cannot confine, and
// says which.
func needConfinement(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the helper mounts and maps ids")
	}
	if _, err := os.Stat("/proc/self/ns/user"); err != nil {
		t.Skip("this kernel has no user namespaces")
	}
}

// run starts s confined and returns its output and status.
func run(t *testing.T, s confine.Spec) (string, confine.Status) {
	t.Helper()
	cmd, err := confine.Command(s)
	require.NoError(t, err)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	p, err := confine.Start(cmd)
	require.NoError(t, err)
	_ = cmd.Wait()
	st, ok := p.Status()
	require.True(t, ok, "the helper reports: %s", out.String())
	return out.String(), st
}

func TestConfinedProcess(t *testing.T) {
	needConfinement(t)
	t.Parallel()
	secret := filepath.Join(t.TempDir(), "state")
	require.NoError(t, os.Mkdir(secret, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(secret, "node.key"), []byte("secret"), 0o644))
	work := filepath.Join(secret, "work")
	require.NoError(t, os.Mkdir(work, 0o755))
	require.NoError(t, os.Chown(work, 1879048999, 1879048999))
	sh, err := exec.LookPath("sh")
	require.NoError(t, err)
	script := strings.Join([]string{
		"id -u; id -g; id -G",
		"pwd",
		"kill -0 " + strconv.Itoa(os.Getpid()) + " 2>/dev/null && echo SAW-HOST-PID",
		"cat " + filepath.Join(secret, "node.key") + " 2>/dev/null && echo KEY-READ",
		"ls " + secret + " 2>/dev/null | tr '\\n' ' '; echo",
		"grep NoNewPrivs /proc/self/status",
		"grep CapEff /proc/self/status",
		"echo hi > /tmp/x && echo tmp-ok",
		"echo hi > ok && echo dir-ok",
		"perl -MPOSIX -e 'POSIX::setuid(0) or print \"setuid0 failed\\n\"'",
		"exit 4",
	}, "\n")
	out, st := run(t, confine.Spec{Path: sh, Argv: []string{"sh", "-c", script}, UID: 1879048999, GID: 1879048999,
		Dir: work, Hide: []string{secret}})
	t.Log(out)
	require.Empty(t, st.StartError)
	require.Equal(t, 4, st.ExitCode)
	lines := strings.Split(out, "\n")
	require.Equal(t, []string{"1879048999", "1879048999", "1879048999", work}, lines[:4])
	require.NotContains(t, out, "SAW-HOST-PID", "the host's processes are not in its PID namespace")
	require.NotContains(t, out, "KEY-READ")
	require.Contains(t, out, "NoNewPrivs:\t1")
	require.Contains(t, out, "CapEff:\t0000000000000000")
	require.Contains(t, out, "tmp-ok")
	require.Contains(t, out, "dir-ok")
	require.Contains(t, out, "setuid0 failed")
	require.FileExists(t, filepath.Join(work, "ok"), "the working directory is the host's")
}
