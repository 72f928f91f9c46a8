// Package fake is a GPU backend for tests and simulations built on go-nvml's
// own mock servers (dgxh100, dgxa100, dgxb200). With cgo it reads the mocks
// through the same code as the real NVML backend (hw/nvml.Read); what the
// mocks lack — NVLink peers across the HGX board and each GPU's NUMA node —
// comes from a small topology fixture. A seed makes GPU UUIDs and the machine
// identity unique, so that many fake daemons on one host look like distinct
// machines.
//
// go-nvml does not compile without cgo, so a cgo-free build (the static
// better-compute binary, whose simulated nodes need no C) serves the same
// machines from snapshot.json: what the reader made of each mock, recorded
// by `go test ./internal/agent/hw/fake -run TestSnapshot -update`. A test
// keeps the two paths equal, answer for answer.
//
// It must never load the real NVML library.
package fake

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent/hw"
)

// productNames are the machines the fake can be, with their DMI product name.
var productNames = map[string]string{
	"dgxh100": "DGXH100",
	"dgxa100": "DGXA100",
	"dgxb200": "DGXB200",
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
	// Model is one of dgxh100, dgxa100, dgxb200.
	Model string
	// Seed makes the identity unique; fake daemons sharing a seed are the
	// same machine.
	Seed string
	// Topology overrides the HGX default.
	Topology Topology
}

// Backend is a fake GPU machine.
type Backend struct {
	hw.Backend
	identity *agentv1.HardwareIdentity
	// list is the GPUs Telemetry makes readings for (telemetry.go).
	list gpuList
	// mig is the MIG layouts ConfigureMIG set (mig.go).
	mig migOverlay
	// faults is the injected bad state and health reads it (health.go).
	faults *faults
	health healthPath
}

var (
	_ hw.Backend        = (*Backend)(nil)
	_ hw.IdentitySource = (*Backend)(nil)
	_ hw.MIGConfigurer  = (*Backend)(nil)
)

// New builds the fake machine for opts: from go-nvml's mock through the NVML
// reader with cgo, from the recorded snapshot without.
func New(opts Options) (*Backend, error) {
	if _, ok := productNames[opts.Model]; !ok {
		return nil, fmt.Errorf("unknown fake model %q (want dgxh100, dgxa100 or dgxb200)", opts.Model)
	}
	return openWithFault(opts, buildFault)
}

// openWithFault opens the machine and injects the findings fault names
// (buildFault's form).
func openWithFault(opts Options, fault string) (*Backend, error) {
	b, err := open(opts)
	if err != nil {
		return nil, err
	}
	if err := b.injectBuildFault(fault); err != nil {
		_ = b.Close()
		return nil, err
	}
	return b, nil
}

// machine is what the options make of a model with n GPUs: each GPU's UUID,
// NUMA node and NVLink peers (by index, in link order).
type machine struct {
	uuids []string
	numa  []int
	peers [][]int
}

func layout(opts Options, n int) (machine, error) {
	m := machine{numa: opts.Topology.NUMA, peers: make([][]int, n)}
	if len(m.numa) == 0 {
		m.numa = make([]int, n)
		for i := range m.numa {
			m.numa[i] = i * 2 / n
		}
	}
	if len(m.numa) != n {
		return machine{}, fmt.Errorf("topology fixture gives %d NUMA nodes for %d GPUs", len(m.numa), n)
	}
	if len(opts.Topology.NVLinks) == 0 {
		for i := range n {
			for j := range n {
				if i != j {
					m.peers[i] = append(m.peers[i], j)
				}
			}
		}
	} else {
		for _, p := range opts.Topology.NVLinks {
			if p[0] < 0 || p[1] < 0 || p[0] >= n || p[1] >= n || p[0] == p[1] {
				return machine{}, fmt.Errorf("topology fixture: bad nvlink pair %v", p)
			}
			m.peers[p[0]] = append(m.peers[p[0]], p[1])
			m.peers[p[1]] = append(m.peers[p[1]], p[0])
		}
	}
	for i := range n {
		m.uuids = append(m.uuids, "GPU-"+uuidFrom(opts.Seed, opts.Model, "gpu", fmt.Sprint(i)))
	}
	return m, nil
}

// identity is the machine's DMI identity, hostname, GPUs and MACs.
func (m machine) identity(opts Options) *agentv1.HardwareIdentity {
	h := hex.EncodeToString(digest(opts.Seed, opts.Model, "serial")[:6])
	mac := digest(opts.Seed, opts.Model, "mac")[:6]
	mac[0] = mac[0]&0xfe | 0x02 // locally administered, unicast
	return &agentv1.HardwareIdentity{
		DmiProductUuid:   uuidFrom(opts.Seed, opts.Model, "dmi"),
		DmiProductSerial: "FAKE" + strings.ToUpper(h),
		DmiBoardSerial:   "FAKEBRD" + strings.ToUpper(h),
		DmiProductName:   productNames[opts.Model],
		Hostname:         "fake-" + opts.Model + "-" + h,
		Macs:             []string{fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", mac[0], mac[1], mac[2], mac[3], mac[4], mac[5])},
		GpuUuids:         append([]string(nil), m.uuids...),
	}
}

// Identity is the fake machine's DMI identity, hostname, GPUs and MACs.
func (b *Backend) Identity() *agentv1.HardwareIdentity { return b.identity }

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
