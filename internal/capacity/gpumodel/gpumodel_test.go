package gpumodel

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNames(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name      string
		memMiB    int
		short     string
		canonical string
	}{
		{"NVIDIA H100 80GB HBM3", 81559, "H100", "H100 80GB"},
		{"NVIDIA A100-SXM4-40GB", 40960, "A100", "A100 40GB"},
		{"NVIDIA B200", 0, "B200", "B200"},
		{"  Mystery Accelerator ", 1024, "Mystery Accelerator", "Mystery Accelerator 1GB"},
	} {
		require.Equal(t, tt.short, Short(tt.name), tt.name)
		require.Equal(t, tt.canonical, Canonical(tt.name, tt.memMiB), tt.name)
	}
	require.Equal(t, map[string]string{"gpu.model": "H100", "gpu.count": "8", "gpu.memory": "80GB"}, Labels("NVIDIA H100 80GB HBM3", 8, 81559))
	require.Equal(t, map[string]string{"gpu.model": "B200", "gpu.count": "2"}, Labels("NVIDIA B200", 2, 0))
	require.Empty(t, Labels("", 0, 0))
}
