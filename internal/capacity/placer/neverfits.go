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
	models := PoolModels(nodes)
	matches := func(g placement.GPU) bool { return r.Model == "" || placement.ModelMatches(r.Model, g.Model) }
	any := false
	for i := range nodes {
		for _, g := range nodes[i].GPUs {
			any = any || matches(g)
		}
	}
	if !any {
		if r.Model == "" {
			return "the pool has no GPUs"
		}
		return fmt.Sprintf("the pool has no %s GPUs (%s)", r.Model, ModelsPhrase(models))
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
		return fmt.Sprintf("the largest node has %d %s MIG instances of %sGPUs, asked %d", mig, r.MIGProfile, model, r.GPUs)
	case r.MIGProfile == "" && r.Slots == 0 && r.GPUs > whole:
		return fmt.Sprintf("the largest node has %d %sGPUs, asked %d", whole, model, r.GPUs)
	case r.Slots > slots:
		return fmt.Sprintf("the largest node has %d shared slots of %sGPUs, asked %d", slots, model, r.Slots)
	case r.VCPU > vcpu:
		return fmt.Sprintf("the largest node offers %d vCPUs, asked %d", vcpu, r.VCPU)
	case r.MemoryGiB > mem:
		return fmt.Sprintf("the largest node offers %d GiB of memory, asked %d", mem, r.MemoryGiB)
	case r.Hugepages1Gi > huge:
		return fmt.Sprintf("the largest node offers %d 1Gi hugepages, asked %d", huge, r.Hugepages1Gi)
	}
	if s := ex.String(); s != "" {
		return "no node of the pool can ever hold it: " + s
	}
	return "no node of the pool can ever hold it"
}

// NeverFits is the refusal of a request no node of the pool could ever
// hold: FAILED_PRECONDITION (waiting or retrying cannot help), with the
// machine code NO_CAPACITY and the explanation kept for clients that read
// them.
func NeverFits(poolName string, nodes []placement.Node, r *capmodel.Reservation, ex placement.Explanation) error {
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
