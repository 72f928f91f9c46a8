package placer

import (
	"fmt"
	"slices"
	"strings"

	"connectrpc.com/connect"

	"github.com/better-compute/better-compute/internal/capacity/capmodel"
	"github.com/better-compute/better-compute/internal/capacity/gpumodel"
	"github.com/better-compute/better-compute/internal/capacity/placement"
	"github.com/better-compute/better-compute/internal/envelope"
)

// Pristine is the pool as it would be with every node schedulable and
// healthy and no GPU quarantined or changing MIG mode: what the pool could
// hold once its nodes come back. A request that does not fit even this never
// fits; one that fits it may later.
func Pristine(nodes map[string]*placement.Node) []placement.Node {
	ids := make([]string, 0, len(nodes))
	for id := range nodes {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	out := make([]placement.Node, 0, len(ids))
	for _, id := range ids {
		n := *nodes[id]
		n.Schedulable, n.Healthy = true, true
		n.GPUs = slices.Clone(n.GPUs)
		for i := range n.GPUs {
			n.GPUs[i].Quarantined, n.GPUs[i].PartitionPending = false, false
		}
		out = append(out, n)
	}
	return out
}

// PoolModels lists the GPU models of a pool's nodes by their short names
// ("H100"), sorted.
func PoolModels(nodes []placement.Node) []string {
	var out []string
	for i := range nodes {
		for _, g := range nodes[i].GPUs {
			if m := gpumodel.Short(g.Model); !slices.Contains(out, m) {
				out = append(out, m)
			}
		}
	}
	slices.Sort(out)
	return out
}

// ModelsPhrase says which models a pool has: "it has H100, L40S", or "it
// has no GPUs".
func ModelsPhrase(models []string) string {
	if len(models) == 0 {
		return "it has no GPUs"
	}
	return "it has " + strings.Join(models, ", ")
}

// neverReason says, in the pool's terms, why no node of the pool could
// hold r even empty and healthy: "the largest node has 8 H100 GPUs", or
// the model it lacks. It falls back to the node explanation when the limit
// is not a size (a taint, a label, NVLink).
func neverReason(nodes []placement.Node, r *capmodel.Reservation, ex placement.Explanation) string {
	if len(nodes) == 0 {
		return "the pool has no nodes"
	}
	return sizeReason(nodes, r, ex, "the pool", "the largest node", "no node of the pool can ever hold it")
}

// sizeReason is neverReason's body in the words of who is short (all,
// largest, and the sentence when the limit is not a size): the pool and its
// largest node, or the node a request is pinned to.
func sizeReason(nodes []placement.Node, r *capmodel.Reservation, ex placement.Explanation, all, largest, never string) string {
	models := PoolModels(nodes)
	matches := func(g placement.GPU) bool { return r.Model == "" || placement.ModelMatches(r.Model, g.Model) }
	any := false
	for i := range nodes {
		for _, g := range nodes[i].GPUs {
			any = any || matches(g)
		}
	}
	// A guest without GPUs is not short of them (it may be of vCPUs).
	if !any && r.GPUs+r.Slots > 0 {
		if r.Model == "" {
			return all + " has no GPUs"
		}
		return fmt.Sprintf("%s has no %s GPUs (%s)", all, r.Model, ModelsPhrase(models))
	}
	model := ""
	if r.Model != "" {
		model = r.Model + " "
	}
	var whole, slots, mig, vcpu, mem, huge int
	for i := range nodes {
		n := &nodes[i]
		var w, s, m int
		for _, g := range n.GPUs {
			if !matches(g) {
				continue
			}
			switch g.Mode {
			case placement.ModeWhole:
				w++
			case placement.ModeShared:
				s += len(g.Slots)
			case placement.ModeMIG:
				for _, in := range g.MIG {
					if in.Profile == r.MIGProfile {
						m++
					}
				}
			}
		}
		// What the host offers with nothing booked (the snapshot's host
		// resources are already net of host_reserve).
		whole, slots, mig = max(whole, w), max(slots, s), max(mig, m)
		vcpu = max(vcpu, n.Host.VCPU-n.HostReserve.VCPU)
		mem = max(mem, n.Host.MemoryGiB-n.HostReserve.MemoryGiB)
		huge = max(huge, n.Host.Hugepages1Gi-n.HostReserve.Hugepages1Gi)
	}
	switch {
	case r.MIGProfile != "" && r.GPUs > mig:
		return fmt.Sprintf("%s has %d %s MIG instances of %sGPUs, asked %d", largest, mig, r.MIGProfile, model, r.GPUs)
	case r.MIGProfile == "" && r.Slots == 0 && r.GPUs > whole:
		return fmt.Sprintf("%s has %d %sGPUs, asked %d", largest, whole, model, r.GPUs)
	case r.Slots > slots:
		return fmt.Sprintf("%s has %d shared slots of %sGPUs, asked %d", largest, slots, model, r.Slots)
	case r.VCPU > vcpu:
		return fmt.Sprintf("%s offers %d vCPUs, asked %d", largest, vcpu, r.VCPU)
	case r.MemoryGiB > mem:
		return fmt.Sprintf("%s offers %d GiB of memory, asked %d", largest, mem, r.MemoryGiB)
	case r.Hugepages1Gi > huge:
		return fmt.Sprintf("%s offers %d 1Gi hugepages, asked %d", largest, huge, r.Hugepages1Gi)
	}
	if s := ex.String(); s != "" {
		return never + ": " + s
	}
	return never
}

// NeverFits is the refusal of a request no node of the pool could ever
// hold: FAILED_PRECONDITION (waiting or retrying cannot help), with the
// machine code NO_CAPACITY and the explanation kept for clients that read
// them.
func NeverFits(poolName string, nodes []placement.Node, r *capmodel.Reservation, ex placement.Explanation) error {
	if r.PinNodeID != "" {
		return pinnedNeverFits(poolName, nodes, r, ex)
	}
	if why := BindingUnsupported(poolName, nodes, r); why != "" {
		// The binding the caller chose is what no node offers: name the
		// field, so a client can point at it.
		msg := fmt.Sprintf("pool %s can never hold this request: %s", poolName, why)
		if s := ex.String(); s != "" {
			msg += " (" + s + ")"
		}
		return &envelope.Error{Code: envelope.CodeNoCapacity, Status: connect.CodeFailedPrecondition, Message: msg,
			Violations: []envelope.Violation{{Field: "binding", Reason: why}}, Explanation: ExplanationProto(ex)}
	}
	msg := fmt.Sprintf("pool %s can never hold this request: %s", poolName, neverReason(nodes, r, ex))
	return &envelope.Error{Code: envelope.CodeNoCapacity, Status: connect.CodeFailedPrecondition, Message: msg,
		Explanation: ExplanationProto(ex)}
}

// bindingNeeds says, per binding, what a node's bcd must do for it: the
// capability and, for an operator, why a node may lack it.
var bindingNeeds = map[string]struct{ capability, without string }{
	capmodel.BindingNode:       {CapDevices, "bcd cannot confine an allocation to its GPUs on any node"},
	capmodel.BindingKubernetes: {CapKubernetes, "bcd's Kubernetes device plugin or DRA driver is not registered on any node"},
}

// BindingUnsupported says why no node of the pool can bind r as its
// binding asks (no node advertises the capability it needs), or "" when
// some node can or the binding needs none.
func BindingUnsupported(poolName string, nodes []placement.Node, r *capmodel.Reservation) string {
	need, ok := bindingNeeds[r.Binding]
	if !ok || len(nodes) == 0 {
		return ""
	}
	for i := range nodes {
		if slices.Contains(nodes[i].Capabilities, need.capability) {
			return ""
		}
	}
	return fmt.Sprintf("no node of pool %s advertises %s (%s)", poolName, need.capability, need.without)
}

// pinnedNeverFits is NeverFits for a request pinned to one node: only that
// node matters, so the refusal names it and says what it lacks.
func pinnedNeverFits(poolName string, nodes []placement.Node, r *capmodel.Reservation, ex placement.Explanation) error {
	i := slices.IndexFunc(nodes, func(n placement.Node) bool { return n.ID == r.PinNodeID })
	var why string
	if i < 0 {
		why = fmt.Sprintf("node %s (where the request is pinned) is not in the pool", r.PinNodeID)
	} else {
		node := fmt.Sprintf("node %s (where the request is pinned)", nodes[i].Name)
		why = sizeReason(nodes[i:i+1], r, PinnedOwn(ex), node, node, node+" can never hold it")
	}
	msg := fmt.Sprintf("pool %s can never hold this request: %s", poolName, why)
	return &envelope.Error{Code: envelope.CodeNoCapacity, Status: connect.CodeFailedPrecondition, Message: msg,
		Explanation: ExplanationProto(ex)}
}

// PinnedOwn is the part of a pinned request's explanation that is about the
// pinned node: without the other nodes' ReasonPinned.
func PinnedOwn(ex placement.Explanation) placement.Explanation {
	out := placement.Explanation{Evaluated: ex.Evaluated, Feasible: ex.Feasible,
		ByReason: map[string]int{}, ByClass: map[placement.ClassKey]map[string]int{}}
	for r, n := range ex.ByReason {
		if r != placement.ReasonPinned {
			out.ByReason[r] = n
		}
	}
	for c, m := range ex.ByClass {
		for r, n := range m {
			if r != placement.ReasonPinned {
				if out.ByClass[c] == nil {
					out.ByClass[c] = map[string]int{}
				}
				out.ByClass[c][r] = n
			}
		}
	}
	return out
}
