package placer_test

import (
	"errors"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/capacity/capmodel"
	"github.com/better-compute/better-compute/internal/capacity/placement"
	"github.com/better-compute/better-compute/internal/capacity/placer"
	"github.com/better-compute/better-compute/internal/envelope"
)

// cpuNode is a GPU-less host offering vcpu vCPUs to guests.
func cpuNode(id string, vcpu int) placement.Node {
	return placement.Node{ID: id, Name: "host-" + id, Schedulable: true, Healthy: true,
		Capabilities: []string{"instances"},
		Host:         placement.HostResources{VCPU: vcpu + 2, MemoryGiB: 64},
		HostReserve:  placement.HostResources{VCPU: 2}}
}

// neverFits places r on the pristine nodes and returns NeverFits' refusal.
func neverFits(t *testing.T, nodes []placement.Node, r *capmodel.Reservation) *envelope.Error {
	t.Helper()
	res, err := placement.Place(placement.NewSnapshot(nodes), placer.Request(r), placement.Options{})
	require.NoError(t, err)
	require.Empty(t, res.Plans)
	var apiErr *envelope.Error
	require.True(t, errors.As(placer.NeverFits("p1", nodes, r, res.Explanation), &apiErr))
	require.Equal(t, envelope.CodeNoCapacity, apiErr.Code)
	require.Equal(t, connect.CodeFailedPrecondition, apiErr.Status)
	return apiErr
}

// TestNeverFitsPinned: a request pinned to a node is never-fit for that
// node's size, whatever the pool's other nodes offer, and the refusal names
// it; a pin to a node not in the pool says so.
func TestNeverFitsPinned(t *testing.T) {
	t.Parallel()
	nodes := []placement.Node{cpuNode("a", 8), cpuNode("b", 32)}
	r := &capmodel.Reservation{TenantID: "t1", VCPU: 16, MemoryGiB: 1, PinNodeID: "a"}
	require.Equal(t, "a", placer.Request(r).Node)
	err := neverFits(t, nodes, r)
	require.Equal(t, "pool p1 can never hold this request: node host-a (where the request is pinned) offers 8 vCPUs, asked 16", err.Message)
	// The explanation keeps the other node's pin rejection.
	require.Equal(t, int32(2), err.Explanation.GetEvaluated())
	require.Contains(t, err.Explanation.GetSummary(), placement.ReasonPinned)

	// Not a size: the pinned node's own reason, not the pin's.
	nodes[0].Taints = []placement.Taint{{Key: "maintenance"}}
	r.VCPU = 4
	err = neverFits(t, nodes, r)
	require.Equal(t, "pool p1 can never hold this request: node host-a (where the request is pinned) can never hold it: 1 node: tainted maintenance", err.Message)

	r.PinNodeID = "gone"
	err = neverFits(t, nodes, r)
	require.Equal(t, "pool p1 can never hold this request: node gone (where the request is pinned) is not in the pool", err.Message)

	// Unpinned, a guest without GPUs is short of vCPUs, not of GPUs.
	r.PinNodeID, r.VCPU = "", 64
	err = neverFits(t, nodes, r)
	require.Equal(t, "pool p1 can never hold this request: the largest node offers 32 vCPUs, asked 64", err.Message)
}
