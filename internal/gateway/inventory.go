package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/store"
)

// KnownGPUModels are the models the control plane knows how to place; a
// reported model matches when it contains one of KnownGPUFamilies.
var (
	KnownGPUModels   = []string{"H100 80GB HBM3", "H100 SXM5 80GB", "H200", "A100-SXM4-80GB", "A100-SXM4-40GB", "B200"}
	KnownGPUFamilies = []string{"H100", "H200", "A100", "B200"}
)

// Node condition types the gateway sets from inventory.
const (
	ConditionGpuCountMismatch = "GpuCountMismatch"
	ConditionGpuModelUnknown  = "GpuModelUnknown"
)

// Inventory content limits.
const (
	maxGPUs         = 64
	maxMIGPerGPU    = 64
	maxNVLinks      = 64 * 32
	maxNUMANodes    = 64
	maxCPUListBytes = 4096
)

// Section is an inventory section whose sha256 verified and whose data
// decoded as the message its name says.
type Section struct {
	Name           string
	SHA256         string
	SnapshotDigest string
	Count          int
	Data           []byte
	// Message is *agentv1.SystemInventory, *agentv1.GpuInventory,
	// *agentv1.CpuInventory or *agentv1.MemoryInventory.
	Message proto.Message
}

// DecodeSection verifies an inventory section received from a node: a
// known name, at most MaxSectionBytes, sha256 over exactly the received
// bytes, well-formed digests and count, and data that decodes as the
// section's message within the content limits. It never reads the
// database.
func DecodeSection(s *agentv1.InventorySection) (*Section, error) {
	if err := validateSectionShape(s); err != nil {
		return nil, err
	}
	sum := sha256.Sum256(s.GetData())
	if hex.EncodeToString(sum[:]) != s.GetSha256() {
		return nil, invalid("inventory section %q: sha256 does not match the data", s.GetName())
	}
	var msg proto.Message
	switch s.GetName() {
	case "system":
		msg = &agentv1.SystemInventory{}
	case "gpus":
		msg = &agentv1.GpuInventory{}
	case "cpus":
		msg = &agentv1.CpuInventory{}
	case "memory":
		msg = &agentv1.MemoryInventory{}
	case "labels":
		msg = &agentv1.NodeLabels{}
	}
	if err := proto.Unmarshal(s.GetData(), msg); err != nil {
		return nil, invalid("inventory section %q: does not decode: %v", s.GetName(), err)
	}
	if err := validateSectionContent(msg); err != nil {
		return nil, err
	}
	fleet.SanitizeNodeText(msg) // model names, host names, versions reach terminals
	return &Section{
		Name: s.GetName(), SHA256: s.GetSha256(), SnapshotDigest: s.GetSnapshotDigest(),
		Count: int(s.GetSectionCount()), Data: s.GetData(), Message: msg,
	}, nil
}

func validateSectionContent(msg proto.Message) error {
	switch m := msg.(type) {
	case *agentv1.SystemInventory:
		id := m.GetIdentity()
		for _, f := range []string{id.GetDmiProductUuid(), id.GetDmiProductSerial(), id.GetDmiBoardSerial(), id.GetDmiProductName(),
			id.GetHostname(), m.GetKernel(), m.GetOs(), m.GetArchitecture(), m.GetCgroupVersion()} {
			if len(f) > maxShort {
				return invalid("inventory system: a field is longer than %d bytes", maxShort)
			}
		}
		if len(id.GetGpuUuids()) > maxGPUs || len(id.GetMacs()) > maxListItems {
			return invalid("inventory system: too many GPU UUIDs or MACs")
		}
	case *agentv1.GpuInventory:
		if len(m.GetGpus()) > maxGPUs {
			return invalid("inventory gpus: more than %d GPUs", maxGPUs)
		}
		if len(m.GetNvlinks()) > maxNVLinks {
			return invalid("inventory gpus: more than %d NVLinks", maxNVLinks)
		}
		seen := map[string]bool{}
		for i, g := range m.GetGpus() {
			switch {
			case g.GetUuid() == "" || len(g.GetUuid()) > maxShort:
				return invalid("inventory gpus[%d].uuid: required, at most %d bytes", i, maxShort)
			case seen[g.GetUuid()]:
				return invalid("inventory gpus[%d].uuid: %q reported twice", i, g.GetUuid())
			case len(g.GetModel()) > maxShort || len(g.GetPciBusId()) > maxShort:
				return invalid("inventory gpus[%d]: model or pci_bus_id too long", i)
			case g.GetNumaNode() < -1:
				return invalid("inventory gpus[%d].numa_node: -1 (unknown) or a NUMA node", i)
			case !slices.Contains([]string{"", "disabled", "enabled", "pending"}, g.GetMigMode()):
				return invalid("inventory gpus[%d].mig_mode: disabled, enabled or pending", i)
			case len(g.GetMigInstances()) > maxMIGPerGPU:
				return invalid("inventory gpus[%d]: more than %d MIG instances", i, maxMIGPerGPU)
			case g.GetIndex() < 0:
				return invalid("inventory gpus[%d].index: negative", i)
			}
			seen[g.GetUuid()] = true
			for j, mi := range g.GetMigInstances() {
				if mi.GetUuid() == "" || len(mi.GetUuid()) > maxShort || seen[mi.GetUuid()] || len(mi.GetProfile()) > maxShort {
					return invalid("inventory gpus[%d].mig_instances[%d]: uuid required and unique, fields at most %d bytes", i, j, maxShort)
				}
				seen[mi.GetUuid()] = true
			}
		}
		links := map[string]bool{}
		for i, l := range m.GetNvlinks() {
			key := l.GetGpuUuid() + "/" + strconv.Itoa(int(l.GetLink()))
			if l.GetGpuUuid() == "" || len(l.GetGpuUuid()) > maxShort || len(l.GetPeerUuid()) > maxShort || l.GetLink() < 0 || links[key] {
				return invalid("inventory gpus.nvlinks[%d]: gpu_uuid required, link non-negative and unique per GPU", i)
			}
			links[key] = true
		}
		if len(m.GetDriverVersion()) > maxShort || len(m.GetCudaVersion()) > maxShort {
			return invalid("inventory gpus: driver or CUDA version too long")
		}
	case *agentv1.NodeLabels:
		return validateNodeLabels(m)
	case *agentv1.CpuInventory:
		if len(m.GetModel()) > maxShort {
			return invalid("inventory cpus.model: longer than %d bytes", maxShort)
		}
		if m.GetSockets() < 0 || m.GetCores() < 0 || m.GetThreads() < 0 {
			return invalid("inventory cpus: negative counts")
		}
		if len(m.GetNumaNodes()) > maxNUMANodes {
			return invalid("inventory cpus: more than %d NUMA nodes", maxNUMANodes)
		}
		ids := map[int32]bool{}
		for i, n := range m.GetNumaNodes() {
			if n.GetId() < 0 || ids[n.GetId()] || len(n.GetCpus()) > maxCPUListBytes {
				return invalid("inventory cpus.numa_nodes[%d]: id non-negative and unique, cpus at most %d bytes", i, maxCPUListBytes)
			}
			ids[n.GetId()] = true
		}
	}
	return nil
}

// Reported labels follow Kubernetes' label syntax, the labels bcd reports
// being a Node's: a key is an optional DNS-subdomain prefix and a name, a
// value at most 63 bytes and possibly empty.
const (
	maxReportedLabels = 256
	maxLabelKeyBytes  = 253 + 1 + 63
	maxLabelValue     = 63
)

var (
	labelKeyRE   = regexp.MustCompile(`^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	labelValueRE = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$`)
)

func validateNodeLabels(m *agentv1.NodeLabels) error {
	if len(m.GetLabels()) > maxReportedLabels {
		return invalid("inventory labels: more than %d labels", maxReportedLabels)
	}
	if len(m.GetSource()) > maxShort {
		return invalid("inventory labels.source: longer than %d bytes", maxShort)
	}
	for k, v := range m.GetLabels() {
		if len(k) > maxLabelKeyBytes || !labelKeyRE.MatchString(k) {
			return invalid("inventory labels: key %q is not a label key", truncate(k))
		}
		if len(v) > maxLabelValue || !labelValueRE.MatchString(v) {
			return invalid("inventory labels[%s]: value %q is not a label value (at most %d bytes, alphanumeric with - _ . inside)", truncate(k), truncate(v), maxLabelValue)
		}
	}
	return nil
}

// reportedLabelsJSON is the JSON object of a snapshot's labels section,
// "{}" when it has none (the node stopped reporting labels).
func reportedLabelsJSON(sections map[string]*Section) string {
	sec := sections["labels"]
	if sec == nil {
		return "{}"
	}
	b, err := json.Marshal(sec.Message.(*agentv1.NodeLabels).GetLabels())
	if err != nil || string(b) == "null" {
		return "{}"
	}
	return string(b)
}

// SnapshotDigest is the digest of a whole snapshot: hex SHA-256 over the
// sorted "name:sha256\n" lines of its sections.
func SnapshotDigest(shas map[string]string) string {
	names := make([]string, 0, len(shas))
	for n := range shas {
		names = append(names, n)
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		fmt.Fprintf(h, "%s:%s\n", n, shas[n])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// pendingSnapshot collects the sections of one snapshot digest.
type pendingSnapshot struct {
	count    int
	sections map[string]*Section
}

// maxPendingSnapshots bounds the snapshots a session assembles at once.
const maxPendingSnapshots = 2

// inventory stores one verified section and, once every section of its
// snapshot is in and the digest matches, commits the snapshot.
func (s *session) inventory(raw *agentv1.InventorySection) error {
	sec, err := DecodeSection(raw)
	if err != nil {
		return err
	}
	ps := s.snapshots[sec.SnapshotDigest]
	if ps == nil {
		if len(s.snapshots) >= maxPendingSnapshots {
			// An agent that started over: keep only the newest snapshot.
			clear(s.snapshots)
		}
		ps = &pendingSnapshot{count: sec.Count, sections: map[string]*Section{}}
		if s.snapshots == nil {
			s.snapshots = map[string]*pendingSnapshot{}
		}
		s.snapshots[sec.SnapshotDigest] = ps
	}
	if ps.count != sec.Count {
		delete(s.snapshots, sec.SnapshotDigest)
		return invalid("inventory section %q: section_count %d, other sections of the snapshot said %d", sec.Name, sec.Count, ps.count)
	}
	if err := s.g.cfg.DB.Write(s.ctx, func(ctx context.Context, tx store.Tx) error {
		return fleet.InventorySectionPut(ctx, tx, s.nodeID, sec.Name, sec.SHA256, sec.Data)
	}); err != nil {
		return err
	}
	ps.sections[sec.Name] = sec
	if len(ps.sections) < ps.count {
		return nil
	}
	delete(s.snapshots, sec.SnapshotDigest)
	shas := map[string]string{}
	for n, x := range ps.sections {
		shas[n] = x.SHA256
	}
	if got := SnapshotDigest(shas); got != sec.SnapshotDigest {
		return invalid("inventory snapshot %s: the digest of its sections is %s", sec.SnapshotDigest, got)
	}
	return s.commitSnapshot(sec.SnapshotDigest, ps.sections)
}

// InventoryDiff is what changed between two snapshots of a node.
type InventoryDiff struct {
	GPUsAdded     []string       `json:"gpus_added"`
	GPUsRemoved   []string       `json:"gpus_removed"`
	ModelsChanged []ModelChange  `json:"models_changed"`
	GPUCount      map[string]int `json:"gpu_count"`
}

// ModelChange is one GPU whose model changed.
type ModelChange struct {
	UUID string `json:"uuid"`
	From string `json:"from"`
	To   string `json:"to"`
}

// DiffGPUs compares a node's GPUs before and after a snapshot.
func DiffGPUs(before, after []fleet.GPU) InventoryDiff {
	d := InventoryDiff{GPUsAdded: []string{}, GPUsRemoved: []string{}, ModelsChanged: []ModelChange{},
		GPUCount: map[string]int{"from": len(before), "to": len(after)}}
	old := map[string]string{}
	for _, g := range before {
		old[g.UUID] = g.Model
	}
	now := map[string]bool{}
	for _, g := range after {
		now[g.UUID] = true
		model, ok := old[g.UUID]
		switch {
		case !ok:
			d.GPUsAdded = append(d.GPUsAdded, g.UUID)
		case model != g.Model:
			d.ModelsChanged = append(d.ModelsChanged, ModelChange{UUID: g.UUID, From: model, To: g.Model})
		}
	}
	for _, g := range before {
		if !now[g.UUID] {
			d.GPUsRemoved = append(d.GPUsRemoved, g.UUID)
		}
	}
	return d
}

// KnownGPUModel reports whether a reported model is one of a known family.
func KnownGPUModel(model string) bool {
	for _, f := range KnownGPUFamilies {
		if strings.Contains(strings.ToUpper(model), f) {
			return true
		}
	}
	return false
}

// snapshotParams builds the device rows of a snapshot.
func snapshotParams(nodeID, digest string, sections map[string]*Section) fleet.Inventory {
	inv := fleet.Inventory{NodeID: nodeID, Digest: digest, Resources: &fleet.NodeResources{}}
	if sec := sections["gpus"]; sec != nil {
		gi := sec.Message.(*agentv1.GpuInventory)
		for _, g := range gi.GetGpus() {
			gpu := fleet.GPU{
				UUID: g.GetUuid(), Index: int(g.GetIndex()), Model: g.GetModel(), MemoryMiB: i64(g.GetMemoryMib()),
				PCIBusID: g.GetPciBusId(), NumaNode: int(g.GetNumaNode()), MigMode: g.GetMigMode(),
			}
			for _, m := range g.GetMigInstances() {
				gpu.MigInstances = append(gpu.MigInstances, fleet.MigInstance{
					UUID: m.GetUuid(), GPUUUID: g.GetUuid(), Profile: m.GetProfile(), GPUInstanceID: int(m.GetGpuInstanceId()), MemoryMiB: i64(m.GetMemoryMib()),
				})
			}
			inv.GPUs = append(inv.GPUs, gpu)
		}
		for _, l := range gi.GetNvlinks() {
			inv.NvLinks = append(inv.NvLinks, fleet.NvLink{GPUUUID: l.GetGpuUuid(), PeerUUID: l.GetPeerUuid(), Link: int(l.GetLink())})
		}
	}
	r := inv.Resources
	if sec := sections["cpus"]; sec != nil {
		ci := sec.Message.(*agentv1.CpuInventory)
		r.CPUModel, r.Sockets, r.Cores, r.Threads = ci.GetModel(), int(ci.GetSockets()), int(ci.GetCores()), int(ci.GetThreads())
		for _, n := range ci.GetNumaNodes() {
			inv.NumaNodes = append(inv.NumaNodes, fleet.NumaNode{
				ID: int(n.GetId()), CPUs: n.GetCpus(), MemoryMiB: i64(n.GetMemoryMib()), Hugepages2Mi: i64(n.GetHugepages_2Mi()), Hugepages1Gi: i64(n.GetHugepages_1Gi()),
			})
		}
	}
	if sec := sections["memory"]; sec != nil {
		mi := sec.Message.(*agentv1.MemoryInventory)
		r.MemoryMiB, r.Hugepages2MiTotal, r.Hugepages1GiTotal = i64(mi.GetTotalMib()), i64(mi.GetHugepages_2MiTotal()), i64(mi.GetHugepages_1GiTotal())
	}
	return inv
}

// i64 converts an agent's unsigned count for a BIGINT column.
func i64(v uint64) int64 { return int64(min(v, math.MaxInt64)) }

// gpuConditions derives GpuCountMismatch and GpuModelUnknown.
func gpuConditions(labelsJSON string, hadSnapshot bool, before, after []fleet.GPU) []fleet.NodeCondition {
	count := fleet.NodeCondition{Type: ConditionGpuCountMismatch, Status: "false", Reason: "AsExpected",
		Message: fmt.Sprintf("%d GPUs reported", len(after))}
	var labels map[string]string
	_ = json.Unmarshal([]byte(labelsJSON), &labels)
	if want, ok := labels["gpu.count"]; ok && want != strconv.Itoa(len(after)) {
		count.Status, count.Reason = "true", "LabelMismatch"
		count.Message = fmt.Sprintf("label gpu.count is %s but the node reports %d GPUs", want, len(after))
	} else if hadSnapshot && len(after) < len(before) {
		count.Status, count.Reason = "true", "CountDropped"
		count.Message = fmt.Sprintf("the node reports %d GPUs, %d before", len(after), len(before))
	}
	model := fleet.NodeCondition{Type: ConditionGpuModelUnknown, Status: "false", Reason: "KnownModels", Message: "every GPU model is known"}
	var unknown []string
	for _, g := range after {
		if !KnownGPUModel(g.Model) && !slices.Contains(unknown, g.Model) {
			unknown = append(unknown, g.Model)
		}
	}
	if len(unknown) > 0 {
		model.Status, model.Reason = "true", "UnknownModel"
		model.Message = "unknown GPU models: " + strings.Join(unknown, ", ")
	}
	return []fleet.NodeCondition{count, model}
}

// commitSnapshot rebuilds the node's devices from a complete snapshot in
// one transaction, with its diff, conditions and event.
func (s *session) commitSnapshot(digest string, sections map[string]*Section) error {
	g := s.g
	p := snapshotParams(s.nodeID, digest, sections)
	uuids := make([]string, 0, len(p.GPUs))
	for _, x := range p.GPUs {
		uuids = append(uuids, x.UUID)
	}
	err := g.cfg.DB.Write(s.ctx, func(ctx context.Context, tx store.Tx) error {
		node, err := fleet.NodeStatusGet(ctx, tx, s.nodeID)
		if err != nil {
			return err
		}
		if node.InventoryDigest == digest {
			return nil
		}
		owners, err := fleet.GPUListOwners(ctx, tx, s.nodeID, uuids)
		if err != nil {
			return err
		}
		for u, other := range owners {
			return status.Errorf(codes.AlreadyExists, "inventory: GPU %s is held by node %s", u, other)
		}
		before, err := fleet.GPUList(ctx, tx, s.nodeID)
		if err != nil {
			return err
		}
		diff := DiffGPUs(before, p.GPUs)
		b, err := json.Marshal(diff)
		if err != nil {
			return err
		}
		if err := fleet.InventoryReplace(ctx, tx, &p, string(b)); err != nil {
			return err
		}
		// Before NodeChanged: the pools' reconcile reads them.
		if err := fleet.NodeReportedLabelsSet(ctx, tx, s.nodeID, reportedLabelsJSON(sections)); err != nil {
			return err
		}
		for _, c := range gpuConditions(node.Labels, node.InventoryDigest != "", before, p.GPUs) {
			c.NodeID = s.nodeID
			if err := fleet.NodeConditionSet(ctx, tx, &c); err != nil {
				return err
			}
		}
		if h := g.cfg.Hooks; h != nil {
			if err := h.NodeChanged(ctx, tx, s.nodeID); err != nil {
				return err
			}
		}
		var data map[string]any
		_ = json.Unmarshal(b, &data)
		data["digest"] = digest
		return g.cfg.Recorder.InsertEvents(ctx, tx, []envelope.Event{{
			Type: "node.inventory_changed", TenantID: node.TenantID, ResourceType: "Node", ResourceID: s.nodeID,
			Time: g.cfg.Clock.Now(), Data: data,
		}})
	})
	if err != nil {
		return err
	}
	s.node.InventoryDigest = digest
	s.log.Info("inventory snapshot committed", "digest", digest, "gpus", len(p.GPUs))
	return nil
}
