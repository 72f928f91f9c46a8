package reservation_test

import (
	"context"
	"encoding/json"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/store"
)

// racks puts nodes 0-2 in rack r1 and 3-4 in rack r2, all on spine s1.
func racks(i int) map[string]string {
	rack := "r1"
	if i >= 3 {
		rack = "r2"
	}
	return map[string]string{"topology.rack": rack, "topology.spine": "s1"}
}

func (f *fixture) nodeRack(t *testing.T, nodeID string) string {
	t.Helper()
	var text string
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT labels FROM nodes WHERE id = $1`, nodeID).Scan(&text)
	}))
	var l map[string]string
	require.NoError(t, json.Unmarshal([]byte(text), &l))
	return l["topology.rack"]
}

func (f *fixture) gang(c *client.Client, tenant string, nodes, gpus int32, topology string) (*apiv1.CreateReservationsResponse, error) {
	res, err := c.Reservations.CreateReservations(context.Background(), connect.NewRequest(&apiv1.CreateReservationsRequest{
		Count: nodes, Gang: &apiv1.Gang{Topology: topology},
		Template: &apiv1.CreateReservationRequest{Tenant: tenant, Pool: "h100", Gpus: gpus, DurationSeconds: 3600, Binding: reservation.BindingNone}}))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

// TestCreateGang: a gang lands one member per node, all in one rack, the
// fullest rack that holds it; one that no rack holds is refused whole with
// the largest rack's room, books nothing and never queues; preview says
// the same before anything is booked.
func TestCreateGang(t *testing.T) {
	t.Parallel()
	f := setupLabelled(t, 5, bctest.FakeDaemonConfig{}, nil, racks)
	ctx := context.Background()

	preview := func(nodes int32, topology string) *apiv1.PreviewReservationResponse {
		t.Helper()
		res, err := f.member.Reservations.Preview(ctx, connect.NewRequest(&apiv1.PreviewReservationRequest{GangNodes: nodes, GangTopology: topology,
			Request: &apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Gpus: 8, DurationSeconds: 3600, Binding: reservation.BindingNone}}))
		require.NoError(t, err)
		return res.Msg
	}
	p := preview(3, "rack")
	require.True(t, p.GetFeasible())
	require.Equal(t, "r1", p.GetGangDomain())
	require.Len(t, p.GetGangPlacements(), 3)
	p = preview(4, "rack")
	require.False(t, p.GetFeasible())
	require.Contains(t, p.GetExplanation().GetSummary(), "4 nodes asked, the largest rack (r1) has 3 that can hold a member now")
	require.True(t, preview(5, "spine").GetFeasible(), "one spine holds all five")

	// Two nodes: rack r2 is the best fit (2 free against r1's 3).
	before := f.arrayWritten(t)
	f.cp.Authz.Reset()
	g, err := f.gang(f.member, "acme", 2, 8, "rack")
	require.NoError(t, err)
	require.Equal(t, 1, f.cp.Authz.Calls(), "one decision for the whole gang")
	require.Equal(t, "r2", g.GetGangDomain())
	require.Len(t, g.GetReservations(), 2)
	seen := map[string]bool{}
	for _, r := range g.GetReservations() {
		n := r.GetPlacement().GetNodeId()
		require.False(t, seen[n], "one member per node")
		seen[n] = true
		require.Equal(t, "r2", f.nodeRack(t, n))
		require.Len(t, r.GetPlacement().GetAtoms(), 8)
	}
	after := f.arrayWritten(t)
	require.Equal(t, before.reservations+2, after.reservations)
	require.Equal(t, before.audits+1, after.audits, "one audit row for the gang")

	// One GPU taken in r1: a three-node gang of 8-GPU members fits no
	// rack now, and is refused whole.
	f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 1, DurationSeconds: 3600, Binding: reservation.BindingNone})
	before = f.arrayWritten(t)
	_, err = f.gang(f.member, "acme", 3, 8, "rack")
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err), "error: %v", err)
	require.Equal(t, "NO_CAPACITY", client.Code(err))
	require.Contains(t, err.Error(), "3 nodes asked, the largest rack (r1) has 2 that can hold a member now")
	require.Contains(t, err.Error(), "never queued")
	require.Equal(t, before, f.arrayWritten(t), "a refused gang books nothing")
	p = preview(3, "rack")
	require.False(t, p.GetFeasible())

	// Smaller members fit the rack with the 1-GPU reservation in it.
	g, err = f.gang(f.member, "acme", 3, 4, "rack")
	require.NoError(t, err)
	require.Equal(t, "r1", g.GetGangDomain())
}

// TestGangRefusesBadInput: gang fields are checked with their names, and
// a refused request writes nothing; another tenant cannot book a gang in
// acme's pool.
func TestGangRefusesBadInput(t *testing.T) {
	t.Parallel()
	f := setupLabelled(t, 2, bctest.FakeDaemonConfig{}, nil, racks)
	ctx := context.Background()
	before := f.arrayWritten(t)
	for _, c := range []struct {
		req   *apiv1.CreateReservationsRequest
		field string
	}{
		{&apiv1.CreateReservationsRequest{Count: 2, MinCount: 1, Gang: &apiv1.Gang{}, Template: &apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Gpus: 8}}, "min_count"},
		{&apiv1.CreateReservationsRequest{Count: 2, Gang: &apiv1.Gang{Topology: "row"}, Template: &apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Gpus: 8}}, "gang.topology"},
		{&apiv1.CreateReservationsRequest{Count: 2, Gang: &apiv1.Gang{}, Template: &apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Slots: 1}}, "template.gpus"},
		{&apiv1.CreateReservationsRequest{Count: 600, Gang: &apiv1.Gang{}, Template: &apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Gpus: 1}}, "count"},
	} {
		_, err := f.member.Reservations.CreateReservations(ctx, connect.NewRequest(c.req))
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "%s: %v", c.field, err)
		require.Contains(t, fields(err), c.field)
	}
	_, err := f.member.Reservations.Preview(ctx, connect.NewRequest(&apiv1.PreviewReservationRequest{GangNodes: 2, GangTopology: "row",
		Request: &apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Gpus: 8}}))
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	require.Contains(t, fields(err), "gang_topology")

	require.Equal(t, before, f.arrayWritten(t), "refused input writes nothing")

	// Another tenant's credentials against acme's pool: refused (and the
	// refusal audited), nothing booked.
	_, err = f.gang(f.evil, "acme", 2, 8, "rack")
	require.Error(t, err)
	require.Contains(t, []connect.Code{connect.CodeNotFound, connect.CodePermissionDenied}, connect.CodeOf(err), "error: %v", err)
	_, err = f.gang(f.evil, "other", 2, 8, "rack")
	require.Error(t, err, "the other tenant sees no pool h100 of its own")
	require.Equal(t, before.written, f.arrayWritten(t).written, "nothing booked")

	// Nor can it preview one there: a gang preview names racks and nodes,
	// which are acme's to see.
	for _, tenant := range []string{"acme", "other"} {
		res, err := f.evil.Reservations.Preview(ctx, connect.NewRequest(&apiv1.PreviewReservationRequest{GangNodes: 2, GangTopology: "rack",
			Request: &apiv1.CreateReservationRequest{Tenant: tenant, Pool: "h100", Gpus: 8, DurationSeconds: 3600, Binding: reservation.BindingNone}}))
		require.Error(t, err, "tenant %s: %v", tenant, res)
		require.Contains(t, []connect.Code{connect.CodeNotFound, connect.CodePermissionDenied}, connect.CodeOf(err), "tenant %s: %v", tenant, err)
		// As words: a random id in the message may hold "r1".
		require.NotRegexp(t, `\br[12]\b|\brack\b`, err.Error())
	}
}

// fields lists the fields an INVALID_ARGUMENT names.
func fields(err error) []string {
	var out []string
	for _, v := range client.Detail(err).GetViolations() {
		out = append(out, v.GetField())
	}
	return out
}
