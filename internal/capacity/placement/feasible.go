package placement

import (
	"slices"
	"strings"
)

// Reasons a node is rejected. Some are completed with detail (the taint,
// the label term, the capability), so an Explanation counts them apart.
const (
	ReasonPinned          = "not the node the request is pinned to"
	ReasonUnschedulable   = "not schedulable"
	ReasonUnhealthy       = "unhealthy"
	ReasonModel           = "no GPUs of the requested model"
	ReasonFreeGPUs        = "not enough free GPUs"
	ReasonFreeSlots       = "not enough free shared slots"
	ReasonNVLink          = "not enough NVLink-connected GPUs"
	ReasonSingleTenant    = "offered to a single other tenant"
	ReasonOtherTenants    = "other tenants hold atoms on it"
	ReasonNotWhole        = "not wholly free (a machine lease takes the whole node)"
	ReasonGPUCount        = "its GPU count is not the request's (a machine lease takes every GPU)"
	ReasonMIGUnsupported  = "no GPU in MIG mode with the requested profile"
	ReasonFreeMIG         = "not enough free MIG instances"
	ReasonVCPU            = "not enough free vcpu"
	ReasonMemory          = "not enough free memory"
	ReasonHugepages2Mi    = "not enough free 2Mi hugepages"
	ReasonHugepages1Gi    = "not enough free 1Gi hugepages"
	reasonTaintPrefix     = "tainted "
	reasonLabelPrefix     = "label selector not met: "
	reasonCapabilityPrefx = "missing capability "
)

// Checker is one feasibility filter: it returns "" when the node can take
// the request, otherwise the reason it cannot. Checkers only read.
type Checker interface {
	Check(req *Request, n *Node) string
}

// CheckerFunc adapts a function to a Checker.
type CheckerFunc func(req *Request, n *Node) string

// Check calls f.
func (f CheckerFunc) Check(req *Request, n *Node) string { return f(req, n) }

// DefaultCheckers is the filter chain, cheapest and most operator-relevant
// first; a node is rejected by the first that fails.
func DefaultCheckers() []Checker {
	return []Checker{
		CheckerFunc(checkPinned),
		CheckerFunc(checkSchedulable),
		CheckerFunc(checkHealthy),
		CheckerFunc(checkTaints),
		CheckerFunc(checkTenancy),
		CheckerFunc(checkLabels),
		CheckerFunc(checkCapabilities),
		CheckerFunc(checkHost),
	}
}

func checkPinned(req *Request, n *Node) string {
	if req.Node != "" && req.Node != n.ID {
		return ReasonPinned
	}
	return ""
}

func checkSchedulable(_ *Request, n *Node) string {
	if !n.Schedulable {
		return ReasonUnschedulable
	}
	return ""
}

func checkHealthy(_ *Request, n *Node) string {
	if !n.Healthy {
		return ReasonUnhealthy
	}
	return ""
}

// checkTaints lets a `dedicated=<tenant>` taint through for that tenant only
// and any other taint only when the request tolerates it.
func checkTaints(req *Request, n *Node) string {
	for _, t := range n.Taints {
		if !taintAdmits(req, &t) {
			return reasonTaintPrefix + t.String()
		}
	}
	return ""
}

// taintAdmits reports whether req may land on a node tainted t: a toleration
// names the taint's key or the whole "key=value" (compared in place, so the
// scan builds no string).
func taintAdmits(req *Request, t *Taint) bool {
	if t.Key == "dedicated" {
		return t.Value == req.Tenant
	}
	for _, tol := range req.Tolerations {
		if tol == t.Key {
			return true
		}
		if t.Value != "" && len(tol) == len(t.Key)+1+len(t.Value) &&
			tol[:len(t.Key)] == t.Key && tol[len(t.Key)] == '=' && tol[len(t.Key)+1:] == t.Value {
			return true
		}
	}
	return false
}

func checkTenancy(req *Request, n *Node) string {
	if n.SingleTenant != "" && n.SingleTenant != req.Tenant {
		return ReasonSingleTenant
	}
	if req.SingleTenant {
		for t, c := range n.TenantAtoms {
			if c > 0 && t != req.Tenant {
				return ReasonOtherTenants
			}
		}
	}
	if req.WholeNode {
		return wholeReason(req, len(n.GPUs), func(yield func(int) bool) {
			for _, c := range n.TenantAtoms {
				if !yield(c) {
					return
				}
			}
		})
	}
	return ""
}

// wholeReason says why a node cannot be leased whole: someone holds atoms
// on it, or it has another number of GPUs than the request takes.
func wholeReason(req *Request, gpus int, held func(yield func(int) bool)) string {
	if gpus != req.GPUs {
		return ReasonGPUCount
	}
	for c := range held {
		if c > 0 {
			return ReasonNotWhole
		}
	}
	return ""
}

func checkLabels(req *Request, n *Node) string {
	for _, l := range req.Selector {
		if !l.Matches(n.Labels) {
			return reasonLabelPrefix + l.String()
		}
	}
	return ""
}

// Matches reports whether labels satisfy the requirement.
func (r LabelRequirement) Matches(labels map[string]string) bool {
	v, ok := labels[r.Key]
	switch r.Op {
	case OpExists:
		return ok
	case OpDoesNotExist:
		return !ok
	case OpIn:
		return ok && valueIn(v, r.Values)
	case OpNotIn:
		return !ok || !valueIn(v, r.Values)
	}
	return false
}

func valueIn(v string, values []string) bool {
	for _, w := range values {
		if w == v || w == "*" {
			return true
		}
		if p, ok := strings.CutSuffix(w, "*"); ok && strings.HasPrefix(v, p) {
			return true
		}
	}
	return false
}

func checkCapabilities(req *Request, n *Node) string {
	for _, c := range req.Capabilities {
		if !slices.Contains(n.Capabilities, c) {
			return reasonCapabilityPrefx + c
		}
	}
	return ""
}

func checkHost(req *Request, n *Node) string { return hostReason(req, n.HostFree()) }

func hostReason(req *Request, free HostResources) string {
	switch {
	case req.VCPU > free.VCPU:
		return ReasonVCPU
	case req.MemoryGiB > free.MemoryGiB:
		return ReasonMemory
	case req.Hugepages2Mi > free.Hugepages2Mi:
		return ReasonHugepages2Mi
	case req.Hugepages1Gi > free.Hugepages1Gi:
		return ReasonHugepages1Gi
	}
	return ""
}

// check runs the default chain, in DefaultCheckers' order and with its
// reasons (the pin is checkSummary's, which ran before), without the calls through the interface and without building a
// reason string per rejected node: those that carry detail are built once
// per call (labels, capabilities) or per taint, and kept in the scratch.
func (sc *scratch) check(req *Request, d *digest) string {
	if !d.schedulable {
		return ReasonUnschedulable
	}
	if !d.healthy {
		return ReasonUnhealthy
	}
	n := d.n
	if d.taints {
		for i := range n.Taints {
			if !taintAdmits(req, &n.Taints[i]) {
				return sc.taintReason(n.Taints[i])
			}
		}
	}
	if d.singleTenant != "" && d.singleTenant != req.Tenant {
		return ReasonSingleTenant
	}
	if req.SingleTenant {
		for _, t := range d.tenants {
			if t.atoms > 0 && t.tenant != req.Tenant {
				return ReasonOtherTenants
			}
		}
	}
	if req.WholeNode {
		if why := wholeReason(req, d.gpus, func(yield func(int) bool) {
			for _, t := range d.tenants {
				if !yield(t.atoms) {
					return
				}
			}
		}); why != "" {
			return why
		}
	}
	for i := range req.Selector {
		if !req.Selector[i].Matches(n.Labels) {
			if sc.labelReasons[i] == "" {
				sc.labelReasons[i] = reasonLabelPrefix + req.Selector[i].String()
			}
			return sc.labelReasons[i]
		}
	}
	for i, c := range req.Capabilities {
		if !slices.Contains(n.Capabilities, c) {
			if sc.capReasons[i] == "" {
				sc.capReasons[i] = reasonCapabilityPrefx + c
			}
			return sc.capReasons[i]
		}
	}
	return hostReason(req, d.hostFree)
}

// maxTaintReasons bounds the scratch's taint reasons, which outlive a call.
const maxTaintReasons = 256

func (sc *scratch) taintReason(t Taint) string {
	r, ok := sc.taintReasons[t]
	if !ok {
		if len(sc.taintReasons) >= maxTaintReasons {
			clear(sc.taintReasons)
		}
		r = reasonTaintPrefix + t.String()
		sc.taintReasons[t] = r
	}
	return r
}

// checkSummary prunes a node from its summary alone, before its detail is
// loaded. Its free counts are upper bounds, so it never rejects a node the
// full chain would accept; it runs first, so a node that fails both is
// counted under the summary's reason. The pin is checked first, as in the
// chain. The model is not checked here: a class has one model, and Place
// rejects a class of the wrong model whole before looking at its nodes.
func checkSummary(req *Request, s *NodeSummary) string {
	if req.Node != "" && req.Node != s.ID {
		return ReasonPinned
	}
	if req.MIGProfile == "" && req.GPUs > s.FreeGPUs {
		return ReasonFreeGPUs
	}
	if req.Slots > s.FreeSlots {
		return ReasonFreeSlots
	}
	return ""
}
