package reservation_test

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/store"
)

// TestPlacerHandover: two replicas share one PostgreSQL database. The first
// to need a pool owns its placer; the other forwards the pool's mutations
// to it. Clients create on both while the owner is killed mid-run (its
// sessions ended on the server, a batch in flight cut off before commit).
// The survivor takes the pool over and places again; afterwards every
// caller was answered, every reservation a caller was told of exists with
// its bookings, and no booking is left without its reservation.
func TestPlacerHandover(t *testing.T) {
	if os.Getenv(bctest.PostgresURLEnv) == "" {
		t.Skip("several replicas need PostgreSQL: on SQLite one process owns every pool")
	}
	t.Parallel()
	e := setupTorture(t, 1)
	a := e.cp
	b := a.NewReplica(t)
	ctx := context.Background()
	create := func(cp *bctest.ControlPlane) (*apiv1.Reservation, error) {
		res, err := cp.Admin().Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{
			Tenant: "acme", Project: "default", Pool: "main", Gpus: 1, DurationSeconds: 600, Binding: reservation.BindingNone}))
		if err != nil {
			return nil, err
		}
		return res.Msg.GetReservation(), nil
	}
	owner := func(db *store.DB) (replica string) {
		require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT o.replica_id FROM placer_owners o JOIN pools p ON p.id = o.pool_id WHERE p.name = 'main'`).Scan(&replica)
		}))
		return replica
	}

	_, err := create(a)
	require.NoError(t, err)
	require.Equal(t, a.App.Capacity.Engine.ReplicaID(), owner(b.App.DB), "the first replica to place in the pool owns it")
	_, err = create(b)
	require.NoError(t, err, "the other replica forwards to the owner")
	require.Equal(t, a.App.Capacity.Engine.ReplicaID(), owner(b.App.DB))

	// Clients on both replicas; the owner dies after some creates.
	var (
		mu      sync.Mutex
		ok      []string
		done    atomic.Int64
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		started = make(chan struct{}, 64)
	)
	for c := range 6 {
		cp := a
		if c%2 == 1 {
			cp = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				r, err := create(cp)
				done.Add(1)
				if err == nil {
					mu.Lock()
					ok = append(ok, r.GetId())
					mu.Unlock()
				}
				select {
				case started <- struct{}{}:
				default:
				}
			}
		}()
	}
	for range 12 {
		bctest.Receive(t, "creates before the kill", started)
	}
	a.Kill(t)
	// The survivor takes the pool over: a create through it succeeds.
	bctest.WaitFor(t, "the survivor to take the pool over", func() bool {
		_, err := create(b)
		return err == nil
	})
	close(stop)
	wg.Wait()
	require.Equal(t, b.App.Capacity.Engine.ReplicaID(), owner(b.App.DB), "the survivor owns the pool")

	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, ok)
	for _, id := range ok {
		got, err := b.Admin().Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "acme", Reservation: id}))
		require.NoError(t, err, "a reservation a caller was told of is lost: %s", id)
		if st := got.Msg.GetReservation().GetState(); st == reservation.StateActive || st == reservation.StatePlaced {
			var n int
			require.NoError(t, b.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
				return tx.QueryRow(ctx, `SELECT COUNT(*) FROM bookings WHERE reservation_id = $1`, id).Scan(&n)
			}))
			require.Positive(t, n, "reservation %s holds no bookings", id)
		}
	}
	var orphans int
	require.NoError(t, b.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM bookings k LEFT JOIN reservations r ON r.id = k.reservation_id WHERE r.id IS NULL`).Scan(&orphans)
	}))
	require.Zero(t, orphans, "bookings without a reservation")
	t.Logf("%d creates, %d answered OK", done.Load(), len(ok))
}

// TestPlacerFence: the replica that places a pool loses its lock session
// without being told (the server ended it). It retires its placers at
// once, the other replica claims the pool at the next epoch, and the first
// forwards to it from then on; an owner row held FOR SHARE (a batch in
// flight) makes the claim wait for the batch.
func TestPlacerFence(t *testing.T) {
	if os.Getenv(bctest.PostgresURLEnv) == "" {
		t.Skip("several replicas need PostgreSQL: on SQLite one process owns every pool")
	}
	t.Parallel()
	e := setupTorture(t, 1)
	a := e.cp
	b := a.NewReplica(t)
	ctx := context.Background()
	create := func(cp *bctest.ControlPlane) error {
		_, err := cp.Admin().Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{
			Tenant: "acme", Project: "default", Pool: "main", Gpus: 1, DurationSeconds: 600, Binding: reservation.BindingNone}))
		return err
	}
	type owner struct {
		replica string
		epoch   int64
		pool    string
	}
	ownerOf := func() (o owner) {
		require.NoError(t, b.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT o.replica_id, o.epoch, o.pool_id FROM placer_owners o JOIN pools p ON p.id = o.pool_id WHERE p.name = 'main'`).
				Scan(&o.replica, &o.epoch, &o.pool)
		}))
		return o
	}
	require.NoError(t, create(a))
	first := ownerOf()
	require.Equal(t, a.App.Capacity.Engine.ReplicaID(), first.replica)
	require.True(t, a.App.Capacity.Engine.Placing(first.pool))

	// The server ends a's lock session.
	var killed int
	require.NoError(t, a.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(pg_terminate_backend(pid)) FROM (SELECT DISTINCT l.pid FROM pg_locks l
			WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1::bigint::oid
			AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())) s`, int64(0x4243504c)).Scan(&killed)
	}))
	require.Equal(t, 1, killed, "a's lock session")
	bctest.WaitFor(t, "a to retire the placer whose lock it lost", func() bool {
		return !a.App.Capacity.Engine.Placing(first.pool)
	})

	// A batch of a pool's old owner in flight (its owner row held FOR
	// SHARE) holds a new claim back until it ends. A pool no replica
	// placed yet, recorded as a gone replica's at epoch 5, so that only
	// this claim (or a tick's, which waits alike) takes it.
	pl, err := b.Admin().Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "fenced",
		Selector: []*apiv1.SelectorRequirement{{Key: "zone", Operator: "In", Values: []string{"nowhere"}}}}))
	require.NoError(t, err)
	fenced := pl.Msg.GetPool().GetId()
	require.NoError(t, b.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO placer_owners (pool_id, replica_id, url, since, epoch) VALUES ($1, 'rep_gone', 'https://127.0.0.1:1', compute_now(), 5)`, fenced)
		return err
	}))
	held, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	letGo := func() { releaseOnce.Do(func() { close(release) }) }
	// A failure below must not leave the row held: the database's close
	// (and every snapshot of the cluster) would wait on it.
	t.Cleanup(letGo)
	inFlight := make(chan error, 1)
	go func() {
		inFlight <- b.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			if _, err := store.Strings(tx.Query(ctx, `SELECT replica_id FROM placer_owners WHERE pool_id = $1 FOR SHARE`, fenced)); err != nil {
				return err
			}
			close(held)
			<-release
			return nil
		})
	}()
	bctest.Receive(t, "the batch holding the owner row", held)
	type claim struct {
		here bool
		err  error
	}
	claimed := make(chan claim, 1)
	go func() {
		here, _, err := b.App.Capacity.Engine.Claim(ctx, fenced)
		claimed <- claim{here, err}
	}()
	bctest.WaitFor(t, "the claim to wait on the owner row", func() bool {
		select {
		case c := <-claimed:
			letGo()
			t.Fatalf("b claimed the pool while a batch held its owner row (here %v, err %v)", c.here, c.err)
		default:
		}
		var n int
		require.NoError(t, b.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		}))
		return n > 0
	})
	letGo()
	require.NoError(t, <-inFlight)
	c := <-claimed
	require.NoError(t, c.err)
	require.True(t, c.here, "b places the pool")
	var replica string
	var epoch int64
	require.NoError(t, b.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT replica_id, epoch FROM placer_owners WHERE pool_id = $1`, fenced).Scan(&replica, &epoch)
	}))
	require.Equal(t, b.App.Capacity.Engine.ReplicaID(), replica)
	require.Equal(t, int64(6), epoch, "at the next epoch")
}
