package agent

import (
	"testing"

	"github.com/stretchr/testify/require"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent/hw"
	"github.com/better-compute/better-compute/internal/gpuhealth"
)

// More findings than a report carries go most severe first, and the report
// does not claim the set complete (the control plane would clear the rest).
func TestStatusFindingsOverTheBound(t *testing.T) {
	t.Parallel()
	var list []*agentv1.HealthEvent
	for gpu := range 8 {
		for link := range 9 {
			list = append(list, hw.Finding(gpuhealth.KindNVLinkDegraded, "GPU-x", gpu, int64(link)))
		}
	}
	list = append(list, hw.Finding(gpuhealth.KindLost, "GPU-y", 9, 0))
	a := &Agent{findings: findingState{polled: true, list: list}}
	r := &agentv1.StatusReport{Health: "ok"}
	a.statusFindingsLocked(r)
	require.Len(t, r.GetFindings(), MaxReportedFindings)
	require.False(t, r.GetFindingsComplete())
	require.Equal(t, gpuhealth.KindLost, r.GetFindings()[0].GetKind(), "the critical one is kept")
	require.Equal(t, "degraded", r.GetHealth())

	a.findings.list = list[:3]
	r = &agentv1.StatusReport{Health: "ok"}
	a.statusFindingsLocked(r)
	require.Len(t, r.GetFindings(), 3)
	require.True(t, r.GetFindingsComplete())
}
