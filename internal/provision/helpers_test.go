package provision_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/events"
	"github.com/better-compute/better-compute/internal/jobs"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/store"
)

// fakeSite plays the site agent that runs dispatched steps: it keeps every
// idempotency key it was handed, applies each at most once, fences keys it
// is asked about and never saw, and counts executions per key and per step
// so a test can tell whether anything destructive ran twice.
type fakeSite struct {
	mu       sync.Mutex
	executed map[string]int    // idempotency key → executions
	perStep  map[string]int    // "<workflow>:<index>" → executions
	fenced   map[string]bool   // keys answered "not dispatched"
	done     map[string]string // key → error ("" succeeded) once finished
	running  []string          // async keys not finished yet
	// async kinds finish later (Finish); the rest finish in Dispatch.
	async map[string]bool
	// fail makes the next n attempts of a kind fail.
	fail map[string]int
	// lookupUnknown makes Lookup answer "unknown" (a site that cannot tell).
	lookupUnknown bool
	// onDispatch, when set, runs before the site applies a dispatch; it
	// returns false to drop the dispatch (the request never arrived).
	onDispatch func(ctx context.Context, run provision.StepRun) bool
}

func newFakeSite(async ...string) *fakeSite {
	s := &fakeSite{executed: map[string]int{}, perStep: map[string]int{}, fenced: map[string]bool{}, done: map[string]string{},
		async: map[string]bool{}, fail: map[string]int{}}
	for _, k := range async {
		s.async[k] = true
	}
	return s
}

func stepKey(run provision.StepRun) string { return fmt.Sprintf("%s:%d", run.WorkflowID, run.Index) }

// execute applies a dispatch once per key.
func (s *fakeSite) execute(run provision.StepRun) (provision.Dispatched, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := run.IdempotencyKey
	if s.fenced[key] {
		return provision.Dispatched{}, fmt.Errorf("key %s was fenced: %w", key, provision.ErrNotDispatched)
	}
	if s.executed[key] > 0 {
		// A repeat delivery of a key: the site's own idempotency answers
		// it without running anything. The count below stays at one, so a
		// test sees only what the engine sent, and the engine never sends
		// a key twice.
		s.executed[key]++
		return provision.Dispatched{Handle: "cmd-" + key}, nil
	}
	s.executed[key]++
	s.perStep[stepKey(run)]++
	errText := ""
	if s.fail[run.Kind] > 0 {
		s.fail[run.Kind]--
		errText = run.Kind + " failed"
	}
	if s.async[run.Kind] {
		s.running = append(s.running, key)
		return provision.Dispatched{Handle: "cmd-" + key}, nil
	}
	s.done[key] = errText
	return provision.Dispatched{Handle: "cmd-" + key, Result: &provision.Result{Error: errText,
		Output: map[string]any{"kind": run.Kind}}}, nil
}

func (s *fakeSite) Dispatch(ctx context.Context, run provision.StepRun) (provision.Dispatched, error) {
	if s.onDispatch != nil && !s.onDispatch(ctx, run) {
		return provision.Dispatched{}, ctx.Err()
	}
	return s.execute(run)
}

func (s *fakeSite) Lookup(_ context.Context, run provision.StepRun) (provision.Outcome, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := run.IdempotencyKey
	if s.lookupUnknown {
		return provision.Outcome{Status: provision.OutcomeUnknown}, nil
	}
	if s.executed[key] == 0 {
		s.fenced[key] = true
		return provision.Outcome{Status: provision.OutcomeNotDispatched}, nil
	}
	errText, done := s.done[key]
	switch {
	case !done:
		return provision.Outcome{Status: provision.OutcomeRunning, Handle: "cmd-" + key}, nil
	case errText != "":
		return provision.Outcome{Status: provision.OutcomeFailed, Handle: "cmd-" + key, Result: provision.Result{Error: errText}}, nil
	}
	return provision.Outcome{Status: provision.OutcomeSucceeded, Handle: "cmd-" + key, Result: provision.Result{Output: map[string]any{"kind": "done"}}}, nil
}

// finish ends the oldest running async key at the site and returns it.
func (s *fakeSite) finish(errText string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.running) == 0 {
		return "", false
	}
	key := s.running[0]
	s.running = s.running[1:]
	s.done[key] = errText
	return key, true
}

func (s *fakeSite) count(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.executed[key]
}

func (s *fakeSite) dispatches() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.executed {
		n += c
	}
	return n
}

// recorder writes events to the real outbox.
type recorder struct{}

func (recorder) InsertAudits(context.Context, store.Tx, []envelope.AuditEntry) error { return nil }

func (recorder) InsertEvents(ctx context.Context, tx store.Tx, evs []envelope.Event) error {
	return events.Insert(ctx, tx, nil, evs)
}

type fixture struct {
	db   *store.DB
	clk  *bctest.SimClock
	site *fakeSite
	eng  *provision.Engine
	cfg  provision.Config
	rt   *jobs.Runtime
	ctx  context.Context
}

// kinds every fixture has a runner for.
var allKinds = []string{"power.cycle", "disk.wipe", "image.write", "inventory.refresh"}

// setup opens a store with the module's tables, River's tables and an
// insert-only job client: jobs are enqueued but only tests run the engine
// (Reconcile, Sweep), so every step is deterministic. mod edits the config.
func setup(t *testing.T, profiles []provision.Profile, mod func(*provision.Config)) *fixture {
	t.Helper()
	ctx := context.Background()
	clk := bctest.NewSimClock(time.Time{})
	db := bctest.NewDB(t, clk)
	require.NoError(t, db.Migrate(ctx, events.Migrations(), provision.Migrations()))
	require.NoError(t, jobs.Migrations(ctx, db))
	rt, err := jobs.New(db, nil, nil, jobs.Config{Clock: clk})
	require.NoError(t, err)
	site := newFakeSite("disk.wipe", "image.write")
	f := &fixture{db: db, clk: clk, site: site, rt: rt, ctx: ctx}
	f.cfg = provision.Config{DB: db, Recorder: recorder{}, Enqueue: rt.InsertTx, Clock: clk, Profiles: profiles,
		Runners: map[string]provision.StepRunner{}, Lease: time.Minute, Logger: slog.New(slog.DiscardHandler)}
	for _, k := range allKinds {
		f.cfg.Runners[k] = site
	}
	if mod != nil {
		mod(&f.cfg)
	}
	f.eng, err = provision.New(f.cfg)
	require.NoError(t, err)
	return f
}

func (f *fixture) start(t *testing.T, target, profile string) provision.Workflow {
	t.Helper()
	w, err := f.eng.Start(f.ctx, provision.StartParams{TenantID: "tnt_test", TargetID: target, Profile: profile,
		Input: map[string]any{"image": "debian"}, CreatedBy: "test"})
	require.NoError(t, err)
	return w
}

// reconcile runs the advance job's work until the workflow stops changing:
// each run dispatches at most once, and the jobs it enqueues for the rest
// are not worked in these tests.
func (f *fixture) reconcile(t *testing.T, id string) provision.Workflow {
	t.Helper()
	prev := ""
	for range 100 {
		require.NoError(t, f.eng.Reconcile(f.ctx, id))
		w := f.get(t, id)
		sig := string(w.State)
		for _, s := range w.Steps {
			sig += fmt.Sprintf("|%s/%d/%d/%t", s.State, s.Attempt, s.Failures, s.Dispatched)
		}
		if sig == prev {
			return w
		}
		prev = sig
	}
	t.Fatalf("workflow %s never settled", id)
	return provision.Workflow{}
}

func (f *fixture) get(t *testing.T, id string) provision.Workflow {
	t.Helper()
	var w provision.Workflow
	require.NoError(t, f.db.Read(f.ctx, func(ctx context.Context, tx store.Tx) (err error) {
		w, err = provision.Get(ctx, tx, id)
		return err
	}))
	return w
}

// complete finishes the oldest running async dispatch at the site and
// reports it to the engine.
func (f *fixture) complete(t *testing.T, errText string) string {
	t.Helper()
	key, ok := f.site.finish(errText)
	require.True(t, ok, "a dispatch is running at the site")
	require.NoError(t, f.eng.Complete(f.ctx, key, provision.Result{Error: errText, Output: map[string]any{"bytes": 42}}))
	return key
}

func (f *fixture) eventTypes(t *testing.T, id string) []string {
	t.Helper()
	var out []string
	// The events table itself, not events_visible: on a shared PostgreSQL
	// server another test's open transaction holds the visibility horizon
	// back, and this workflow's events were written one transaction after
	// another, so seq is their order.
	require.NoError(t, f.db.Read(f.ctx, func(ctx context.Context, tx store.Tx) error {
		rows, err := tx.Query(ctx, `SELECT type FROM events WHERE resource_id = $1 ORDER BY seq`, id)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var typ string
			if err := rows.Scan(&typ); err != nil {
				return err
			}
			out = append(out, typ)
		}
		return rows.Err()
	}))
	return out
}

func stepStates(w provision.Workflow) []string {
	out := make([]string, len(w.Steps))
	for i, s := range w.Steps {
		out[i] = s.Name + "=" + string(s.State)
	}
	return out
}

func requireCode(t *testing.T, err error, code envelope.Code) *envelope.Error {
	t.Helper()
	var ee *envelope.Error
	require.True(t, errors.As(err, &ee), "want an envelope error, got %v", err)
	require.Equal(t, code, ee.Code, "error: %v", err)
	return ee
}
