package placement

import (
	"fmt"
	"reflect"
	"testing"

	"pgregory.net/rapid"
)

// The scan was rewritten to allocate nothing per node (digests, a scratch,
// top-K candidates, atoms spelled out only for the plans returned). These
// tests hold it to the implementation it replaced, kept in
// reference_test.go: the same plans in the same order with the same scores
// and atoms, and the same explanation, for any fleet, request and options.

// genOptions draws the options a caller may pass: any limit, the default
// or random weights, and the default chain, an explicit one or none.
func genOptions(t *rapid.T) Options {
	opts := Options{Limit: rapid.SampledFrom([]int{0, 1, 2, 4, 1000}).Draw(t, "limit")}
	if rapid.Bool().Draw(t, "weights") {
		opts.Weights = &Weights{
			Binpack: rapid.Float64Range(0, 3).Draw(t, "wBinpack"), Topology: rapid.Float64Range(0, 3).Draw(t, "wTopology"),
			Fragmentation: rapid.Float64Range(0, 3).Draw(t, "wFrag"), Spread: rapid.Float64Range(0, 3).Draw(t, "wSpread"),
		}
	}
	switch rapid.IntRange(0, 3).Draw(t, "checkers") {
	case 1:
		opts.Checkers = DefaultCheckers()
	case 2:
		opts.Checkers = []Checker{}
	case 3:
		opts.Checkers = []Checker{CheckerFunc(checkTaints), CheckerFunc(checkHost)}
	}
	return opts
}

// genPin draws a request's pin: mostly none, else one of the fleet's
// nodes or a node that is not in it.
func genPin(t *rapid.T, nodes []Node) string {
	switch rapid.IntRange(0, 3).Draw(t, "pin") {
	case 1:
		if len(nodes) > 0 {
			return nodes[rapid.IntRange(0, len(nodes)-1).Draw(t, "pinNode")].ID
		}
	case 2:
		return "no-such-node"
	}
	return ""
}

func requireSameResult(t interface{ Fatalf(string, ...any) }, snap *Snapshot, req Request, opts Options) {
	want, wantErr := refPlace(snap, req, opts)
	got, gotErr := Place(snap, req, opts)
	if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
		t.Fatalf("error: got %v, reference %v", gotErr, wantErr)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("result differs from the reference for %+v %+v\ngot:       %+v\nreference: %+v", req, opts, got, want)
	}
}

func TestPlaceMatchesReference(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		var nodes []Node
		var req Request
		if rapid.Bool().Draw(t, "richFleet") {
			s := genStrictness(t)
			nodes, req = genFleet(t, s, rapid.Bool().Draw(t, "mixed")), genAsk(t, s)
			// The reference does not model machine leases (its tenancy
			// check has no whole-node reasons); they have tests of their
			// own (placement_test.go, the whole-node properties).
			req.WholeNode = false
		} else {
			g := rapidGen{t}
			nodes, req = genNodes(g), genRequest(g)
		}
		req.Node = genPin(t, nodes)
		opts := genOptions(t)
		snap := NewSnapshot(nodes)
		if rapid.Bool().Draw(t, "lazy") {
			sums := make([]NodeSummary, len(nodes))
			byID := map[string]Node{}
			for i := range nodes {
				sums[i], byID[nodes[i].ID] = Summarize(&nodes[i]), nodes[i]
			}
			snap = NewLazySnapshot(sums, func(id string) Node { return byID[id] })
		}
		requireSameResult(t, snap, req, opts)
		// Once more over the same snapshot: the pooled scratch and the
		// digests loaded by the first call must not change the answer.
		requireSameResult(t, snap, req, opts)
	})
}

// TestPlaceMatchesReferenceLargePool compares over a pool big enough that
// many nodes tie on score, so the top-K keeps and drops by node ID.
func TestPlaceMatchesReferenceLargePool(t *testing.T) {
	t.Parallel()
	snap := NewSnapshot(fullScanNodes(2_000))
	for _, req := range []Request{
		{GPUs: 2, VCPU: 8, MemoryGiB: 32, Tenant: "globex", Model: "H100"},
		{GPUs: 1, Tenant: "acme"},
		{GPUs: 4, VCPU: 16, Tenant: "acme", RequireNVLink: true},
		{GPUs: 3, VCPU: 40, Tenant: "globex"},
		{GPUs: 8, Tenant: "globex", SingleTenant: true},
		{GPUs: 2, Tenant: "globex", Model: "A100"},
	} {
		for _, limit := range []int{1, 4, 50} {
			requireSameResult(t, snap, req, Options{Limit: limit})
		}
	}
}
