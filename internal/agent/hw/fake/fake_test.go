package fake

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDGXH100(t *testing.T) {
	t.Parallel()
	b, err := New(Options{Model: "dgxh100", Seed: "node-a"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	inv, err := b.Inventory(context.Background())
	require.NoError(t, err)
	require.Len(t, inv.Gpus, 8)
	require.Equal(t, "550.54.15", inv.DriverVersion)
	require.Equal(t, "12.4", inv.CudaVersion)
	seen := map[string]bool{}
	for i, g := range inv.Gpus {
		require.EqualValues(t, i, g.Index)
		require.Contains(t, g.Model, "H100")
		require.Contains(t, g.Model, "80GB")
		require.GreaterOrEqual(t, g.MemoryMib, uint64(80*1024))
		require.NotEmpty(t, g.PciBusId)
		require.Equal(t, "disabled", g.MigMode)
		want := int32(0)
		if i >= 4 {
			want = 1
		}
		require.Equal(t, want, g.NumaNode, "gpu %d", i)
		// The device filter allows /dev/nvidiaN by this minor.
		require.NotNil(t, g.MinorNumber, "gpu %d has no /dev/nvidiaN minor", i)
		require.EqualValues(t, i, g.GetMinorNumber(), "gpu %d", i)
		require.False(t, seen[g.Uuid])
		seen[g.Uuid] = true
	}
	// All-to-all on the HGX board: 8 GPUs × 7 peers.
	require.Len(t, inv.Nvlinks, 56)
	peers := map[string]map[string]bool{}
	for _, l := range inv.Nvlinks {
		require.NotEqual(t, l.GpuUuid, l.PeerUuid)
		if peers[l.GpuUuid] == nil {
			peers[l.GpuUuid] = map[string]bool{}
		}
		peers[l.GpuUuid][l.PeerUuid] = true
	}
	for u := range seen {
		require.Len(t, peers[u], 7)
	}
	id := b.Identity()
	require.Len(t, id.GpuUuids, 8)
	require.Equal(t, "DGXH100", id.DmiProductName)
}

func TestSeedsDiffer(t *testing.T) {
	t.Parallel()
	a, err := New(Options{Model: "dgxa100", Seed: "1"})
	require.NoError(t, err)
	b, err := New(Options{Model: "dgxa100", Seed: "2"})
	require.NoError(t, err)
	a2, err := New(Options{Model: "dgxa100", Seed: "1"})
	require.NoError(t, err)
	require.NotEqual(t, a.Identity().DmiProductUuid, b.Identity().DmiProductUuid)
	require.NotEqual(t, a.Identity().GpuUuids[0], b.Identity().GpuUuids[0])
	require.NotEqual(t, a.Identity().Macs, b.Identity().Macs)
	require.Equal(t, a.Identity().GpuUuids, a2.Identity().GpuUuids, "same seed, same machine")
}

func TestModelsAndTopology(t *testing.T) {
	t.Parallel()
	for _, m := range []string{"dgxa100", "dgxb200"} {
		b, err := New(Options{Model: m, Seed: "x"})
		require.NoError(t, err, m)
		inv, err := b.Inventory(context.Background())
		require.NoError(t, err)
		require.Len(t, inv.Gpus, 8, m)
	}
	b, err := New(Options{Model: "dgxh100", Topology: Topology{NUMA: []int{0, 0, 0, 0, 0, 0, 0, 0}, NVLinks: [][2]int{{0, 1}}}})
	require.NoError(t, err)
	inv, err := b.Inventory(context.Background())
	require.NoError(t, err)
	require.Len(t, inv.Nvlinks, 2)
	require.EqualValues(t, 0, inv.Gpus[7].NumaNode)
	_, err = New(Options{Model: "dgx1"})
	require.Error(t, err)
}
