package capmodel

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ParseCPUList parses a kernel CPU list ("0-3,8,10-11").
func ParseCPUList(s string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(strings.TrimSpace(s), ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("cpu list %q: %w", s, err)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				return nil, fmt.Errorf("cpu list %q: %w", s, err)
			}
		}
		if b < a || b-a > 1<<16 {
			return nil, fmt.Errorf("cpu list %q: bad range %q", s, part)
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// FormatCPUList writes CPUs in kernel list form.
func FormatCPUList(cpus []int) string {
	cpus = slices.Clone(cpus)
	slices.Sort(cpus)
	var b strings.Builder
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if j == i {
			fmt.Fprintf(&b, "%d", cpus[i])
		} else {
			fmt.Fprintf(&b, "%d-%d", cpus[i], cpus[j])
		}
		i = j + 1
	}
	return b.String()
}

// CPUAtom names a CPU of a node as an atom.
func CPUAtom(nodeID string, cpu int) string { return nodeID + "/cpu/" + strconv.Itoa(cpu) }

// Atom kinds.
const (
	KindGPU  = "gpu"
	KindMIG  = "mig"
	KindSlot = "slot"
	KindCPU  = "cpu"
)

// Reservation states.
const (
	StatePending = "pending"
	StatePlaced  = "placed"
	StateBinding = "binding"
	StateActive  = "active"
	// StateReleasing: a kubernetes-bound reservation that was released (or
	// ended) while the node's pods may still hold its GPUs. It keeps its
	// bookings, and is billed, until the node reports AllocationReleased,
	// the node is lost, or the booking's end finds the devices needed;
	// then it reaches its EndsAs state.
	StateReleasing = "releasing"
	StateReleased  = "released"
	StateExpired   = "expired"
	StateFailed    = "failed"
	StateCanceled  = "canceled"
)

// Bindings.
const (
	BindingNode       = "node"
	BindingKubernetes = "kubernetes"
	BindingNone       = "none"
	// BindingInstance: booked by the instance service for one guest, in
	// the instance's transaction; it may hold no GPU (vCPUs and memory
	// only) and is active as soon as it is placed.
	BindingInstance = "instance"
	// BindingMachine: a dedicated-root lease of the whole machine behind
	// a node. It books every GPU of a node no one else holds, and the
	// metal module's lease binds it: the machine is deployed with the
	// lessee's image (the node's bcd goes with the platform OS it ran).
	BindingMachine = "machine"
)

// MachineLabel is the label a node deployed on a machine carries (the
// metal module's metal.MachineLabel): binding machine places only there.
const MachineLabel = "bettercompute.io/machine"

// Condition types.
const (
	CondDevicesHeld = "DevicesHeld"
	CondBindTimeout = "BindTimeout"
	CondNodeLost    = "NodeLost"
	// CondIsolated says what the node enforces for a bound reservation
	// (its AllocationBound report): true when its devices are confined.
	CondIsolated = "Isolated"
	// CondNodeReleased is false from the release command until the node
	// confirms it killed what was left and removed the cgroup.
	CondNodeReleased = "NodeReleased"
	// CondHeldPastEnd is true when pods still held a releasing
	// reservation's devices at its booking's end and the booking could not
	// be extended (another booking starts on them): the booking ended, and
	// the node may still run those pods.
	CondHeldPastEnd = "HeldPastEnd"
	// CondGPUUnhealthy is true when a GPU the reservation holds was taken
	// out of service for health (an XID, a finding, an operator's
	// quarantine): the reservation keeps it until it ends or is moved.
	CondGPUUnhealthy = "GpuUnhealthy"
	// CondMachineLease follows a binding machine reservation's lease:
	// offered (waiting for the lessee's image and key), deploying, active,
	// failed, releasing.
	CondMachineLease = "MachineLease"
)

// Holding reports whether a reservation in state holds its bookings.
func Holding(state string) bool {
	return state == StatePlaced || state == StateBinding || state == StateActive || state == StateReleasing
}

// Live reports whether a reservation in state may still change.
func Live(state string) bool { return state == StatePending || Holding(state) }

// Condition is one condition of a reservation.
type Condition struct {
	Type       string    `json:"type"`
	Status     string    `json:"status"`
	Reason     string    `json:"reason"`
	Message    string    `json:"message"`
	UpdateTime time.Time `json:"update_time"`
}

// PlacementRecord is where a reservation sits, as stored.
type PlacementRecord struct {
	NodeName string   `json:"node_name,omitempty"`
	Atoms    []string `json:"atoms,omitempty"`
	// GPUUUIDs are the physical GPUs the atoms sit on.
	GPUUUIDs []string   `json:"gpu_uuids,omitempty"`
	CPUs     []int      `json:"cpus,omitempty"`
	CPUSet   string     `json:"cpuset,omitempty"`
	NUMA     int        `json:"numa"`
	Island   int        `json:"island"`
	Score    [5]float64 `json:"score"`
	// AtomModel is the atoms' model ("H100 80GB"), the rollups' key.
	AtomModel string `json:"atom_model,omitempty"`
	// Kinds counts the GPU atoms by kind (gpu, mig, slot) for the rollups.
	Kinds map[string]int `json:"kinds,omitempty"`
}

// Reservation is a row of reservations.
type Reservation struct {
	ID, TenantID, ProjectID, PoolID string
	State                           string
	GPUs                            int
	Model, MIGProfile               string
	Slots, VCPU, MemoryGiB          int
	Hugepages1Gi                    int
	Binding                         string
	SingleTenant                    bool
	StartsAt, EndsAt                time.Time
	NodeID, GPUModel                string
	Placement                       PlacementRecord
	Conditions                      []Condition
	Explanation                     string // JSON of apiv1.Explanation
	CommandID                       string
	BindAttempts                    int
	BindDeadline                    *time.Time
	ActiveSince, ActiveUntil        *time.Time
	CreatedBy                       string
	CreateTime, UpdateTime          time.Time
	// Flavor is the instance flavor a binding-instance reservation was
	// booked for (usage meters instance.<flavor>.hours).
	Flavor string
	// EndsAs is the state a releasing reservation reaches once its
	// bookings end (released, expired, canceled or failed); ReleaseTime
	// is when it began releasing. Both are kept after it ends.
	EndsAs      string
	ReleaseTime *time.Time
	// Requires are agent capabilities the host must advertise beyond what
	// the binding implies (an instance's network policy). Not stored: only
	// instances set it, and they place inline, never from the queue.
	Requires []string
	// PinNodeID places the reservation on that node only (a sandbox from
	// a snapshot boots where the snapshot's files are). Not stored: it
	// steers the first placement only, which instances make inline; a
	// reservation read back has none, and a recreated instance books
	// anew without it.
	PinNodeID string
}

// Condition returns the reservation's condition of type typ.
func (r *Reservation) Condition(typ string) (Condition, bool) {
	for _, c := range r.Conditions {
		if c.Type == typ {
			return c, true
		}
	}
	return Condition{}, false
}

// SetCondition sets or replaces a condition; it reports whether anything
// changed.
func (r *Reservation) SetCondition(c Condition) bool {
	for i := range r.Conditions {
		if r.Conditions[i].Type == c.Type {
			old := r.Conditions[i]
			if old.Status == c.Status && old.Reason == c.Reason && old.Message == c.Message {
				return false
			}
			if old.Status == c.Status {
				c.UpdateTime = old.UpdateTime
			}
			r.Conditions[i] = c
			return true
		}
	}
	r.Conditions = append(r.Conditions, c)
	return true
}

// CPUSetMems is the NUMA nodes of the reservation's CPUs, or of its GPUs when
// it has no CPUs.
func (r *Reservation) CPUSetMems() string {
	if r.Placement.NUMA >= 0 && (len(r.Placement.CPUs) > 0 || len(r.Placement.Atoms) > 0) {
		return fmt.Sprint(r.Placement.NUMA)
	}
	return ""
}
