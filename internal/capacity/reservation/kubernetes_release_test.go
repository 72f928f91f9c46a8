package reservation_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/capacity/usage"
	"github.com/better-compute/better-compute/internal/store"
)

// podsHold is the failure the node gives allocation.release while the test
// plays pods that keep the GPUs: bcd then sends no AllocationReleased, as a
// bcd whose kubelet's pods still hold them does not.
const podsHold = "PODS_HOLD"

// kubeFixture is the fixture with one node that advertises
// binding.kubernetes.
func kubeFixture(t *testing.T) (*fixture, *bctest.FakeDaemon) {
	t.Helper()
	f := setupWith(t, 1, bctest.FakeDaemonConfig{Kubelet: true})
	d := f.sim.Daemons[0]
	f.eventually(t, "the node advertises binding.kubernetes", func() bool {
		return f.count(t, `SELECT COUNT(*) FROM nodes WHERE id = $1 AND capabilities LIKE '%binding.kubernetes%' AND liveness = 'ready'`, d.NodeID()) == 1
	})
	return f, d
}

// kubeActive books gpus of acme for an hour, bound by the kubelet, and
// waits until the node reported the bind.
func (f *fixture) kubeActive(t *testing.T, gpus int32) *apiv1.Reservation {
	t.Helper()
	r := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: gpus, DurationSeconds: 3600, Binding: "kubernetes"})
	return f.waitState(t, r.GetId(), "active")
}

func (f *fixture) release(t *testing.T, c *client.Client, id string) *apiv1.Reservation {
	t.Helper()
	res, err := c.Reservations.Release(context.Background(), connect.NewRequest(&apiv1.ReleaseReservationRequest{Tenant: "acme", Reservation: id}))
	require.NoError(t, err)
	return res.Msg.GetReservation()
}

// eventTypes lists a reservation's events, oldest first.
func (f *fixture) eventTypes(t *testing.T, id string) []string {
	t.Helper()
	var out []string
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		var err error
		out, err = store.Strings(tx.Query(ctx, `SELECT type FROM events WHERE resource_id = $1 ORDER BY seq`, id))
		return err
	}))
	return out
}

// activeInterval is what usage bills: the reservation's active interval
// (until is nil while it is still open).
func (f *fixture) activeInterval(t *testing.T, id string) (since, until *time.Time) {
	t.Helper()
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT active_since, active_until FROM reservations WHERE id = $1`, id).Scan(&since, &until)
	}))
	return since, until
}

// gpuHours sums a reservation's gpu.<model>.hours as the usage API lists
// them, after the hourly rollup (closed windows, and the open one).
func (f *fixture) gpuHours(t *testing.T, id string, from, to time.Time) float64 {
	t.Helper()
	require.NoError(t, f.cp.App.DB.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		_, err := usage.Rollup(ctx, tx, f.cp.Clock.Now(), nil)
		return err
	}))
	res, err := f.member.Usage.List(context.Background(), connect.NewRequest(&apiv1.ListUsageRequest{Tenant: "acme",
		StartTime: timestamppb.New(from.Add(-time.Hour)), EndTime: timestamppb.New(to.Add(time.Hour)), PageSize: 500}))
	require.NoError(t, err)
	var sum float64
	for _, w := range res.Msg.GetWindows() {
		if w.GetReservationId() == id && strings.HasPrefix(w.GetMetric(), "gpu.") {
			sum += w.GetQuantity()
		}
	}
	return sum
}

func apiCondition(r *apiv1.Reservation, typ string) *apiv1.ReservationCondition {
	for _, c := range r.GetConditions() {
		if c.GetType() == typ {
			return c
		}
	}
	return nil
}

// TestKubernetesBindActiveOnAllocationBound: a kubernetes binding is bound
// by bcd like a node one: allocation.bind carries binding "kubernetes", and
// the reservation goes active only on the node's AllocationBound. While the
// node refuses the bind it stays binding.
func TestKubernetesBindActiveOnAllocationBound(t *testing.T) {
	t.Parallel()
	f, d := kubeFixture(t)
	d.FailCommands(reservation.KindAllocationBind, "NOT_NOW")
	r := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 2, DurationSeconds: 3600, Binding: "kubernetes"})
	require.Equal(t, "binding", r.GetState(), "conditions: %v", r.GetConditions())
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM commands WHERE kind = 'allocation.bind' AND params LIKE $1 AND params LIKE '%"binding":"kubernetes"%'`,
		"%"+r.GetId()+"%"), "the bind names the binding")
	f.eventually(t, "the node refuses the bind", func() bool {
		return f.count(t, `SELECT COUNT(*) FROM commands WHERE kind = 'allocation.bind' AND params LIKE $1 AND state = 'failed'`, "%"+r.GetId()+"%") == 1
	})
	require.Equal(t, "binding", f.get(t, r.GetId()).GetState(), "no AllocationBound, not active")
	since, _ := f.activeInterval(t, r.GetId())
	require.Nil(t, since, "not billed before the node binds")

	// The bind times out and is sent again; the node binds it this time.
	d.FailCommands(reservation.KindAllocationBind, "")
	f.cp.Clock.Advance(2 * time.Minute)
	require.NoError(t, f.cp.App.Capacity.Tick(context.Background()))
	got := f.waitState(t, r.GetId(), "active")
	require.True(t, hasCondition(got, "DevicesHeld", "true"))
	require.Equal(t, "offered to the node's kubelet", apiCondition(got, "DevicesHeld").GetMessage())
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM events WHERE type = 'allocation.bound' AND resource_id = $1`, r.GetId()))
	types := f.eventTypes(t, r.GetId())
	require.Less(t, indexOf(types, "reservation.binding"), indexOf(types, "reservation.active"), "events: %v", types)
}

func indexOf(ss []string, s string) int {
	for i, x := range ss {
		if x == s {
			return i
		}
	}
	return -1
}

// TestKubernetesReleaseHeldByPods: released while the node's pods hold its
// GPUs, a kubernetes binding is releasing: booked (another reservation for
// the node's GPUs waits), billed (its active interval stays open), past its
// end too, where it is extended in a 5-minute step. Once the node reports
// AllocationReleased the bookings end then, it is released, and the waiting
// reservation is placed on those GPUs.
func TestKubernetesReleaseHeldByPods(t *testing.T) {
	t.Parallel()
	f, d := kubeFixture(t)
	ctx := context.Background()
	r := f.kubeActive(t, 8)
	end := r.GetEndTime().AsTime()
	d.FailCommands(reservation.KindAllocationRelease, podsHold)

	f.cp.Clock.Advance(10 * time.Minute)
	releasedAt := f.cp.Clock.Now()
	rel := f.release(t, f.member, r.GetId())
	require.Equal(t, "releasing", rel.GetState())
	require.Equal(t, "released", rel.GetEndsAs())
	require.WithinDuration(t, releasedAt, rel.GetReleaseTime().AsTime(), time.Second)
	require.Equal(t, end, rel.GetEndTime().AsTime(), "the booking keeps its end")
	held := apiCondition(rel, "DevicesHeld")
	require.Equal(t, "true", held.GetStatus())
	require.Equal(t, reservation.ReasonHeldByPods, held.GetReason())
	require.True(t, hasCondition(rel, "NodeReleased", "false"))
	require.Equal(t, []time.Time{end}, f.bookingEnds(t, r.GetId()), "still booked")
	_, until := f.activeInterval(t, r.GetId())
	require.Nil(t, until, "still billed")
	// Releasing twice is not an error, and changes nothing.
	require.Equal(t, "releasing", f.release(t, f.member, r.GetId()).GetState())
	f.eventually(t, "the node answers the release without letting go", func() bool {
		return f.count(t, `SELECT COUNT(*) FROM commands WHERE kind = 'allocation.release' AND params LIKE $1 AND state = 'failed'`, "%"+r.GetId()+"%") == 1
	})

	// The placer does not book the GPUs again under the pods.
	next := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 8, DurationSeconds: 3600, Binding: "kubernetes"})
	require.Equal(t, "pending", next.GetState())
	_, err := f.cp.App.Capacity.PlacePending(ctx, f.pool)
	require.NoError(t, err)
	require.Equal(t, "pending", f.get(t, next.GetId()).GetState())

	// Its end comes with the pods still there: extended one step, billed.
	f.cp.Clock.Advance(end.Sub(f.cp.Clock.Now()) + time.Second)
	require.NoError(t, f.cp.App.Capacity.Tick(ctx))
	got := f.get(t, r.GetId())
	require.Equal(t, "releasing", got.GetState())
	require.Equal(t, end.Add(reservation.HeldStep), got.GetEndTime().AsTime())
	require.Equal(t, []time.Time{end.Add(reservation.HeldStep)}, f.bookingEnds(t, r.GetId()))
	require.Contains(t, f.eventTypes(t, r.GetId()), "reservation.extended")
	require.Equal(t, "pending", f.get(t, next.GetId()).GetState())
	// Another release went with the step; the pods still hold.
	f.eventually(t, "the node answers the second release", func() bool {
		return f.count(t, `SELECT COUNT(*) FROM commands WHERE kind = 'allocation.release' AND params LIKE $1 AND state = 'failed'`, "%"+r.GetId()+"%") == 2
	})

	// The pods let go: the next step's release is answered with
	// AllocationReleased, and the bookings end when it arrives.
	d.FailCommands(reservation.KindAllocationRelease, "")
	f.cp.Clock.Advance(reservation.HeldStep)
	require.NoError(t, f.cp.App.Capacity.Tick(ctx))
	letGo := f.cp.Clock.Now()
	got = f.waitState(t, r.GetId(), "released")
	require.Equal(t, "released", got.GetEndsAs())
	require.Equal(t, reservation.ReasonPodsLetGo, apiCondition(got, "DevicesHeld").GetReason())
	require.Equal(t, "false", apiCondition(got, "DevicesHeld").GetStatus())
	require.True(t, hasCondition(got, "NodeReleased", "true"))
	gotEnd := got.GetEndTime().AsTime()
	require.True(t, !gotEnd.Before(letGo) && gotEnd.Before(end.Add(2*reservation.HeldStep)), "end %s, let go at %s", gotEnd, letGo)
	require.Equal(t, []time.Time{gotEnd}, f.bookingEnds(t, r.GetId()))
	since, until := f.activeInterval(t, r.GetId())
	require.NotNil(t, until)
	require.Equal(t, gotEnd, until.UTC(), "billed until the pods let go")
	// 8 GPUs from the bind to the let-go: past the release and the end.
	hours := f.gpuHours(t, r.GetId(), *since, gotEnd)
	require.InDelta(t, 8*gotEnd.Sub(*since).Hours(), hours, 0.01)
	require.Greater(t, hours, 8.0, "billed past the hour booked")

	_, err = f.cp.App.Capacity.PlacePending(ctx, f.pool)
	require.NoError(t, err)
	f.eventually(t, "the waiting reservation takes the GPUs", func() bool {
		return f.get(t, next.GetId()).GetPlacement().GetNodeId() == d.NodeID()
	})
}

// TestKubernetesHeldExtensionStopsWhenNeeded: pods still hold a kubernetes
// binding's GPUs at its end, but another booking starts on them within the
// step: the booking ends at its end, and HeldPastEnd says why.
func TestKubernetesHeldExtensionStopsWhenNeeded(t *testing.T) {
	t.Parallel()
	f, d := kubeFixture(t)
	ctx := context.Background()
	r := f.kubeActive(t, 8)
	end := r.GetEndTime().AsTime()
	later := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 8, Binding: "kubernetes",
		StartTime: timestamppb.New(end.Add(2 * time.Minute)), EndTime: timestamppb.New(end.Add(time.Hour))})
	require.Equal(t, "placed", later.GetState())
	d.FailCommands(reservation.KindAllocationRelease, podsHold)

	f.cp.Clock.Advance(end.Sub(f.cp.Clock.Now()) + time.Second)
	require.NoError(t, f.cp.App.Capacity.Tick(ctx))
	got := f.get(t, r.GetId())
	require.Equal(t, "expired", got.GetState(), "conditions: %v", got.GetConditions())
	require.Equal(t, "expired", got.GetEndsAs())
	past := apiCondition(got, "HeldPastEnd")
	require.NotNil(t, past)
	require.Equal(t, "true", past.GetStatus())
	require.Equal(t, reservation.ReasonDevicesNeeded, past.GetReason())
	require.Equal(t, end, got.GetEndTime().AsTime())
	require.Equal(t, []time.Time{end}, f.bookingEnds(t, r.GetId()))
	_, until := f.activeInterval(t, r.GetId())
	require.Equal(t, end, until.UTC(), "billed to its end, not past it")
	require.NotContains(t, f.eventTypes(t, r.GetId()), "reservation.extended")
	require.Equal(t, "placed", f.get(t, later.GetId()).GetState())
}

// TestKubernetesHeldEndsWhenNodeLost: a releasing reservation whose node is
// lost ends then, whatever the pool's policy.
func TestKubernetesHeldEndsWhenNodeLost(t *testing.T) {
	t.Parallel()
	f, d := kubeFixture(t)
	ctx := context.Background()
	r := f.kubeActive(t, 4)
	d.FailCommands(reservation.KindAllocationRelease, podsHold)
	f.cp.Clock.Advance(10 * time.Minute)
	require.Equal(t, "releasing", f.release(t, f.member, r.GetId()).GetState())

	f.cp.Clock.Advance(time.Minute)
	lost := f.cp.Clock.Now().UTC().Truncate(time.Microsecond)
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return f.cp.App.Capacity.Hooks().NodesLost(ctx, tx, []string{d.NodeID()})
	}))
	got := f.get(t, r.GetId())
	require.Equal(t, "released", got.GetState())
	require.Equal(t, "NodeLost", apiCondition(got, "DevicesHeld").GetReason())
	require.True(t, hasCondition(got, "NodeLost", "true"))
	require.Equal(t, lost, got.GetEndTime().AsTime())
	require.Equal(t, []time.Time{lost}, f.bookingEnds(t, r.GetId()))
	_, until := f.activeInterval(t, r.GetId())
	require.Equal(t, lost, until.UTC())
}

// TestKubernetesHeldIsolation: another tenant neither sees nor releases a
// releasing reservation, and another node's AllocationReleased for it
// changes nothing.
func TestKubernetesHeldIsolation(t *testing.T) {
	t.Parallel()
	f, d := kubeFixture(t)
	ctx := context.Background()
	r := f.kubeActive(t, 2)
	d.FailCommands(reservation.KindAllocationRelease, podsHold)
	require.Equal(t, "releasing", f.release(t, f.member, r.GetId()).GetState())

	_, err := f.evil.Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "other", Reservation: r.GetId()}))
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err), "%v", err)
	_, err = f.evil.Reservations.Release(ctx, connect.NewRequest(&apiv1.ReleaseReservationRequest{Tenant: "other", Reservation: r.GetId()}))
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err), "%v", err)
	_, err = f.evil.Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "acme", Reservation: r.GetId()}))
	require.Equal(t, connect.CodePermissionDenied, connect.CodeOf(err), "%v", err)
	_, err = f.evil.Reservations.Release(ctx, connect.NewRequest(&apiv1.ReleaseReservationRequest{Tenant: "acme", Reservation: r.GetId()}))
	require.Equal(t, connect.CodePermissionDenied, connect.CodeOf(err), "%v", err)
	ls, err := f.evil.Reservations.List(ctx, connect.NewRequest(&apiv1.ListReservationsRequest{Tenant: "other", State: "releasing"}))
	require.NoError(t, err)
	require.Empty(t, ls.Msg.GetReservations())

	// Only its node is heard: another node's report is ignored.
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return f.cp.App.Capacity.Hooks().AllocationReleased(ctx, tx, "nod_someoneelse", &agentv1.AllocationReleased{AllocationId: r.GetId()})
	}))
	got := f.get(t, r.GetId())
	require.Equal(t, "releasing", got.GetState())
	require.True(t, hasCondition(got, "NodeReleased", "false"))
	// A tenant may not stretch a held reservation itself.
	_, err = f.member.Reservations.Extend(ctx, connect.NewRequest(&apiv1.ExtendReservationRequest{Tenant: "acme", Reservation: r.GetId(), ExtendSeconds: 600}))
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err), "%v", err)
}
