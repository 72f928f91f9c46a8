package hw

import (
	"cmp"
	"fmt"
	"slices"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/gpuhealth"
)

// Finding is the standing finding of kind with code on the GPU at index:
// its severity is the default policy's (critical for a lost GPU or a failed
// remap, error for what takes the GPU out, warning for what only degrades
// it) and its message says what the code means. Every backend builds its
// findings here, so that the real reader and the fake say the same.
func Finding(kind, uuid string, index int, code int64) *agentv1.HealthEvent {
	i := int32(index)
	return &agentv1.HealthEvent{
		Kind: kind, Device: uuid, Code: code, GpuIndex: &i,
		Severity: gpuhealth.Severity(gpuhealth.Action(nil, kind, code)),
		Message:  findingMessage(kind, code),
	}
}

func findingMessage(kind string, code int64) string {
	switch kind {
	case gpuhealth.KindRowRemapPending:
		return "rows are pending remap: reset the GPU"
	case gpuhealth.KindRowRemapFailed:
		return "a row remap failed: the GPU needs replacing"
	case gpuhealth.KindECCUncorrectable:
		return fmt.Sprintf("%d uncorrectable ECC errors since the driver loaded", code)
	case gpuhealth.KindRetiredPages:
		return fmt.Sprintf("%d memory pages retired", code)
	case gpuhealth.KindNVLinkDown:
		return fmt.Sprintf("NVLink %d went down", code)
	case gpuhealth.KindNVLinkDegraded:
		return fmt.Sprintf("NVLink %d counts replay, recovery or CRC errors", code)
	case gpuhealth.KindPCIeDegraded:
		return fmt.Sprintf("PCIe link trained at x%d, below its maximum width", code)
	case gpuhealth.KindThrottle:
		return fmt.Sprintf("clocks slowed for thermal or power-brake reasons (NVML reasons 0x%x)", code)
	case gpuhealth.KindLost:
		return "the GPU has fallen off the bus"
	}
	return gpuhealth.Describe(kind, code)
}

// SortFindings puts findings in their canonical order: by GPU index, then
// kind in gpuhealth.Kinds order, then code.
func SortFindings(fs []*agentv1.HealthEvent) {
	slices.SortStableFunc(fs, func(a, b *agentv1.HealthEvent) int {
		return cmp.Or(
			cmp.Compare(a.GetGpuIndex(), b.GetGpuIndex()),
			cmp.Compare(slices.Index(gpuhealth.Kinds, a.GetKind()), slices.Index(gpuhealth.Kinds, b.GetKind())),
			cmp.Compare(a.GetCode(), b.GetCode()),
			cmp.Compare(a.GetDevice(), b.GetDevice()),
		)
	})
}
