package placement

// The implementation of Place before the scan was made allocation-free,
// kept verbatim (names prefixed "ref") as the oracle the fast path is
// compared with on random fleets: same plans, order, scores and
// explanation.

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// refPick is the atoms chosen on one node and what the scorers need to know
// about them.
type refPick struct {
	atoms      []string
	gpus       []*GPU // GPUs touched, in atom order, without repeats
	islands    int    // NVLink islands touched (whole GPUs)
	numa       int    // NUMA node of the touched GPUs, -1 when several
	cpusLocal  bool   // the refCpuset hint lies on numa
	unitsTotal int    // atoms of the requested kind on the node
	unitsFree  int    // of which free before this refPick
	leftover   int    // free atoms left in the touched islands or GPUs
}

// refGpuUsable reports whether any atom of the GPU may be booked.
func refGpuUsable(g *GPU) bool { return !g.Quarantined && !g.PartitionPending }

func refModelOK(req *Request, g *GPU) bool {
	return req.Model == "" || ModelMatches(req.Model, g.Model)
}

// refPickAtoms chooses the GPU atoms for req on n, or returns the reason none
// fit. Whole GPUs stay inside one NVLink island and one NUMA node where
// possible; MIG instances and slots stay on one GPU, then one NUMA node,
// where possible.
func refPickAtoms(req *Request, n *Node) (refPick, string) {
	var p refPick
	var reason string
	switch {
	case req.MIGProfile != "":
		p, reason = refPickMIG(req, n)
	case req.Slots > 0:
		p, reason = refPickSlots(req, n)
	default:
		p, reason = refPickWhole(req, n)
	}
	if reason != "" {
		return p, reason
	}
	p.numa = -1
	for i, g := range p.gpus {
		if i == 0 {
			p.numa = g.NUMA
		} else if g.NUMA != p.numa {
			p.numa = -1
			break
		}
	}
	// The refCpuset itself is built only for the plans returned.
	p.cpusLocal = req.VCPU == 0 || (p.numa >= 0 && refNumaCPUsFree(n, p.numa) >= req.VCPU)
	return p, ""
}

func refIslandKey(g *GPU) int {
	if g.Island < 0 {
		// No NVLink: the GPU is an island of its own.
		return -1 - g.Index
	}
	return g.Island
}

type refGpuGroup struct {
	island, numa int
	gpus         []*GPU
	islandFree   int  // free GPUs in the whole island
	cpuFit       bool // the group's NUMA node has the request's vCPUs free
}

func refPickWhole(req *Request, n *Node) (refPick, string) {
	var p refPick
	var free []*GPU
	modelSeen := false
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if !refModelOK(req, g) {
			continue
		}
		modelSeen = true
		if !refGpuUsable(g) || g.Mode != ModeWhole {
			continue
		}
		p.unitsTotal++
		if !g.Booked {
			free = append(free, g)
		}
	}
	p.unitsFree = len(free)
	if !modelSeen {
		return p, ReasonModel
	}
	want := req.GPUs
	if len(free) < want {
		return p, ReasonFreeGPUs
	}
	// Nodes hold a handful of GPUs, so linear scans beat maps here.
	islandFree := func(key int) int {
		c := 0
		for _, g := range free {
			if refIslandKey(g) == key {
				c++
			}
		}
		return c
	}
	// bestGroup returns the GPUs of the best group of at least want free
	// GPUs sharing key, or nil. It prefers a NUMA node with the vCPUs
	// free, then best fit: the fewest free GPUs left behind in the
	// island, then in the group, then the lowest GPU index.
	bestGroup := func(key func(*GPU) [2]int) []*GPU {
		var best refGpuGroup
		var members []*GPU
		for i, g := range free {
			k := key(g)
			if slices.ContainsFunc(free[:i], func(h *GPU) bool { return key(h) == k }) {
				continue // group already seen
			}
			members = members[:0]
			for _, h := range free[i:] {
				if key(h) == k {
					members = append(members, h)
				}
			}
			if len(members) < want {
				continue
			}
			gr := refGpuGroup{island: k[0], numa: k[1], gpus: members, islandFree: islandFree(k[0]), cpuFit: refNumaCPUsFree(n, k[1]) >= req.VCPU}
			if best.gpus == nil || cmp.Or(
				-refCmpBool(gr.cpuFit, best.cpuFit),
				cmp.Compare(gr.islandFree, best.islandFree),
				cmp.Compare(len(gr.gpus), len(best.gpus)),
			) < 0 {
				gr.gpus = slices.Clone(members)
				best = gr
			}
		}
		if best.gpus == nil {
			return nil
		}
		return best.gpus[:want]
	}
	const anyKey = -1 << 30
	chosen := bestGroup(func(g *GPU) [2]int { return [2]int{refIslandKey(g), g.NUMA} })
	if chosen == nil {
		chosen = bestGroup(func(g *GPU) [2]int { return [2]int{refIslandKey(g), anyKey} })
	}
	if chosen == nil && req.RequireNVLink && want > 1 {
		return p, ReasonNVLink
	}
	if chosen == nil {
		chosen = bestGroup(func(g *GPU) [2]int { return [2]int{anyKey, g.NUMA} })
	}
	if chosen == nil {
		all := slices.Clone(free)
		slices.SortStableFunc(all, func(a, b *GPU) int {
			return cmp.Or(cmp.Compare(a.NUMA, b.NUMA), cmp.Compare(refIslandKey(a), refIslandKey(b)), cmp.Compare(a.Index, b.Index))
		})
		chosen = all[:want]
	}
	p.atoms = make([]string, 0, want)
	p.gpus = chosen
	var touched []int
	for _, g := range chosen {
		p.atoms = append(p.atoms, g.UUID)
		if k := refIslandKey(g); !slices.Contains(touched, k) {
			touched = append(touched, k)
			if g.Island >= 0 {
				p.leftover += islandFree(k)
			}
		}
		if g.Island >= 0 {
			p.leftover--
		}
	}
	p.islands = len(touched)
	return p, ""
}

func refCmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// refUnitGroup is the free MIG instances or slots of one GPU.
type refUnitGroup struct {
	gpu   *GPU
	atoms []string
}

// refPickUnits takes want atoms from groups: from one GPU where one has enough
// (the fullest that fits), else from one NUMA node, else anywhere, most
// free first.
func refPickUnits(groups []refUnitGroup, want int) (atoms []string, gpus []*GPU, leftover int) {
	slices.SortFunc(groups, func(a, b refUnitGroup) int {
		return cmp.Or(cmp.Compare(len(a.atoms), len(b.atoms)), cmp.Compare(a.gpu.Index, b.gpu.Index))
	})
	for _, g := range groups {
		if len(g.atoms) >= want {
			return g.atoms[:want], []*GPU{g.gpu}, len(g.atoms) - want
		}
	}
	numaFree := map[int]int{}
	for _, g := range groups {
		numaFree[g.gpu.NUMA] += len(g.atoms)
	}
	best := -1
	for numa, f := range numaFree {
		if f >= want && (best == -1 || f < numaFree[best] || (f == numaFree[best] && numa < best)) {
			best = numa
		}
	}
	slices.SortStableFunc(groups, func(a, b refUnitGroup) int {
		return cmp.Or(
			-refCmpBool(a.gpu.NUMA == best, b.gpu.NUMA == best),
			cmp.Compare(len(b.atoms), len(a.atoms)),
			cmp.Compare(a.gpu.Index, b.gpu.Index),
		)
	})
	for _, g := range groups {
		if want == 0 {
			break
		}
		k := min(want, len(g.atoms))
		atoms = append(atoms, g.atoms[:k]...)
		gpus = append(gpus, g.gpu)
		leftover += len(g.atoms) - k
		want -= k
	}
	return atoms, gpus, leftover
}

func refPickMIG(req *Request, n *Node) (refPick, string) {
	var p refPick
	var groups []refUnitGroup
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if !refModelOK(req, g) || !refGpuUsable(g) || g.Mode != ModeMIG {
			continue
		}
		maxN := migMax(g.Model, req.MIGProfile)
		if maxN == 0 {
			continue
		}
		ug := refUnitGroup{gpu: g}
		for _, in := range g.MIG {
			// Only layouts the model supports: an instance outside the
			// table is ignored, never booked.
			if in.Profile != req.MIGProfile || in.N < 0 || in.N >= maxN {
				continue
			}
			p.unitsTotal++
			if !in.Booked {
				ug.atoms = append(ug.atoms, fmt.Sprintf("%s/mig/%s/%d", g.UUID, in.Profile, in.N))
			}
		}
		p.unitsFree += len(ug.atoms)
		if len(ug.atoms) > 0 {
			groups = append(groups, ug)
		}
	}
	if p.unitsTotal == 0 {
		return p, ReasonMIGUnsupported
	}
	if p.unitsFree < req.GPUs {
		return p, ReasonFreeMIG
	}
	p.atoms, p.gpus, p.leftover = refPickUnits(groups, req.GPUs)
	return p, ""
}

func refPickSlots(req *Request, n *Node) (refPick, string) {
	var p refPick
	var groups []refUnitGroup
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if !refModelOK(req, g) || !refGpuUsable(g) || g.Mode != ModeShared {
			continue
		}
		ug := refUnitGroup{gpu: g}
		for _, s := range g.Slots {
			p.unitsTotal++
			if !s.Booked {
				ug.atoms = append(ug.atoms, g.UUID+"/s"+strconv.Itoa(s.K))
			}
		}
		p.unitsFree += len(ug.atoms)
		if len(ug.atoms) > 0 {
			groups = append(groups, ug)
		}
	}
	if p.unitsFree < req.Slots {
		return p, ReasonFreeSlots
	}
	p.atoms, p.gpus, p.leftover = refPickUnits(groups, req.Slots)
	return p, ""
}

func refNumaCPUsFree(n *Node, id int) int {
	for i := range n.NUMA {
		if n.NUMA[i].ID == id {
			return len(n.NUMA[i].FreeCPUs)
		}
	}
	return 0
}

// refPickCPUs hints which CPUs to pin: from the GPUs' NUMA node when it has
// enough, else that node's first and the rest in NUMA order. It returns nil
// when the free CPUs are not known well enough to fill the request.
func refPickCPUs(want int, n *Node, numa int) ([]int, bool) {
	if want == 0 {
		return nil, true
	}
	nodes := slices.Clone(n.NUMA)
	slices.SortStableFunc(nodes, func(a, b NUMANode) int {
		return cmp.Or(-refCmpBool(a.ID == numa, b.ID == numa), cmp.Compare(a.ID, b.ID))
	})
	var cpus []int
	local := true
	for _, nn := range nodes {
		if len(cpus) == want {
			break
		}
		free := slices.Clone(nn.FreeCPUs)
		slices.Sort(free)
		k := min(want-len(cpus), len(free))
		if k > 0 && nn.ID != numa {
			local = false
		}
		cpus = append(cpus, free[:k]...)
	}
	if len(cpus) < want {
		return nil, false
	}
	slices.Sort(cpus)
	return cpus, local
}

// refCpuset formats CPUs as ranges, "0-3,8".
func refCpuset(cpus []int) string {
	var b strings.Builder
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(cpus[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(cpus[j]))
		}
		i = j + 1
	}
	return b.String()
}

// refScoreBinpack prefers nodes that end up fuller in the requested kind of
// atom, so whole nodes stay free for large requests.
func refScoreBinpack(want int, p *refPick) float64 {
	if p.unitsTotal == 0 {
		return 0
	}
	return float64(p.unitsTotal-p.unitsFree+want) / float64(p.unitsTotal)
}

// refScoreTopology rewards one NVLink island (or one GPU for MIG and slots)
// and one NUMA node shared by the GPUs and the pinned CPUs.
func refScoreTopology(p *refPick) float64 {
	var s float64
	if p.islands <= 1 && (p.islands == 1 || len(p.gpus) <= 1) {
		s += 0.5
	}
	if p.numa >= 0 && p.cpusLocal {
		s += 0.5
	}
	return s
}

// refScoreFragmentation prefers the refPick that leaves the fewest free atoms
// stranded in the islands or GPUs it breaks into.
func refScoreFragmentation(p *refPick) float64 { return 1 / (1 + float64(p.leftover)) }

// refScoreSpread prefers nodes where the tenant holds fewer atoms already.
func refScoreSpread(req *Request, n *Node) float64 {
	return 1 / (1 + float64(n.TenantAtoms[req.Tenant]))
}

func refScore(w Weights, req *Request, n *Node, p *refPick) ScoreBreakdown {
	want := req.GPUs
	if req.Slots > 0 {
		want = req.Slots
	}
	b := ScoreBreakdown{
		Binpack:       refScoreBinpack(want, p),
		Topology:      refScoreTopology(p),
		Fragmentation: refScoreFragmentation(p),
		Spread:        refScoreSpread(req, n),
	}
	sum := w.Binpack + w.Topology + w.Fragmentation + w.Spread
	if sum > 0 {
		b.Total = (w.Binpack*b.Binpack + w.Topology*b.Topology + w.Fragmentation*b.Fragmentation + w.Spread*b.Spread) / sum
	}
	return b
}

// refPlace filters the snapshot's nodes for req, picks atoms on each feasible
// node, and returns up to opts.Limit plans, best first, with an explanation
// of every rejection. It returns a *RequestError for an invalid request and
// an empty Result (no error) when nothing fits. Ties are broken by node ID,
// so the result depends on the snapshot only, not its order.
func refPlace(snap *Snapshot, req Request, opts Options) (Result, error) {
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
		checkers = refDefaultCheckers()
	}

	res := Result{Explanation: refNewExplanation()}
	ex := &res.Explanation
	var top []Plan
	for _, class := range snap.classes {
		idx := snap.byClass[class.Key]
		ex.Evaluated += len(idx)
		// Node by node: the pin, then the class's model, are the
		// summary's first checks (Place rejects whole classes instead).
	nodes:
		for _, i := range idx {
			if r := refCheckSummary(&req, &snap.nodes[i]); r != "" {
				refReject(ex, class.Key, r, 1)
				continue
			}
			n := snap.digest(i).n
			for _, c := range checkers {
				if r := c.Check(&req, n); r != "" {
					refReject(ex, class.Key, r, 1)
					continue nodes
				}
			}
			p, r := refPickAtoms(&req, n)
			if r != "" {
				refReject(ex, class.Key, r, 1)
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
				Score: refScore(w, &req, n, &p),
				Split: req.MIGProfile == "" && req.Slots == 0 && req.GPUs > 1 && p.islands != 1,
			}
			top = refInsertTop(top, plan, limit)
		}
	}
	for i := range top {
		cpus, _ := refPickCPUs(req.VCPU, snap.digest(snap.index[top[i].NodeID]).n, top[i].NUMA)
		top[i].CPUSet, top[i].CPUs = refCpuset(cpus), cpus
	}
	res.Plans = top
	return res, nil
}

// refInsertTop keeps the best limit plans in order without sorting every
// feasible node.
func refInsertTop(top []Plan, p Plan, limit int) []Plan {
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

// refDefaultCheckers is the filter chain, cheapest and most operator-relevant
// first; a node is rejected by the first that fails.
func refDefaultCheckers() []Checker {
	return []Checker{
		CheckerFunc(refCheckPinned),
		CheckerFunc(refCheckSchedulable),
		CheckerFunc(refCheckHealthy),
		CheckerFunc(refCheckTaints),
		CheckerFunc(refCheckTenancy),
		CheckerFunc(refCheckLabels),
		CheckerFunc(refCheckCapabilities),
		CheckerFunc(refCheckHost),
	}
}

func refCheckPinned(req *Request, n *Node) string {
	if req.Node != "" && n.ID != req.Node {
		return ReasonPinned
	}
	return ""
}

func refCheckSchedulable(_ *Request, n *Node) string {
	if !n.Schedulable {
		return ReasonUnschedulable
	}
	return ""
}

func refCheckHealthy(_ *Request, n *Node) string {
	if !n.Healthy {
		return ReasonUnhealthy
	}
	return ""
}

// refCheckTaints lets a `dedicated=<tenant>` taint through for that tenant only
// and any other taint only when the request tolerates it.
func refCheckTaints(req *Request, n *Node) string {
	for _, t := range n.Taints {
		if t.Key == "dedicated" {
			if t.Value != req.Tenant {
				return reasonTaintPrefix + t.String()
			}
			continue
		}
		if !slices.Contains(req.Tolerations, t.Key) && !slices.Contains(req.Tolerations, t.String()) {
			return reasonTaintPrefix + t.String()
		}
	}
	return ""
}

func refCheckTenancy(req *Request, n *Node) string {
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
	return ""
}

func refCheckLabels(req *Request, n *Node) string {
	for _, l := range req.Selector {
		if !l.Matches(n.Labels) {
			return reasonLabelPrefix + l.String()
		}
	}
	return ""
}

func refCheckCapabilities(req *Request, n *Node) string {
	for _, c := range req.Capabilities {
		if !slices.Contains(n.Capabilities, c) {
			return reasonCapabilityPrefx + c
		}
	}
	return ""
}

func refCheckHost(req *Request, n *Node) string {
	free := n.HostFree()
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

// refCheckSummary prunes a node from its summary alone, before its detail is
// loaded. Its free counts are upper bounds and a class has one GPU model,
// so it never rejects a node the full chain would accept; it runs first, so
// a node that fails both is counted under the summary's reason.
func refCheckSummary(req *Request, s *NodeSummary) string {
	if req.Node != "" && s.ID != req.Node {
		return ReasonPinned
	}
	if req.Model != "" && s.Class.Model != "" && !ModelMatches(req.Model, s.Class.Model) {
		return ReasonModel
	}
	if req.MIGProfile == "" && req.GPUs > s.FreeGPUs {
		return ReasonFreeGPUs
	}
	if req.Slots > s.FreeSlots {
		return ReasonFreeSlots
	}
	return ""
}

func refNewExplanation() Explanation {
	return Explanation{ByReason: map[string]int{}, ByClass: map[ClassKey]map[string]int{}}
}

func refReject(e *Explanation, class ClassKey, reason string, nodes int) {
	e.ByReason[reason] += nodes
	m := e.ByClass[class]
	if m == nil {
		m = map[string]int{}
		e.ByClass[class] = m
	}
	m[reason] += nodes
}
