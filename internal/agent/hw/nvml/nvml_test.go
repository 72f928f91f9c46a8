//go:build cgo

package nvml_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/agent/hw/nvml"
)

// Without an NVIDIA driver, New fails with a clear error instead of
// crashing: bcd must run on hosts without GPUs.
func TestNewWithoutDriver(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "/usr/lib64/libnvidia-ml.so.1", "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1"} {
		if _, err := os.Stat(filepath.Clean(p)); err == nil {
			t.Skip("libnvidia-ml present")
		}
	}
	_, err := nvml.New()
	require.ErrorIs(t, err, nvml.ErrUnavailable)
}
