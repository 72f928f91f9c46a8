//go:build cgo

package nvml_test

import (
	"context"
	"errors"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/agent/hw/nvml"
)

// ReadTelemetry reads what the device answers and leaves unset what it
// does not support: go-nvml's mock answers memory, and here GPU 0 also
// utilization, temperature, power and ECC counts, GPU 1 refuses power.
func TestReadTelemetry(t *testing.T) {
	t.Parallel()
	srv := dgxh100.New()
	d0 := srv.Devices[0].(*server.Device)
	d0.GetUtilizationRatesFunc = func() (gonvml.Utilization, gonvml.Return) {
		return gonvml.Utilization{Gpu: 42, Memory: 10}, gonvml.SUCCESS
	}
	d0.GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return 61, gonvml.SUCCESS }
	d0.GetPowerUsageFunc = func() (uint32, gonvml.Return) { return 312500, gonvml.SUCCESS }
	d0.GetTotalEccErrorsFunc = func(typ gonvml.MemoryErrorType, _ gonvml.EccCounterType) (uint64, gonvml.Return) {
		if typ == gonvml.MEMORY_ERROR_TYPE_CORRECTED {
			return 3, gonvml.SUCCESS
		}
		return 0, gonvml.SUCCESS
	}
	d1 := srv.Devices[1].(*server.Device)
	d1.GetPowerUsageFunc = func() (uint32, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
	require.Equal(t, gonvml.SUCCESS, srv.Init())

	got, err := nvml.ReadTelemetry(context.Background(), srv)
	require.NoError(t, err)
	require.Len(t, got, 8)
	g := got[0]
	require.Equal(t, d0.UUID, g.GetUuid())
	require.EqualValues(t, 0, g.GetIndex())
	require.InDelta(t, 42, g.GetUtilizationPercent(), 0)
	require.InDelta(t, 61, g.GetTemperatureCelsius(), 0)
	require.InDelta(t, 312.5, g.GetPowerWatts(), 0, "milliwatts become watts")
	require.EqualValues(t, 3, g.GetEccCorrectedTotal())
	require.NotNil(t, g.EccUncorrectedTotal)
	require.EqualValues(t, d0.MemoryInfo.Total, g.GetMemoryTotalBytes())
	require.NotNil(t, g.MemoryUsedBytes)

	// Unsupported readings stay unset rather than zero.
	require.Nil(t, got[1].PowerWatts, "NOT_SUPPORTED")
	require.Nil(t, got[1].UtilizationPercent, "the mock has no utilization call for GPU 1")
	require.Nil(t, got[1].TemperatureCelsius)
	require.Nil(t, got[1].XidTotal, "NVML keeps no XID counter: bcd fills it")
	require.NotNil(t, got[1].MemoryTotalBytes)
}

// On a host with an NVIDIA driver, every GPU reads with its memory and a
// utilization in range; elsewhere the test says why it did not run.
func TestTelemetryOnRealGPU(t *testing.T) {
	t.Parallel()
	b, err := nvml.New()
	if errors.Is(err, nvml.ErrUnavailable) {
		t.Skipf("no NVIDIA driver on this host: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	got, err := b.Telemetry(context.Background())
	require.NoError(t, err)
	require.NotEmpty(t, got)
	for _, g := range got {
		require.NotEmpty(t, g.GetUuid())
		require.NotNil(t, g.MemoryTotalBytes, "gpu %d", g.GetIndex())
		require.LessOrEqual(t, g.GetMemoryUsedBytes(), g.GetMemoryTotalBytes())
		if g.UtilizationPercent != nil {
			require.True(t, g.GetUtilizationPercent() >= 0 && g.GetUtilizationPercent() <= 100)
		}
		t.Logf("gpu %d %s: util %v%% mem %d/%d temp %v°C power %vW ecc %v/%v", g.GetIndex(), g.GetUuid(), g.GetUtilizationPercent(),
			g.GetMemoryUsedBytes(), g.GetMemoryTotalBytes(), g.GetTemperatureCelsius(), g.GetPowerWatts(),
			g.GetEccCorrectedTotal(), g.GetEccUncorrectedTotal())
	}
}
