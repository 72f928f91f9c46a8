package provision_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/events"
	"github.com/better-compute/better-compute/internal/jobs"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/store"
)

// chaosProfiles is a deploy: every destructive kind, an await and a
// non-destructive step, with retries for the failures chaos makes.
func chaosProfiles() []provision.Profile {
	return []provision.Profile{{Name: "deploy", Steps: []provision.Step{
		{Name: "power", Kind: "power.cycle", Destructive: true, Timeout: 5 * time.Minute, Retries: 5},
		{Name: "rejoin", Kind: provision.KindAwaitRejoin, Timeout: 30 * time.Minute},
		{Name: "wipe", Kind: "disk.wipe", Destructive: true, Timeout: 20 * time.Minute, Retries: 5},
		{Name: "write", Kind: "image.write", Destructive: true, Timeout: 20 * time.Minute, Retries: 5},
		{Name: "inventory", Kind: "inventory.refresh", Timeout: 5 * time.Minute, Retries: 5},
	}}}
}

// chaos decides, per dispatch, whether the worker dies and where.
type chaos struct {
	mu         sync.Mutex
	rng        *rand.Rand
	crashes    int // crashes left
	p          float64
	kills      atomic.Int64
	ambiguous  atomic.Int64
	lostReport atomic.Int64
}

const (
	actOK = iota
	actDieBefore
	actDieAfter
	actResetAfter
	actResetBefore
)

func (c *chaos) roll() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.rng.Float64()
	switch {
	case r < c.p && c.crashes > 0:
		c.crashes--
		if c.rng.IntN(2) == 0 {
			return actDieBefore
		}
		return actDieAfter
	case r < 1.3*c.p:
		return actResetAfter
	case r < 1.5*c.p:
		return actResetBefore
	}
	return actOK
}

func (c *chaos) chance(p float64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rng.Float64() < p
}

// generation is one life of a worker: an engine and a River client that
// works its jobs, until chaos kills it.
type generation struct {
	eng     *provision.Engine
	cancel  context.CancelFunc
	done    chan error
	crashed atomic.Bool
}

func (g *generation) crash() {
	if g.crashed.CompareAndSwap(false, true) {
		g.cancel()
	}
}

// chaosRunner is the runner of one generation: it forwards to the site
// (which outlives workers, as a site agent does) and, when chaos says so,
// kills the worker before the site gets the request or after the site
// applied it, or fails with an error that leaves the dispatch in doubt.
type chaosRunner struct {
	site  *fakeSite
	gen   *generation
	chaos *chaos
}

func (r *chaosRunner) Dispatch(ctx context.Context, run provision.StepRun) (provision.Dispatched, error) {
	switch r.chaos.roll() {
	case actDieBefore:
		r.chaos.kills.Add(1)
		r.gen.crash()
		<-ctx.Done()
		return provision.Dispatched{}, ctx.Err()
	case actDieAfter:
		r.chaos.kills.Add(1)
		_, _ = r.site.execute(run)
		r.gen.crash()
		<-ctx.Done()
		return provision.Dispatched{}, ctx.Err()
	case actResetAfter:
		r.chaos.ambiguous.Add(1)
		_, _ = r.site.execute(run)
		return provision.Dispatched{}, errors.New("connection reset by peer")
	case actResetBefore:
		r.chaos.ambiguous.Add(1)
		return provision.Dispatched{}, errors.New("no route to host")
	}
	return r.site.Dispatch(ctx, run)
}

func (r *chaosRunner) Lookup(ctx context.Context, run provision.StepRun) (provision.Outcome, error) {
	return r.site.Lookup(ctx, run)
}

type chaosRig struct {
	t     *testing.T
	ctx   context.Context
	db    *store.DB
	clk   *bctest.SimClock
	site  *fakeSite
	chaos *chaos
	gen   *generation
	lease time.Duration
}

func newChaosRig(t *testing.T) *chaosRig {
	ctx := context.Background()
	clk := bctest.NewSimClock(time.Time{})
	db := bctest.NewDB(t, clk)
	require.NoError(t, db.Migrate(ctx, events.Migrations(), provision.Migrations()))
	require.NoError(t, jobs.Migrations(ctx, db))
	return &chaosRig{t: t, ctx: ctx, db: db, clk: clk, site: newFakeSite("disk.wipe", "image.write"), lease: time.Minute}
}

// startGeneration starts a fresh worker on the shared database.
func (r *chaosRig) startGeneration() {
	t := r.t
	g := &generation{done: make(chan error, 1)}
	runner := &chaosRunner{site: r.site, gen: g, chaos: r.chaos}
	cfg := provision.Config{DB: r.db, Recorder: recorder{}, Clock: r.clk, Profiles: chaosProfiles(), Lease: r.lease,
		Logger: slog.New(slog.DiscardHandler), Runners: map[string]provision.StepRunner{}}
	for _, k := range allKinds {
		cfg.Runners[k] = runner
	}
	eng, err := provision.New(cfg)
	require.NoError(t, err)
	workers := river.NewWorkers()
	eng.AddWorkers(workers)
	// A worker that dies does not wait for its jobs: StopTimeout is as
	// short as it gets, so River cancels them at once.
	rt, err := jobs.New(r.db, workers, nil, jobs.Config{Worker: true, PollInterval: 20 * time.Millisecond,
		StopTimeout: time.Nanosecond, Clock: r.clk, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	eng.SetEnqueue(rt.InsertTx)
	ctx, cancel := context.WithCancel(r.ctx)
	g.eng, g.cancel = eng, cancel
	go func() { g.done <- rt.Run(ctx) }()
	r.gen = g
}

func (r *chaosRig) stopGeneration() {
	r.gen.crash()
	// Run may report that its jobs outlived the (nanosecond) grace
	// period: that is the crash.
	bctest.Receive(r.t, "the worker to stop", r.gen.done)
}

// busy counts River jobs running or ready to run. A job River made
// available but scheduled later on the simulated clock (a deadline's
// wake-up) waits for the clock, so it does not count.
func (r *chaosRig) busy() int {
	n := 0
	now := r.clk.Now()
	require.NoError(r.t, r.db.Read(r.ctx, func(ctx context.Context, tx store.Tx) error {
		rows, err := tx.Query(ctx, `SELECT state, scheduled_at FROM river_job WHERE state IN ('available', 'running')`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				state string
				at    time.Time
			)
			if err := rows.Scan(&state, &at); err != nil {
				return err
			}
			if state == "running" || !at.After(now) {
				n++
			}
		}
		return rows.Err()
	}))
	return n
}

func (r *chaosRig) sweep() {
	_, err := r.gen.eng.Sweep(r.ctx)
	require.NoError(r.t, err)
}

func (r *chaosRig) active() []provision.Workflow {
	var out []provision.Workflow
	require.NoError(r.t, r.db.Read(r.ctx, func(ctx context.Context, tx store.Tx) error {
		ws, err := provision.List(ctx, tx, provision.ListParams{Limit: 1000})
		for _, w := range ws {
			if w.State.Active() {
				w, err := provision.Get(ctx, tx, w.ID)
				if err != nil {
					return err
				}
				out = append(out, w)
			}
		}
		return err
	}))
	return out
}

// run drives the workflows to their end: it lets the worker work until
// nothing is left to run, then plays the outside world — a dead worker is
// replaced (after its claims' lease), a finished site command is reported
// (or its report lost), a ramdisk joins — and when only time can help, it
// moves the clock to the next deadline.
func (r *chaosRig) run(targets []string) {
	t := r.t
	r.startGeneration()
	for _, target := range targets {
		_, err := r.gen.eng.Start(r.ctx, provision.StartParams{TenantID: "tnt_test", TargetID: target, Profile: "deploy"})
		require.NoError(t, err)
	}
	for iter := 0; ; iter++ {
		require.Less(t, iter, 2000, "the workflows did not end")
		bctest.WaitFor(t, "the worker to go idle or die", func() bool { return r.gen.crashed.Load() || r.busy() == 0 })
		if r.gen.crashed.Load() {
			r.stopGeneration()
			r.startGeneration()
			r.clk.Advance(r.lease)
			r.sweep()
			continue
		}
		if key, ok := r.site.finish(""); ok {
			if r.chaos.chance(r.chaos.p) {
				// The site agent died before it reported: the report is lost.
				r.chaos.lostReport.Add(1)
				continue
			}
			require.NoError(t, r.gen.eng.Complete(r.ctx, key, provision.Result{Output: map[string]any{"ok": true}}))
			continue
		}
		active := r.active()
		if len(active) == 0 {
			break
		}
		signalled := false
		for _, w := range active {
			for _, s := range w.Steps {
				if s.State == provision.StepAwaiting {
					_, err := r.gen.eng.Signal(r.ctx, w.TargetID, s.Kind, provision.Result{})
					require.NoError(t, err)
					signalled = true
				}
			}
		}
		if signalled {
			continue
		}
		// Nothing outside can help: let time pass to the next deadline,
		// lease or backoff, in steps shorter than the shortest step
		// timeout (5 minutes). A job River makes due on its own tick can
		// dispatch after the look above; a step so dispatched must still
		// be in time when the site's answer is played next round (a
		// 20-minute step timed out under it on a loaded CI machine).
		r.clk.Advance(4 * time.Minute)
		r.sweep()
	}
	r.stopGeneration()
}

// TestChaosDestructiveStepsAtMostOnce kills workers between dispatch and
// completion (before the site got the request, or after it applied it),
// loses site reports and fails dispatches ambiguously, restarts, and checks
// that no idempotency key reached the site twice and no destructive step
// ran twice — and that every workflow still ends, succeeded. Seeds:
// BC_CHAOS_SEEDS (default 8), each with three machines at once.
func TestChaosDestructiveStepsAtMostOnce(t *testing.T) {
	t.Parallel()
	seeds := 8
	if s := os.Getenv("BC_CHAOS_SEEDS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err, "BC_CHAOS_SEEDS")
		seeds = n
	}
	r := newChaosRig(t)
	var kills, ambiguous, lost int64
	for seed := range seeds {
		r.chaos = &chaos{rng: rand.New(rand.NewPCG(uint64(seed), 11)), crashes: 4, p: 0.2}
		targets := []string{fmt.Sprintf("mch_%d_a", seed), fmt.Sprintf("mch_%d_b", seed), fmt.Sprintf("mch_%d_c", seed)}
		r.run(targets)
		kills += r.chaos.kills.Load()
		ambiguous += r.chaos.ambiguous.Load()
		lost += r.chaos.lostReport.Load()
	}
	t.Logf("%d seeds: %d workers killed mid-dispatch, %d ambiguous dispatch errors, %d site reports lost", seeds, kills, ambiguous, lost)
	require.Positive(t, kills, "chaos killed no worker: the test proved nothing")

	// Every workflow succeeded, and the site saw each key at most once and
	// each destructive step run once.
	var ws []provision.Workflow
	require.NoError(t, r.db.Read(r.ctx, func(ctx context.Context, tx store.Tx) error {
		list, err := provision.List(ctx, tx, provision.ListParams{Limit: 1000})
		for _, w := range list {
			w, err := provision.Get(ctx, tx, w.ID)
			if err != nil {
				return err
			}
			ws = append(ws, w)
		}
		return err
	}))
	require.Len(t, ws, 3*seeds)
	r.site.mu.Lock()
	defer r.site.mu.Unlock()
	for key, n := range r.site.executed {
		require.Equal(t, 1, n, "idempotency key %s was dispatched %d times", key, n)
	}
	for _, w := range ws {
		require.Equal(t, provision.WorkflowSucceeded, w.State, "workflow %s: %s", w.ID, w.Reason)
		for _, s := range w.Steps {
			if s.Destructive {
				require.Equal(t, 1, r.site.perStep[fmt.Sprintf("%s:%d", w.ID, s.Index)], "step %s of %s ran more than once", s.Name, w.ID)
			}
		}
	}
}

// TestRiverDrivesWorkflows: with a worker running, River's jobs alone move
// workflows from start to end.
func TestRiverDrivesWorkflows(t *testing.T) {
	t.Parallel()
	r := newChaosRig(t)
	r.chaos = &chaos{rng: rand.New(rand.NewPCG(1, 2))}
	r.run([]string{"mch_1", "mch_2"})
	for _, key := range []string{"mch_1", "mch_2"} {
		var w provision.Workflow
		require.NoError(t, r.db.Read(r.ctx, func(ctx context.Context, tx store.Tx) error {
			ws, err := provision.List(ctx, tx, provision.ListParams{TargetID: key})
			if err == nil {
				w = ws[0]
			}
			return err
		}))
		require.Equal(t, provision.WorkflowSucceeded, w.State)
	}
}
