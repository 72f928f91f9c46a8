package fake

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/gpuhealth"
)

// Every standing kind injected on a GPU comes back out of Findings with
// its code, the GPU's UUID and index and the default severity, and goes
// when cleared.
func TestInjectFindingRoundTrip(t *testing.T) {
	t.Parallel()
	tests := []struct {
		kind     string
		code     int64
		want     int64
		severity string
	}{
		{gpuhealth.KindRowRemapPending, 0, 0, gpuhealth.SeverityError},
		{gpuhealth.KindRowRemapFailed, 0, 0, gpuhealth.SeverityCritical},
		{gpuhealth.KindECCUncorrectable, 3, 3, gpuhealth.SeverityError},
		{gpuhealth.KindRetiredPages, 0, 60, gpuhealth.SeverityError},
		{gpuhealth.KindRetiredPages, 75, 75, gpuhealth.SeverityError},
		{gpuhealth.KindNVLinkDown, 2, 2, gpuhealth.SeverityError},
		{gpuhealth.KindNVLinkDegraded, 4, 4, gpuhealth.SeverityWarning},
		{gpuhealth.KindPCIeDegraded, 8, 8, gpuhealth.SeverityWarning},
		{gpuhealth.KindThrottle, 0x80, 0x80, gpuhealth.SeverityWarning},
		{gpuhealth.KindThrottle, 0x1, 0x40, gpuhealth.SeverityWarning}, // idle is no throttle: a typical one instead
		{gpuhealth.KindLost, 0, 0, gpuhealth.SeverityCritical},
	}
	covered := map[string]bool{gpuhealth.KindXID: true}
	for _, tt := range tests {
		covered[tt.kind] = true
		t.Run(tt.kind, func(t *testing.T) {
			t.Parallel()
			b, err := New(Options{Model: "dgxh100", Seed: "health-" + tt.kind})
			require.NoError(t, err)
			t.Cleanup(func() { _ = b.Close() })
			ctx := context.Background()
			got, err := b.Findings(ctx)
			require.NoError(t, err)
			require.Empty(t, got, "a fresh machine is healthy")

			b.InjectFinding(tt.kind, 5, tt.code)
			got, err = b.Findings(ctx)
			require.NoError(t, err)
			require.Len(t, got, 1, "%v", got)
			f := got[0]
			require.Equal(t, tt.kind, f.GetKind())
			require.Equal(t, tt.want, f.GetCode())
			require.Equal(t, b.Identity().GetGpuUuids()[5], f.GetDevice())
			require.NotNil(t, f.GpuIndex)
			require.EqualValues(t, 5, f.GetGpuIndex())
			require.Equal(t, tt.severity, f.GetSeverity())
			require.NotEmpty(t, f.GetMessage())
			if tt.kind != gpuhealth.KindLost && tt.kind != gpuhealth.KindRowRemapFailed {
				got, err = b.Findings(ctx)
				require.NoError(t, err)
				require.Len(t, got, 1, "a standing finding stays while it is there")
			}

			b.ClearFinding(tt.kind, 5)
			got, err = b.Findings(ctx)
			require.NoError(t, err)
			require.Empty(t, got)
		})
	}
	for _, k := range gpuhealth.Kinds {
		require.True(t, covered[k], "kind %s is not tested", k)
	}
}

// A reset clears what a reset clears (pending remaps, volatile ECC), not
// a failed remap; a reboot clears everything but a failed remap.
func TestResetAndReboot(t *testing.T) {
	t.Parallel()
	b, err := New(Options{Model: "dgxa100", Seed: "reset"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	ctx := context.Background()
	uuid := b.Identity().GetGpuUuids()[1]
	b.InjectFinding(gpuhealth.KindRowRemapPending, 1, 0)
	b.InjectFinding(gpuhealth.KindECCUncorrectable, 1, 2)
	b.InjectFinding(gpuhealth.KindRowRemapFailed, 1, 0)
	b.InjectFinding(gpuhealth.KindThrottle, 2, 0)
	require.NoError(t, b.ResetGPU(ctx, uuid))
	kinds := func() []string {
		got, err := b.Findings(ctx)
		require.NoError(t, err)
		var ks []string
		for _, f := range got {
			ks = append(ks, f.GetKind())
		}
		return ks
	}
	require.Equal(t, []string{gpuhealth.KindRowRemapFailed, gpuhealth.KindThrottle}, kinds())
	require.Error(t, b.ResetGPU(ctx, "GPU-not-here"))

	b.InjectFinding(gpuhealth.KindLost, 3, 0)
	require.Error(t, b.ResetGPU(ctx, b.Identity().GetGpuUuids()[3]), "a lost GPU does not come back with a reset")
	b.Reboot()
	require.Equal(t, []string{gpuhealth.KindRowRemapFailed}, kinds())
}

// An XID raised on a GPU reaches the watch with the GPU, the code and the
// process running on it; one raised before any watch waits for it.
func TestInjectXID(t *testing.T) {
	t.Parallel()
	b, err := New(Options{Model: "dgxh100", Seed: "xid"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	b.InjectXID(6, 48, 0) // before the watch
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan *agentv1.HealthEvent, 4)
	done := make(chan error, 1)
	go func() { done <- b.WatchXIDs(ctx, func(ev *agentv1.HealthEvent) { got <- ev }) }()
	next := func() *agentv1.HealthEvent {
		select {
		case ev := <-got:
			return ev
		case <-time.After(10 * time.Second):
			t.Fatal("no XID")
			return nil
		}
	}
	ev := next()
	require.EqualValues(t, 48, ev.GetCode())
	require.EqualValues(t, 6, ev.GetGpuIndex())
	require.Zero(t, ev.GetPid())
	b.InjectXID(2, 79, int64(os.Getpid()))
	ev = next()
	require.Equal(t, gpuhealth.KindXID, ev.GetKind())
	require.Equal(t, b.Identity().GetGpuUuids()[2], ev.GetDevice())
	require.EqualValues(t, 79, ev.GetCode())
	require.EqualValues(t, 2, ev.GetGpuIndex())
	require.EqualValues(t, os.Getpid(), ev.GetPid())
	require.NotEmpty(t, ev.GetProcessName())
	require.NotNil(t, ev.GetTime())
	cancel()
	require.NoError(t, <-done)
}
