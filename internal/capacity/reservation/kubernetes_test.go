package reservation_test

import (
	"context"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// TestKubernetesBindingRefusedWithoutKubelet: a reservation the kubelet
// binds is refused where no node's bcd advertises binding.kubernetes (no
// node could ever bind it, so it does not wait): FAILED_PRECONDITION with
// the machine code NO_CAPACITY, the field binding named, nothing written.
// Preview says the same.
func TestKubernetesBindingRefusedWithoutKubelet(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	ctx := context.Background()
	before := f.written(t)
	_, err := f.member.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{
		Tenant: "acme", Pool: "h100", Gpus: 1, DurationSeconds: 3600, Binding: "kubernetes"}))
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err), "error: %v", err)
	require.Equal(t, "NO_CAPACITY", client.Code(err))
	require.ErrorContains(t, err, "no node of pool h100 advertises binding.kubernetes")
	var fields []string
	for _, v := range client.Detail(err).GetViolations() {
		fields = append(fields, v.GetField())
		require.Contains(t, v.GetReason(), "device plugin or DRA driver is not registered")
	}
	require.Equal(t, []string{"binding"}, fields)
	require.Equal(t, before, f.written(t), "nothing written")

	pv, err := f.member.Reservations.Preview(ctx, connect.NewRequest(&apiv1.PreviewReservationRequest{
		Request: &apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Gpus: 1, DurationSeconds: 3600, Binding: "kubernetes"}}))
	require.NoError(t, err)
	require.False(t, pv.Msg.GetFeasible())
	require.Contains(t, pv.Msg.GetExplanation().GetSummary(), "no node of pool h100 advertises binding.kubernetes")

	// The same request bound by bcd on the node places.
	r := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 1, DurationSeconds: 3600})
	require.NotEmpty(t, r.GetPlacement().GetNodeId())
}

// TestKubernetesBindingPlacesOnlyOnKubeletNodes: in a pool where one node
// advertises binding.kubernetes and one does not, reservations the kubelet
// binds go only to the first; once it is full they wait, though the
// other node has room (the check is the placer's, in the committing
// batch). A reservation bound by bcd still places on the other.
func TestKubernetesBindingPlacesOnlyOnKubeletNodes(t *testing.T) {
	t.Parallel()
	f := setup(t, 2)
	d, err := f.sim.Daemons[1].RestartWith(func(c *bctest.FakeDaemonConfig) { c.Kubelet = true })
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Stop() })
	kube := d.NodeID()
	f.eventually(t, "the node advertises binding.kubernetes", func() bool {
		return f.count(t, `SELECT COUNT(*) FROM nodes WHERE id = $1 AND capabilities LIKE '%binding.kubernetes%' AND liveness = 'ready'`, kube) == 1
	})
	require.Equal(t, 0, f.count(t, `SELECT COUNT(*) FROM nodes WHERE id <> $1 AND capabilities LIKE '%binding.kubernetes%'`, kube))

	for range 2 {
		r := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 4, DurationSeconds: 3600, Binding: "kubernetes"})
		require.Equal(t, kube, r.GetPlacement().GetNodeId(), "explanation: %v", r.GetExplanation())
		// bcd binds it (it offers the GPUs to its kubelet), as a node one.
		require.Equal(t, "binding", r.GetState())
		f.waitState(t, r.GetId(), "active")
	}
	waits := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 1, DurationSeconds: 3600, Binding: "kubernetes"})
	require.Equal(t, "pending", waits.GetState(), "the node without binding.kubernetes has 8 free GPUs and must not take it")
	require.Empty(t, waits.GetPlacement().GetNodeId())
	require.Equal(t, 0, f.count(t, `SELECT COUNT(*) FROM reservations WHERE binding = 'kubernetes' AND node_id IS NOT NULL AND node_id <> '' AND node_id <> $1`, kube))

	other := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 1, DurationSeconds: 3600})
	require.NotEqual(t, kube, other.GetPlacement().GetNodeId())
	require.NotEmpty(t, other.GetPlacement().GetNodeId())
}
