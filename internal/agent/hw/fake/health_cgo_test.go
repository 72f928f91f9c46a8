//go:build cgo

package fake

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/better-compute/better-compute/internal/gpuhealth"
)

// The cgo-free fake finds what the NVML reader finds on the mock, for the
// same injected state.
func TestFindingsMockEqualsSnapshot(t *testing.T) {
	t.Parallel()
	opts := Options{Model: "dgxh100", Seed: "equal"}
	m, err := fromMock(opts)
	require.NoError(t, err)
	s, err := fromSnapshot(opts)
	require.NoError(t, err)
	steps := []func(b *Backend){
		func(b *Backend) {
			b.InjectFinding(gpuhealth.KindRowRemapPending, 0, 0)
			b.InjectFinding(gpuhealth.KindRowRemapFailed, 0, 0)
			b.InjectFinding(gpuhealth.KindECCUncorrectable, 0, 9)
			b.InjectFinding(gpuhealth.KindRetiredPages, 1, 59) // below the threshold: none
			b.InjectFinding(gpuhealth.KindRetiredPages, 2, 61)
			b.InjectFinding(gpuhealth.KindNVLinkDown, 3, 1)
			b.InjectFinding(gpuhealth.KindNVLinkDegraded, 3, 1) // the link is down: not degraded
			b.InjectFinding(gpuhealth.KindNVLinkDegraded, 4, 6)
			b.InjectFinding(gpuhealth.KindNVLinkDown, 4, 12) // never up: not down
			b.InjectFinding(gpuhealth.KindPCIeDegraded, 5, 4)
			b.InjectFinding(gpuhealth.KindThrottle, 6, 0xff)
			b.InjectFinding(gpuhealth.KindLost, 7, 0)
			b.InjectFinding(gpuhealth.KindThrottle, 7, 0) // lost hides the rest
		},
		func(b *Backend) { require.NoError(t, b.ResetGPU(context.Background(), b.Identity().GetGpuUuids()[0])) },
		func(b *Backend) { b.Reboot() },
	}
	for i, step := range steps {
		step(m)
		step(s)
		mf, err := m.Findings(context.Background())
		require.NoError(t, err)
		sf, err := s.Findings(context.Background())
		require.NoError(t, err)
		require.Len(t, sf, len(mf), "step %d:\nmock:     %v\nsnapshot: %v", i, mf, sf)
		for j := range mf {
			require.True(t, proto.Equal(mf[j], sf[j]), "step %d finding %d:\nmock:     %v\nsnapshot: %v", i, j, mf[j], sf[j])
		}
		if i == 0 {
			require.Len(t, mf, 9)
		}
	}
}
