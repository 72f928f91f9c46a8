package reservation_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/store"
)

// A GPU quarantined while a placer batch books it: the reconcile that marks
// the atom quarantined and the batch that books it take turns on the node's
// row, so the batch either commits first or sees the quarantine. Before the
// reconcile locked the node, the batch's last check read the atoms without
// waiting and booked them while the quarantine was being written.
func TestQuarantineDuringBatchWaitsForIt(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	if f.cp.App.DB.Dialect() != store.Postgres {
		t.Skip("SQLite has one writer: a batch and a quarantine cannot interleave (set BC_TEST_POSTGRES_URL)")
	}
	ctx := context.Background()
	node := f.sim.Daemons[0].NodeID()
	// The placer's index is loaded: it knows every GPU as free.
	first := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 1, DurationSeconds: 3600})
	require.NotEqual(t, "pending", first.GetState())

	var free []string
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		free, err = store.Strings(tx.Query(ctx, `SELECT uuid FROM gpus WHERE node_id = $1 AND uuid <> $2 ORDER BY idx`,
			node, first.GetPlacement().GetAtoms()[0]))
		return err
	}))
	require.Len(t, free, 7)

	// The quarantine of every free GPU, held open (and let go if the test
	// fails: the database's close would wait on it).
	held, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	letGo := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(letGo)
	quarantined := make(chan error, 1)
	go func() {
		quarantined <- f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			for _, g := range free {
				if _, err := tx.Exec(ctx, `INSERT INTO node_conditions (node_id, type, status, reason, message, update_time)
					VALUES ($1, $2, 'true', 'XID79', 'fell off the bus', compute_now())`, node, "GpuQuarantined/"+g); err != nil {
					return err
				}
			}
			if err := f.cp.App.Capacity.Hooks().NodeChanged(ctx, tx, node); err != nil {
				return err
			}
			close(held)
			<-release
			return nil
		})
	}()
	select {
	case <-held:
	case err := <-quarantined:
		t.Fatalf("the quarantine ended before it was held: %v", err)
	}

	type result struct {
		r   *apiv1.Reservation
		err error
	}
	created := make(chan result, 1)
	go func() {
		res, err := f.member.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{
			Tenant: "acme", Pool: "h100", Gpus: 1, DurationSeconds: 3600}))
		if err != nil {
			created <- result{err: err}
			return
		}
		created <- result{r: res.Msg.GetReservation()}
	}()
	// The create must wait for the quarantine: it is seen waiting on a
	// row lock, and it has not answered.
	deadline := time.After(2 * time.Minute)
	for waiting := false; !waiting; {
		select {
		case res := <-created:
			letGo()
			require.NoError(t, <-quarantined)
			t.Fatalf("the create answered while the quarantine of its GPUs was uncommitted: %+v (err %v)", res.r.GetPlacement().GetAtoms(), res.err)
		case <-deadline:
			letGo()
			t.Fatal("the create neither answered nor waited on a lock")
		case <-time.After(20 * time.Millisecond):
		}
		waiting = f.count(t, `SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0
	}
	_ = f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		qs, _ := store.Strings(tx.Query(ctx, `SELECT query FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`))
		t.Logf("DEBUG waiting: %q", qs)
		return nil
	})
	letGo()
	require.NoError(t, <-quarantined)
	res := <-created
	require.NoError(t, res.err)
	require.Equal(t, "pending", res.r.GetState(), "every GPU left is quarantined: the create waits in the queue")
	require.Zero(t, f.count(t, `SELECT COUNT(*) FROM bookings b JOIN atoms a ON a.id = b.atom WHERE a.quarantined = $1`, true),
		"nothing is booked on a quarantined GPU")
}

// A node drained and undrained takes work again: the drain and the undrain
// move the pool's version with the node as a delta, and a node a batch
// found draining is read again rather than kept out until a reload.
func TestUndrainedNodeTakesWorkAgain(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	ctx := context.Background()
	name := ""
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT name FROM nodes WHERE id = $1`, f.sim.Daemons[0].NodeID()).Scan(&name)
	}))
	// The placer's index is loaded with the node schedulable.
	first := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 1, DurationSeconds: 3600})
	require.NotEqual(t, "pending", first.GetState())

	_, err := f.admin.Nodes.Drain(ctx, connect.NewRequest(&apiv1.DrainNodeRequest{Tenant: "acme", Node: name}))
	require.NoError(t, err)
	_, err = f.member.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{
		Tenant: "acme", Pool: "h100", Gpus: 1, DurationSeconds: 3600}))
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err), "a draining node takes no new work: %v", err)

	_, err = f.admin.Nodes.Undrain(ctx, connect.NewRequest(&apiv1.UndrainNodeRequest{Tenant: "acme", Node: name}))
	require.NoError(t, err)
	r := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 1, DurationSeconds: 3600})
	require.NotEqual(t, "pending", r.GetState(), "the undrained node takes work again")
	require.Equal(t, f.sim.Daemons[0].NodeID(), r.GetPlacement().GetNodeId())
}

// A preview reads the pool's one index, the placer's, and never loads or
// re-syncs it itself: it asks the placer, which catches up between its
// batches. Before, a preview re-synced the placer's index in place,
// dropping the marks of a batch in flight, and other previews read a second
// copy loaded by age.
func TestPreviewLeavesThePlacersIndex(t *testing.T) {
	t.Parallel()
	// No capacity tick: nothing but this test's creates runs a batch, so
	// the placer's index moves only with them.
	f := setupWith(t, 1, bctest.FakeDaemonConfig{}, func(c *app.Config) { c.CapacityTick = time.Hour })
	ctx := context.Background()
	node := f.sim.Daemons[0].NodeID()
	first := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 1, DurationSeconds: 3600})
	require.NotEqual(t, "pending", first.GetState())
	f.waitState(t, first.GetId(), "active")
	ix := f.cp.App.Capacity.Engine.Cached(f.pool)
	require.NotNil(t, ix, "the placer's index")
	before := ix.Version()

	var bad string
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT uuid FROM gpus WHERE node_id = $1 AND uuid <> $2 ORDER BY idx LIMIT 1`,
			node, first.GetPlacement().GetAtoms()[0]).Scan(&bad)
	}))
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO node_conditions (node_id, type, status, reason, message, update_time)
			VALUES ($1, $2, 'true', 'XID79', 'fell off the bus', compute_now())`, node, "GpuQuarantined/"+bad); err != nil {
			return err
		}
		return f.cp.App.Capacity.Hooks().NodeChanged(ctx, tx, node)
	}))

	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pv, err := f.member.Reservations.Preview(ctx, connect.NewRequest(&apiv1.PreviewReservationRequest{
				Request: &apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Gpus: 7}}))
			require.NoError(t, err)
			require.False(t, pv.Msg.GetFeasible(), "the preview sees the quarantine: six GPUs are free")
		}()
	}
	wg.Wait()
	// The previews read the placer's one index, which the placer caught
	// up (between its batches, never in one) for them to see the change:
	// read again where it changed, or reloaded whole when a version came
	// without a delta; either way the placer's, as there is no other.
	require.Greater(t, f.cp.App.Capacity.Engine.Cached(f.pool).Version(), before)

	// The placer's next batch catches up, and places around the GPU.
	r := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 6, DurationSeconds: 3600})
	require.NotEqual(t, "pending", r.GetState())
	require.NotContains(t, r.GetPlacement().GetAtoms(), bad)
}

// The batch checks a node's host memory in the database, not only in the
// index: memory the index does not know of (here the host reporting less
// without the pool's version moving) is not over-committed.
func TestBatchChecksHostMemoryInTheDatabase(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	ctx := context.Background()
	node := f.sim.Daemons[0].NodeID()
	mem := f.count(t, `SELECT memory_gib FROM host_resources WHERE node_id = $1`, node)
	require.Greater(t, mem, 8)
	half := int32(mem / 2)
	first := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 1, MemoryGib: half, DurationSeconds: 3600})
	require.NotEqual(t, "pending", first.GetState())

	// The host now hands out less than two halves; the index still holds
	// the old figure. The node's NUMA memory shrinks with it, so that a
	// reconcile of the node landing after this (a health report under load,
	// say) recomputes the same smaller figure rather than the old one.
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE numa_nodes SET memory_mib = memory_mib - $2
			WHERE node_id = $1 AND numa_id = (SELECT MIN(numa_id) FROM numa_nodes WHERE node_id = $1)`, node, (mem-(2*int(half)-1))*1024)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE host_resources SET memory_gib = $2 WHERE node_id = $1`, node, 2*int(half)-1)
		return err
	}))
	r := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 1, MemoryGib: half, DurationSeconds: 3600})
	require.Equal(t, "pending", r.GetState(), "the second half does not fit the host any more")
	require.Equal(t, int(half), f.count(t, `SELECT COALESCE(SUM(memory_gib), 0) FROM reservations
		WHERE node_id = $1 AND state IN ('placed', 'binding', 'active')`, node))
}

// An extension is held to its node's host memory like a booking: extended
// into the window of a later reservation on the same node whose memory
// would then not fit beside it, it is refused (CONFLICT) and nothing moves;
// extended short of it, it passes. Before, an extension checked only its
// devices, and the replica torture test caught a host over-committed.
func TestExtendChecksHostMemory(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	ctx := context.Background()
	node := f.sim.Daemons[0].NodeID()
	mem := f.count(t, `SELECT memory_gib FROM host_resources WHERE node_id = $1`, node)
	require.Greater(t, mem, 8)
	half := int32(mem / 2)
	now := f.cp.Clock.Now()
	first := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 1, MemoryGib: half, DurationSeconds: 3600})
	require.NotEqual(t, "pending", first.GetState())
	later := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 1, MemoryGib: int32(mem) - half + 1,
		StartTime: timestamppb.New(now.Add(2 * time.Hour)), EndTime: timestamppb.New(now.Add(3 * time.Hour))})
	require.NotEqual(t, "pending", later.GetState())
	require.Equal(t, node, later.GetPlacement().GetNodeId())
	// The packer put it on first's GPU, free by then; move its booking to
	// another GPU of the node (as a busier node would have placed it), so
	// that only the host's memory stands between first's extension and it.
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE bookings SET atom = (SELECT MIN(a.id) FROM atoms a WHERE a.node_id = $2
				AND a.id NOT IN (SELECT atom FROM bookings WHERE reservation_id IN ($1, $3)))
			WHERE reservation_id = $3`, first.GetId(), node, later.GetId())
		if err != nil {
			return err
		}
		// Its CPUs too: after first's.
		_, err = tx.Exec(ctx, `UPDATE cpu_bookings SET cpu_lo = cpu_lo + (SELECT MAX(cpu_hi) FROM cpu_bookings WHERE reservation_id = $1),
			cpu_hi = cpu_hi + (SELECT MAX(cpu_hi) FROM cpu_bookings WHERE reservation_id = $1) WHERE reservation_id = $2`, first.GetId(), later.GetId())
		return err
	}))
	require.Zero(t, f.count(t, `SELECT COUNT(*) FROM bookings a JOIN bookings b ON a.atom = b.atom
		WHERE a.reservation_id = $1 AND b.reservation_id = $2`, first.GetId(), later.GetId()), "no GPU in common")

	_, err := f.member.Reservations.Extend(ctx, connect.NewRequest(&apiv1.ExtendReservationRequest{Tenant: "acme", Reservation: first.GetId(),
		EndTime: timestamppb.New(first.GetEndTime().AsTime().Add(90 * time.Minute))}))
	require.Equal(t, "CONFLICT", client.Code(err), "err: %v", err)
	require.ErrorContains(t, err, "host memory")
	got, err := f.member.Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "acme", Reservation: first.GetId()}))
	require.NoError(t, err)
	require.Equal(t, first.GetEndTime().AsTime(), got.Msg.GetReservation().GetEndTime().AsTime(), "refused: the end did not move")

	_, err = f.member.Reservations.Extend(ctx, connect.NewRequest(&apiv1.ExtendReservationRequest{Tenant: "acme", Reservation: first.GetId(),
		EndTime: timestamppb.New(first.GetEndTime().AsTime().Add(30 * time.Minute))}))
	require.NoError(t, err, "short of the later reservation, the memory fits")
}

// The pending pass places many tenants' work without naming them up front:
// it locks each tenant's quota rows before it charges them, so a create in
// another pool charging the same quota (here: a transaction holding them)
// and the pass take turns. Before, the pass read the quotas without a lock
// and placed while the other transaction held them.
func TestPendingPassLocksTheQuotasItCharges(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	if f.cp.App.DB.Dialect() != store.Postgres {
		t.Skip("SQLite has one writer: the pass and a create cannot interleave (set BC_TEST_POSTGRES_URL)")
	}
	ctx := context.Background()
	_, err := f.admin.Pools.Offer(ctx, connect.NewRequest(&apiv1.OfferPoolRequest{Tenant: "acme", Pool: "h100", To: []string{"other"}}))
	require.NoError(t, err)
	gpus := int32(8)
	_, err = f.admin.Quotas.Set(ctx, connect.NewRequest(&apiv1.SetQuotaRequest{Tenant: "other", Gpus: &gpus}))
	require.NoError(t, err)
	full := f.create(t, f.member, &apiv1.CreateReservationRequest{Gpus: 8, DurationSeconds: 3600, Binding: "none"})
	require.NotEqual(t, "pending", full.GetState())
	res, err := f.evil.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{
		Tenant: "other", Pool: "h100", Gpus: 1, DurationSeconds: 3600, Binding: "none"}))
	require.NoError(t, err)
	waiting := res.Msg.GetReservation()
	require.Equal(t, "pending", waiting.GetState(), "the node is full")

	// Another transaction charging other's quota, held open (and let go
	// if the test fails).
	held, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	letGo := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(letGo)
	charged := make(chan error, 1)
	go func() {
		charged <- f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			if _, err := store.Strings(tx.Query(ctx, `SELECT q.id FROM quotas q JOIN tenants t ON t.id = q.tenant_id
				WHERE t.name = 'other' ORDER BY q.id FOR UPDATE`)); err != nil {
				return err
			}
			close(held)
			<-release
			return nil
		})
	}()
	bctest.Receive(t, "the quota rows held", held)
	// Releasing acme's reservation wakes the pool's pending pass.
	_, err = f.member.Reservations.Release(ctx, connect.NewRequest(&apiv1.ReleaseReservationRequest{Tenant: "acme", Reservation: full.GetId()}))
	require.NoError(t, err)
	state := func() string {
		r, err := f.evil.Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "other", Reservation: waiting.GetId()}))
		require.NoError(t, err)
		return r.Msg.GetReservation().GetState()
	}
	bctest.WaitFor(t, "the pending pass to wait for other's quota rows (or to place without them)", func() bool {
		if st := state(); st != "pending" {
			letGo()
			<-charged
			t.Fatalf("the pending pass placed other's reservation (%s) while its quota rows were held", st)
		}
		return f.count(t, `SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0
	})
	require.Equal(t, "pending", state())
	letGo()
	require.NoError(t, <-charged)
	bctest.WaitFor(t, "the pass to place other's reservation once the quota rows are free", func() bool { return state() != "pending" })
}
