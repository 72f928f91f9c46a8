package fake

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/gpuhealth"
)

// A build fault is a standing finding from the machine's first read; a
// bad one makes the machine fail to open, saying what is wrong.
func TestBuildFault(t *testing.T) {
	t.Parallel()
	b, err := openWithFault(Options{Model: "dgxh100", Seed: t.Name()}, "ecc_uncorrectable:0,gpu.nvlink_down:3:2")
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	got, err := b.Findings(context.Background())
	require.NoError(t, err)
	kinds := map[string]int64{}
	for _, f := range got {
		kinds[f.GetKind()] = f.GetCode()
		require.Contains(t, []int64{0, 3}, int64(f.GetGpuIndex()))
	}
	require.Equal(t, map[string]int64{gpuhealth.KindECCUncorrectable: 1, gpuhealth.KindNVLinkDown: 2}, kinds)

	none, err := openWithFault(Options{Model: "dgxh100", Seed: t.Name()}, "")
	require.NoError(t, err)
	t.Cleanup(func() { _ = none.Close() })
	got, err = none.Findings(context.Background())
	require.NoError(t, err)
	require.Empty(t, got)

	for spec, want := range map[string]string{
		"gpu.xid:0":             `kind "gpu.xid" is not a standing finding`,
		"overheated":            `kind "overheated" is not a standing finding`,
		"ecc_uncorrectable:8":   `GPU "8" is not an index of this machine's 8 GPUs`,
		"ecc_uncorrectable:-1":  `GPU "-1" is not an index`,
		"ecc_uncorrectable:0:x": `code "x" is not a number`,
		"lost:0:0:0":            `want KIND[:GPU[:CODE]]`,
		":0":                    `want KIND[:GPU[:CODE]]`,
	} {
		_, err := openWithFault(Options{Model: "dgxh100", Seed: t.Name()}, spec)
		require.ErrorContains(t, err, want, spec)
		require.ErrorContains(t, err, "fake: build fault", spec)
	}
}
