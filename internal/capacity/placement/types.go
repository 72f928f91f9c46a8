package placement

import (
	"fmt"
	"slices"
	"sync/atomic"
)

// GPUMode is how a GPU is partitioned for booking.
type GPUMode int

const (
	// ModeWhole books the GPU as one atom, `<uuid>`.
	ModeWhole GPUMode = iota
	// ModeMIG books MIG instances, `<uuid>/mig/<profile>/<n>`.
	ModeMIG
	// ModeShared books time-shared slots, `<uuid>/s<k>`.
	ModeShared
)

// ClassKey groups nodes that look alike to a request: GPU model, pool and
// shape (the operator's name for a node's size, e.g. "8x-nvlink").
type ClassKey struct {
	Model string
	Pool  string
	Shape string
}

func (k ClassKey) String() string {
	s := k.Model + "/" + k.Pool
	if k.Shape != "" {
		s += "/" + k.Shape
	}
	return s
}

// Taint keeps requests off a node unless they tolerate it. A `dedicated`
// taint reserves the node for the tenant named in its value.
type Taint struct {
	Key   string
	Value string
}

func (t Taint) String() string {
	if t.Value == "" {
		return t.Key
	}
	return t.Key + "=" + t.Value
}

// MIGInstance is one MIG instance of a GPU in MIG mode.
type MIGInstance struct {
	Profile string
	N       int
	Booked  bool
}

// Slot is one shared slot of a GPU in shared mode.
type Slot struct {
	K      int
	Booked bool
}

// GPU is one physical GPU of a node.
type GPU struct {
	UUID      string
	Model     string
	Index     int
	NUMA      int
	Island    int // NVLink island; negative when the GPU has no NVLink peers
	MemoryMiB int
	Mode      GPUMode
	// PartitionPending freezes a GPU that is changing MIG mode: none of its
	// atoms can be booked until the change lands.
	PartitionPending bool
	// Quarantined takes the GPU out of placement without blocking its node.
	Quarantined bool
	// Booked is set when the whole GPU is booked (ModeWhole).
	Booked bool
	MIG    []MIGInstance
	Slots  []Slot
}

// NUMANode is one NUMA node of a host with its free CPUs and memory.
type NUMANode struct {
	ID            int
	FreeCPUs      []int
	FreeMemoryGiB int
}

// HostResources are the host-side atoms of a node.
type HostResources struct {
	VCPU         int
	MemoryGiB    int
	Hugepages2Mi int
	Hugepages1Gi int
}

func (h HostResources) minus(o HostResources) HostResources {
	return HostResources{
		VCPU:         h.VCPU - o.VCPU,
		MemoryGiB:    h.MemoryGiB - o.MemoryGiB,
		Hugepages2Mi: h.Hugepages2Mi - o.Hugepages2Mi,
		Hugepages1Gi: h.Hugepages1Gi - o.Hugepages1Gi,
	}
}

// Node is the full detail of one node as placement sees it.
type Node struct {
	ID          string
	Name        string
	Pool        string
	Shape       string
	Labels      map[string]string
	Taints      []Taint
	Schedulable bool
	Healthy     bool
	// Capabilities the node's agent supports, e.g. "devices.limits".
	Capabilities []string
	// SingleTenant is set when the node is offered to one tenant only.
	SingleTenant string
	// TenantAtoms counts the atoms each tenant already holds on the node;
	// the spread scorer reads it.
	TenantAtoms map[string]int
	GPUs        []GPU
	NUMA        []NUMANode
	// Host is the node's allocatable host resources; HostReserve is kept
	// for the host itself and HostBooked is already booked.
	Host        HostResources
	HostReserve HostResources
	HostBooked  HostResources
}

// Model is the node's GPU model; empty when it has none or several (the
// per-GPU model filter then decides, not the class).
func (n *Node) Model() string {
	if len(n.GPUs) == 0 {
		return ""
	}
	for _, g := range n.GPUs[1:] {
		if g.Model != n.GPUs[0].Model {
			return ""
		}
	}
	return n.GPUs[0].Model
}

// Class is the node's class key.
func (n *Node) Class() ClassKey { return ClassKey{Model: n.Model(), Pool: n.Pool, Shape: n.Shape} }

// HostFree is what is left of the host resources for bookings.
func (n *Node) HostFree() HostResources { return n.Host.minus(n.HostReserve).minus(n.HostBooked) }

// NodeSummary is the cheap part of a node the index holds for every node;
// the detail is loaded on first view. Free counts are upper bounds used to
// prune whole classes and nodes before their detail is loaded.
type NodeSummary struct {
	ID        string
	Name      string
	Class     ClassKey
	FreeGPUs  int // whole GPUs free for booking
	FreeSlots int // shared slots free for booking
}

// ClassCount is the per-class part of the index.
type ClassCount struct {
	Key       ClassKey
	Nodes     int
	FreeGPUs  int
	FreeSlots int
}

// Snapshot is a read-only, lazily detailed index of the fleet: per-class
// counts and node summaries up front, full node detail on first view. The
// caller builds it before taking any lock; Place never changes it. Detail is
// cached in atomic pointers so concurrent Place calls over one Snapshot are
// safe without a lock (a detail may be loaded twice in a race; the loader is
// pure, so both copies are equal). Each detail carries its digest, the
// compact form a full scan reads.
type Snapshot struct {
	nodes   []NodeSummary
	classes []ClassCount
	byClass map[ClassKey][]int // indexes into nodes, in snapshot order
	index   map[string]int     // node ID to index into nodes
	detail  []atomic.Pointer[digest]
	load    func(id string) Node
}

// NewSnapshot indexes nodes whose detail is already in memory. It keeps
// pointers into nodes and the digests it computes from them, so the caller
// must not change nodes afterwards.
func NewSnapshot(nodes []Node) *Snapshot {
	sums := make([]NodeSummary, len(nodes))
	byID := make(map[string]*Node, len(nodes))
	for i := range nodes {
		n := &nodes[i]
		sums[i] = Summarize(n)
		byID[n.ID] = n
	}
	s := NewLazySnapshot(sums, func(id string) Node { return *byID[id] })
	digests, arena := make([]digest, len(nodes)), newArena(nodes)
	for i := range nodes {
		digests[i] = newDigest(&nodes[i], arena)
		s.detail[i].Store(&digests[i])
	}
	return s
}

// Replace returns a snapshot like s but with n as the detail of the node
// of n's ID, sharing every other node's summary and digest with s (which
// stays as it was): a placer that booked one node of a snapshot places the
// next request against it without indexing the others again. The node must
// be in s, of the same class; n must not change afterwards.
func (s *Snapshot) Replace(n *Node) (*Snapshot, error) {
	i, ok := s.index[n.ID]
	if !ok {
		return nil, fmt.Errorf("placement: node %s is not in the snapshot", n.ID)
	}
	sum := Summarize(n)
	old := s.nodes[i]
	if sum.Class != old.Class {
		return nil, fmt.Errorf("placement: node %s changed class", n.ID)
	}
	out := &Snapshot{
		nodes:   slices.Clone(s.nodes),
		classes: slices.Clone(s.classes),
		byClass: s.byClass,
		index:   s.index,
		detail:  make([]atomic.Pointer[digest], len(s.detail)),
	}
	out.nodes[i] = sum
	for k := range out.classes {
		if c := &out.classes[k]; c.Key == sum.Class {
			c.FreeGPUs += sum.FreeGPUs - old.FreeGPUs
			c.FreeSlots += sum.FreeSlots - old.FreeSlots
		}
	}
	for k := range s.detail {
		if d := s.detail[k].Load(); d != nil && k != i {
			out.detail[k].Store(d)
		}
	}
	d := newDigest(n, newArena([]Node{*n}))
	out.detail[i].Store(&d)
	load := s.load
	out.load = func(id string) Node {
		if id == n.ID {
			return *n
		}
		return load(id)
	}
	return out, nil
}

// NewLazySnapshot indexes summaries and loads a node's detail with load the
// first time placement looks at it. load must be pure (decode rows already
// read, never query): it runs inside Place.
func NewLazySnapshot(summaries []NodeSummary, load func(id string) Node) *Snapshot {
	s := &Snapshot{
		nodes:   summaries,
		byClass: map[ClassKey][]int{},
		index:   make(map[string]int, len(summaries)),
		detail:  make([]atomic.Pointer[digest], len(summaries)),
		load:    load,
	}
	pos := map[ClassKey]int{}
	for i, sum := range summaries {
		p, ok := pos[sum.Class]
		if !ok {
			p = len(s.classes)
			pos[sum.Class] = p
			s.classes = append(s.classes, ClassCount{Key: sum.Class})
		}
		c := &s.classes[p]
		c.Nodes++
		c.FreeGPUs += sum.FreeGPUs
		c.FreeSlots += sum.FreeSlots
		s.byClass[sum.Class] = append(s.byClass[sum.Class], i)
		s.index[sum.ID] = i
	}
	return s
}

// Summarize computes a node's summary from its detail.
func Summarize(n *Node) NodeSummary {
	sum := NodeSummary{ID: n.ID, Name: n.Name, Class: n.Class()}
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if !gpuUsable(g) {
			continue
		}
		switch g.Mode {
		case ModeWhole:
			if !g.Booked {
				sum.FreeGPUs++
			}
		case ModeShared:
			for _, sl := range g.Slots {
				if !sl.Booked {
					sum.FreeSlots++
				}
			}
		}
	}
	return sum
}

// Classes returns the per-class counts in first-seen order.
func (s *Snapshot) Classes() []ClassCount { return append([]ClassCount(nil), s.classes...) }

// Len is the number of nodes in the snapshot.
func (s *Snapshot) Len() int { return len(s.nodes) }

// digest returns the i-th node's digest, loading its detail on first view.
func (s *Snapshot) digest(i int) *digest {
	if d := s.detail[i].Load(); d != nil {
		return d
	}
	n := s.load(s.nodes[i].ID)
	d := newDigest(&n, &digestArena{})
	s.detail[i].Store(&d)
	return &d
}

// LabelOp is a label selector operator.
type LabelOp string

const (
	OpIn           LabelOp = "In"
	OpNotIn        LabelOp = "NotIn"
	OpExists       LabelOp = "Exists"
	OpDoesNotExist LabelOp = "DoesNotExist"
)

// LabelRequirement is one term of a label selector. A value "*" matches any
// value and a value ending in "*" matches by prefix, so `zone In [*]` is
// `zone Exists` and `rack In [r1-*]` matches "r1-a".
type LabelRequirement struct {
	Key    string
	Op     LabelOp
	Values []string
}

func (r LabelRequirement) String() string {
	switch r.Op {
	case OpExists, OpDoesNotExist:
		return fmt.Sprintf("%s %s", r.Key, r.Op)
	}
	return fmt.Sprintf("%s %s %v", r.Key, r.Op, r.Values)
}

// Request is what a booking asks for.
type Request struct {
	// GPUs is the number of whole GPUs, or of MIG instances when
	// MIGProfile is set.
	GPUs int
	// Model restricts GPUs to one model; empty takes any.
	Model      string
	MIGProfile string
	// Slots is the number of shared slots; it excludes GPUs.
	Slots        int
	VCPU         int
	MemoryGiB    int
	Hugepages2Mi int
	Hugepages1Gi int
	Tenant       string
	// SingleTenant asks for a node no other tenant holds atoms on.
	SingleTenant bool
	// WholeNode asks for every GPU of a node no one holds any atom on
	// (a machine lease): GPUs must be the node's GPU count.
	WholeNode bool
	// RequireNVLink rejects nodes that cannot fit a multi-GPU request in
	// one NVLink island instead of spreading it across islands.
	RequireNVLink bool
	Selector      []LabelRequirement
	// Tolerations are taints ("key" or "key=value") the request accepts.
	Tolerations  []string
	Capabilities []string
	// Node pins the request to the node of that ID ("" takes any): every
	// other node is rejected with ReasonPinned before anything else is
	// checked. A sandbox from a snapshot pins to where the snapshot's
	// files are. An unknown ID matches no node.
	Node string
}

// ScoreBreakdown is each scorer's score in [0, 1] and the weighted total.
type ScoreBreakdown struct {
	Binpack       float64
	Topology      float64
	Fragmentation float64
	Spread        float64
	Total         float64
}

// Plan is one way to place the request: the node and the atoms to book.
type Plan struct {
	NodeID   string
	NodeName string
	Class    ClassKey
	// Atoms are the GPU atoms to book: `<uuid>`, `<uuid>/mig/<profile>/<n>`
	// or `<uuid>/s<k>`.
	Atoms []string
	// Host is the host resources to book on the node.
	Host HostResources
	// NUMA is the NUMA node the atoms sit on, -1 when they span several.
	NUMA int
	// CPUSet is a hint of the CPUs to pin, e.g. "0-3,8"; empty when the
	// request asks for no vCPUs or the free CPUs are not known.
	CPUSet string
	// CPUs is CPUSet as a list, in order.
	CPUs  []int
	Score ScoreBreakdown
	// Split is set when a multi-GPU request's whole GPUs are not inside one
	// NVLink island; such a plan ranks below every plan that is, whatever
	// the other scores say.
	Split bool
}

// Result is what Place returns: plans best first and why the other nodes
// were rejected.
type Result struct {
	Plans       []Plan
	Explanation Explanation
}
