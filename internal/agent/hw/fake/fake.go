// Package fake is a GPU backend for tests and simulations built on go-nvml's
// own mock servers (dgxh100, dgxa100, dgxb200). It is read through the same
// code as the real NVML backend (hw/nvml.Read); what the mocks lack — NVLink
// peers across the HGX board and each GPU's NUMA node — comes from a small
// topology fixture. A seed makes GPU UUIDs and the machine identity unique,
// so that many fake daemons on one host look like distinct machines.
//
// It must never load the real NVML library.
package fake

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent/hw"
	nvmlbackend "github.com/better-compute/better-compute/internal/agent/hw/nvml"
)

// Models are the machines the fake can be.
var Models = map[string]struct {
	New         func() *server.Server
	ProductName string
}{
	"dgxh100": {dgxh100.New, "DGXH100"},
	"dgxa100": {dgxa100.New, "DGXA100"},
	"dgxb200": {dgxb200.New, "DGXB200"},
}

// Topology is what the mocks do not model. A zero Topology means the HGX
// default: every GPU NVLinked to every other, the first half of the GPUs on
// NUMA node 0 and the second half on node 1.
type Topology struct {
	// NUMA gives each GPU's NUMA node by index.
	NUMA []int `json:"numa"`
	// NVLinks lists peer pairs by GPU index; empty means all-to-all.
	NVLinks [][2]int `json:"nvlinks"`
}

// LoadTopology reads a Topology fixture (JSON).
func LoadTopology(path string) (Topology, error) {
	var t Topology
	b, err := os.ReadFile(path)
	if err != nil {
		return t, fmt.Errorf("read topology fixture: %w", err)
	}
	if err := json.Unmarshal(b, &t); err != nil {
		return t, fmt.Errorf("parse topology fixture %s: %w", path, err)
	}
	return t, nil
}

// Options configure a fake machine.
type Options struct {
	// Model is one of Models' keys.
	Model string
	// Seed makes the identity unique; fake daemons sharing a seed are the
	// same machine.
	Seed string
	// Topology overrides the HGX default.
	Topology Topology
}

// Backend is a fake GPU machine.
type Backend struct {
	*nvmlbackend.Backend
	identity *agentv1.HardwareIdentity
}

var (
	_ hw.Backend        = (*Backend)(nil)
	_ hw.IdentitySource = (*Backend)(nil)
)

// New builds the mock server for opts.Model, applies the seed and topology,
// and opens it through the NVML reader.
func New(opts Options) (*Backend, error) {
	m, ok := Models[opts.Model]
	if !ok {
		return nil, fmt.Errorf("unknown fake model %q (want dgxh100, dgxa100 or dgxb200)", opts.Model)
	}
	srv := m.New()
	n := len(srv.Devices)
	numa := opts.Topology.NUMA
	if len(numa) == 0 {
		numa = make([]int, n)
		for i := range numa {
			numa[i] = i * 2 / n
		}
	}
	if len(numa) != n {
		return nil, fmt.Errorf("topology fixture gives %d NUMA nodes for %d GPUs", len(numa), n)
	}
	peers := make([][]int, n)
	if len(opts.Topology.NVLinks) == 0 {
		for i := range n {
			for j := range n {
				if i != j {
					peers[i] = append(peers[i], j)
				}
			}
		}
	} else {
		for _, p := range opts.Topology.NVLinks {
			if p[0] < 0 || p[1] < 0 || p[0] >= n || p[1] >= n || p[0] == p[1] {
				return nil, fmt.Errorf("topology fixture: bad nvlink pair %v", p)
			}
			peers[p[0]] = append(peers[p[0]], p[1])
			peers[p[1]] = append(peers[p[1]], p[0])
		}
	}
	devs := make([]*server.Device, n)
	for i, d := range srv.Devices {
		devs[i] = d.(*server.Device)
	}
	for i, d := range devs {
		d.UUID = "GPU-" + uuidFrom(opts.Seed, opts.Model, "gpu", fmt.Sprint(i))
		d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			p := nvml.PciInfo{PciDeviceId: d.Config.PciDeviceId}
			nvmlbackend.SetBusID(&p.BusId, d.PciBusID)
			return p, nvml.SUCCESS
		}
		d.GetNumaNodeIdFunc = func() (int, nvml.Return) { return numa[i], nvml.SUCCESS }
		links := peers[i]
		d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
			if link >= nvml.NVLINK_MAX_LINKS {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			if link < len(links) {
				return nvml.FEATURE_ENABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_DISABLED, nvml.SUCCESS
		}
		d.GetNvLinkRemotePciInfoFunc = func(link int) (nvml.PciInfo, nvml.Return) {
			if link >= len(links) {
				return nvml.PciInfo{}, nvml.ERROR_NOT_SUPPORTED
			}
			var p nvml.PciInfo
			nvmlbackend.SetBusID(&p.BusId, devs[links[link]].PciBusID)
			return p, nvml.SUCCESS
		}
	}
	b, err := nvmlbackend.FromInterface(srv)
	if err != nil {
		return nil, err
	}
	h := hex.EncodeToString(digest(opts.Seed, opts.Model, "serial")[:6])
	mac := digest(opts.Seed, opts.Model, "mac")[:6]
	mac[0] = mac[0]&0xfe | 0x02 // locally administered, unicast
	macs := []string{fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", mac[0], mac[1], mac[2], mac[3], mac[4], mac[5])}
	id := &agentv1.HardwareIdentity{
		DmiProductUuid:   uuidFrom(opts.Seed, opts.Model, "dmi"),
		DmiProductSerial: "FAKE" + strings.ToUpper(h),
		DmiBoardSerial:   "FAKEBRD" + strings.ToUpper(h),
		DmiProductName:   m.ProductName,
		Hostname:         "fake-" + opts.Model + "-" + h,
		Macs:             macs,
	}
	for _, d := range devs {
		id.GpuUuids = append(id.GpuUuids, d.UUID)
	}
	return &Backend{Backend: b, identity: id}, nil
}

// Identity is the fake machine's DMI identity, hostname, GPUs and MACs.
func (b *Backend) Identity() *agentv1.HardwareIdentity { return b.identity }

// Inventory reads the mock through the NVML reader.
func (b *Backend) Inventory(ctx context.Context) (*agentv1.GpuInventory, error) {
	return b.Backend.Inventory(ctx)
}

func digest(parts ...string) []byte {
	h := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return h[:]
}

// uuidFrom derives a stable version-4-shaped UUID from parts.
func uuidFrom(parts ...string) string {
	b := digest(parts...)[:16]
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
