package reporules

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// The control plane is one static binary: it builds without cgo (simulated
// hosts need no C), and so does bcd, which then refuses only the nvml
// backend, saying why. The go build cache makes this cheap after the first
// run.
func TestProgramsBuildWithoutCgo(t *testing.T) {
	t.Parallel()
	goBin, err := exec.LookPath("go")
	require.NoError(t, err, "the go tool runs this test")
	out := t.TempDir()
	build := exec.CommandContext(t.Context(), goBin, "build", "-o", out+string(filepath.Separator), "./cmd/better-compute", "./cmd/bcd")
	build.Dir = repoRoot(t)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	b, err := build.CombinedOutput()
	require.NoError(t, err, "CGO_ENABLED=0 go build ./cmd/better-compute ./cmd/bcd:\n%s", b)

	var stderr bytes.Buffer
	bcd := exec.CommandContext(t.Context(), filepath.Join(out, "bcd"), "--hardware", "nvml", "--server", "127.0.0.1:1", "--state-dir", t.TempDir())
	bcd.Stderr = &stderr
	require.Error(t, bcd.Run())
	require.Contains(t, stderr.String(), "--hardware nvml: nvml unavailable: this bcd was built without cgo")
}
