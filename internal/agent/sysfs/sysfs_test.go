package sysfs

import (
	"testing"

	"github.com/stretchr/testify/require"
)

const fixture = "testdata/dgx2s"

func TestIdentity(t *testing.T) {
	t.Parallel()
	id, err := FS{Root: fixture}.Identity()
	require.NoError(t, err)
	require.Equal(t, "4c4c4544-0042-3510-8052-b4c04f4d3233", id.DmiProductUuid)
	require.Equal(t, "1234567890AB", id.DmiProductSerial)
	require.Equal(t, "BRD0001", id.DmiBoardSerial)
	require.Equal(t, "DGXH100", id.DmiProductName)
	// lo and the docker bridge are virtual: only the two PCI NICs count.
	require.Equal(t, []string{"0c:42:a1:00:00:01", "0c:42:a1:00:00:02"}, id.Macs)
}

func TestCPU(t *testing.T) {
	t.Parallel()
	inv, err := FS{Root: fixture}.CPU()
	require.NoError(t, err)
	require.Equal(t, "Intel(R) Xeon(R) Platinum 8480C", inv.Model)
	require.EqualValues(t, 2, inv.Sockets)
	require.EqualValues(t, 112, inv.Cores)
	require.EqualValues(t, 224, inv.Threads)
	require.Len(t, inv.NumaNodes, 2)
	tests := []struct {
		id    int32
		cpus  string
		mib   uint64
		h2, g uint64
	}{
		{0, "0-55,112-167", 1056462848 / 1024, 1024, 16},
		{1, "56-111,168-223", 1056462848 / 1024, 1024, 16},
	}
	for i, want := range tests {
		got := inv.NumaNodes[i]
		require.Equal(t, want.id, got.Id)
		require.Equal(t, want.cpus, got.Cpus)
		require.Equal(t, want.mib, got.MemoryMib)
		require.Equal(t, want.h2, got.Hugepages_2Mi)
		require.Equal(t, want.g, got.Hugepages_1Gi)
	}
}

func TestMemoryKernelPressure(t *testing.T) {
	t.Parallel()
	f := FS{Root: fixture}
	mem, err := f.Memory()
	require.NoError(t, err)
	require.EqualValues(t, 2112925696/1024, mem.TotalMib)
	require.EqualValues(t, 2048, mem.Hugepages_2MiTotal)
	require.EqualValues(t, 32, mem.Hugepages_1GiTotal)

	k, osName := f.Kernel()
	require.Equal(t, "5.15.0-105-generic", k)
	require.Equal(t, "Ubuntu 22.04.4 LTS", osName)

	p, ok := f.Pressure()
	require.True(t, ok)
	require.InDelta(t, 1.5, p.Cpu, 1e-9)
	require.InDelta(t, 2.25, p.Memory, 1e-9)
	require.InDelta(t, 0.1, p.Io, 1e-9)

	_, ok = FS{Root: t.TempDir()}.Pressure()
	require.False(t, ok)
}
