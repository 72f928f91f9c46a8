//go:build cgo

// Package nvml is the GPU backend over NVIDIA's NVML. Reading is written once
// against nvml.Interface: New loads the real libnvidia-ml at run time (so
// bcd starts on hosts without GPUs and fails with a clear error only when
// asked for them), and hw/fake passes go-nvml's mock servers to FromInterface.
//
// go-nvml needs cgo, so this backend is built only with cgo; a cgo-free bcd
// (CGO_ENABLED=0) refuses --hardware nvml with ErrUnavailable (nocgo.go).
//
// It must never change device state (clocks, persistence, MIG mode) except
// through ConfigureMIG (mig.go), which the control plane asks for with
// gpu.mig.configure and which refuses a GPU in use.
package nvml

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent/hw"
)

// ErrUnavailable is returned when NVML cannot be loaded or initialised.
var ErrUnavailable = errors.New("nvml unavailable")

// Backend reads GPUs through an nvml.Interface.
type Backend struct {
	mu  sync.Mutex
	lib nvml.Interface
	// findings is what the health poll remembers between polls.
	findings FindingState
	// closed is set and closing closed when Close begins; watchers are
	// the XID watches Close waits for before it shuts NVML down.
	closed   bool
	closing  chan struct{}
	watchers sync.WaitGroup
}

var _ hw.Backend = (*Backend)(nil)

// New loads libnvidia-ml and initialises it.
func New() (*Backend, error) {
	return FromInterface(nvml.New())
}

// FromInterface initialises lib and reads GPUs through it.
func FromInterface(lib nvml.Interface) (b *Backend, err error) {
	defer func() {
		// Loading a missing shared library panics in some go-nvml paths;
		// the caller gets an error it can show instead.
		if r := recover(); r != nil {
			b, err = nil, fmt.Errorf("%w: %v", ErrUnavailable, r)
		}
	}()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: init: %s (is the NVIDIA driver installed and libnvidia-ml.so.1 on the library path?)", ErrUnavailable, nvml.ErrorString(ret))
	}
	return &Backend{lib: lib, closing: make(chan struct{})}, nil
}

// Close shuts NVML down.
func (b *Backend) Close() error {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		close(b.closing)
	}
	b.mu.Unlock()
	b.watchers.Wait()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.lib == nil {
		return nil
	}
	ret := b.lib.Shutdown()
	b.lib = nil
	if ret != nvml.SUCCESS {
		return fmt.Errorf("nvml shutdown: %s", nvml.ErrorString(ret))
	}
	return nil
}

// Inventory reads every GPU, its MIG instances and its NVLink peers.
func (b *Backend) Inventory(ctx context.Context) (*agentv1.GpuInventory, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.lib == nil {
		return nil, errors.New("nvml backend closed")
	}
	return Read(ctx, b.lib)
}

func check(what string, ret nvml.Return) error {
	if ret == nvml.SUCCESS {
		return nil
	}
	return fmt.Errorf("nvml %s: %s", what, nvml.ErrorString(ret))
}

// Read reads the inventory through lib, which must be initialised.
func Read(ctx context.Context, lib nvml.Interface) (*agentv1.GpuInventory, error) {
	inv := &agentv1.GpuInventory{}
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		inv.DriverVersion = v
	}
	if v, ret := lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		inv.CudaVersion = fmt.Sprintf("%d.%d", v/1000, (v%1000)/10)
	}
	n, ret := lib.DeviceGetCount()
	if err := check("device count", ret); err != nil {
		return nil, err
	}
	devices := make([]nvml.Device, 0, n)
	byBus := map[string]string{}
	for i := range n {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		d, ret := lib.DeviceGetHandleByIndex(i)
		if err := check(fmt.Sprintf("device %d", i), ret); err != nil {
			return nil, err
		}
		g, err := readGPU(d, i)
		if err != nil {
			return nil, err
		}
		devices = append(devices, d)
		inv.Gpus = append(inv.Gpus, g)
		if g.PciBusId != "" {
			byBus[normBus(g.PciBusId)] = g.Uuid
		}
	}
	for i, d := range devices {
		inv.Nvlinks = append(inv.Nvlinks, readLinks(d, inv.Gpus[i].Uuid, byBus)...)
	}
	return inv, nil
}

func readGPU(d nvml.Device, index int) (*agentv1.Gpu, error) {
	g := &agentv1.Gpu{Index: int32(index), NumaNode: -1, MigMode: "disabled"}
	var ret nvml.Return
	if g.Uuid, ret = d.GetUUID(); ret != nvml.SUCCESS {
		return nil, check(fmt.Sprintf("device %d uuid", index), ret)
	}
	if g.Model, ret = d.GetName(); ret != nvml.SUCCESS {
		return nil, check(fmt.Sprintf("device %d name", index), ret)
	}
	if m, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
		g.MemoryMib = m.Total / (1024 * 1024)
	}
	if p, ret := d.GetPciInfo(); ret == nvml.SUCCESS {
		g.PciBusId = cString(p.BusId[:])
	}
	if numa, ret := safeNuma(d); ret == nvml.SUCCESS {
		g.NumaNode = int32(numa)
	}
	if minor, ret := safeMinor(d); ret == nvml.SUCCESS && minor >= 0 {
		// /dev/nvidiaN: what bcd's device filter lets an allocation open.
		g.MinorNumber = proto.Int32(int32(minor))
	}
	if cur, pending, ret := d.GetMigMode(); ret == nvml.SUCCESS {
		switch {
		case cur != pending:
			g.MigMode = "pending"
		case cur == nvml.DEVICE_MIG_ENABLE:
			g.MigMode = "enabled"
			g.MigInstances = readMIG(d)
		}
	}
	return g, nil
}

// safeNuma asks for the GPU's NUMA node; drivers before R535 and mocks
// without the call do not know it.
func safeNuma(d nvml.Device) (n int, ret nvml.Return) {
	defer func() {
		if recover() != nil {
			n, ret = -1, nvml.ERROR_NOT_SUPPORTED
		}
	}()
	return d.GetNumaNodeId()
}

// safeMinor asks for the minor number of the GPU's /dev/nvidiaN; a mock
// without the call does not know it.
func safeMinor(d nvml.Device) (n int, ret nvml.Return) {
	defer func() {
		if recover() != nil {
			n, ret = -1, nvml.ERROR_NOT_SUPPORTED
		}
	}()
	return d.GetMinorNumber()
}

func readMIG(d nvml.Device) []*agentv1.MigInstance {
	var out []*agentv1.MigInstance
	for p := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := d.GetGpuInstanceProfileInfo(p)
		if ret != nvml.SUCCESS {
			continue
		}
		gis, ret := d.GetGpuInstances(&info)
		if ret != nvml.SUCCESS {
			continue
		}
		for _, gi := range gis {
			gii, ret := gi.GetInfo()
			if ret != nvml.SUCCESS {
				continue
			}
			out = append(out, &agentv1.MigInstance{
				Profile:       fmt.Sprintf("%dg.%dgb", info.SliceCount, (info.MemorySizeMB+1023)/1024),
				GpuInstanceId: gii.Id,
				MemoryMib:     info.MemorySizeMB,
			})
		}
	}
	return out
}

// readLinks lists active NVLinks whose remote end is another GPU of this
// node; links to NVSwitches are not peers.
func readLinks(d nvml.Device, uuid string, byBus map[string]string) (links []*agentv1.NvLink) {
	defer func() {
		if recover() != nil {
			links = nil // the device (or mock) has no NVLink calls
		}
	}()
	for l := range nvml.NVLINK_MAX_LINKS {
		state, ret := d.GetNvLinkState(l)
		if ret != nvml.SUCCESS {
			if ret == nvml.ERROR_INVALID_ARGUMENT || ret == nvml.ERROR_NOT_SUPPORTED {
				break
			}
			continue
		}
		if state != nvml.FEATURE_ENABLED {
			continue
		}
		pci, ret := d.GetNvLinkRemotePciInfo(l)
		if ret != nvml.SUCCESS {
			continue
		}
		peer, ok := byBus[normBus(cString(pci.BusId[:]))]
		if !ok || peer == uuid {
			continue
		}
		links = append(links, &agentv1.NvLink{GpuUuid: uuid, PeerUuid: peer, Link: int32(l)})
	}
	return links
}

func cString(b []int8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}

// normBus folds the 8- and 4-digit PCI domain spellings together.
func normBus(s string) string {
	s = strings.ToLower(s)
	if len(s) == len("00000000:00:00.0") {
		s = s[4:]
	}
	return s
}

// SetBusID stores s in an NVML PciInfo bus id field.
func SetBusID(dst *[32]int8, s string) {
	for i := range dst {
		dst[i] = 0
	}
	for i := 0; i < len(s) && i < len(dst)-1; i++ {
		dst[i] = int8(s[i])
	}
}
