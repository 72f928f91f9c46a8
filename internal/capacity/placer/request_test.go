package placer_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/capacity/capmodel"
	"github.com/better-compute/better-compute/internal/capacity/placer"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

// TestRequestCapabilities: a node binding needs devices.limits, a
// kubernetes one binding.kubernetes, an instance a hypervisor (and, for a
// private or none guest, the policy enforcement it asked for).
func TestRequestCapabilities(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{placer.CapDevices}, placer.Request(&capmodel.Reservation{Binding: capmodel.BindingNode, GPUs: 1}).Capabilities)
	require.Equal(t, []string{placer.CapKubernetes}, placer.Request(&capmodel.Reservation{Binding: capmodel.BindingKubernetes, GPUs: 1}).Capabilities)
	require.Empty(t, placer.Request(&capmodel.Reservation{Binding: capmodel.BindingNone, GPUs: 1}).Capabilities)
	req := placer.Request(&capmodel.Reservation{Binding: capmodel.BindingInstance, VCPU: 2, MemoryGiB: 2,
		Requires: []string{vmcmd.CapNetworkPolicy}})
	require.Equal(t, []string{vmcmd.CapInstances, vmcmd.CapNetworkPolicy}, req.Capabilities)

}
