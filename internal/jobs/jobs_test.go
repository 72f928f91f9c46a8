package jobs_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/jobs"
	"github.com/better-compute/better-compute/internal/store"
)

type pingArgs struct {
	N int `json:"n"`
}

func (pingArgs) Kind() string { return "jobs_test_ping" }

type bundle struct {
	db   *store.DB
	done chan int
}

func setup(t *testing.T) *bundle {
	t.Helper()
	db := bctest.NewDB(t, nil)
	require.NoError(t, jobs.Migrations(context.Background(), db))
	return &bundle{db: db, done: make(chan int, 16)}
}

func (b *bundle) workers(work func(ctx context.Context, n int) error) *river.Workers {
	w := river.NewWorkers()
	river.AddWorker(w, river.WorkFunc(func(ctx context.Context, j *river.Job[pingArgs]) error {
		if err := work(ctx, j.Args.N); err != nil {
			return err
		}
		b.done <- j.Args.N
		return nil
	}))
	return w
}

// run starts rt.Run and returns a stop func that cancels it and returns
// Run's error.
func run(t *testing.T, rt *jobs.Runtime) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- rt.Run(ctx) }()
	stopped := false
	stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return bctest.Receive(t, "Run to return", errc)
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func waitDone(t *testing.T, b *bundle) int {
	t.Helper()
	return bctest.Receive(t, "the job to run", b.done)
}

func TestWorkerRunsCommittedJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rt, err := jobs.New(b.db, b.workers(func(context.Context, int) error { return nil }), nil,
		jobs.Config{Worker: true, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	stop := run(t, rt)

	// A rolled-back enqueue never runs; the committed one does.
	err = b.db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		if err := rt.InsertTx(ctx, tx, pingArgs{N: 1}, nil); err != nil {
			return err
		}
		return errors.New("roll back")
	})
	require.Error(t, err)
	require.NoError(t, b.db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return rt.InsertTx(ctx, tx, pingArgs{N: 2}, nil)
	}))
	assert.Equal(t, 2, waitDone(t, b))
	require.NoError(t, stop())
	select {
	case n := <-b.done:
		t.Fatalf("rolled-back job %d ran", n)
	default:
	}
}

func TestRunStopsGracefully(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan struct{}, 1)
	var finished atomic.Bool
	rt, err := jobs.New(b.db, b.workers(func(ctx context.Context, _ int) error {
		started <- struct{}{}
		select {
		case <-time.After(300 * time.Millisecond):
			finished.Store(true)
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}), nil, jobs.Config{Worker: true, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	stop := run(t, rt)
	require.NoError(t, b.db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return rt.InsertTx(ctx, tx, pingArgs{N: 1}, nil)
	}))
	bctest.Receive(t, "the job to start", started)
	require.NoError(t, stop())
	assert.True(t, finished.Load(), "the in-flight job finishes before Run returns")
}

func TestRunTwiceFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rt, err := jobs.New(b.db, nil, nil, jobs.Config{})
	require.NoError(t, err)
	// Two Runs race for the runtime; whichever loses returns at once with an
	// error while the winner keeps running, so the first result is the
	// refusal, whatever the scheduler does.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 2)
	for range 2 {
		go func() { errc <- rt.Run(ctx) }()
	}
	require.ErrorContains(t, <-errc, "already running")
	cancel()
	require.NoError(t, <-errc)
	// After it returns, the runtime can run again.
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	require.NoError(t, rt.Run(ctx2))
}

func TestPeriodicJobRunsOnLeader(t *testing.T) {
	t.Parallel()
	b := setup(t)
	periodic := []*river.PeriodicJob{
		river.NewPeriodicJob(river.PeriodicInterval(time.Hour),
			func() (river.JobArgs, *river.InsertOpts) { return pingArgs{N: 7}, nil },
			&river.PeriodicJobOpts{RunOnStart: true}),
	}
	rt, err := jobs.New(b.db, b.workers(func(context.Context, int) error { return nil }), periodic,
		jobs.Config{Worker: true, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	stop := run(t, rt)
	assert.Equal(t, 7, waitDone(t, b))
	require.NoError(t, stop())
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := jobs.New(b.db, nil, nil, jobs.Config{Worker: true})
	require.Error(t, err, "the worker role needs workers")
}

func TestMigrationsReplicasTogether(t *testing.T) {
	t.Parallel()
	cfg := bctest.NewStoreConfig(t, nil)
	const replicas = 3
	errs := make([]error, replicas)
	var wg sync.WaitGroup
	for i := range replicas {
		db := bctest.OpenDB(t, cfg)
		wg.Go(func() { errs[i] = jobs.Migrations(context.Background(), db) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
}
