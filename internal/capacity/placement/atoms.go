package placement

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// pick is the atoms chosen on one node and what the scorers need to know
// about them.
type pick struct {
	atoms      []string
	gpus       []*GPU // GPUs touched, in atom order, without repeats
	islands    int    // NVLink islands touched (whole GPUs)
	numa       int    // NUMA node of the touched GPUs, -1 when several
	cpusLocal  bool   // the cpuset hint lies on numa
	unitsTotal int    // atoms of the requested kind on the node
	unitsFree  int    // of which free before this pick
	leftover   int    // free atoms left in the touched islands or GPUs
}

// gpuUsable reports whether any atom of the GPU may be booked.
func gpuUsable(g *GPU) bool { return !g.Quarantined && !g.PartitionPending }

func modelOK(req *Request, g *GPU) bool {
	return req.Model == "" || ModelMatches(req.Model, g.Model)
}

// pickAtoms chooses the GPU atoms for req on n, or returns the reason none
// fit. Whole GPUs stay inside one NVLink island and one NUMA node where
// possible; MIG instances and slots stay on one GPU, then one NUMA node,
// where possible.
func pickAtoms(req *Request, n *Node) (pick, string) {
	var p pick
	var reason string
	switch {
	case req.MIGProfile != "":
		p, reason = pickMIG(req, n)
	case req.Slots > 0:
		p, reason = pickSlots(req, n)
	default:
		p, reason = pickWhole(req, n)
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
	// The cpuset itself is built only for the plans returned.
	p.cpusLocal = req.VCPU == 0 || (p.numa >= 0 && numaCPUsFree(n, p.numa) >= req.VCPU)
	return p, ""
}

func islandKey(g *GPU) int {
	if g.Island < 0 {
		// No NVLink: the GPU is an island of its own.
		return -1 - g.Index
	}
	return g.Island
}

type gpuGroup struct {
	island, numa int
	gpus         []*GPU
	islandFree   int  // free GPUs in the whole island
	cpuFit       bool // the group's NUMA node has the request's vCPUs free
}

func pickWhole(req *Request, n *Node) (pick, string) {
	var p pick
	var free []*GPU
	modelSeen := false
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if !modelOK(req, g) {
			continue
		}
		modelSeen = true
		if !gpuUsable(g) || g.Mode != ModeWhole {
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
			if islandKey(g) == key {
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
		var best gpuGroup
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
			gr := gpuGroup{island: k[0], numa: k[1], gpus: members, islandFree: islandFree(k[0]), cpuFit: numaCPUsFree(n, k[1]) >= req.VCPU}
			if best.gpus == nil || cmp.Or(
				-cmpBool(gr.cpuFit, best.cpuFit),
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
	chosen := bestGroup(func(g *GPU) [2]int { return [2]int{islandKey(g), g.NUMA} })
	if chosen == nil {
		chosen = bestGroup(func(g *GPU) [2]int { return [2]int{islandKey(g), anyKey} })
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
			return cmp.Or(cmp.Compare(a.NUMA, b.NUMA), cmp.Compare(islandKey(a), islandKey(b)), cmp.Compare(a.Index, b.Index))
		})
		chosen = all[:want]
	}
	p.atoms = make([]string, 0, want)
	p.gpus = chosen
	var touched []int
	for _, g := range chosen {
		p.atoms = append(p.atoms, g.UUID)
		if k := islandKey(g); !slices.Contains(touched, k) {
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

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// unitGroup is the free MIG instances or slots of one GPU.
type unitGroup struct {
	gpu   *GPU
	atoms []string
}

// pickUnits takes want atoms from groups: from one GPU where one has enough
// (the fullest that fits), else from one NUMA node, else anywhere, most
// free first.
func pickUnits(groups []unitGroup, want int) (atoms []string, gpus []*GPU, leftover int) {
	slices.SortFunc(groups, func(a, b unitGroup) int {
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
	slices.SortStableFunc(groups, func(a, b unitGroup) int {
		return cmp.Or(
			-cmpBool(a.gpu.NUMA == best, b.gpu.NUMA == best),
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

func pickMIG(req *Request, n *Node) (pick, string) {
	var p pick
	var groups []unitGroup
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if !modelOK(req, g) || !gpuUsable(g) || g.Mode != ModeMIG {
			continue
		}
		maxN := migMax(g.Model, req.MIGProfile)
		if maxN == 0 {
			continue
		}
		ug := unitGroup{gpu: g}
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
	p.atoms, p.gpus, p.leftover = pickUnits(groups, req.GPUs)
	return p, ""
}

func pickSlots(req *Request, n *Node) (pick, string) {
	var p pick
	var groups []unitGroup
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if !modelOK(req, g) || !gpuUsable(g) || g.Mode != ModeShared {
			continue
		}
		ug := unitGroup{gpu: g}
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
	p.atoms, p.gpus, p.leftover = pickUnits(groups, req.Slots)
	return p, ""
}

func numaCPUsFree(n *Node, id int) int {
	for i := range n.NUMA {
		if n.NUMA[i].ID == id {
			return len(n.NUMA[i].FreeCPUs)
		}
	}
	return 0
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
