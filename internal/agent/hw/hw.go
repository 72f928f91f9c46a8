// Package hw defines what bcd needs from a GPU hardware backend. The real
// backend (hw/nvml) and the fake one (hw/fake) read GPUs through the same
// code, so a fake daemon reports exactly what the real reader would make of
// the mock's answers.
//
// It must never touch the host's CPUs or memory: those come from sysfs.
package hw

import (
	"context"
	"errors"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
)

// Backend reads the node's GPUs.
type Backend interface {
	Inventory(ctx context.Context) (*agentv1.GpuInventory, error)
	Close() error
}

// IdentitySource is implemented by backends that impersonate a whole machine
// (the fake), so that many fake daemons on one host each present their own
// DMI identity and MAC addresses instead of the host's.
type IdentitySource interface {
	Identity() *agentv1.HardwareIdentity
}

// TelemetrySource is implemented by backends that read their GPUs' live
// state (utilization, memory in use, temperature, power, ECC counts). A
// reading a device does not support is left unset. bcd exports it on its
// /metrics and sends it with each heartbeat.
type TelemetrySource interface {
	Telemetry(ctx context.Context) ([]*agentv1.GpuTelemetry, error)
}

// MIGConfigurer is implemented by backends that can repartition a GPU:
// ConfigureMIG enables MIG mode on the GPU if it is off, destroys its GPU
// and compute instances and creates one GPU instance (with one compute
// instance filling it) per profile, in order ("3g.40gb", "2g.20gb", ...).
// It refuses with ErrGPUBusy while any process runs on the GPU or one of
// its instances, and leaves the layout as it was when it refuses a profile.
type MIGConfigurer interface {
	ConfigureMIG(ctx context.Context, uuid string, profiles []string) error
}

var (
	// ErrGPUBusy is a MIG change refused because the GPU is in use.
	ErrGPUBusy = errors.New("the GPU is in use")
	// ErrNoGPU is a MIG change for a GPU the node does not have.
	ErrNoGPU = errors.New("no such GPU on this node")
	// ErrMIGLayout is a MIG change the GPU cannot hold (an unknown
	// profile, or profiles that do not fit together).
	ErrMIGLayout = errors.New("the GPU cannot hold this MIG layout")
)

// HealthSource is implemented by backends that read their GPUs' health
// findings (kinds in internal/gpuhealth).
//
// Findings is the whole standing set as of now (row remaps, uncorrectable
// ECC, retired pages, NVLink, PCIe width, throttling, lost GPUs); a reading
// a device does not support yields no finding, never an error. WatchXIDs
// calls report with each XID the driver raises until ctx ends; it returns
// early only when the backend cannot watch at all.
type HealthSource interface {
	Findings(ctx context.Context) ([]*agentv1.HealthEvent, error)
	WatchXIDs(ctx context.Context, report func(*agentv1.HealthEvent)) error
}

// GPUResetter is implemented by backends that can reset one GPU (what
// clears pending row remaps and volatile ECC counts). The caller makes sure
// nothing uses the GPU.
type GPUResetter interface {
	ResetGPU(ctx context.Context, uuid string) error
}
