package fake

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The fake's telemetry is plausible: one reading per GPU of its inventory,
// every value in range, memory in use below the GPU's memory, and a load
// that moves with the time.
func TestTelemetryPlausible(t *testing.T) {
	t.Parallel()
	b, err := New(Options{Model: "dgxh100", Seed: "telemetry"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	inv, err := b.Inventory(context.Background())
	require.NoError(t, err)
	got, err := b.Telemetry(context.Background())
	require.NoError(t, err)
	require.Len(t, got, len(inv.GetGpus()))
	for i, g := range got {
		require.Equal(t, inv.GetGpus()[i].GetUuid(), g.GetUuid())
		require.Equal(t, inv.GetGpus()[i].GetIndex(), g.GetIndex())
		require.True(t, g.GetUtilizationPercent() >= 0 && g.GetUtilizationPercent() <= 100, "utilization %v", g.GetUtilizationPercent())
		require.EqualValues(t, inv.GetGpus()[i].GetMemoryMib()*1024*1024, g.GetMemoryTotalBytes())
		require.Less(t, g.GetMemoryUsedBytes(), g.GetMemoryTotalBytes())
		require.True(t, g.GetTemperatureCelsius() >= 30 && g.GetTemperatureCelsius() <= 90, "temperature %v", g.GetTemperatureCelsius())
		require.True(t, g.GetPowerWatts() >= 60 && g.GetPowerWatts() <= 700, "power %v", g.GetPowerWatts())
		require.NotNil(t, g.EccCorrectedTotal)
		require.Zero(t, g.GetEccUncorrectedTotal())
		require.Nil(t, g.XidTotal, "bcd counts XIDs, not the backend")
	}

	// A quarter period later every GPU's load has moved (sin shifted by
	// π/2 never equals itself for all eight phases at once).
	t0 := time.Unix(1700000000, 0)
	a, c := readings(inv.GetGpus(), t0), readings(inv.GetGpus(), t0.Add(telemetryPeriod/4))
	moved := 0
	for i := range a {
		if a[i].GetUtilizationPercent() != c[i].GetUtilizationPercent() {
			moved++
		}
	}
	require.Positive(t, moved)
}
