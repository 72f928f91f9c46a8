//go:build cgo

package fake

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	nvmlbackend "github.com/better-compute/better-compute/internal/agent/hw/nvml"
)

var mockServers = map[string]func() *server.Server{
	"dgxh100": dgxh100.New,
	"dgxa100": dgxa100.New,
	"dgxb200": dgxb200.New,
}

func open(opts Options) (*Backend, error) { return fromMock(opts) }

// fromMock builds the mock server for opts.Model, applies the seed and
// topology, and opens it through the NVML reader.
func fromMock(opts Options) (*Backend, error) {
	srv := mockServers[opts.Model]()
	m, err := layout(opts, len(srv.Devices))
	if err != nil {
		return nil, err
	}
	devs := make([]*server.Device, len(srv.Devices))
	for i, d := range srv.Devices {
		devs[i] = d.(*server.Device)
	}
	for i, d := range devs {
		d.UUID = m.uuids[i]
		d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			p := nvml.PciInfo{PciDeviceId: d.Config.PciDeviceId}
			nvmlbackend.SetBusID(&p.BusId, d.PciBusID)
			return p, nvml.SUCCESS
		}
		d.GetNumaNodeIdFunc = func() (int, nvml.Return) { return m.numa[i], nvml.SUCCESS }
		links := m.peers[i]
		d.GetNvLinkRemotePciInfoFunc = func(link int) (nvml.PciInfo, nvml.Return) {
			if link >= len(links) {
				return nvml.PciInfo{}, nvml.ERROR_NOT_SUPPORTED
			}
			var p nvml.PciInfo
			nvmlbackend.SetBusID(&p.BusId, devs[links[link]].PciBusID)
			return p, nvml.SUCCESS
		}
	}
	f := newFaults(len(devs))
	events := &mockEvents{devs: devs, faults: f}
	wireHealth(srv, devs, m.peers, f, events)
	b, err := nvmlbackend.FromInterface(srv)
	if err != nil {
		return nil, fmt.Errorf("open the %s mock: %w", opts.Model, err)
	}
	baseline(b)
	return &Backend{Backend: b, identity: m.identity(opts), faults: f, health: mockHealth{Backend: b, events: events}}, nil
}
