package placement

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// node8 builds a schedulable, healthy H100 node with 8 free whole GPUs:
// islands {0-3} and {4-7}, NUMA 0 for GPUs 0-3 and NUMA 1 for 4-7, and 64
// vCPUs split over the two NUMA nodes.
func node8(id string) Node {
	n := Node{
		ID: id, Name: "name-" + id, Pool: "default", Shape: "8x",
		Labels:       map[string]string{"zone": "a"},
		Schedulable:  true,
		Healthy:      true,
		Capabilities: []string{"devices.limits"},
		Host:         HostResources{VCPU: 64, MemoryGiB: 512, Hugepages2Mi: 1024, Hugepages1Gi: 64},
		HostReserve:  HostResources{VCPU: 4, MemoryGiB: 16, Hugepages1Gi: 4},
	}
	for i := range 8 {
		n.GPUs = append(n.GPUs, GPU{
			UUID: fmt.Sprintf("%s-gpu%d", id, i), Model: "H100 80GB", Index: i,
			NUMA: i / 4, Island: i / 4, MemoryMiB: 81920,
		})
	}
	for numa := range 2 {
		nn := NUMANode{ID: numa, FreeMemoryGiB: 240}
		for c := range 30 {
			nn.FreeCPUs = append(nn.FreeCPUs, numa*32+c)
		}
		n.NUMA = append(n.NUMA, nn)
	}
	return n
}

func place(t *testing.T, nodes []Node, req Request) Result {
	t.Helper()
	res, err := Place(NewSnapshot(nodes), req, Options{Limit: 5})
	require.NoError(t, err)
	return res
}

func TestFilterReasons(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mutate func(*Node)
		req    Request
		want   string
	}{
		{"unschedulable", func(n *Node) { n.Schedulable = false }, Request{GPUs: 1}, ReasonUnschedulable},
		{"unhealthy", func(n *Node) { n.Healthy = false }, Request{GPUs: 1}, ReasonUnhealthy},
		{"dedicated taint", func(n *Node) { n.Taints = []Taint{{"dedicated", "acme"}} }, Request{GPUs: 1, Tenant: "globex"}, "tainted dedicated=acme"},
		{"other taint", func(n *Node) { n.Taints = []Taint{{"maintenance", ""}} }, Request{GPUs: 1}, "tainted maintenance"},
		{"single-tenant offer", func(n *Node) { n.SingleTenant = "acme" }, Request{GPUs: 1, Tenant: "globex"}, ReasonSingleTenant},
		{"other tenants", func(n *Node) { n.TenantAtoms = map[string]int{"acme": 1} }, Request{GPUs: 1, Tenant: "globex", SingleTenant: true}, ReasonOtherTenants},
		{"whole node held", func(n *Node) { n.TenantAtoms = map[string]int{"acme": 1} }, Request{GPUs: 8, Tenant: "acme", WholeNode: true}, ReasonNotWhole},
		{"whole node count", nil, Request{GPUs: 4, WholeNode: true}, ReasonGPUCount},
		{"label In", nil, Request{GPUs: 1, Selector: []LabelRequirement{{"zone", OpIn, []string{"b"}}}}, "label selector not met: zone In [b]"},
		{"label NotIn wildcard", nil, Request{GPUs: 1, Selector: []LabelRequirement{{"zone", OpNotIn, []string{"*"}}}}, "label selector not met: zone NotIn [*]"},
		{"label Exists", nil, Request{GPUs: 1, Selector: []LabelRequirement{{"rack", OpExists, nil}}}, "label selector not met: rack Exists"},
		{"label DoesNotExist", nil, Request{GPUs: 1, Selector: []LabelRequirement{{"zone", OpDoesNotExist, nil}}}, "label selector not met: zone DoesNotExist"},
		{"capability", func(n *Node) { n.Capabilities = nil }, Request{GPUs: 1, Capabilities: []string{"devices.limits"}}, "missing capability devices.limits"},
		{"model", nil, Request{GPUs: 1, Model: "A100 80GB"}, ReasonModel},
		{"free GPUs", nil, Request{GPUs: 9}, ReasonFreeGPUs},
		{"nvlink", func(n *Node) { n.GPUs[0].Booked = true; n.GPUs[4].Booked = true }, Request{GPUs: 4, RequireNVLink: true}, ReasonNVLink},
		{"vcpu", nil, Request{GPUs: 1, VCPU: 61}, ReasonVCPU},
		{"memory", func(n *Node) { n.HostBooked.MemoryGiB = 490 }, Request{GPUs: 1, MemoryGiB: 10}, ReasonMemory},
		{"hugepages 1Gi minus reserve", nil, Request{GPUs: 1, Hugepages1Gi: 61}, ReasonHugepages1Gi},
		{"hugepages 2Mi", nil, Request{GPUs: 1, Hugepages2Mi: 1025}, ReasonHugepages2Mi},
		{"no MIG GPUs", nil, Request{GPUs: 1, MIGProfile: "1g.10gb"}, ReasonMIGUnsupported},
		{"no slots", nil, Request{Slots: 1}, ReasonFreeSlots},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			n := node8("n1")
			if tt.mutate != nil {
				tt.mutate(&n)
			}
			res := place(t, []Node{n}, tt.req)
			require.Empty(t, res.Plans)
			got := res.Explanation.ByReason
			require.Equal(t, map[string]int{tt.want: 1}, got)
			require.Equal(t, map[string]int{tt.want: 1}, res.Explanation.ByClass[n.Class()])
		})
	}
}

func TestFiltersPass(t *testing.T) {
	t.Parallel()
	n := node8("n1")
	n.Taints = []Taint{{"dedicated", "acme"}, {"maintenance", "soon"}}
	n.SingleTenant = "acme"
	n.Labels["rack"] = "r1-a"
	res := place(t, []Node{n}, Request{
		GPUs: 1, Tenant: "acme", Tolerations: []string{"maintenance"}, Model: "h100 80gb",
		Capabilities: []string{"devices.limits"},
		Selector: []LabelRequirement{
			{"zone", OpIn, []string{"*"}}, {"rack", OpIn, []string{"r1-*"}},
			{"gpu", OpDoesNotExist, nil}, {"zone", OpNotIn, []string{"b"}},
		},
	})
	require.Len(t, res.Plans, 1)
	require.Equal(t, 1, res.Explanation.Feasible)
	require.Empty(t, res.Explanation.ByReason)
}

func TestExplanationString(t *testing.T) {
	t.Parallel()
	var nodes []Node
	for i := range 15 {
		n := node8(fmt.Sprintf("n%02d", i))
		if i < 3 {
			n.Taints = []Taint{{"dedicated", "acme"}}
		} else {
			n.GPUs[0].Booked, n.GPUs[4].Booked = true, true
		}
		nodes = append(nodes, n)
	}
	res := place(t, nodes, Request{GPUs: 4, RequireNVLink: true, Tenant: "globex"})
	require.Empty(t, res.Plans)
	require.Equal(t, "12 nodes: not enough NVLink-connected GPUs; 3 nodes: tainted dedicated=acme", res.Explanation.String())
	require.Equal(t, res.Explanation.String(), res.Explanation.ClassString(nodes[0].Class()))
	require.Equal(t, 15, res.Explanation.Evaluated)
}

func TestIslandAndNUMAPreference(t *testing.T) {
	t.Parallel()
	t.Run("one island when one fits", func(t *testing.T) {
		t.Parallel()
		n := node8("n1")
		n.GPUs[0].Booked = true // island 0 has 3 free, island 1 has 4
		res := place(t, []Node{n}, Request{GPUs: 4})
		require.Equal(t, []string{"n1-gpu4", "n1-gpu5", "n1-gpu6", "n1-gpu7"}, res.Plans[0].Atoms)
		require.Equal(t, 1, res.Plans[0].NUMA)
		require.Equal(t, 1.0, res.Plans[0].Score.Topology)
	})
	t.Run("best fit island", func(t *testing.T) {
		t.Parallel()
		n := node8("n1")
		n.GPUs[0].Booked = true // island 0 has 3 free: fill it, keep island 1 whole
		res := place(t, []Node{n}, Request{GPUs: 2})
		require.Equal(t, []string{"n1-gpu1", "n1-gpu2"}, res.Plans[0].Atoms)
	})
	t.Run("island spanning NUMA beats NUMA without NVLink", func(t *testing.T) {
		t.Parallel()
		n := node8("n1")
		for i := range n.GPUs {
			n.GPUs[i].Island = -1
			n.GPUs[i].NUMA = 0
		}
		n.GPUs[6].Island, n.GPUs[7].Island = 9, 9
		n.GPUs[7].NUMA = 1
		res := place(t, []Node{n}, Request{GPUs: 2})
		require.Equal(t, []string{"n1-gpu6", "n1-gpu7"}, res.Plans[0].Atoms)
		require.Equal(t, -1, res.Plans[0].NUMA)
	})
	t.Run("spills across islands, one NUMA node first", func(t *testing.T) {
		t.Parallel()
		n := node8("n1")
		n.GPUs[0].Booked, n.GPUs[4].Booked = true, true
		n.GPUs[5].NUMA = 0
		res := place(t, []Node{n}, Request{GPUs: 4})
		require.Len(t, res.Plans[0].Atoms, 4)
		require.Equal(t, 0, res.Plans[0].NUMA)
		require.Equal(t, []string{"n1-gpu1", "n1-gpu2", "n1-gpu3", "n1-gpu5"}, res.Plans[0].Atoms)
		require.Less(t, res.Plans[0].Score.Topology, 1.0)
	})
	t.Run("NVLink node ranks first", func(t *testing.T) {
		t.Parallel()
		broken := node8("a-broken")
		broken.GPUs[0].Booked, broken.GPUs[4].Booked = true, true
		whole := node8("b-whole")
		whole.GPUs[0].Booked, whole.GPUs[1].Booked = true, true
		res := place(t, []Node{broken, whole}, Request{GPUs: 4})
		require.Len(t, res.Plans, 2)
		require.Equal(t, "b-whole", res.Plans[0].NodeID)
	})
	t.Run("cpuset on the GPUs' NUMA node", func(t *testing.T) {
		t.Parallel()
		n := node8("n1")
		n.GPUs[0].Booked = true
		res := place(t, []Node{n}, Request{GPUs: 4, VCPU: 4})
		require.Equal(t, "32-35", res.Plans[0].CPUSet)
		require.Equal(t, 1, res.Plans[0].NUMA)
	})
}

func migNode(id string) Node {
	n := node8(id)
	for i := range n.GPUs {
		g := &n.GPUs[i]
		g.Mode = ModeMIG
		for k := range 7 {
			g.MIG = append(g.MIG, MIGInstance{Profile: "1g.10gb", N: k, Booked: i < 2 && k < 5})
		}
		// Outside the H100 layout: never booked.
		g.MIG = append(g.MIG, MIGInstance{Profile: "1g.10gb", N: 7}, MIGInstance{Profile: "5g.50gb", N: 0})
	}
	return n
}

func TestMIGAtoms(t *testing.T) {
	t.Parallel()
	n := migNode("n1")
	n.GPUs[0].PartitionPending = true // frozen: its two free instances are off limits
	res := place(t, []Node{n}, Request{GPUs: 2, MIGProfile: "1g.10gb"})
	require.Equal(t, []string{"n1-gpu1/mig/1g.10gb/5", "n1-gpu1/mig/1g.10gb/6"}, res.Plans[0].Atoms)

	res = place(t, []Node{n}, Request{GPUs: 3, MIGProfile: "1g.10gb", Model: "H100 80GB"})
	require.Equal(t, []string{"n1-gpu2/mig/1g.10gb/0", "n1-gpu2/mig/1g.10gb/1", "n1-gpu2/mig/1g.10gb/2"}, res.Plans[0].Atoms)

	res = place(t, []Node{n}, Request{GPUs: 1, MIGProfile: "3g.40gb"})
	require.Empty(t, res.Plans)
	require.Equal(t, "1 node: "+ReasonMIGUnsupported, res.Explanation.String())

	for i := range n.GPUs {
		n.GPUs[i].Quarantined = i > 1
	}
	res = place(t, []Node{n}, Request{GPUs: 3, MIGProfile: "1g.10gb"})
	require.Equal(t, "1 node: "+ReasonFreeMIG, res.Explanation.String())
}

func TestSlotAtoms(t *testing.T) {
	t.Parallel()
	n := node8("n1")
	for i := range n.GPUs[:3] {
		g := &n.GPUs[i]
		g.Mode = ModeShared
		for k := range 4 {
			g.Slots = append(g.Slots, Slot{K: k, Booked: i == 1 && k < 3})
		}
	}
	res := place(t, []Node{n}, Request{Slots: 1})
	require.Equal(t, []string{"n1-gpu1/s3"}, res.Plans[0].Atoms)
	res = place(t, []Node{n}, Request{Slots: 6})
	require.Equal(t, []string{"n1-gpu0/s0", "n1-gpu0/s1", "n1-gpu0/s2", "n1-gpu0/s3", "n1-gpu2/s0", "n1-gpu2/s1"}, res.Plans[0].Atoms)
	res = place(t, []Node{n}, Request{Slots: 10})
	require.Equal(t, "1 node: "+ReasonFreeSlots, res.Explanation.String())
}

func TestQuarantinedGPUSkipped(t *testing.T) {
	t.Parallel()
	n := node8("n1")
	n.GPUs[4].Quarantined = true
	res := place(t, []Node{n}, Request{GPUs: 4})
	require.Equal(t, []string{"n1-gpu0", "n1-gpu1", "n1-gpu2", "n1-gpu3"}, res.Plans[0].Atoms)
	res = place(t, []Node{n}, Request{GPUs: 7})
	require.Len(t, res.Plans[0].Atoms, 7)
	require.NotContains(t, res.Plans[0].Atoms, "n1-gpu4")
	res = place(t, []Node{n}, Request{GPUs: 8})
	require.Equal(t, "1 node: "+ReasonFreeGPUs, res.Explanation.String())
}

func TestInvalidRequests(t *testing.T) {
	t.Parallel()
	snap := NewSnapshot([]Node{node8("n1")})
	tests := []struct {
		req   Request
		field string
	}{
		{Request{}, "gpus"},
		{Request{GPUs: -1}, "gpus"},
		{Request{Slots: -1}, "slots"},
		{Request{GPUs: 1, Slots: 1}, "slots"},
		{Request{GPUs: 1, VCPU: -1}, "vcpu"},
		{Request{GPUs: 1, MemoryGiB: -1}, "memoryGiB"},
		{Request{GPUs: 1, Hugepages1Gi: -1}, "hugepages1Gi"},
		{Request{GPUs: 1, Model: "H100 80GB", MIGProfile: "1g.5gb"}, "migProfile"},
		{Request{GPUs: 1, MIGProfile: "9g.99gb"}, "migProfile"},
		{Request{GPUs: 1, Selector: []LabelRequirement{{"zone", "Like", nil}}}, "selector[0].op"},
		{Request{GPUs: 1, Selector: []LabelRequirement{{"zone", OpIn, nil}}}, "selector[0].values"},
	}
	for _, tt := range tests {
		_, err := Place(snap, tt.req, Options{})
		var re *RequestError
		require.True(t, errors.As(err, &re), "%+v: %v", tt.req, err)
		require.Equal(t, tt.field, re.Field)
		require.True(t, strings.HasPrefix(err.Error(), "invalid placement request: "+tt.field+": "))
	}
	_, err := Place(snap, Request{GPUs: 1}, Options{Limit: -1})
	require.Error(t, err)
}

func TestDeterministicAndOrderFree(t *testing.T) {
	t.Parallel()
	var nodes []Node
	for i := range 40 {
		n := node8(fmt.Sprintf("n%02d", i))
		for j := range n.GPUs {
			n.GPUs[j].Booked = (i*7+j*3)%5 == 0
		}
		nodes = append(nodes, n)
	}
	req := Request{GPUs: 2, VCPU: 8}
	first, err := Place(NewSnapshot(nodes), req, Options{Limit: 10})
	require.NoError(t, err)
	require.Len(t, first.Plans, 10)
	for seed := range uint64(5) {
		shuffled := append([]Node(nil), nodes...)
		rand.New(rand.NewPCG(seed, 1)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		got, err := Place(NewSnapshot(shuffled), req, Options{Limit: 10})
		require.NoError(t, err)
		require.Equal(t, first, got)
	}
}

func TestLazySnapshot(t *testing.T) {
	t.Parallel()
	a := node8("a")
	b := node8("b")
	for i := range b.GPUs {
		b.GPUs[i].Model = "A100 80GB"
	}
	c := node8("c")
	c.GPUs[0].Booked = true
	loaded := map[string]int{}
	byID := map[string]Node{"a": a, "b": b, "c": c}
	snap := NewLazySnapshot([]NodeSummary{Summarize(&a), Summarize(&b), Summarize(&c)}, func(id string) Node {
		loaded[id]++
		return byID[id]
	})
	require.Equal(t, []ClassCount{
		{Key: a.Class(), Nodes: 2, FreeGPUs: 15},
		{Key: b.Class(), Nodes: 1, FreeGPUs: 8},
	}, snap.Classes())
	res, err := Place(snap, Request{GPUs: 8, Model: "H100 80GB"}, Options{})
	require.NoError(t, err)
	require.Len(t, res.Plans, 1)
	// b is rejected by class and c by its summary: only a is loaded.
	require.Equal(t, map[string]int{"a": 1}, loaded)
	_, err = Place(snap, Request{GPUs: 8, Model: "H100 80GB"}, Options{})
	require.NoError(t, err)
	require.Equal(t, map[string]int{"a": 1}, loaded)
}

func TestTopN(t *testing.T) {
	t.Parallel()
	var nodes []Node
	for i := range 10 {
		n := node8(fmt.Sprintf("n%d", i))
		for j := range i % 8 {
			n.GPUs[j].Booked = true
		}
		nodes = append(nodes, n)
	}
	res, err := Place(NewSnapshot(nodes), Request{GPUs: 1}, Options{})
	require.NoError(t, err)
	require.Len(t, res.Plans, DefaultLimit)
	for i := 1; i < len(res.Plans); i++ {
		require.GreaterOrEqual(t, res.Plans[i-1].Score.Total, res.Plans[i].Score.Total)
	}
	// The fullest nodes (7 GPUs booked) pack best.
	require.Equal(t, "n7", res.Plans[0].NodeID)
	require.Equal(t, []string{"n7-gpu7"}, res.Plans[0].Atoms)
}

func TestCPUSetFormat(t *testing.T) {
	t.Parallel()
	require.Equal(t, "0-3,8,10-11", cpuset([]int{0, 1, 2, 3, 8, 10, 11}))
	require.Empty(t, cpuset(nil))
}

// TestConcurrentPlace runs Place from several goroutines over one lazy
// snapshot: the detail cache is lock-free and must be race-free.
func TestConcurrentPlace(t *testing.T) {
	t.Parallel()
	nodes := make([]Node, 50)
	sums := make([]NodeSummary, len(nodes))
	byID := map[string]Node{}
	for i := range nodes {
		nodes[i] = node8(fmt.Sprintf("n%02d", i))
		sums[i] = Summarize(&nodes[i])
		byID[nodes[i].ID] = nodes[i]
	}
	snap := NewLazySnapshot(sums, func(id string) Node { return byID[id] })
	want, err := Place(NewSnapshot(nodes), Request{GPUs: 2, VCPU: 2}, Options{})
	require.NoError(t, err)
	results := make(chan Result, 8)
	for range 8 {
		go func() {
			res, _ := Place(snap, Request{GPUs: 2, VCPU: 2}, Options{})
			results <- res
		}()
	}
	for range 8 {
		require.Equal(t, want, <-results)
	}
}

// TestReplaceAnswersAsANewSnapshot: placing after Replace gives what a
// snapshot built from the changed nodes gives, and leaves the original
// snapshot's answers as they were.
func TestReplaceAnswersAsANewSnapshot(t *testing.T) {
	nodes := []Node{node8("a"), node8("b"), node8("c")}
	// b is the fullest: binpack takes it first.
	for i := range 5 {
		nodes[1].GPUs[i].Booked = true
	}
	orig := NewSnapshot(slices.Clone(nodes))
	req := Request{GPUs: 3}
	before, err := Place(orig, req, Options{Limit: 5})
	require.NoError(t, err)
	require.Equal(t, "b", before.Plans[0].NodeID)

	// b fills up: the next request of three goes elsewhere.
	b := nodes[1]
	b.GPUs = slices.Clone(b.GPUs)
	for i := range b.GPUs {
		b.GPUs[i].Booked = true
	}
	replaced, err := orig.Replace(&b)
	require.NoError(t, err)
	changed := slices.Clone(nodes)
	changed[1] = b
	want, err := Place(NewSnapshot(changed), req, Options{Limit: 5})
	require.NoError(t, err)
	got, err := Place(replaced, req, Options{Limit: 5})
	require.NoError(t, err)
	require.Equal(t, want.Plans, got.Plans)
	require.NotEqual(t, "b", got.Plans[0].NodeID)
	require.Equal(t, NewSnapshot(changed).Classes(), replaced.Classes())

	again, err := Place(orig, req, Options{Limit: 5})
	require.NoError(t, err)
	require.Equal(t, before.Plans, again.Plans, "the original snapshot is unchanged")

	other := node8("z")
	_, err = orig.Replace(&other)
	require.Error(t, err, "a node not in the snapshot")
}

// pinFleet is three nodes of one class, n2 the best fit for one GPU (the
// fullest), plus one node of another class.
func pinFleet() []Node {
	nodes := []Node{node8("n1"), node8("n2"), node8("n3"), node8("n4")}
	for i := range 6 {
		nodes[1].GPUs[i].Booked = true
	}
	nodes[3].Pool = "other"
	return nodes
}

func TestPinnedPlacement(t *testing.T) {
	t.Parallel()
	// Unpinned, the fullest node wins; pinned, only n3 is offered.
	require.Equal(t, "n2", place(t, pinFleet(), Request{GPUs: 1}).Plans[0].NodeID)
	for _, opts := range []Options{{Limit: 5}, {Limit: 5, Checkers: DefaultCheckers()}} {
		res, err := Place(NewSnapshot(pinFleet()), Request{GPUs: 1, Node: "n3"}, opts)
		require.NoError(t, err)
		require.Len(t, res.Plans, 1)
		require.Equal(t, "n3", res.Plans[0].NodeID)
		require.Equal(t, "name-n3", res.Plans[0].NodeName)
		require.Equal(t, 1, res.Explanation.Feasible)
		require.Equal(t, 4, res.Explanation.Evaluated)
		require.Equal(t, map[string]int{ReasonPinned: 3}, res.Explanation.ByReason)
	}
}

func TestPinnedToAFullNode(t *testing.T) {
	t.Parallel()
	nodes := pinFleet()
	res := place(t, nodes, Request{GPUs: 3, Node: "n2"})
	require.Empty(t, res.Plans)
	// The others are counted as not the pinned node, the pinned one
	// under its own reason.
	require.Equal(t, map[string]int{ReasonPinned: 3, ReasonFreeGPUs: 1}, res.Explanation.ByReason)
	require.Equal(t, map[string]int{ReasonPinned: 2, ReasonFreeGPUs: 1}, res.Explanation.ByClass[nodes[1].Class()])
	require.Equal(t, map[string]int{ReasonPinned: 1}, res.Explanation.ByClass[nodes[3].Class()])
	require.Equal(t, "3 nodes: not the node the request is pinned to; 1 node: not enough free GPUs", res.Explanation.String())

	// The pinned node's host is full: its detail says so.
	nodes = pinFleet()
	nodes[0].HostBooked.VCPU = 60
	res = place(t, nodes, Request{GPUs: 1, VCPU: 1, Node: "n1"})
	require.Empty(t, res.Plans)
	require.Equal(t, map[string]int{ReasonPinned: 3, ReasonVCPU: 1}, res.Explanation.ByReason)

	// Pinned to a node of the wrong model: only it is the model's
	// rejection, the rest of its class is the pin's.
	res = place(t, pinFleet(), Request{GPUs: 1, Model: "A100 80GB", Node: "n1"})
	require.Empty(t, res.Plans)
	require.Equal(t, map[string]int{ReasonPinned: 3, ReasonModel: 1}, res.Explanation.ByReason)
}

func TestPinnedToAMissingNode(t *testing.T) {
	t.Parallel()
	nodes := pinFleet()
	res := place(t, nodes, Request{GPUs: 1, Node: "gone"})
	require.Empty(t, res.Plans)
	require.Equal(t, 0, res.Explanation.Feasible)
	require.Equal(t, map[string]int{ReasonPinned: 4}, res.Explanation.ByReason)
	require.Equal(t, map[string]int{ReasonPinned: 3}, res.Explanation.ByClass[nodes[0].Class()])
}

func TestCheckPinned(t *testing.T) {
	t.Parallel()
	n := node8("n1")
	require.Equal(t, "", checkPinned(&Request{}, &n))
	require.Equal(t, "", checkPinned(&Request{Node: "n1"}, &n))
	require.Equal(t, ReasonPinned, checkPinned(&Request{Node: "n2"}, &n))
	require.Equal(t, ReasonPinned, DefaultCheckers()[0].Check(&Request{Node: "n2"}, &n))
}
