package placement

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// gen draws the values a property test needs; rapid and a seeded
// math/rand both implement it, so the properties are written once.
type gen interface {
	intRange(lo, hi int, label string) int
}

// tb is the part of testing.TB and rapid.T the properties use.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
}

func pickOf[T any](g gen, label string, xs ...T) T { return xs[g.intRange(0, len(xs)-1, label)] }

func genBool(g gen, label string) bool { return g.intRange(0, 1, label) == 1 }

func genNodes(g gen) []Node {
	count := g.intRange(1, 20, "nodes")
	nodes := make([]Node, 0, count)
	for i := range count {
		id := fmt.Sprintf("n%02d", i)
		model := pickOf(g, "model", "H100 80GB", "A100 80GB")
		n := Node{
			ID: id, Name: id, Pool: pickOf(g, "pool", "p1", "p2"), Shape: "8x",
			Schedulable:  g.intRange(0, 9, "schedulable") > 0,
			Healthy:      g.intRange(0, 9, "healthy") > 0,
			Labels:       map[string]string{},
			Capabilities: pickOf(g, "caps", []string{"devices.limits"}, []string{"devices.limits"}, nil),
			SingleTenant: pickOf(g, "singleTenant", "", "", "", "acme"),
			TenantAtoms:  map[string]int{},
			Host:         HostResources{VCPU: g.intRange(8, 64, "vcpu"), MemoryGiB: 256, Hugepages1Gi: g.intRange(0, 16, "hp1g")},
			HostReserve:  HostResources{VCPU: 2, Hugepages1Gi: 2},
		}
		if z := pickOf(g, "zone", "", "a", "b"); z != "" {
			n.Labels["zone"] = z
		}
		if t := pickOf(g, "taint", "", "", "dedicated=acme", "dedicated=globex", "maint"); t != "" {
			k, v, _ := strings.Cut(t, "=")
			n.Taints = append(n.Taints, Taint{k, v})
		}
		if g.intRange(0, 3, "otherTenant") == 0 {
			n.TenantAtoms["globex"] = 1
		}
		for numa := range 2 {
			nn := NUMANode{ID: numa}
			for c := range g.intRange(0, 16, "cpus") {
				nn.FreeCPUs = append(nn.FreeCPUs, numa*32+c)
			}
			n.NUMA = append(n.NUMA, nn)
		}
		for j := range g.intRange(0, 8, "gpus") {
			gpu := GPU{
				UUID: fmt.Sprintf("%s-g%d", id, j), Model: model, Index: j,
				NUMA:             g.intRange(0, 1, "numa"),
				Island:           g.intRange(-1, 2, "island"),
				Mode:             GPUMode(pickOf(g, "mode", 0, 0, 0, 1, 2)),
				Booked:           g.intRange(0, 3, "booked") == 0,
				Quarantined:      g.intRange(0, 9, "quarantined") == 0,
				PartitionPending: g.intRange(0, 9, "pending") == 0,
			}
			for k := range g.intRange(0, 8, "mig") {
				gpu.MIG = append(gpu.MIG, MIGInstance{Profile: "1g.10gb", N: k, Booked: genBool(g, "migBooked")})
			}
			for k := range g.intRange(0, 4, "slots") {
				gpu.Slots = append(gpu.Slots, Slot{K: k, Booked: genBool(g, "slotBooked")})
			}
			n.GPUs = append(n.GPUs, gpu)
		}
		nodes = append(nodes, n)
	}
	return nodes
}

func genRequest(g gen) Request {
	req := Request{
		Model:         pickOf(g, "reqModel", "", "H100 80GB", "A100 80GB"),
		Tenant:        pickOf(g, "tenant", "acme", "globex"),
		VCPU:          g.intRange(0, 12, "reqVCPU"),
		Hugepages1Gi:  g.intRange(0, 4, "reqHP"),
		SingleTenant:  g.intRange(0, 4, "reqSingle") == 0,
		RequireNVLink: genBool(g, "reqNVLink"),
	}
	switch g.intRange(0, 2, "kind") {
	case 0:
		req.GPUs = g.intRange(1, 4, "reqGPUs")
	case 1:
		req.GPUs, req.MIGProfile = g.intRange(1, 3, "reqMIG"), "1g.10gb"
	default:
		req.Slots = g.intRange(1, 3, "reqSlots")
	}
	if genBool(g, "tolerate") {
		req.Tolerations = []string{"maint"}
	}
	if genBool(g, "caps") {
		req.Capabilities = []string{"devices.limits"}
	}
	req.Selector = pickOf(g, "selector",
		nil,
		[]LabelRequirement{{"zone", OpIn, []string{"a"}}},
		[]LabelRequirement{{"zone", OpIn, []string{"*"}}},
		[]LabelRequirement{{"zone", OpNotIn, []string{"b"}}},
		[]LabelRequirement{{"zone", OpDoesNotExist, nil}},
	)
	return req
}

// freeWhole is, independently of the picker, the GPUs a whole-GPU request
// may take on n.
func freeWhole(req *Request, n *Node) []*GPU {
	var out []*GPU
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if (req.Model == "" || req.Model == g.Model) && g.Mode == ModeWhole && !g.Booked && !g.Quarantined && !g.PartitionPending {
			out = append(out, g)
		}
	}
	return out
}

// checkPlacement asserts every property of one Place call.
func checkPlacement(t tb, nodes []Node, req Request) {
	t.Helper()
	res, err := Place(NewSnapshot(nodes), req, Options{Limit: 4})
	if err != nil {
		t.Fatalf("place: %v", err)
	}
	byID := map[string]*Node{}
	for i := range nodes {
		byID[nodes[i].ID] = &nodes[i]
	}
	ex := res.Explanation
	rejected := 0
	for _, c := range ex.ByReason {
		rejected += c
	}
	if ex.Evaluated != len(nodes) || ex.Feasible+rejected != len(nodes) {
		t.Fatalf("explanation does not account for every node: %+v", ex)
	}
	if len(res.Plans) != min(4, ex.Feasible) {
		t.Fatalf("%d plans for %d feasible nodes", len(res.Plans), ex.Feasible)
	}
	want := req.GPUs + req.Slots
	for pi, p := range res.Plans {
		if pi > 0 && better(&res.Plans[pi-1], &res.Plans[pi]) > 0 {
			t.Fatalf("plans not best first")
		}
		for _, v := range []float64{p.Score.Binpack, p.Score.Topology, p.Score.Fragmentation, p.Score.Spread, p.Score.Total} {
			if v < 0 || v > 1 {
				t.Fatalf("score out of [0, 1]: %+v", p.Score)
			}
		}
		n := byID[p.NodeID]
		if !n.Schedulable || !n.Healthy {
			t.Fatalf("placed on unschedulable or unhealthy node %s", n.ID)
		}
		for _, ta := range n.Taints {
			if ta.Key == "dedicated" && ta.Value != req.Tenant {
				t.Fatalf("placed %s on %s tainted %s", req.Tenant, n.ID, ta)
			}
			if ta.Key != "dedicated" && !slices.Contains(req.Tolerations, ta.Key) {
				t.Fatalf("placed on %s with untolerated taint %s", n.ID, ta)
			}
		}
		if n.SingleTenant != "" && n.SingleTenant != req.Tenant {
			t.Fatalf("placed %s on %s offered to %s", req.Tenant, n.ID, n.SingleTenant)
		}
		if req.SingleTenant && n.TenantAtoms["globex"] > 0 && req.Tenant != "globex" {
			t.Fatalf("single-tenant request on shared node %s", n.ID)
		}
		for _, l := range req.Selector {
			if !l.Matches(n.Labels) {
				t.Fatalf("placed on %s against selector %s", n.ID, l)
			}
		}
		for _, c := range req.Capabilities {
			if !slices.Contains(n.Capabilities, c) {
				t.Fatalf("placed on %s without capability %s", n.ID, c)
			}
		}
		free := n.HostFree()
		if req.VCPU > free.VCPU || req.Hugepages1Gi > free.Hugepages1Gi {
			t.Fatalf("host resources over-booked on %s", n.ID)
		}
		if len(p.Atoms) != want {
			t.Fatalf("%d atoms for %d wanted: %v", len(p.Atoms), want, p.Atoms)
		}
		seen := map[string]bool{}
		islands := map[int]bool{}
		for _, a := range p.Atoms {
			if seen[a] {
				t.Fatalf("atom %s twice", a)
			}
			seen[a] = true
			g := atomGPU(t, n, a)
			if g.Quarantined || g.PartitionPending || (req.Model != "" && g.Model != req.Model) {
				t.Fatalf("atom %s on a GPU placement must skip", a)
			}
			islands[g.Island] = true
			checkAtomFree(t, req, g, a)
		}
		if req.MIGProfile == "" && req.Slots == 0 && req.GPUs > 1 {
			// NVLink islands are preferred when they exist.
			count := map[int]int{}
			best := 0
			for _, g := range freeWhole(&req, n) {
				if g.Island >= 0 {
					count[g.Island]++
					best = max(best, count[g.Island])
				}
			}
			inOne := len(islands) == 1 && !islands[-1]
			if best >= req.GPUs && !inOne {
				t.Fatalf("node %s has an island with %d free GPUs but got %v", n.ID, best, p.Atoms)
			}
			if req.RequireNVLink && !inOne {
				t.Fatalf("NVLink required but got %v", p.Atoms)
			}
		}
	}

	// Scoring is deterministic for a snapshot, whatever its order.
	again, err := Place(NewSnapshot(nodes), req, Options{Limit: 4})
	if err != nil || !equalResults(res, again) {
		t.Fatalf("second Place differs")
	}
	rev := slices.Clone(nodes)
	slices.Reverse(rev)
	reversed, err := Place(NewSnapshot(rev), req, Options{Limit: 4})
	if err != nil || !equalResults(res, reversed) {
		t.Fatalf("Place over the reversed snapshot differs")
	}
}

func equalResults(a, b Result) bool {
	return fmt.Sprintf("%+v", a) == fmt.Sprintf("%+v", b)
}

func atomGPU(t tb, n *Node, atom string) *GPU {
	t.Helper()
	uuid, _, _ := strings.Cut(atom, "/")
	for i := range n.GPUs {
		if n.GPUs[i].UUID == uuid {
			return &n.GPUs[i]
		}
	}
	t.Fatalf("atom %s names no GPU of %s", atom, n.ID)
	return nil
}

func checkAtomFree(t tb, req Request, g *GPU, atom string) {
	t.Helper()
	_, rest, _ := strings.Cut(atom, "/")
	switch {
	case req.MIGProfile != "":
		mig, ok := strings.CutPrefix(rest, "mig/")
		profile, ks, _ := strings.Cut(mig, "/")
		k, err := strconv.Atoi(ks)
		if !ok || err != nil || g.Mode != ModeMIG || profile != req.MIGProfile || k >= migMax(g.Model, profile) {
			t.Fatalf("atom %s outside the model's MIG layout", atom)
		}
		for _, in := range g.MIG {
			if in.Profile == profile && in.N == k && in.Booked {
				t.Fatalf("atom %s already booked", atom)
			}
		}
	case req.Slots > 0:
		k, err := strconv.Atoi(strings.TrimPrefix(rest, "s"))
		if err != nil || g.Mode != ModeShared {
			t.Fatalf("atom %s is not a shared slot", atom)
		}
		for _, s := range g.Slots {
			if s.K == k && s.Booked {
				t.Fatalf("atom %s already booked", atom)
			}
		}
	default:
		if rest != "" || g.Mode != ModeWhole || g.Booked {
			t.Fatalf("atom %s is not a free whole GPU", atom)
		}
	}
}

type randGen struct{ r *rand.Rand }

func (g randGen) intRange(lo, hi int, _ string) int { return lo + g.r.IntN(hi-lo+1) }

// TestPropertiesSeeded runs the properties over seeded random snapshots, so
// they hold in every build; props_rapid_test.go runs the same properties
// under rapid, with shrinking.
func TestPropertiesSeeded(t *testing.T) {
	t.Parallel()
	for seed := range uint64(1000) {
		g := randGen{rand.New(rand.NewPCG(seed, 42))}
		nodes, req := genNodes(g), genRequest(g)
		require.NoError(t, req.Validate())
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) { checkPlacement(t, nodes, req) })
	}
}
