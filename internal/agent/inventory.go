package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent/hw"
)

// Section names and the messages they carry.
const (
	SectionSystem = "system" // SystemInventory
	SectionGPUs   = "gpus"   // GpuInventory
	SectionCPUs   = "cpus"   // CpuInventory
	SectionMemory = "memory" // MemoryInventory
	SectionLabels = "labels" // NodeLabels, only where Config.NodeLabels is set
)

// SnapshotDigest is hex SHA-256 over the sorted "name:sha256\n" lines of a
// snapshot's sections.
func SnapshotDigest(sectionSHA map[string]string) string {
	lines := make([]string, 0, len(sectionSHA))
	for name, sum := range sectionSHA {
		lines = append(lines, name+":"+sum+"\n")
	}
	sort.Strings(lines)
	h := sha256.Sum256([]byte(strings.Join(lines, "")))
	return hex.EncodeToString(h[:])
}

func (a *Agent) gpus(ctx context.Context) (*agentv1.GpuInventory, error) {
	if a.cfg.Hardware == nil {
		return &agentv1.GpuInventory{}, nil
	}
	inv, err := a.cfg.Hardware.Inventory(ctx)
	if err != nil {
		return nil, fmt.Errorf("gpu inventory: %w", err)
	}
	return inv, nil
}

// identity is what Join sends and the system section reports.
func (a *Agent) identity(ctx context.Context) (*agentv1.HardwareIdentity, error) {
	if src, ok := a.cfg.Hardware.(hw.IdentitySource); ok {
		return proto.CloneOf(src.Identity()), nil
	}
	id, err := a.fs.Identity()
	if err != nil {
		return nil, err
	}
	g, err := a.gpus(ctx)
	if err != nil {
		return nil, err
	}
	for _, gpu := range g.GetGpus() {
		id.GpuUuids = append(id.GpuUuids, gpu.GetUuid())
	}
	return id, nil
}

// inventory reads everything and returns the sections with their digest.
func (a *Agent) inventory(ctx context.Context) ([]*agentv1.InventorySection, string, error) {
	id, err := a.identity(ctx)
	if err != nil {
		return nil, "", err
	}
	kernel, osName := a.fs.Kernel()
	gpus, err := a.gpus(ctx)
	if err != nil {
		return nil, "", err
	}
	cpus, err := a.fs.CPU()
	if err != nil {
		return nil, "", err
	}
	mem, err := a.fs.Memory()
	if err != nil {
		return nil, "", err
	}
	msgs := []struct {
		name string
		m    proto.Message
	}{
		{SectionSystem, &agentv1.SystemInventory{Identity: id, Kernel: kernel, Os: osName, Architecture: runtime.GOARCH, CgroupVersion: a.cgroupVersion()}},
		{SectionGPUs, gpus},
		{SectionCPUs, cpus},
		{SectionMemory, mem},
	}
	if a.cfg.NodeLabels != nil {
		labels, err := a.cfg.NodeLabels(ctx)
		if err != nil {
			return nil, "", fmt.Errorf("node labels: %w", err)
		}
		msgs = append(msgs, struct {
			name string
			m    proto.Message
		}{SectionLabels, &agentv1.NodeLabels{Labels: labels, Source: a.cfg.NodeLabelsSource}})
	}
	sums := map[string]string{}
	sections := make([]*agentv1.InventorySection, 0, len(msgs))
	for _, m := range msgs {
		// Deterministic so that an unchanged inventory keeps its digest.
		data, err := proto.MarshalOptions{Deterministic: true}.Marshal(m.m)
		if err != nil {
			return nil, "", fmt.Errorf("encode %s section: %w", m.name, err)
		}
		h := sha256.Sum256(data)
		sums[m.name] = hex.EncodeToString(h[:])
		sections = append(sections, &agentv1.InventorySection{Name: m.name, Data: data, Sha256: sums[m.name], SectionCount: int32(len(msgs))})
	}
	digest := SnapshotDigest(sums)
	for _, s := range sections {
		s.SnapshotDigest = digest
	}
	return sections, digest, nil
}

func (a *Agent) sendInventory(s *session, sections []*agentv1.InventorySection, digest string) error {
	for _, sec := range sections {
		if err := s.send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Inventory{Inventory: sec}}); err != nil {
			return fmt.Errorf("send inventory: %w", err)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmds.InventoryDigest == digest {
		return nil
	}
	a.cmds.InventoryDigest = digest
	return a.saveCommandsLocked()
}

func (a *Agent) saveCommandsLocked() error {
	return a.dir.writeJSON(commandsFile, &a.cmds)
}

// labelsLoop sends the inventory again each time the node's labels change,
// so a pool that selects by them takes or lets go of the node without
// waiting for the next session. A change while no session is up is sent
// once one is: each session starts with a fresh inventory, and sending an
// unchanged one again is a no-op at the gateway.
func (a *Agent) labelsLoop(ctx context.Context) {
	if a.cfg.NodeLabelsChanged == nil {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.cfg.NodeLabelsChanged():
		}
		for {
			if s := a.currentSession(); s != nil {
				sections, digest, err := a.inventory(ctx)
				if err == nil {
					err = a.sendInventory(s, sections, digest)
				}
				if err == nil || ctx.Err() != nil {
					break
				}
				a.log.Warn("send inventory after a label change", "err", err)
			}
			// No session (or it failed): the next one sends the labels
			// in its first inventory; try again in case this one is
			// still being set up.
			t := time.NewTimer(time.Second)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}
