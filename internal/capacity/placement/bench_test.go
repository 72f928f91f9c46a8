package placement

import (
	"fmt"
	"testing"
)

// benchNodes builds n 8-GPU nodes in 4 classes with a mix of booked GPUs,
// so the picker sees broken islands as well as whole ones.
func benchNodes(count int) []Node {
	nodes := make([]Node, count)
	for i := range nodes {
		n := node8(fmt.Sprintf("n%05d", i))
		n.Pool = fmt.Sprintf("pool%d", i%4)
		for j := range n.GPUs {
			n.GPUs[j].Booked = (i*7+j*3)%5 == 0
		}
		if i%10 == 0 {
			n.Taints = []Taint{{"dedicated", "acme"}}
		}
		nodes[i] = n
	}
	return nodes
}

func BenchmarkPlace(b *testing.B) {
	for _, count := range []int{1_000, 10_000} {
		snap := NewSnapshot(benchNodes(count))
		req := Request{GPUs: 4, VCPU: 16, MemoryGiB: 64, Tenant: "globex", Model: "H100 80GB"}
		b.Run(fmt.Sprintf("nodes=%d", count), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				res, err := Place(snap, req, Options{})
				if err != nil || len(res.Plans) == 0 {
					b.Fatalf("no plan: %v %s", err, res.Explanation)
				}
			}
		})
	}
}

// fullScanNodes builds count 8-GPU nodes of one class (so no class or
// summary pruning helps), two NVLink islands on two NUMA nodes, with a mix
// of partial bookings: some nodes whole, some with an island broken, some
// too full to take the request, some tainted or short of host resources.
func fullScanNodes(count int) []Node {
	nodes := make([]Node, count)
	for i := range nodes {
		n := node8(fmt.Sprintf("n%05d", i))
		n.TenantAtoms = map[string]int{"globex": i % 3}
		for j := range n.GPUs {
			n.GPUs[j].Booked = (i*7+j*3)%5 == 0 || (i%11 == 0 && j < 5)
		}
		switch {
		case i%17 == 0:
			n.Taints = []Taint{{"dedicated", "acme"}}
		case i%19 == 0:
			n.HostBooked = HostResources{VCPU: 50}
		}
		nodes[i] = n
	}
	return nodes
}

// BenchmarkPlaceFullScan is Place over the whole pool, the fallback the
// placer runs when its index cannot answer: every node is checked, and
// picked and scored unless it cannot enter the top. Allocations per op
// must not grow with the node count.
//
// nodes=N is the mixed fleet above in ID order. worst=N is the case the
// scan cannot prune: identical nodes in descending ID order, so every node
// ties the best score and beats the plans found so far on the tie-break,
// and each one is picked, scored and enters the top.
func BenchmarkPlaceFullScan(b *testing.B) {
	req := Request{GPUs: 2, VCPU: 8, MemoryGiB: 32, Tenant: "globex", Model: "H100"}
	run := func(name string, snap *Snapshot) {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				res, err := Place(snap, req, Options{Limit: 4})
				if err != nil || len(res.Plans) == 0 {
					b.Fatalf("no plan: %v %s", err, res.Explanation)
				}
			}
		})
	}
	for _, count := range []int{1_000, 10_000} {
		run(fmt.Sprintf("nodes=%d", count), NewSnapshot(fullScanNodes(count)))
	}
	nodes := make([]Node, 10_000)
	for i := range nodes {
		nodes[i] = node8(fmt.Sprintf("n%05d", len(nodes)-i))
		nodes[i].GPUs[0].Booked = true
	}
	run("worst=10000", NewSnapshot(nodes))
}

// BenchmarkNewSnapshot is the cost of indexing a pool whose detail is in
// memory, digests included.
func BenchmarkNewSnapshot(b *testing.B) {
	nodes := fullScanNodes(10_000)
	b.ReportAllocs()
	for b.Loop() {
		NewSnapshot(nodes)
	}
}
