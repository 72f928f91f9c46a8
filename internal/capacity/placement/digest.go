package placement

// digest is what a full scan reads of a node, packed small and computed
// once, when the node's detail is first viewed, so scanning a pool touches
// a few cache lines per node instead of walking every GPU's full record.
// A snapshot's detail is immutable, so its digest never goes stale.
type digest struct {
	n            *Node
	id           string
	schedulable  bool
	healthy      bool
	taints       bool // the node has taints
	mixed        bool // its GPUs are not all of one model
	gpus         int
	model        string // the model of every GPU when !mixed
	singleTenant string
	hostFree     HostResources
	// wholeTotal counts the usable GPUs in whole mode; free is those not
	// booked, in node order.
	wholeTotal int
	free       []freeGPU
	// maxIslandFree is the most free GPUs sharing one island key.
	maxIslandFree int
	// numa is each NUMA node's ID and free CPU count, in node order.
	numa []numaCPUs
	// tenants mirrors TenantAtoms: a node holds a handful of tenants, and
	// comparing a few strings is cheaper than hashing one.
	tenants []tenantAtoms
}

type numaCPUs struct{ id, free int }

type tenantAtoms struct {
	tenant string
	atoms  int
}

// newDigest packs n. The slices it needs are carved from arena, which the
// caller may share between nodes so a snapshot's digests lie together.
func newDigest(n *Node, arena *digestArena) digest {
	d := digest{
		n: n, id: n.ID, schedulable: n.Schedulable, healthy: n.Healthy,
		taints: len(n.Taints) > 0, gpus: len(n.GPUs), singleTenant: n.SingleTenant,
		hostFree: n.HostFree(),
	}
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if i == 0 {
			d.model = g.Model
		} else if g.Model != d.model {
			d.mixed = true
		}
		if gpuUsable(g) && g.Mode == ModeWhole {
			d.wholeTotal++
		}
	}
	free := 0
	for i := range n.GPUs {
		if g := &n.GPUs[i]; gpuUsable(g) && g.Mode == ModeWhole && !g.Booked {
			free++
		}
	}
	d.free = arena.gpus(free)
	for i := range n.GPUs {
		if g := &n.GPUs[i]; gpuUsable(g) && g.Mode == ModeWhole && !g.Booked {
			d.free = append(d.free, newFreeGPU(i, g))
		}
	}
	for _, f := range d.free {
		d.maxIslandFree = max(d.maxIslandFree, islandFree(d.free, f.island))
	}
	d.numa = arena.numa(len(n.NUMA))
	for i := range n.NUMA {
		d.numa = append(d.numa, numaCPUs{n.NUMA[i].ID, len(n.NUMA[i].FreeCPUs)})
	}
	d.tenants = arena.tenants(len(n.TenantAtoms))
	for t, c := range n.TenantAtoms {
		d.tenants = append(d.tenants, tenantAtoms{t, c})
	}
	return d
}

// numaCPUsFree is the free CPU count of NUMA node id, 0 when the node has
// no such NUMA node.
func (d *digest) numaCPUsFree(id int) int {
	for _, c := range d.numa {
		if c.id == id {
			return c.free
		}
	}
	return 0
}

// tenantAtoms is TenantAtoms[tenant].
func (d *digest) tenantAtoms(tenant string) int {
	for _, t := range d.tenants {
		if t.tenant == tenant {
			return t.atoms
		}
	}
	return 0
}

// digestArena hands out empty slices with room reserved from shared
// backing arrays, so the digests of a snapshot built at once are packed
// together. The zero value allocates per slice.
type digestArena struct {
	gs      []freeGPU
	ns      []numaCPUs
	ts      []tenantAtoms
	reserve bool
}

func carve[T any](pool *[]T, n int, reserve bool) []T {
	if n == 0 {
		return nil
	}
	if !reserve || len(*pool)+n > cap(*pool) {
		return make([]T, 0, n)
	}
	s := (*pool)[len(*pool) : len(*pool) : len(*pool)+n]
	*pool = (*pool)[:len(*pool)+n]
	return s
}

func (a *digestArena) gpus(n int) []freeGPU        { return carve(&a.gs, n, a.reserve) }
func (a *digestArena) numa(n int) []numaCPUs       { return carve(&a.ns, n, a.reserve) }
func (a *digestArena) tenants(n int) []tenantAtoms { return carve(&a.ts, n, a.reserve) }

// newArena reserves room for the digests of nodes.
func newArena(nodes []Node) *digestArena {
	var gpus, numa, tenants int
	for i := range nodes {
		gpus += len(nodes[i].GPUs)
		numa += len(nodes[i].NUMA)
		tenants += len(nodes[i].TenantAtoms)
	}
	return &digestArena{
		gs: make([]freeGPU, 0, gpus),
		ns: make([]numaCPUs, 0, numa), ts: make([]tenantAtoms, 0, tenants), reserve: true,
	}
}
