package placer

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/better-compute/internal/capacity/capmodel"
	"github.com/better-compute/better-compute/internal/capacity/placement"
	"github.com/better-compute/better-compute/internal/store"
)

// The pool index is the in-memory capacity view placement reads: each
// node's static detail (atoms, NUMA, host) and the bookings of its atoms that
// have not ended. It is loaded from the database outside any write lock and
// kept current by the engine itself: a booking marks its atoms the moment it
// is inserted (before commit, so concurrent placements in this process steer
// clear of them), a release frees them after commit. What it cannot see —
// other replicas' bookings, a transaction that rolled back after booking — it
// learns at the next reload (every IndexRefresh, on a pool version change, or
// right after a lost race). It is never the guard: the database's exclusion
// constraint is. A stale index costs a replan, never a double booking.

// span is one booking of an atom.
type span struct {
	start, end time.Time
	rsv        string
}

// hold is one live reservation on a node: its host share and tenant.
type hold struct {
	rsv, tenant string
	start, end  time.Time
	mem, hp1    int
	atoms       int
}

type ixNode struct {
	base placement.Node // static: booked flags clear, every CPU free
	// booked holds the spans of the GPU atoms (whole GPUs, MIG instances,
	// slots) by atom id; parts names them per base.GPUs entry (MIG
	// instances or slots), built once so a snapshot formats no strings.
	booked map[string][]span
	parts  [][]string
	// cpus holds the spans of booked CPUs by CPU number: a snapshot asks
	// for every CPU of every candidate, and an atom id per CPU was the
	// placer's hottest path.
	cpus  map[int][]span
	holds []hold
	// free is how many units of each shape (see ShapeOf) the node had
	// free at its last change: its bucket on that shape's shelf. at is
	// its position in that bucket.
	free map[string]int
	at   map[string]int
}

// Index is a pool's placement index (see above).
type Index struct {
	mu      sync.RWMutex
	poolID  string
	version int64
	nodes   []*ixNode
	byID    map[string]*ixNode
	// shelves are the candidate buckets of each request shape: for a
	// shape, the nodes that have units of it by how many were free at
	// their last change. Every node is on the whole-GPU shelf (""), so a
	// request for no GPU finds them all; a MIG profile's or the slots'
	// shelf holds only the nodes partitioned so.
	shelves map[string][][]*ixNode
	// shareVCPU and shareMemGiB are the smallest host's per-GPU share.
	shareVCPU, shareMemGiB int
	// gen counts changes to what a snapshot reads: a snapshot taken at
	// gen g is the index's view while gen is still g (see sharedSnap).
	gen uint64
}

// CandidateLimit is how many nodes a placement looks at before the full
// scan: the fullest nodes that can take the request (binpack), a few of them
// chosen at random so concurrent placements spread.
const CandidateLimit = 24

// Cached returns the index of a pool this replica places, as its placer
// last loaded it, or nil: releases after commit reach the one index the
// placer books against.
func (e *Placers) Cached(poolID string) *Index {
	e.plMu.Lock()
	p := e.placers[poolID]
	e.plMu.Unlock()
	if p == nil {
		return nil
	}
	return p.cur.Load()
}

func loadIndex(ctx context.Context, q store.Querier, poolID string, version int64, now time.Time) (*Index, error) {
	// The static part is the snapshot loader's, with nothing booked.
	s, err := loadSnapshot(ctx, q, poolID)
	if err != nil {
		return nil, err
	}
	ix := &Index{poolID: poolID, version: version, byID: make(map[string]*ixNode, len(s.Nodes)),
		shareVCPU: s.shareVCPU, shareMemGiB: s.shareMemGiB}
	ids := make([]string, 0, len(s.Nodes))
	for id := range s.Nodes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		n := newIxNode(*s.Nodes[id])
		ix.nodes = append(ix.nodes, n)
		ix.byID[id] = n
	}
	atomNode := map[string]*ixNode{}
	for _, n := range ix.nodes {
		for _, a := range nodeAtoms(&n.base) {
			atomNode[a] = n
		}
	}
	if err := poolBookings(ctx, q, poolID, now, func(a string, sp span) {
		if n := atomNode[a]; n != nil {
			n.booked[a] = append(n.booked[a], sp)
		}
	}, func(node string, cpu int, sp span) {
		if n := ix.byID[node]; n != nil {
			n.cpus[cpu] = append(n.cpus[cpu], sp)
		}
	}); err != nil {
		return nil, err
	}
	if err := poolHolds(ctx, q, poolID, now, func(node string, h hold) {
		if n := ix.byID[node]; n != nil {
			n.holds = append(n.holds, h)
		}
	}); err != nil {
		return nil, err
	}
	for _, n := range ix.nodes {
		n.free = n.freeAt(now)
		ix.place(n)
	}
	return ix, nil
}

// nodeAtoms lists a node's atom ids.
func nodeAtoms(n *placement.Node) []string {
	var out []string
	for _, g := range n.GPUs {
		switch g.Mode {
		case placement.ModeWhole:
			out = append(out, g.UUID)
		case placement.ModeMIG:
			for _, m := range g.MIG {
				out = append(out, fmt.Sprintf("%s/mig/%s/%d", g.UUID, m.Profile, m.N))
			}
		case placement.ModeShared:
			for _, s := range g.Slots {
				out = append(out, g.UUID+"/s"+strconv.Itoa(s.K))
			}
		}
	}
	return out
}

// newIxNode is a node with nothing booked.
func newIxNode(base placement.Node) *ixNode {
	base.TenantAtoms = nil
	n := &ixNode{base: base, booked: map[string][]span{}, cpus: map[int][]span{}, parts: make([][]string, len(base.GPUs))}
	for i, g := range base.GPUs {
		switch g.Mode {
		case placement.ModeMIG:
			for _, m := range g.MIG {
				n.parts[i] = append(n.parts[i], fmt.Sprintf("%s/mig/%s/%d", g.UUID, m.Profile, m.N))
			}
		case placement.ModeShared:
			for _, sl := range g.Slots {
				n.parts[i] = append(n.parts[i], g.UUID+"/s"+strconv.Itoa(sl.K))
			}
		}
	}
	return n
}

func overlaps(spans []span, start, end time.Time) bool {
	for _, s := range spans {
		if s.start.Before(end) && start.Before(s.end) {
			return true
		}
	}
	return false
}

// ShapeOf names the units a request books, the shelf its candidates come
// from: whole GPUs (""), shared slots ("slot"), or MIG instances of one
// profile ("mig/" and the profile).
func ShapeOf(migProfile string, slots int) string {
	switch {
	case migProfile != "":
		return "mig/" + migProfile
	case slots > 0:
		return "slot"
	}
	return ""
}

// freeAt counts the units of each shape free at t. Every node counts
// whole GPUs, none free included.
func (n *ixNode) freeAt(t time.Time) map[string]int {
	end := t.Add(time.Microsecond)
	free := map[string]int{"": 0}
	for i, g := range n.base.GPUs {
		usable := !g.Quarantined && !g.PartitionPending
		switch g.Mode {
		case placement.ModeWhole:
			if usable && !overlaps(n.booked[g.UUID], t, end) {
				free[""]++
			}
		case placement.ModeMIG:
			for j, a := range n.parts[i] {
				k := "mig/" + g.MIG[j].Profile
				free[k] += 0
				if usable && !overlaps(n.booked[a], t, end) {
					free[k]++
				}
			}
		case placement.ModeShared:
			free["slot"] += 0
			for _, a := range n.parts[i] {
				if usable && !overlaps(n.booked[a], t, end) {
					free["slot"]++
				}
			}
		}
	}
	return free
}

// arena backs the details of one snapshot: a few large allocations instead
// of several per candidate node (allocation was most of a create's time in
// the placer).
type arena struct {
	gpus []placement.GPU
	numa []placement.NUMANode
	cpus []int
	busy []bool
}

func newArena(nodes []*ixNode) *arena {
	var g, nn, c int
	for _, n := range nodes {
		g += len(n.base.GPUs)
		nn += len(n.base.NUMA)
		for _, x := range n.base.NUMA {
			c += len(x.FreeCPUs)
		}
	}
	return &arena{gpus: make([]placement.GPU, 0, g), numa: make([]placement.NUMANode, 0, nn), cpus: make([]int, 0, c)}
}

// take appends src to the arena's buf and returns the copy, capped so an
// append to it cannot run into the next node's part.
func take[T any](buf *[]T, src []T) []T {
	at := len(*buf)
	*buf = append(*buf, src...)
	return (*buf)[at:len(*buf):len(*buf)]
}

// detail is the node as placement sees it over [start, end).
func (n *ixNode) detail(start, end time.Time, a *arena) placement.Node {
	d := n.base
	d.GPUs = take(&a.gpus, n.base.GPUs)
	for i := range d.GPUs {
		g := &d.GPUs[i]
		switch g.Mode {
		case placement.ModeWhole:
			g.Booked = overlaps(n.booked[g.UUID], start, end)
		case placement.ModeMIG:
			g.MIG = slices.Clone(g.MIG)
			for j := range g.MIG {
				g.MIG[j].Booked = overlaps(n.booked[n.parts[i][j]], start, end)
			}
		case placement.ModeShared:
			g.Slots = slices.Clone(g.Slots)
			for j := range g.Slots {
				g.Slots[j].Booked = overlaps(n.booked[n.parts[i][j]], start, end)
			}
		}
	}
	// Only the booked CPUs are looked at, marked in the arena's scratch
	// and cleared again below.
	any := false
	for c, spans := range n.cpus {
		if overlaps(spans, start, end) {
			for len(a.busy) <= c {
				a.busy = append(a.busy, false)
			}
			a.busy[c], any = true, true
		}
	}
	if any {
		d.NUMA = take(&a.numa, n.base.NUMA)
		for i := range d.NUMA {
			free := a.cpus[len(a.cpus):len(a.cpus)]
			for _, c := range d.NUMA[i].FreeCPUs {
				if c < len(a.busy) && a.busy[c] {
					d.HostBooked.VCPU++
					continue
				}
				free = append(free, c)
			}
			a.cpus = a.cpus[:len(a.cpus)+len(free)]
			d.NUMA[i].FreeCPUs = free[:len(free):len(free)]
		}
		for c := range n.cpus {
			if c < len(a.busy) {
				a.busy[c] = false
			}
		}
	}
	// A node nobody holds reads as a nil map: placement only reads it.
	d.TenantAtoms = nil
	for _, h := range n.holds {
		if h.start.Before(end) && start.Before(h.end) {
			d.HostBooked.MemoryGiB += h.mem
			d.HostBooked.Hugepages1Gi += h.hp1
			if d.TenantAtoms == nil {
				d.TenantAtoms = make(map[string]int, 2)
			}
			d.TenantAtoms[h.tenant] += h.atoms
		}
	}
	return d
}

// place files a node on each of its shapes' shelves, in the bucket of its
// free count there.
func (ix *Index) place(n *ixNode) {
	if ix.shelves == nil {
		ix.shelves = map[string][][]*ixNode{}
	}
	if n.at == nil {
		n.at = make(map[string]int, len(n.free))
	}
	for shape, free := range n.free {
		shelf := ix.shelves[shape]
		for len(shelf) <= free {
			shelf = append(shelf, nil)
		}
		n.at[shape] = len(shelf[free])
		shelf[free] = append(shelf[free], n)
		ix.shelves[shape] = shelf
	}
}

func (ix *Index) unplace(n *ixNode) {
	for shape, free := range n.free {
		b := ix.shelves[shape][free]
		last, pos := b[len(b)-1], n.at[shape]
		b[pos], last.at[shape] = last, pos
		ix.shelves[shape][free] = b[:len(b)-1]
	}
}

func (ix *Index) refile(n *ixNode, now time.Time) {
	if f := n.freeAt(now); !maps.Equal(f, n.free) {
		ix.unplace(n)
		n.free = f
		ix.place(n)
	}
}

// Snapshot builds a placement snapshot over [start, end): of at most limit
// candidate nodes (of those with units of shape, the fullest that may take
// need of them, a random few among equals), or of every node when limit is
// 0.
func (ix *Index) Snapshot(start, end time.Time, shape string, need, limit int, rng *rand.Rand) *Snapshot {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	var picked []*ixNode
	if limit == 0 {
		picked = ix.nodes
	} else {
		shelf := ix.shelves[shape]
		for k := max(need, 0); k < len(shelf) && len(picked) < limit; k++ {
			b := shelf[k]
			if len(b) <= limit-len(picked) {
				picked = append(picked, b...)
				continue
			}
			// More equals than room: a random window of them, so that
			// concurrent placements do not all race for one node.
			off := rng.IntN(len(b))
			for i := 0; len(picked) < limit; i++ {
				picked = append(picked, b[(off+i)%len(b)])
			}
		}
	}
	s := snapshotOf(picked, start, end)
	s.gen = ix.gen
	return s
}

// snapshotOf is the snapshot of picked nodes over [start, end); the caller
// holds ix.mu.
func snapshotOf(picked []*ixNode, start, end time.Time) *Snapshot {
	s := &Snapshot{Nodes: make(map[string]*placement.Node, len(picked)), picked: picked, start: start, end: end}
	list := make([]placement.Node, len(picked))
	a := newArena(picked)
	for i, n := range picked {
		list[i] = n.detail(start, end, a)
	}
	s.Snap = placement.NewSnapshot(list)
	for i := range list {
		s.Nodes[list[i].ID] = &list[i]
	}
	return s
}

// refreshed is s with the node nodeID read from the index again, and the
// index's generation, or nil when the index changed in some other way
// since s was taken (or after): the next member of an array places against
// it instead of a fresh copy of every candidate. Only this node changed
// since s, by the caller's own mark, when gen is s's plus one.
func (ix *Index) refreshed(s *Snapshot, nodeID string) *Snapshot {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if s.picked == nil || ix.gen != s.gen+1 {
		return nil
	}
	i := slices.IndexFunc(s.picked, func(n *ixNode) bool { return n.base.ID == nodeID })
	if i < 0 {
		return nil
	}
	n := s.picked[i]
	d := n.detail(s.start, s.end, newArena([]*ixNode{n}))
	snap, err := s.Snap.Replace(&d)
	if err != nil {
		return nil
	}
	out := &Snapshot{Snap: snap, Nodes: maps.Clone(s.Nodes), picked: s.picked, start: s.start, end: s.end, gen: ix.gen}
	out.Nodes[nodeID] = &d
	return out
}

// domains groups the nodes with at least need GPU units free (as of their
// last change) by their value of the label key ("" puts them all in one
// domain, ""); nodes without the label are left out. Each domain's nodes
// are in id order. It reads the candidate buckets only, no node's detail.
func (ix *Index) domains(key, shape string, need int) map[string][]*ixNode {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := map[string][]*ixNode{}
	shelf := ix.shelves[shape]
	for k := max(need, 0); k < len(shelf); k++ {
		for _, n := range shelf[k] {
			d, ok := "", true
			if key != "" {
				d, ok = n.base.Labels[key]
			}
			if ok && (key == "" || d != "") {
				out[d] = append(out[d], n)
			}
		}
	}
	for _, ns := range out {
		slices.SortFunc(ns, func(a, b *ixNode) int { return strings.Compare(a.base.ID, b.base.ID) })
	}
	return out
}

// snapshotNodes is the snapshot of some of the index's nodes over
// [start, end).
func (ix *Index) snapshotNodes(picked []*ixNode, start, end time.Time) *Snapshot {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return snapshotOf(picked, start, end)
}

// mark records a plan's bookings for r before they are inserted: the marks
// steer concurrent placements away before the commit.
func (ix *Index) mark(r *capmodel.Reservation, plan *placement.Plan, now time.Time) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.gen++
	n := ix.byID[plan.NodeID]
	if n == nil {
		return
	}
	sp := span{start: r.StartsAt, end: r.EndsAt, rsv: r.ID}
	for _, a := range plan.Atoms {
		n.booked[a] = append(n.booked[a], sp)
	}
	for _, c := range plan.CPUs {
		n.cpus[c] = append(n.cpus[c], sp)
	}
	n.holds = append(n.holds, hold{rsv: r.ID, tenant: r.TenantID, start: r.StartsAt, end: r.EndsAt, mem: r.MemoryGiB,
		hp1: r.Hugepages1Gi, atoms: r.GPUs + r.Slots})
	ix.refile(n, now)
}

// Released drops a reservation's bookings from [at, …) (after its commit:
// freeing early would invite a placement the database then refuses).
func (ix *Index) Released(nodeID, rsv string, at, now time.Time) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.gen++
	n := ix.byID[nodeID]
	if n == nil {
		return
	}
	cut := func(s span) (span, bool) {
		if s.rsv != rsv {
			return s, true
		}
		if !at.After(s.start) {
			return s, false
		}
		if at.Before(s.end) {
			s.end = at
		}
		return s, true
	}
	cutAll(n.booked, cut)
	cutAll(n.cpus, cut)
	holds := n.holds[:0]
	for _, h := range n.holds {
		if h.rsv == rsv {
			if !at.After(h.start) {
				continue
			}
			if at.Before(h.end) {
				h.end = at
			}
		}
		holds = append(holds, h)
	}
	n.holds = holds
	ix.refile(n, now)
}

// Extended moves a reservation's bookings' end (in its transaction: a
// longer booking steers placements away at once).
func (ix *Index) Extended(nodeID, rsv string, end, now time.Time) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.gen++
	n := ix.byID[nodeID]
	if n == nil {
		return
	}
	move := func(s *span) {
		if s.rsv == rsv && end.After(s.end) {
			s.end = end
		}
	}
	eachSpan(n.booked, move)
	eachSpan(n.cpus, move)
	for i := range n.holds {
		if n.holds[i].rsv == rsv && end.After(n.holds[i].end) {
			n.holds[i].end = end
		}
	}
	ix.refile(n, now)
}

// Shortened undoes an extension: the reservation's spans end at end again.
func (ix *Index) Shortened(nodeID, rsv string, end, now time.Time) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.gen++
	n := ix.byID[nodeID]
	if n == nil {
		return
	}
	shorten := func(s *span) {
		if s.rsv == rsv && s.end.After(end) {
			s.end = end
		}
	}
	eachSpan(n.booked, shorten)
	eachSpan(n.cpus, shorten)
	for i := range n.holds {
		if n.holds[i].rsv == rsv && n.holds[i].end.After(end) {
			n.holds[i].end = end
		}
	}
	ix.refile(n, now)
}

// Version is the pool version the index holds.
func (ix *Index) Version() int64 {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.version
}

// setVersion records that the index caught up with the pool's version
// (read by previews on other goroutines).
func (ix *Index) setVersion(v int64) {
	ix.mu.Lock()
	ix.version = v
	ix.gen++
	ix.mu.Unlock()
}

// markUnschedulable takes a node out of placement until the next reload
// (the booking transaction found it drained or not ready).
func (ix *Index) markUnschedulable(nodeID string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.gen++
	if n := ix.byID[nodeID]; n != nil {
		n.base.Schedulable = false
	}
}

// sync re-reads the bookings and holds of some nodes (after lost races:
// another writer booked what the index thought free).
func (ix *Index) sync(ctx context.Context, q store.Querier, nodeIDs []string, now time.Time) error {
	slices.Sort(nodeIDs)
	nodeIDs = slices.Compact(nodeIDs)
	for _, id := range nodeIDs {
		booked, cpus, err := nodeBookings(ctx, q, id, now)
		if err != nil {
			return err
		}
		holds, err := nodeHolds(ctx, q, id, now)
		if err != nil {
			return err
		}
		ix.mu.Lock()
		ix.gen++
		if n := ix.byID[id]; n != nil {
			n.booked, n.cpus, n.holds = booked, cpus, holds
			ix.refile(n, now)
		}
		ix.mu.Unlock()
	}
	return nil
}

// reread reads some nodes of the pool again, whole: what they are (state,
// liveness, atoms, membership) and what is booked on them. A node no longer
// in the pool leaves the index.
func (ix *Index) reread(ctx context.Context, q store.Querier, nodeIDs []string, now time.Time) error {
	s, err := loadSnapshot(ctx, q, ix.poolID, nodeIDs...)
	if err != nil {
		return err
	}
	ix.applyNodes(s, nodeIDs, now)
	var stay []string
	for _, id := range nodeIDs {
		if _, ok := s.Nodes[id]; ok {
			stay = append(stay, id)
		}
	}
	return ix.sync(ctx, q, stay, now)
}

// Static is a snapshot of the whole pool with nothing booked: "could this
// ever fit".
func (ix *Index) Static() *Snapshot {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	list := make([]placement.Node, len(ix.nodes))
	for i, n := range ix.nodes {
		list[i] = n.base
		list[i].TenantAtoms = map[string]int{}
	}
	s := &Snapshot{Snap: placement.NewSnapshot(list), Nodes: make(map[string]*placement.Node, len(list))}
	for i := range list {
		s.Nodes[list[i].ID] = &list[i]
	}
	return s
}

// Share is the smallest host's per-GPU share (vcpu, memoryGiB), the default
// host resources when the pool sets none.
func (ix *Index) Share() (vcpu, memGiB int) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.shareVCPU, ix.shareMemGiB
}

// applyNodes updates the index from a snapshot of some of its pool's nodes
// (a delta from the atoms reconciler): a node in s replaces or joins, one of
// changed missing from s has left the pool. The bookings and holds of the
// nodes that stay are read again by the caller (sync).
func (ix *Index) applyNodes(s *Snapshot, changed []string, now time.Time) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.gen++
	for _, id := range changed {
		old := ix.byID[id]
		fresh, ok := s.Nodes[id]
		switch {
		case ok && old != nil:
			fresh := newIxNode(*fresh)
			old.base, old.parts = fresh.base, fresh.parts
			ix.refile(old, now)
		case ok:
			n := newIxNode(*fresh)
			ix.nodes = append(ix.nodes, n)
			ix.byID[id] = n
			n.free = n.freeAt(now)
			ix.place(n)
		case old != nil:
			ix.unplace(old)
			delete(ix.byID, id)
			ix.nodes = slices.DeleteFunc(ix.nodes, func(n *ixNode) bool { return n == old })
		}
	}
	if s.shareVCPU > 0 && (ix.shareVCPU == 0 || s.shareVCPU < ix.shareVCPU) {
		ix.shareVCPU = s.shareVCPU
	}
	if s.shareMemGiB > 0 && (ix.shareMemGiB == 0 || s.shareMemGiB < ix.shareMemGiB) {
		ix.shareMemGiB = s.shareMemGiB
	}
}

// cutAll applies cut to every span of m, dropping those it does not keep.
func cutAll[K comparable](m map[K][]span, cut func(span) (span, bool)) {
	for k, spans := range m {
		out := spans[:0]
		for _, s := range spans {
			if s2, keep := cut(s); keep {
				out = append(out, s2)
			}
		}
		if len(out) == 0 {
			delete(m, k)
		} else {
			m[k] = out
		}
	}
}

// eachSpan calls fn with every span of m, in place.
func eachSpan[K comparable](m map[K][]span, fn func(*span)) {
	for _, spans := range m {
		for i := range spans {
			fn(&spans[i])
		}
	}
}
