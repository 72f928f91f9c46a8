// Package gpuhealth holds what the gateway, the health module and bcd agree
// a GPU health finding means: its kinds, severities and the actions a
// pool's policy takes, so that the control plane's quarantine and the
// node's own (its kubelet stops getting the GPU) follow one list.
package gpuhealth

import (
	"fmt"
	"sort"
)

// Finding kinds. An XID is an event (it happened once); the others are
// standing findings bcd reads from the driver on every poll and that stay
// open until a complete report no longer carries them.
const (
	// KindXID: device the GPU's UUID, code the XID.
	KindXID = "gpu.xid"
	// KindRowRemapPending: rows are waiting for a GPU reset to be remapped.
	KindRowRemapPending = "gpu.row_remap_pending"
	// KindRowRemapFailed: a row remap failed; the GPU needs RMA.
	KindRowRemapFailed = "gpu.row_remap_failed"
	// KindECCUncorrectable: code is the volatile uncorrectable count.
	KindECCUncorrectable = "gpu.ecc_uncorrectable"
	// KindRetiredPages: code is the retired page count, over the threshold.
	KindRetiredPages = "gpu.retired_pages"
	// KindNVLinkDown: code is the link number.
	KindNVLinkDown = "gpu.nvlink_down"
	// KindNVLinkDegraded: a link counts replay/recovery/CRC errors.
	KindNVLinkDegraded = "gpu.nvlink_degraded"
	// KindPCIeDegraded: the link trained below its maximum width or
	// generation.
	KindPCIeDegraded = "gpu.pcie_degraded"
	// KindThrottle: code is NVML's clock event reasons (thermal or power
	// brake bits only).
	KindThrottle = "gpu.throttle"
	// KindLost: the GPU has fallen off the bus.
	KindLost = "gpu.lost"
	// KindQuarantine is an operator's quarantine (gpus quarantine).
	KindQuarantine = "gpu.quarantine"
)

// Kinds lists every finding kind bcd reports.
var Kinds = []string{KindXID, KindRowRemapPending, KindRowRemapFailed, KindECCUncorrectable, KindRetiredPages,
	KindNVLinkDown, KindNVLinkDegraded, KindPCIeDegraded, KindThrottle, KindLost}

// Severities, most severe first.
const (
	SeverityCritical = "critical"
	SeverityError    = "error"
	SeverityWarning  = "warning"
	SeverityInfo     = "info"
)

// SeverityRank orders severities: higher is worse; 0 is unknown.
func SeverityRank(s string) int {
	switch s {
	case SeverityCritical:
		return 4
	case SeverityError:
		return 3
	case SeverityWarning:
		return 2
	case SeverityInfo:
		return 1
	}
	return 0
}

// Actions a policy takes on a finding.
const (
	// ActionRecord only records the finding.
	ActionRecord = "record"
	// ActionQuarantine takes the GPU out of placement; the node stays
	// schedulable.
	ActionQuarantine = "quarantine"
	// ActionRMA quarantines the GPU and marks it for return.
	ActionRMA = "rma"
	// ActionReset quarantines the GPU, drains its node and resets the GPU.
	ActionReset = "reset"
	// ActionReboot quarantines the GPU, drains its node and reboots it.
	ActionReboot = "reboot"
)

// ValidAction reports whether a is an action a policy may name.
func ValidAction(a string) bool {
	switch a {
	case ActionRecord, ActionQuarantine, ActionRMA, ActionReset, ActionReboot:
		return true
	}
	return false
}

// Remediates reports whether an action needs a drain and a workflow.
func Remediates(action string) bool { return action == ActionReset || action == ActionReboot }

// TakesGPUOut reports whether an action takes the GPU out of placement.
func TakesGPUOut(action string) bool { return action != ActionRecord && action != "" }

// defaultXIDActions are the seed's defaults (NVIDIA's XID catalogue: 48
// double-bit ECC, 63 row remap pending, 64 row remap failure, 79 fallen off
// the bus, 95 uncontained ECC).
var defaultXIDActions = map[int64]string{48: ActionQuarantine, 63: ActionReset, 64: ActionRMA, 79: ActionReboot, 95: ActionReboot}

// DefaultXIDActions returns a copy of the default action per XID.
func DefaultXIDActions() map[int64]string {
	out := make(map[int64]string, len(defaultXIDActions))
	for k, v := range defaultXIDActions {
		out[k] = v
	}
	return out
}

// defaultKindActions are the standing findings' actions: a lost GPU or a
// failed remap is hardware; pending remaps clear with a reset; the rest
// degrade a GPU without stopping it and are recorded.
var defaultKindActions = map[string]string{
	KindRowRemapPending:  ActionReset,
	KindRowRemapFailed:   ActionRMA,
	KindECCUncorrectable: ActionQuarantine,
	KindRetiredPages:     ActionQuarantine,
	KindNVLinkDown:       ActionQuarantine,
	KindNVLinkDegraded:   ActionRecord,
	KindPCIeDegraded:     ActionRecord,
	KindThrottle:         ActionRecord,
	KindLost:             ActionReboot,
	KindQuarantine:       ActionQuarantine,
}

// Action is what a finding of kind with code does under a pool's XID
// overrides (nil takes the defaults).
func Action(xidActions map[int64]string, kind string, code int64) string {
	if kind == KindXID {
		if a, ok := xidActions[code]; ok && ValidAction(a) {
			return a
		}
		if a, ok := defaultXIDActions[code]; ok {
			return a
		}
		return ActionRecord
	}
	if a, ok := defaultKindActions[kind]; ok {
		return a
	}
	return ActionRecord
}

// Severity is a finding's severity when bcd gave none: from the action it
// takes.
func Severity(action string) string {
	switch action {
	case ActionReboot, ActionRMA:
		return SeverityCritical
	case ActionReset, ActionQuarantine:
		return SeverityError
	case ActionRecord:
		return SeverityWarning
	}
	return SeverityInfo
}

// Quarantines reports whether an event of kind on device with code takes
// the GPU out of service under the default policy (bcd's own view, for its
// kubelet).
func Quarantines(kind, device string, code int64) bool {
	return device != "" && TakesGPUOut(Action(nil, kind, code))
}

// Describe is a short text for a finding, for events and the CLI.
func Describe(kind string, code int64) string {
	switch kind {
	case KindXID:
		return fmt.Sprintf("XID %d", code)
	case KindNVLinkDown, KindNVLinkDegraded:
		return fmt.Sprintf("%s (link %d)", kind, code)
	}
	return kind
}

// SortedXIDs returns the codes of m in order (for stable output).
func SortedXIDs(m map[int64]string) []int64 {
	out := make([]int64, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
