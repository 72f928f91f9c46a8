package placement

import "cmp"

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
	// nil keeps the default chain, which the scan runs inline.
	checkers := opts.Checkers

	sc := getScratch(&req)
	defer putScratch(sc)
	// Once the top is full, a whole-GPU node that could not enter it even
	// with the best topology and fragmentation scores is counted feasible
	// without picking its GPUs or scoring it.
	bound := req.MIGProfile == "" && req.Slots == 0 && req.GPUs > 0 && boundable(&w)
	res := Result{Explanation: newExplanation()}
	ex := &res.Explanation
	// A pinned request rejects every other node before anything else: a
	// class without the pinned node whole, from the index.
	pin, pinned := -1, req.Node != ""
	if pinned {
		if i, ok := snap.index[req.Node]; ok {
			pin = i
		}
	}
	for ci, class := range snap.classes {
		idx := snap.byClass[class.Key]
		ex.Evaluated += len(idx)
		if pinned && (pin < 0 || snap.nodes[pin].Class != class.Key) {
			ex.reject(class.Key, ReasonPinned, len(idx))
			continue
		}
		// A whole class of the wrong model is rejected from the index,
		// without loading any node's detail.
		if req.Model != "" && class.Key.Model != "" && !ModelMatches(req.Model, class.Key.Model) {
			wrong := len(idx)
			if pinned {
				if wrong > 1 {
					ex.reject(class.Key, ReasonPinned, wrong-1)
				}
				wrong = 1
			}
			ex.reject(class.Key, ReasonModel, wrong)
			continue
		}
		for _, i := range idx {
			d, r := sc.admit(snap, i, &req, checkers)
			if r == "" && bound && len(sc.top) == limit && sc.losesAnyway(&req, d, &w) {
				ex.Feasible++
				continue
			}
			var p pick
			if r == "" {
				p, r = sc.pickAtoms(&req, d)
			}
			if r != "" {
				sc.count(r)
				continue
			}
			ex.Feasible++
			c := candidate{
				id:    d.id,
				node:  i,
				class: ci,
				numa:  p.numa,
				split: req.MIGProfile == "" && req.Slots == 0 && req.GPUs > 1 && p.islands != 1,
				score: score(w, &req, d, &p),
			}
			sc.insertTop(&c, limit)
		}
		sc.flush(ex, class.Key)
	}
	if len(sc.top) > 0 {
		res.Plans = make([]Plan, len(sc.top))
	}
	host := HostResources{VCPU: req.VCPU, MemoryGiB: req.MemoryGiB, Hugepages2Mi: req.Hugepages2Mi, Hugepages1Gi: req.Hugepages1Gi}
	for k := range sc.top {
		c := &sc.top[k]
		d := snap.digest(c.node)
		n := d.n
		// Pick again to spell out the atoms: the pick is a pure function
		// of the node, so it is the one scored.
		sc.pickAtoms(&req, d)
		cpus, _ := pickCPUs(req.VCPU, n, c.numa)
		res.Plans[k] = Plan{
			NodeID:   n.ID,
			NodeName: n.Name,
			Class:    snap.classes[c.class].Key,
			Atoms:    sc.atoms(&req, n),
			Host:     host,
			NUMA:     c.numa,
			CPUSet:   cpuset(cpus),
			CPUs:     cpus,
			Score:    c.score,
			Split:    c.split,
		}
	}
	return res, nil
}

// admit runs node i through the summary check and the checkers, and
// returns its digest or the reason it is rejected. nil checkers run the
// default chain.
func (sc *scratch) admit(snap *Snapshot, i int, req *Request, checkers []Checker) (*digest, string) {
	if r := checkSummary(req, &snap.nodes[i]); r != "" {
		return nil, r
	}
	d := snap.digest(i)
	if checkers == nil {
		return d, sc.check(req, d)
	}
	for _, c := range checkers {
		if r := c.Check(req, d.n); r != "" {
			return d, r
		}
	}
	return d, ""
}

// losesAnyway reports whether a whole-GPU request surely fits d's node
// (the digest says pickWhole cannot refuse it) and its plan could not enter
// the full top: not even when its pick is inside one NVLink island with the
// best topology and fragmentation scores, as the binpack and spread scores
// do not depend on the pick.
func (sc *scratch) losesAnyway(req *Request, d *digest, w *Weights) bool {
	want := req.GPUs
	if d.mixed || d.gpus == 0 || !sc.modelMatches(req, d.model) || len(d.free) < want ||
		(req.RequireNVLink && want > 1 && d.maxIslandFree < want) {
		return false
	}
	best := ScoreBreakdown{
		Binpack:       scoreBinpack(want, &pick{unitsTotal: d.wholeTotal, unitsFree: len(d.free)}),
		Topology:      1,
		Fragmentation: 1,
		Spread:        scoreSpread(req, d),
	}
	c := candidate{id: d.id, score: ScoreBreakdown{Total: weighted(w, &best)}}
	return betterCandidate(&c, &sc.top[len(sc.top)-1]) >= 0
}

func better(a, b *Plan) int {
	return cmp.Or(cmpBool(a.Split, b.Split), cmp.Compare(b.Score.Total, a.Score.Total), cmp.Compare(a.NodeID, b.NodeID))
}
