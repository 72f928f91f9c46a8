package placement

import (
	"cmp"
	"slices"
)

// DefaultLimit is how many plans Place returns when Options.Limit is zero.
const DefaultLimit = 3

// Options tune one Place call.
type Options struct {
	// Limit is the most plans to return; zero means DefaultLimit.
	Limit int
	// Weights weigh the scorers; nil means DefaultWeights.
	Weights *Weights
	// Checkers replace the filter chain; nil means DefaultCheckers.
	Checkers []Checker
}

// Place filters the snapshot's nodes for req, picks atoms on each feasible
// node, and returns up to opts.Limit plans, best first, with an explanation
// of every rejection. It returns a *RequestError for an invalid request and
// an empty Result (no error) when nothing fits. Ties are broken by node ID,
// so the result depends on the snapshot only, not its order.
func Place(snap *Snapshot, req Request, opts Options) (Result, error) {
	if err := req.Validate(); err != nil {
		return Result{}, err
	}
	if opts.Limit < 0 {
		return Result{}, &RequestError{"limit", "must not be negative"}
	}
	limit := cmp.Or(opts.Limit, DefaultLimit)
	w := DefaultWeights
	if opts.Weights != nil {
		w = *opts.Weights
	}
	checkers := opts.Checkers
	if checkers == nil {
		checkers = DefaultCheckers()
	}

	res := Result{Explanation: newExplanation()}
	ex := &res.Explanation
	var top []Plan
	for _, class := range snap.classes {
		idx := snap.byClass[class.Key]
		ex.Evaluated += len(idx)
		// A whole class of the wrong model is rejected from the index,
		// without loading any node's detail.
		if req.Model != "" && class.Key.Model != "" && !ModelMatches(req.Model, class.Key.Model) {
			ex.reject(class.Key, ReasonModel, len(idx))
			continue
		}
	nodes:
		for _, i := range idx {
			if r := checkSummary(&req, &snap.nodes[i]); r != "" {
				ex.reject(class.Key, r, 1)
				continue
			}
			n := snap.node(i)
			for _, c := range checkers {
				if r := c.Check(&req, n); r != "" {
					ex.reject(class.Key, r, 1)
					continue nodes
				}
			}
			p, r := pickAtoms(&req, n)
			if r != "" {
				ex.reject(class.Key, r, 1)
				continue
			}
			ex.Feasible++
			plan := Plan{
				NodeID:   n.ID,
				NodeName: n.Name,
				Class:    class.Key,
				Atoms:    p.atoms,
				Host: HostResources{
					VCPU: req.VCPU, MemoryGiB: req.MemoryGiB,
					Hugepages2Mi: req.Hugepages2Mi, Hugepages1Gi: req.Hugepages1Gi,
				},
				NUMA:  p.numa,
				Score: score(w, &req, n, &p),
				Split: req.MIGProfile == "" && req.Slots == 0 && req.GPUs > 1 && p.islands != 1,
			}
			top = insertTop(top, plan, limit)
		}
	}
	for i := range top {
		cpus, _ := pickCPUs(req.VCPU, snap.node(snap.index[top[i].NodeID]), top[i].NUMA)
		top[i].CPUSet, top[i].CPUs = cpuset(cpus), cpus
	}
	res.Plans = top
	return res, nil
}

func better(a, b *Plan) int {
	return cmp.Or(cmpBool(a.Split, b.Split), cmp.Compare(b.Score.Total, a.Score.Total), cmp.Compare(a.NodeID, b.NodeID))
}

// insertTop keeps the best limit plans in order without sorting every
// feasible node.
func insertTop(top []Plan, p Plan, limit int) []Plan {
	if len(top) == limit && better(&p, &top[len(top)-1]) >= 0 {
		return top
	}
	i, _ := slices.BinarySearchFunc(top, p, func(e, t Plan) int { return better(&e, &t) })
	top = slices.Insert(top, i, p)
	if len(top) > limit {
		top = top[:limit]
	}
	return top
}
