package fake

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
)

// snapshotJSON maps each model to what the NVML reader made of its mock,
// without the parts New derives from the options (GPU UUIDs, NUMA nodes,
// NVLinks).
//
//go:embed snapshot.json
var snapshotJSON []byte

var loadSnapshot = sync.OnceValues(func() (map[string]*agentv1.GpuInventory, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(snapshotJSON, &raw); err != nil {
		return nil, fmt.Errorf("parse the fake hardware snapshot: %w", err)
	}
	out := map[string]*agentv1.GpuInventory{}
	for model, r := range raw {
		inv := &agentv1.GpuInventory{}
		if err := protojson.Unmarshal(r, inv); err != nil {
			return nil, fmt.Errorf("parse the fake hardware snapshot of %s: %w", model, err)
		}
		out[model] = inv
	}
	return out, nil
})

// fromSnapshot builds the machine from the recorded snapshot: the same
// inventory fromMock reads, without go-nvml.
func fromSnapshot(opts Options) (*Backend, error) {
	snap, err := loadSnapshot()
	if err != nil {
		return nil, err
	}
	base, ok := snap[opts.Model]
	if !ok {
		return nil, fmt.Errorf("the fake hardware snapshot has no %s", opts.Model)
	}
	m, err := layout(opts, len(base.GetGpus()))
	if err != nil {
		return nil, err
	}
	inv := proto.Clone(base).(*agentv1.GpuInventory)
	inv.Nvlinks = nil
	for i, g := range inv.Gpus {
		g.Index, g.Uuid, g.NumaNode = int32(i), m.uuids[i], int32(m.numa[i])
	}
	// The reader walks each GPU's links in order and keeps those whose
	// remote end is another GPU of the machine.
	for i := range inv.Gpus {
		for l, p := range m.peers[i] {
			inv.Nvlinks = append(inv.Nvlinks, &agentv1.NvLink{GpuUuid: m.uuids[i], PeerUuid: m.uuids[p], Link: int32(l)})
		}
	}
	f := newFaults(len(inv.Gpus))
	h := &snapshotHealth{faults: f, uuids: m.uuids}
	for i := range inv.Gpus {
		h.links = append(h.links, len(m.peers[i]))
	}
	return &Backend{Backend: &snapshotBackend{inv: inv}, identity: m.identity(opts), faults: f, health: h}, nil
}

// snapshotBackend answers every Inventory with a copy of one inventory.
type snapshotBackend struct {
	mu     sync.Mutex
	inv    *agentv1.GpuInventory
	closed bool
}

func (s *snapshotBackend) Inventory(ctx context.Context) (*agentv1.GpuInventory, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("fake backend closed")
	}
	return proto.Clone(s.inv).(*agentv1.GpuInventory), nil
}

func (s *snapshotBackend) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}
