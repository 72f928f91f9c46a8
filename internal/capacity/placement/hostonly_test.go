package placement

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHostOnlyRequest: a request without devices (a guest of binding
// instance) books host resources alone: no atom, a cpuset of the CPUs it
// asks for, on a node with room; a node short of CPUs or hugepages is
// refused for it; without vCPUs or memory it is no request at all.
func TestHostOnlyRequest(t *testing.T) {
	t.Parallel()
	full := node8("full")
	full.NUMA[0].FreeCPUs, full.NUMA[1].FreeCPUs = nil, nil
	full.HostBooked.VCPU = 58
	res := place(t, []Node{node8("a"), full}, Request{VCPU: 4, MemoryGiB: 8})
	require.Len(t, res.Plans, 1)
	p := res.Plans[0]
	require.Equal(t, "a", p.NodeID)
	require.Empty(t, p.Atoms)
	require.Len(t, p.CPUs, 4)
	require.NotEmpty(t, p.CPUSet)
	require.Equal(t, 1, res.Explanation.Feasible)

	res = place(t, []Node{node8("a")}, Request{VCPU: 2, Hugepages1Gi: 61})
	require.Empty(t, res.Plans, "more 1 GiB hugepages than the node has beyond its reserve")
	res = place(t, []Node{node8("a")}, Request{VCPU: 2, Hugepages1Gi: 8})
	require.Len(t, res.Plans, 1)

	// A guest asking for what a host does not advertise (a hypervisor, its
	// network policy enforced) goes elsewhere.
	plain, hv := node8("plain"), node8("hv")
	hv.Capabilities = []string{"instance.run", "instance.network-policy"}
	plain.Capabilities = []string{"instance.run"}
	res = place(t, []Node{plain, hv}, Request{VCPU: 2, MemoryGiB: 2, Capabilities: []string{"instance.run", "instance.network-policy"}})
	require.Len(t, res.Plans, 1)
	require.Equal(t, "hv", res.Plans[0].NodeID)

	for _, req := range []Request{{}, {VCPU: 2}, {MemoryGiB: 4}, {MIGProfile: "1g.10gb", VCPU: 2, MemoryGiB: 4}} {
		_, err := Place(NewSnapshot([]Node{node8("a")}), req, Options{})
		var re *RequestError
		require.True(t, errors.As(err, &re), "%+v: %v", req, err)
		require.Equal(t, "gpus", re.Field)
	}
}
