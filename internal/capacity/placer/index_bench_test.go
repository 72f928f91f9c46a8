package placer

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/better-compute/better-compute/internal/capacity/capmodel"
	"github.com/better-compute/better-compute/internal/capacity/placement"
)

// benchIndex is an index of count nodes of 8 H100s and 2 × 56 CPUs, each
// with three GPUs and 24 CPUs booked by live reservations: what a create
// reads from the index on a busy fleet.
func benchIndex(count int, now time.Time) *Index {
	ix := &Index{poolID: "p", byID: map[string]*ixNode{}}
	for i := range count {
		id := fmt.Sprintf("n%05d", i)
		base := placement.Node{ID: id, Name: id, Pool: "p", Shape: "8x", Schedulable: true, Healthy: true,
			Host:        placement.HostResources{VCPU: 112, MemoryGiB: 2048},
			HostReserve: placement.HostResources{VCPU: 4, MemoryGiB: 16}}
		for g := range 8 {
			base.GPUs = append(base.GPUs, placement.GPU{UUID: fmt.Sprintf("%s-gpu%d", id, g), Model: "H100 80GB",
				Index: g, NUMA: g / 4, Island: g / 4, MemoryMiB: 81920})
		}
		for numa := range 2 {
			nn := placement.NUMANode{ID: numa, FreeMemoryGiB: 1000}
			for c := range 56 {
				nn.FreeCPUs = append(nn.FreeCPUs, numa*56+c)
			}
			base.NUMA = append(base.NUMA, nn)
		}
		n := newIxNode(base)
		for g := range 3 {
			sp := span{start: now.Add(-time.Hour), end: now.Add(time.Hour), rsv: fmt.Sprintf("r%d-%d", i, g)}
			n.booked[base.GPUs[g].UUID] = append(n.booked[base.GPUs[g].UUID], sp)
			for c := range 8 {
				n.cpus[g*8+c] = append(n.cpus[g*8+c], sp)
			}
			n.holds = append(n.holds, hold{rsv: sp.rsv, tenant: "acme", start: sp.start, end: sp.end, mem: 64, atoms: 1})
		}
		ix.nodes = append(ix.nodes, n)
		ix.byID[id] = n
		n.free = n.freeAt(now)
		ix.place(n)
	}
	return ix
}

// BenchmarkIndexPlace is the placer's in-memory work for one create: the
// candidate snapshot from the index and placement over it.
func BenchmarkIndexPlace(b *testing.B) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	ix := benchIndex(10_000, now)
	r := &capmodel.Reservation{GPUs: 2, VCPU: 16, MemoryGiB: 128, TenantID: "globex", StartsAt: now, EndsAt: now.Add(time.Hour)}
	req := Request(r)
	rng := rand.New(rand.NewPCG(1, 2))
	b.ReportAllocs()
	for b.Loop() {
		snap := ix.Snapshot(r.StartsAt, r.EndsAt, "", r.GPUs, CandidateLimit, rng)
		res, err := placement.Place(snap.Snap, req, placement.Options{Limit: 4})
		if err != nil || len(res.Plans) == 0 {
			b.Fatalf("no plan: %v %s", err, res.Explanation)
		}
	}
}
