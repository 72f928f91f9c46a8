package placement

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// pick is what the scorers need to know about the atoms chosen on one node.
// The atoms themselves stay in the scratch (as GPU and unit indexes) and
// become strings only for the plans returned, so scoring a node allocates
// nothing.
type pick struct {
	gpus       int  // GPUs touched
	islands    int  // NVLink islands touched (whole GPUs)
	numa       int  // NUMA node of the touched GPUs, -1 when several
	cpusLocal  bool // the cpuset hint lies on numa
	unitsTotal int  // atoms of the requested kind on the node
	unitsFree  int  // of which free before this pick
	leftover   int  // free atoms left in the touched islands or GPUs
}

// gpuUsable reports whether any atom of the GPU may be booked.
func gpuUsable(g *GPU) bool { return !g.Quarantined && !g.PartitionPending }

// modelOK reports whether g is of the requested model.
func (sc *scratch) modelOK(req *Request, g *GPU) bool { return sc.modelMatches(req, g.Model) }

// modelMatches reports whether a GPU of model is of the requested model.
// The answer for the last model seen is kept, as a node's GPUs, and often a
// fleet's, share one.
func (sc *scratch) modelMatches(req *Request, model string) bool {
	if req.Model == "" {
		return true
	}
	if !sc.modelSet || model != sc.model {
		sc.model, sc.modelMatch, sc.modelSet = model, ModelMatches(req.Model, model), true
	}
	return sc.modelMatch
}

// migMax is the package's migMax, remembered for the last model seen.
func (sc *scratch) migMax(model, profile string) int {
	if !sc.migSet || model != sc.migModel {
		sc.migModel, sc.migN, sc.migSet = model, migMax(model, profile), true
	}
	return sc.migN
}

// pickAtoms chooses the GPU atoms for req on d's node, or returns the
// reason none fit. Whole GPUs stay inside one NVLink island and one NUMA
// node where possible; MIG instances and slots stay on one GPU, then one
// NUMA node, where possible. The GPUs touched are left in sc.chosen and
// sc.chosenNUMA and, for MIG instances and slots, the units taken in
// sc.unitGPU and sc.unit, for atoms to spell out.
func (sc *scratch) pickAtoms(req *Request, d *digest) (pick, string) {
	var p pick
	var reason string
	sc.chosen, sc.chosenNUMA, sc.unitGPU, sc.unit = sc.chosen[:0], sc.chosenNUMA[:0], sc.unitGPU[:0], sc.unit[:0]
	switch {
	case req.GPUs == 0 && req.Slots == 0 && req.MIGProfile == "":
		// Host resources only (a guest without GPUs): no atom to pick;
		// the host check already admitted the node.
	case req.MIGProfile != "":
		p, reason = sc.pickMIG(req, d.n)
	case req.Slots > 0:
		p, reason = sc.pickSlots(req, d.n)
	default:
		p, reason = sc.pickWhole(req, d)
	}
	if reason != "" {
		return p, reason
	}
	p.gpus = len(sc.chosen)
	p.numa = -1
	for i, numa := range sc.chosenNUMA {
		if i == 0 {
			p.numa = numa
		} else if numa != p.numa {
			p.numa = -1
			break
		}
	}
	// The cpuset itself is built only for the plans returned.
	p.cpusLocal = req.VCPU == 0 || (p.numa >= 0 && d.numaCPUsFree(p.numa) >= req.VCPU)
	return p, ""
}

// atoms spells out the atoms of the last pickAtoms on n.
func (sc *scratch) atoms(req *Request, n *Node) []string {
	if req.MIGProfile == "" && req.Slots == 0 {
		atoms := make([]string, 0, len(sc.chosen))
		for _, gi := range sc.chosen {
			atoms = append(atoms, n.GPUs[gi].UUID)
		}
		return atoms
	}
	atoms := make([]string, 0, len(sc.unit))
	for i, u := range sc.unit {
		g := &n.GPUs[sc.unitGPU[i]]
		if req.MIGProfile != "" {
			in := &g.MIG[u]
			atoms = append(atoms, fmt.Sprintf("%s/mig/%s/%d", g.UUID, in.Profile, in.N))
		} else {
			atoms = append(atoms, g.UUID+"/s"+strconv.Itoa(g.Slots[u].K))
		}
	}
	return atoms
}

func islandKey(g *GPU) int {
	if g.Island < 0 {
		// No NVLink: the GPU is an island of its own.
		return -1 - g.Index
	}
	return g.Island
}

// freeGPU is a GPU free for a whole-GPU booking: its index in the node,
// its island key, whether it has NVLink peers and its NUMA node.
type freeGPU struct {
	idx    int32
	linked bool
	island int
	numa   int
}

func newFreeGPU(i int, g *GPU) freeGPU {
	return freeGPU{idx: int32(i), linked: g.Island >= 0, island: islandKey(g), numa: g.NUMA}
}

// anyKey stands for "any island" or "any NUMA node" in a group key.
const anyKey = -1 << 30

// Group keys bestGroup can group free GPUs by.
const (
	byIslandAndNUMA = iota
	byIsland
	byNUMA
)

// islandFree counts the free GPUs in island key.
func islandFree(free []freeGPU, key int) int {
	c := 0
	for i := range free {
		if free[i].island == key {
			c++
		}
	}
	return c
}

// bestGroup puts in sc.picked the first want GPUs of the best group of at
// least want free GPUs sharing a key under by, and reports whether there is
// one. It prefers a NUMA node with the vCPUs free, then best fit: the
// fewest free GPUs left behind in the island, then in the group, then the
// group seen first (the lowest GPU index).
func (sc *scratch) bestGroup(d *digest, free []freeGPU, want, vcpu, by int) bool {
	// The key of each free GPU under by: its island and NUMA node, either
	// of which may be anyKey.
	ki, kn, seen := sc.keyIsland[:0], sc.keyNUMA[:0], sc.seen[:0]
	for i := range free {
		a, b := free[i].island, free[i].numa
		switch by {
		case byIsland:
			b = anyKey
		case byNUMA:
			a = anyKey
		}
		ki, kn, seen = append(ki, a), append(kn, b), append(seen, false)
	}
	sc.keyIsland, sc.keyNUMA, sc.seen = ki, kn, seen
	found := false
	var bestIsland, bestNUMA, bestIslandFree, bestLen int
	var bestCPUFit bool
	// Nodes hold a handful of GPUs, so linear scans beat maps here.
	for i := range ki {
		if seen[i] {
			continue // group already seen
		}
		members := 0
		for j := i; j < len(ki); j++ {
			if ki[j] == ki[i] && kn[j] == kn[i] {
				seen[j] = true
				members++
			}
		}
		if members < want {
			continue
		}
		left, cpuFit := islandFree(free, ki[i]), d.numaCPUsFree(kn[i]) >= vcpu
		if !found || cmp.Or(
			-cmpBool(cpuFit, bestCPUFit),
			cmp.Compare(left, bestIslandFree),
			cmp.Compare(members, bestLen),
		) < 0 {
			found = true
			bestIsland, bestNUMA, bestIslandFree, bestLen, bestCPUFit = ki[i], kn[i], left, members, cpuFit
		}
	}
	if !found {
		return false
	}
	for j := range ki {
		if len(sc.picked) == want {
			break
		}
		if ki[j] == bestIsland && kn[j] == bestNUMA {
			sc.picked = append(sc.picked, free[j])
		}
	}
	return true
}

// pickWhole picks whole GPUs. A node whose GPUs share one model is picked
// from its digest alone; a mixed one is walked GPU by GPU.
func (sc *scratch) pickWhole(req *Request, d *digest) (pick, string) {
	var p pick
	var free []freeGPU
	modelSeen := false
	if !d.mixed {
		modelSeen = d.gpus > 0 && sc.modelMatches(req, d.model)
		if modelSeen {
			p.unitsTotal, free = d.wholeTotal, d.free
		}
	} else {
		sc.freeBuf = sc.freeBuf[:0]
		n := d.n
		for i := range n.GPUs {
			g := &n.GPUs[i]
			if !sc.modelOK(req, g) {
				continue
			}
			modelSeen = true
			if !gpuUsable(g) || g.Mode != ModeWhole {
				continue
			}
			p.unitsTotal++
			if !g.Booked {
				sc.freeBuf = append(sc.freeBuf, newFreeGPU(i, g))
			}
		}
		free = sc.freeBuf
	}
	p.unitsFree = len(free)
	if !modelSeen {
		return p, ReasonModel
	}
	want := req.GPUs
	if len(free) < want {
		return p, ReasonFreeGPUs
	}
	sc.picked = sc.picked[:0]
	ok := sc.bestGroup(d, free, want, req.VCPU, byIslandAndNUMA) || sc.bestGroup(d, free, want, req.VCPU, byIsland)
	if !ok && req.RequireNVLink && want > 1 {
		return p, ReasonNVLink
	}
	if !ok {
		ok = sc.bestGroup(d, free, want, req.VCPU, byNUMA)
	}
	if !ok {
		n := d.n
		sc.picked = append(sc.picked[:0], free...)
		slices.SortStableFunc(sc.picked, func(a, b freeGPU) int {
			return cmp.Or(cmp.Compare(a.numa, b.numa), cmp.Compare(a.island, b.island), cmp.Compare(n.GPUs[a.idx].Index, n.GPUs[b.idx].Index))
		})
		sc.picked = sc.picked[:want]
	}
	for ci := range sc.picked {
		f := &sc.picked[ci]
		sc.chosen, sc.chosenNUMA = append(sc.chosen, f.idx), append(sc.chosenNUMA, f.numa)
		first := true
		for _, e := range sc.picked[:ci] {
			if e.island == f.island {
				first = false
				break
			}
		}
		if first {
			p.islands++
			if f.linked {
				p.leftover += islandFree(free, f.island)
			}
		}
		if f.linked {
			p.leftover--
		}
	}
	return p, ""
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// unitGroup is the free MIG instances or slots of one GPU: n indexes into
// its MIG or Slots, from off in sc.units.
type unitGroup struct {
	gpu, off, n int32
}

// numaCount is the free units of one NUMA node.
type numaCount struct{ numa, free int }

// pickUnits takes want atoms from the groups in sc.groups: from one GPU
// where one has enough (the fullest that fits), else from one NUMA node,
// else anywhere, most free first. It leaves the GPUs touched in sc.chosen
// and the units taken in sc.unitGPU and sc.unit.
func (sc *scratch) pickUnits(n *Node, want int) (leftover int) {
	groups := sc.groups
	slices.SortFunc(groups, func(a, b unitGroup) int {
		return cmp.Or(cmp.Compare(a.n, b.n), cmp.Compare(n.GPUs[a.gpu].Index, n.GPUs[b.gpu].Index))
	})
	take := func(g unitGroup, k int) {
		sc.chosen, sc.chosenNUMA = append(sc.chosen, g.gpu), append(sc.chosenNUMA, n.GPUs[g.gpu].NUMA)
		for _, u := range sc.units[g.off : g.off+int32(k)] {
			sc.unitGPU = append(sc.unitGPU, g.gpu)
			sc.unit = append(sc.unit, u)
		}
	}
	for _, g := range groups {
		if int(g.n) >= want {
			take(g, want)
			return int(g.n) - want
		}
	}
	sc.numaFree = sc.numaFree[:0]
	for _, g := range groups {
		numa, found := n.GPUs[g.gpu].NUMA, false
		for i := range sc.numaFree {
			if sc.numaFree[i].numa == numa {
				sc.numaFree[i].free += int(g.n)
				found = true
				break
			}
		}
		if !found {
			sc.numaFree = append(sc.numaFree, numaCount{numa, int(g.n)})
		}
	}
	freeOf := func(numa int) int {
		for _, c := range sc.numaFree {
			if c.numa == numa {
				return c.free
			}
		}
		return 0
	}
	best := -1
	for _, c := range sc.numaFree {
		if c.free >= want && (best == -1 || c.free < freeOf(best) || (c.free == freeOf(best) && c.numa < best)) {
			best = c.numa
		}
	}
	slices.SortStableFunc(groups, func(a, b unitGroup) int {
		ga, gb := &n.GPUs[a.gpu], &n.GPUs[b.gpu]
		return cmp.Or(
			-cmpBool(ga.NUMA == best, gb.NUMA == best),
			cmp.Compare(b.n, a.n),
			cmp.Compare(ga.Index, gb.Index),
		)
	})
	for _, g := range groups {
		if want == 0 {
			break
		}
		k := min(want, int(g.n))
		take(g, k)
		leftover += int(g.n) - k
		want -= k
	}
	return leftover
}

func (sc *scratch) pickMIG(req *Request, n *Node) (pick, string) {
	var p pick
	sc.groups, sc.units = sc.groups[:0], sc.units[:0]
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if !sc.modelOK(req, g) || !gpuUsable(g) || g.Mode != ModeMIG {
			continue
		}
		maxN := sc.migMax(g.Model, req.MIGProfile)
		if maxN == 0 {
			continue
		}
		ug := unitGroup{gpu: int32(i), off: int32(len(sc.units))}
		for k := range g.MIG {
			in := &g.MIG[k]
			// Only layouts the model supports: an instance outside the
			// table is ignored, never booked.
			if in.Profile != req.MIGProfile || in.N < 0 || in.N >= maxN {
				continue
			}
			p.unitsTotal++
			if !in.Booked {
				sc.units = append(sc.units, int32(k))
				ug.n++
			}
		}
		p.unitsFree += int(ug.n)
		if ug.n > 0 {
			sc.groups = append(sc.groups, ug)
		}
	}
	if p.unitsTotal == 0 {
		return p, ReasonMIGUnsupported
	}
	if p.unitsFree < req.GPUs {
		return p, ReasonFreeMIG
	}
	p.leftover = sc.pickUnits(n, req.GPUs)
	return p, ""
}

func (sc *scratch) pickSlots(req *Request, n *Node) (pick, string) {
	var p pick
	sc.groups, sc.units = sc.groups[:0], sc.units[:0]
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if !sc.modelOK(req, g) || !gpuUsable(g) || g.Mode != ModeShared {
			continue
		}
		ug := unitGroup{gpu: int32(i), off: int32(len(sc.units))}
		for k, s := range g.Slots {
			p.unitsTotal++
			if !s.Booked {
				sc.units = append(sc.units, int32(k))
				ug.n++
			}
		}
		p.unitsFree += int(ug.n)
		if ug.n > 0 {
			sc.groups = append(sc.groups, ug)
		}
	}
	if p.unitsFree < req.Slots {
		return p, ReasonFreeSlots
	}
	p.leftover = sc.pickUnits(n, req.Slots)
	return p, ""
}

// pickCPUs hints which CPUs to pin: from the GPUs' NUMA node when it has
// enough, else that node's first and the rest in NUMA order. It returns nil
// when the free CPUs are not known well enough to fill the request.
func pickCPUs(want int, n *Node, numa int) ([]int, bool) {
	if want == 0 {
		return nil, true
	}
	nodes := slices.Clone(n.NUMA)
	slices.SortStableFunc(nodes, func(a, b NUMANode) int {
		return cmp.Or(-cmpBool(a.ID == numa, b.ID == numa), cmp.Compare(a.ID, b.ID))
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

// cpuset formats CPUs as ranges, "0-3,8".
func cpuset(cpus []int) string {
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
