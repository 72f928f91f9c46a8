package fake

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/agent/hw"
)

func TestConfigureMIG(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, err := New(Options{Model: "dgxh100", Seed: "mig"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	inv, err := b.Inventory(ctx)
	require.NoError(t, err)
	uuid := inv.Gpus[2].Uuid

	require.NoError(t, b.ConfigureMIG(ctx, uuid, []string{"3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"}))
	inv, err = b.Inventory(ctx)
	require.NoError(t, err)
	g := inv.Gpus[2]
	require.Equal(t, "enabled", g.MigMode)
	var got []string
	for _, mi := range g.MigInstances {
		got = append(got, mi.Profile)
		require.NotEmpty(t, mi.Uuid)
	}
	require.Equal(t, []string{"3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"}, got)
	require.Equal(t, "disabled", inv.Gpus[1].MigMode, "only the GPU asked for changes")

	require.NoError(t, b.ConfigureMIG(ctx, uuid, []string{"7g.80gb"}), "a later layout replaces the last")
	inv, err = b.Inventory(ctx)
	require.NoError(t, err)
	require.Len(t, inv.Gpus[2].MigInstances, 1)

	for _, bad := range [][]string{{"4g.40gb", "4g.40gb"}, {"7g.80gb", "1g.10gb"}, {"big"}} {
		require.ErrorIs(t, b.ConfigureMIG(ctx, uuid, bad), hw.ErrMIGLayout, "%v", bad)
	}
	require.ErrorIs(t, b.ConfigureMIG(ctx, "GPU-nope", []string{"7g.80gb"}), hw.ErrNoGPU)
	b.SetBusy(uuid, true)
	require.ErrorIs(t, b.ConfigureMIG(ctx, uuid, []string{"3g.40gb", "3g.40gb"}), hw.ErrGPUBusy)
	inv, err = b.Inventory(ctx)
	require.NoError(t, err)
	require.Equal(t, "7g.80gb", inv.Gpus[2].MigInstances[0].Profile, "a refused change leaves the layout")
}
