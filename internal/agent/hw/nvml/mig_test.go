//go:build cgo

package nvml_test

import (
	"context"
	"slices"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/agent/hw"
	"github.com/better-compute/better-compute/internal/agent/hw/nvml"
)

// TestConfigureMIG repartitions a GPU of go-nvml's DGX H100 mock and reads
// the layout back through the inventory reader.
func TestConfigureMIG(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := dgxh100.New()
	var procs []gonvml.ProcessInfo
	for _, d := range srv.Devices {
		d := d.(*server.Device)
		d.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) { return procs, gonvml.SUCCESS }
		d.GetMaxMigDeviceCountFunc = func() (int, gonvml.Return) { return 0, gonvml.SUCCESS }
	}
	b, err := nvml.FromInterface(srv)
	require.NoError(t, err)
	uuid := srv.Devices[3].(*server.Device).UUID
	layout := func() (mode string, got []string) {
		inv, err := b.Inventory(ctx)
		require.NoError(t, err)
		g := inv.Gpus[3]
		for _, mi := range g.MigInstances {
			got = append(got, mi.Profile)
		}
		slices.Sort(got)
		return g.MigMode, got
	}

	require.NoError(t, b.ConfigureMIG(ctx, uuid, []string{"1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"}))
	mode, got := layout()
	require.Equal(t, "enabled", mode)
	require.Equal(t, []string{"1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"}, got)

	require.NoError(t, b.ConfigureMIG(ctx, uuid, []string{"7g.80gb"}), "the old instances are destroyed first")
	_, got = layout()
	require.Equal(t, []string{"7g.80gb"}, got)

	require.ErrorIs(t, b.ConfigureMIG(ctx, uuid, []string{"3g.40gb", "5g.50gb"}), hw.ErrMIGLayout)
	require.ErrorIs(t, b.ConfigureMIG(ctx, "GPU-nope", []string{"7g.80gb"}), hw.ErrNoGPU)
	procs = []gonvml.ProcessInfo{{Pid: 42}}
	require.ErrorIs(t, b.ConfigureMIG(ctx, uuid, []string{"3g.40gb", "3g.40gb"}), hw.ErrGPUBusy)
	_, got = layout()
	require.Equal(t, []string{"7g.80gb"}, got, "a refused change leaves the layout as it was")
}
