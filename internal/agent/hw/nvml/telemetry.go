//go:build cgo

package nvml

import (
	"context"
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent/hw"
)

var _ hw.TelemetrySource = (*Backend)(nil)

// Telemetry reads every GPU's live state.
func (b *Backend) Telemetry(ctx context.Context) ([]*agentv1.GpuTelemetry, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.lib == nil {
		return nil, errors.New("nvml backend closed")
	}
	return ReadTelemetry(ctx, b.lib)
}

// ReadTelemetry reads each GPU's utilization, memory in use, temperature,
// power draw and volatile ECC counts through lib, which must be
// initialised. A reading the device does not support (NOT_SUPPORTED, or a
// mock without the call) is left unset; only a GPU that cannot be named
// fails the read.
func ReadTelemetry(ctx context.Context, lib nvml.Interface) ([]*agentv1.GpuTelemetry, error) {
	n, ret := lib.DeviceGetCount()
	if err := check("device count", ret); err != nil {
		return nil, err
	}
	out := make([]*agentv1.GpuTelemetry, 0, n)
	for i := range n {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		d, ret := lib.DeviceGetHandleByIndex(i)
		if err := check(fmt.Sprintf("device %d", i), ret); err != nil {
			return nil, err
		}
		uuid, ret := d.GetUUID()
		if err := check(fmt.Sprintf("device %d uuid", i), ret); err != nil {
			return nil, err
		}
		out = append(out, readTelemetry(d, uuid, i))
	}
	return out, nil
}

func readTelemetry(d nvml.Device, uuid string, index int) *agentv1.GpuTelemetry {
	t := &agentv1.GpuTelemetry{Uuid: uuid, Index: int32(index)}
	try(func() {
		if u, ret := d.GetUtilizationRates(); ret == nvml.SUCCESS {
			t.UtilizationPercent = proto.Float64(float64(min(u.Gpu, 100)))
		}
	})
	try(func() {
		if m, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS && m.Used <= m.Total {
			t.MemoryUsedBytes, t.MemoryTotalBytes = proto.Uint64(m.Used), proto.Uint64(m.Total)
		}
	})
	try(func() {
		if c, ret := d.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
			t.TemperatureCelsius = proto.Float64(float64(c))
		}
	})
	try(func() {
		if mw, ret := d.GetPowerUsage(); ret == nvml.SUCCESS {
			t.PowerWatts = proto.Float64(float64(mw) / 1000)
		}
	})
	try(func() {
		if n, ret := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC); ret == nvml.SUCCESS {
			t.EccCorrectedTotal = proto.Uint64(n)
		}
	})
	try(func() {
		if n, ret := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); ret == nvml.SUCCESS {
			t.EccUncorrectedTotal = proto.Uint64(n)
		}
	})
	return t
}

// try runs one reading; go-nvml's mocks panic on a call they were not given,
// which for telemetry means "not supported".
func try(read func()) {
	defer func() { _ = recover() }()
	read()
}
