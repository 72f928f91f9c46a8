package provision

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/riverqueue/river"

	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

// ErrTargetBusy is wrapped by the FAILED_PRECONDITION error Start returns
// when the target already has an active workflow.
var ErrTargetBusy = errors.New("target has an active workflow")

// Config wires an Engine.
type Config struct {
	DB *store.DB
	// Recorder writes the workflow events to the outbox.
	Recorder envelope.Recorder
	// Enqueue inserts a River job in the caller's transaction
	// (jobs.Runtime.InsertTx); it may be set after New, before work starts.
	Enqueue func(ctx context.Context, tx store.Tx, args river.JobArgs, opts *river.InsertOpts) error
	// Clock drives deadlines, leases and backoff; default DB.Clock().
	Clock  clock.Clock
	Logger *slog.Logger
	// Profiles are the profiles workflows may run (ValidateProfiles).
	Profiles []Profile
	// Runners carry out the steps, by kind. Every kind the profiles use
	// needs one, except "await." kinds.
	Runners map[string]StepRunner
	// DefaultTimeout bounds a step attempt whose profile gives none;
	// default 30 minutes.
	DefaultTimeout time.Duration
	// Lease is how long a worker that claimed a step owns its dispatch
	// before a sweep treats the claim as orphaned; default 2 minutes. A
	// Dispatch call is cut off at half of it.
	Lease time.Duration
	// SweepInterval is how often the periodic sweep looks for due
	// workflows; default 15 s.
	SweepInterval time.Duration
	// OnEnd, when set, runs in the transaction that ends a workflow
	// (succeeded, failed, cancelled), so the caller's own state (the
	// machine's) changes atomically with it.
	OnEnd func(ctx context.Context, tx store.Tx, w Workflow) error
	// Facts returns what a step's when and acceptance conditions see of a
	// target as "machine" (its driver, hardware profile, ...); nil, or a
	// target it does not know (nil map), leaves machine empty.
	Facts func(ctx context.Context, q store.Querier, targetID string) (map[string]any, error)
}

// Engine runs workflows.
type Engine struct {
	cfg      Config
	clock    clock.Clock
	log      *slog.Logger
	profiles map[string]Profile
}

// New validates the config and the profiles.
func New(cfg Config) (*Engine, error) {
	if cfg.DB == nil {
		return nil, errors.New("provision: DB is required")
	}
	if err := ValidateProfiles(cfg.Profiles); err != nil {
		return nil, fmt.Errorf("provision: profiles: %w", err)
	}
	cfg.Clock = cmp.Or[clock.Clock](cfg.Clock, cfg.DB.Clock())
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	cfg.DefaultTimeout = cmp.Or(cfg.DefaultTimeout, 30*time.Minute)
	cfg.Lease = cmp.Or(cfg.Lease, 2*time.Minute)
	cfg.SweepInterval = cmp.Or(cfg.SweepInterval, 15*time.Second)
	if cfg.DefaultTimeout < 0 || cfg.Lease < 0 || cfg.SweepInterval < 0 {
		return nil, errors.New("provision: durations must not be negative")
	}
	e := &Engine{cfg: cfg, clock: cfg.Clock, log: cfg.Logger, profiles: map[string]Profile{}}
	for _, p := range cfg.Profiles {
		if err := e.CheckKinds(p); err != nil {
			return nil, fmt.Errorf("provision: profile %s: %w", p.Name, err)
		}
		e.profiles[p.Name] = p
	}
	return e, nil
}

// CheckKinds reports, as INVALID_ARGUMENT naming the field, every step of
// p whose kind has no runner on this engine.
func (e *Engine) CheckKinds(p Profile) error {
	var vs envelope.Violations
	check := func(list string, steps []Step) {
		for i, s := range steps {
			if s.Kind != "" && !IsAwait(s.Kind) && e.cfg.Runners[s.Kind] == nil {
				vs.Add(fmt.Sprintf("%s[%d].kind", list, i), "step %s: no runner for kind %q (kinds: %v)", s.Name, truncate(s.Kind), e.Kinds())
			}
		}
	}
	check("steps", p.Steps)
	check("cleanup", p.Cleanup)
	return vs.Err()
}

// Kinds lists the step kinds this engine runs, await kinds included.
func (e *Engine) Kinds() []string {
	out := []string{KindAwaitRejoin}
	for k := range e.cfg.Runners {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Profiles lists the engine's profiles by name.
func (e *Engine) Profiles() []Profile {
	out := make([]Profile, 0, len(e.profiles))
	for _, n := range e.profileNames() {
		out = append(out, e.profiles[n])
	}
	return out
}

// SetEnqueue sets the job inserter when the job runtime is built after the
// engine (its workers come from AddWorkers).
func (e *Engine) SetEnqueue(fn func(ctx context.Context, tx store.Tx, args river.JobArgs, opts *river.InsertOpts) error) {
	e.cfg.Enqueue = fn
}

// Profile returns a profile by name.
func (e *Engine) Profile(name string) (Profile, bool) {
	p, ok := e.profiles[name]
	return p, ok
}

func (e *Engine) timeout(s *WorkflowStep) time.Duration {
	if s.Timeout > 0 {
		return s.Timeout
	}
	return e.cfg.DefaultTimeout
}

// StartParams starts a workflow.
type StartParams struct {
	TenantID string
	// TargetID is what the workflow acts on (a machine id); it may have
	// one active workflow.
	TargetID string
	Profile  string
	// Custom, when its Name is set, is the profile to run instead of one
	// of the engine's (a tenant's deploy profile, already validated and
	// checked by CheckKinds); its cleanup profiles ("run <profile>") must
	// be the engine's.
	Custom Profile
	// Input goes to every step's runner (the image to deploy, ...).
	Input     map[string]any
	CreatedBy string
}

// Start starts a workflow in its own transaction.
func (e *Engine) Start(ctx context.Context, p StartParams) (w Workflow, err error) {
	err = e.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		w, err = e.StartTx(ctx, tx, p)
		return err
	})
	return w, err
}

// StartTx starts a workflow in the caller's transaction: the workflow and
// its steps as rows, a workflow.created event and the job that advances
// it. A bad request is INVALID_ARGUMENT; a target that already has an
// active workflow is FAILED_PRECONDITION (wrapping ErrTargetBusy), and
// nothing is written — the caller must roll back on any error.
func (e *Engine) StartTx(ctx context.Context, tx store.Tx, p StartParams) (Workflow, error) {
	var vs envelope.Violations
	if p.TenantID == "" {
		vs.Add("tenant_id", "is required")
	}
	if p.TargetID == "" {
		vs.Add("target_id", "is required")
	}
	vs.MaxLen("tenant_id", p.TenantID, 100)
	vs.MaxLen("target_id", p.TargetID, 200)
	vs.MaxLen("created_by", p.CreatedBy, 200)
	prof, ok := e.profiles[p.Profile]
	if p.Custom.Name != "" {
		prof, ok = p.Custom, true
		if err := prof.Validate(); err != nil {
			return Workflow{}, err
		}
		if err := e.CheckKinds(prof); err != nil {
			return Workflow{}, err
		}
	}
	if !ok {
		vs.Add("profile", "names no profile: %q (known: %v)", truncate(p.Profile), e.profileNames())
	}
	if b, err := json.Marshal(p.Input); err != nil {
		vs.Add("input", "must encode as JSON: %v", err)
	} else if len(b) > maxParamsSize {
		vs.Add("input", "must be at most %d bytes as JSON, got %d", maxParamsSize, len(b))
	}
	if err := vs.Err(); err != nil {
		return Workflow{}, err
	}

	if cur, err := workflowActive(ctx, tx, p.TargetID, store.ForUpdate(tx)); err == nil {
		return Workflow{}, busy(p.TargetID, &cur)
	} else if !errors.Is(err, store.ErrNotFound) {
		return Workflow{}, err
	}
	now := e.clock.Now()
	w := Workflow{ID: envelope.NewID("wf", now), TenantID: p.TenantID, TargetID: p.TargetID, Profile: prof.Name,
		State: WorkflowPending, Input: p.Input, CreatedBy: p.CreatedBy, CreateTime: now, UpdateTime: now,
		spec: spec{Profile: prof}}
	for _, s := range prof.Steps {
		if r, err := ParseOnFailure(s.OnFailure); err == nil && r.Action == OnFailureRun {
			if w.spec.Cleanups == nil {
				w.spec.Cleanups = map[string]Profile{}
			}
			c, ok := e.profiles[r.Target]
			if !ok {
				return Workflow{}, envelope.Invalid(envelope.Violation{Field: "profile",
					Reason: fmt.Sprintf("step %s runs cleanup profile %q, which this engine does not have", s.Name, truncate(r.Target))})
			}
			w.spec.Cleanups[r.Target] = c
		}
	}
	if err := workflowInsert(ctx, tx, &w); err != nil {
		if isActiveConflict(err) {
			// Another start committed between our check and insert; the
			// index refused ours.
			return Workflow{}, busy(p.TargetID, nil)
		}
		return Workflow{}, err
	}
	f := &flow{e: e, w: &w, now: now, kick: true, ctx: ctx, q: tx}
	f.appendSteps(PhaseMain, prof)
	f.emit("workflow.created", map[string]any{"steps": len(prof.Steps)})
	if err := f.save(ctx, tx); err != nil {
		return Workflow{}, err
	}
	return w, nil
}

func busy(target string, cur *Workflow) error {
	msg := fmt.Sprintf("target %s already has an active workflow", target)
	if cur != nil {
		msg = fmt.Sprintf("target %s already has an active workflow: %s (profile %s, %s); cancel it or wait for it to end",
			target, cur.ID, cur.Profile, cur.State)
	}
	return &envelope.Error{Code: envelope.CodeFailedPrecondition, Message: msg, Err: ErrTargetBusy}
}

func (e *Engine) profileNames() []string {
	out := make([]string, 0, len(e.profiles))
	for n := range e.profiles {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Get reads a workflow with its steps.
func Get(ctx context.Context, q store.Querier, id string) (Workflow, error) {
	w, err := workflowGet(ctx, q, id, "")
	if errors.Is(err, store.ErrNotFound) {
		// Keep store.ErrNotFound in the chain: a handler that decides a
		// miss before answering it (so a stranger learns nothing) tells
		// it apart from a failure by errors.Is.
		nf := envelope.NotFound("workflow", id)
		nf.Err = err
		return Workflow{}, nf
	}
	if err != nil {
		return Workflow{}, err
	}
	w.Steps, err = stepsOf(ctx, q, id)
	return w, err
}

// Active reads the active workflow of a target with its steps; found is
// false when the target has none.
func Active(ctx context.Context, q store.Querier, targetID string) (w Workflow, found bool, err error) {
	w, err = workflowActive(ctx, q, targetID, "")
	if errors.Is(err, store.ErrNotFound) {
		return Workflow{}, false, nil
	}
	if err != nil {
		return Workflow{}, false, err
	}
	w.Steps, err = stepsOf(ctx, q, w.ID)
	return w, err == nil, err
}

// change runs fn on a loaded workflow in the caller's transaction and saves
// it, with a job to advance it.
func (e *Engine) change(ctx context.Context, tx store.Tx, id string, fn func(f *flow) error) (Workflow, error) {
	f, err := e.load(ctx, tx, id)
	if errors.Is(err, store.ErrNotFound) {
		return Workflow{}, envelope.NotFound("workflow", id)
	}
	if err != nil {
		return Workflow{}, err
	}
	if err := fn(f); err != nil {
		return Workflow{}, err
	}
	f.decide(false)
	f.kick = f.w.State.Active()
	if err := f.save(ctx, tx); err != nil {
		if isActiveConflict(err) {
			// A retry made a workflow active again while another start
			// committed on its target; the index refused it.
			return Workflow{}, busy(f.w.TargetID, nil)
		}
		return Workflow{}, err
	}
	return *f.w, nil
}

func (e *Engine) write(ctx context.Context, fn func(ctx context.Context, tx store.Tx) (Workflow, error)) (w Workflow, err error) {
	err = e.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		w, err = fn(ctx, tx)
		return err
	})
	return w, err
}

// Pause stops a workflow from starting its next step; a step in flight
// still finishes (or times out) and is recorded.
func (e *Engine) Pause(ctx context.Context, id string) (Workflow, error) {
	return e.write(ctx, func(ctx context.Context, tx store.Tx) (Workflow, error) { return e.PauseTx(ctx, tx, id) })
}

// PauseTx is Pause in the caller's transaction.
func (e *Engine) PauseTx(ctx context.Context, tx store.Tx, id string) (Workflow, error) {
	return e.change(ctx, tx, id, func(f *flow) error {
		switch {
		case f.w.State == WorkflowPaused:
			return nil
		case !f.w.State.Active():
			return envelope.Errorf(envelope.CodeFailedPrecondition, "workflow %s is %s: only a pending or running workflow can be paused", id, f.w.State)
		case f.w.CancelRequested:
			return envelope.Errorf(envelope.CodeFailedPrecondition, "workflow %s is being cancelled", id)
		}
		f.setWorkflow(WorkflowPaused)
		f.w.PauseTime = &f.now
		f.emit("workflow.paused", nil)
		return nil
	})
}

// Resume lets a paused workflow go on.
func (e *Engine) Resume(ctx context.Context, id string) (Workflow, error) {
	return e.write(ctx, func(ctx context.Context, tx store.Tx) (Workflow, error) { return e.ResumeTx(ctx, tx, id) })
}

// ResumeTx is Resume in the caller's transaction.
func (e *Engine) ResumeTx(ctx context.Context, tx store.Tx, id string) (Workflow, error) {
	return e.change(ctx, tx, id, func(f *flow) error {
		if f.w.State != WorkflowPaused {
			return envelope.Errorf(envelope.CodeFailedPrecondition, "workflow %s is %s, not paused", id, f.w.State)
		}
		f.unpause()
		f.emit("workflow.resumed", nil)
		return nil
	})
}

// unpause lets a paused workflow run again. The step in flight gets back
// the time the pause took from its deadline, so that an operator's pause
// never times a step out.
func (f *flow) unpause() {
	if s := f.inFlight(); s != nil && s.Deadline != nil && f.w.PauseTime != nil {
		d := s.Deadline.Add(f.now.Sub(*f.w.PauseTime))
		s.Deadline = &d
		f.touch(s)
		f.wakes = append(f.wakes, d)
	}
	f.setWorkflow(WorkflowRunning)
	f.w.PauseTime = nil
}

// Retry restarts a failed or paused workflow at a step of its profile:
// that step and the ones after it run again with a fresh retry budget and
// new idempotency keys; the steps before keep their results.
func (e *Engine) Retry(ctx context.Context, id, fromStep string) (Workflow, error) {
	return e.write(ctx, func(ctx context.Context, tx store.Tx) (Workflow, error) { return e.RetryTx(ctx, tx, id, fromStep) })
}

// RetryTx is Retry in the caller's transaction. A step the profile lacks
// is INVALID_ARGUMENT (field from_step); a workflow that succeeded, was
// cancelled, runs unpaused, has a step in flight, or (failed) whose target
// has another active workflow is FAILED_PRECONDITION. Nothing is written
// on an error.
func (e *Engine) RetryTx(ctx context.Context, tx store.Tx, id, fromStep string) (Workflow, error) {
	return e.change(ctx, tx, id, func(f *flow) error {
		w := f.w
		switch {
		case w.State == WorkflowSucceeded:
			return envelope.Errorf(envelope.CodeFailedPrecondition, "workflow %s succeeded: there is nothing to retry; start the operation anew", id)
		case w.State == WorkflowCancelled:
			return envelope.Errorf(envelope.CodeFailedPrecondition, "workflow %s was cancelled: start the operation anew", id)
		case w.State != WorkflowFailed && w.State != WorkflowPaused:
			return envelope.Errorf(envelope.CodeFailedPrecondition, "workflow %s is %s: pause it before retrying it from a step", id, w.State)
		case w.CancelRequested:
			return envelope.Errorf(envelope.CodeFailedPrecondition, "workflow %s is being cancelled", id)
		}
		from := f.mainStep(fromStep)
		if from == nil {
			return envelope.Invalid(envelope.Violation{Field: "from_step",
				Reason: fmt.Sprintf("names no step of profile %s: %q (steps: %v)", w.Profile, truncate(fromStep), f.mainSteps())})
		}
		for _, s := range w.Steps {
			if s.Phase == PhaseMain && s.Index < from.Index && s.State == StepPending {
				// A retry never jumps over a step that has not run (a wipe).
				return envelope.Invalid(envelope.Violation{Field: "from_step",
					Reason: fmt.Sprintf("%s comes after step %s, which has not run: retry from it or an earlier step", from.Name, s.Name)})
			}
		}
		if fs := f.mainStep(w.FailedStep); w.State == WorkflowFailed && fs != nil && from.Index > fs.Index {
			return envelope.Invalid(envelope.Violation{Field: "from_step",
				Reason: fmt.Sprintf("%s comes after the failed step %s: retry from it or an earlier step", from.Name, fs.Name)})
		}
		if s := f.inFlight(); s != nil {
			// Its dispatch is out: re-running it under a new key while the
			// old one may still apply would run it twice.
			return envelope.Errorf(envelope.CodeFailedPrecondition, "workflow %s: step %s is %s; wait for it to end (the workflow stays paused)",
				id, s.Name, s.State)
		}
		if w.State == WorkflowFailed {
			if cur, err := workflowActive(ctx, tx, w.TargetID, store.ForUpdate(tx)); err == nil {
				return busy(w.TargetID, &cur)
			} else if !errors.Is(err, store.ErrNotFound) {
				return err
			}
		}
		for i := range w.Steps {
			if s := &w.Steps[i]; s.Phase == PhaseMain && s.Index >= from.Index {
				f.rerun(s)
			}
		}
		if w.State == WorkflowPaused {
			f.unpause()
		}
		f.setWorkflow(WorkflowRunning)
		w.FailedStep, w.Reason, w.EndTime = "", "", nil
		w.Restarts++
		f.emit("workflow.retried", map[string]any{"from_step": from.Name, "restarts": w.Restarts})
		return nil
	})
}

// Cancel ends a workflow: at once when no dispatched step is in flight (an
// awaiting step is abandoned), else when that step ends — a dispatched
// power or wipe command is not taken back halfway, and the target stays
// held until it is over. Pending steps are skipped.
func (e *Engine) Cancel(ctx context.Context, id string) (Workflow, error) {
	return e.write(ctx, func(ctx context.Context, tx store.Tx) (Workflow, error) { return e.CancelTx(ctx, tx, id) })
}

// CancelTx is Cancel in the caller's transaction.
func (e *Engine) CancelTx(ctx context.Context, tx store.Tx, id string) (Workflow, error) {
	return e.change(ctx, tx, id, func(f *flow) error {
		switch {
		case !f.w.State.Active():
			return envelope.Errorf(envelope.CodeFailedPrecondition, "workflow %s already ended (%s)", id, f.w.State)
		case f.w.CancelRequested:
			return nil
		}
		f.w.CancelRequested = true
		f.wDirty = true
		f.emit("workflow.cancel_requested", nil)
		return nil
	})
}

// Complete records the result of a dispatch, by its idempotency key: the
// runner's asynchronous answer (a command finished). A result for an
// attempt that is no longer current is kept on its claim row and changes
// nothing else; an unknown key is NOT_FOUND.
func (e *Engine) Complete(ctx context.Context, key string, res Result) error {
	return e.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error { return e.CompleteTx(ctx, tx, key, res) })
}

// CompleteTx is Complete in the caller's transaction.
func (e *Engine) CompleteTx(ctx context.Context, tx store.Tx, key string, res Result) error {
	a, err := attemptGet(ctx, tx, key)
	if errors.Is(err, store.ErrNotFound) {
		return envelope.NotFound("dispatch", key)
	}
	if err != nil {
		return err
	}
	_, err = e.change(ctx, tx, a.WorkflowID, func(f *flow) error {
		s := f.step(a.StepID)
		if s != nil && s.State == StepRunning && s.IdempotencyKey == key {
			if !s.Dispatched {
				f.markDispatched(s, a.Handle)
			}
			f.finishAttempt(s, res)
			return nil
		}
		// A late result: keep it on the claim for the operator.
		if a.State != attemptSucceeded && a.State != attemptFailed {
			end := f.now
			state := attemptSucceeded
			if res.Error != "" {
				state = attemptFailed
			}
			f.ends = append(f.ends, Attempt{IdempotencyKey: key, State: state, Handle: a.Handle,
				Error: cmp.Or(res.Error, a.Error), EndTime: &end})
		}
		return nil
	})
	return err
}

// Signal delivers an outside event to the target's active workflow: the
// step of kind (an "await." kind) in flight succeeds with res, or fails
// when res.Error is set. A signal that arrives just before the workflow
// reached its await step (no step in flight, that step next) is taken
// for it. Anything else is FAILED_PRECONDITION.
func (e *Engine) Signal(ctx context.Context, targetID, kind string, res Result) (Workflow, error) {
	return e.write(ctx, func(ctx context.Context, tx store.Tx) (Workflow, error) {
		return e.SignalTx(ctx, tx, targetID, kind, res)
	})
}

// SignalTx is Signal in the caller's transaction.
func (e *Engine) SignalTx(ctx context.Context, tx store.Tx, targetID, kind string, res Result) (Workflow, error) {
	return e.SignalProvingTx(ctx, tx, targetID, kind, "", res)
}

// SignalProvingTx is SignalTx for a signal that is also proof of the step
// before the await step, when that step is of kind proves: a machine's
// ramdisk can join (its token was made for that very boot) before the
// site's report that it power-cycled the machine reaches the control
// plane. Then the running step succeeds first, its own result arriving
// later as a late one, and the await step takes the signal. A step of
// another kind in flight (a wipe) is never ended by a signal.
func (e *Engine) SignalProvingTx(ctx context.Context, tx store.Tx, targetID, kind, proves string, res Result) (Workflow, error) {
	if !IsAwait(kind) {
		return Workflow{}, envelope.Invalid(envelope.Violation{Field: "kind", Reason: fmt.Sprintf("must be an %s kind, got %q", AwaitPrefix, truncate(kind))})
	}
	cur, err := workflowActive(ctx, tx, targetID, "")
	if errors.Is(err, store.ErrNotFound) {
		return Workflow{}, envelope.Errorf(envelope.CodeFailedPrecondition, "target %s has no active workflow awaiting %s", targetID, kind)
	}
	if err != nil {
		return Workflow{}, err
	}
	return e.change(ctx, tx, cur.ID, func(f *flow) error {
		s := f.inFlight()
		if s != nil && proves != "" && s.Kind == proves && s.State == StepRunning && !f.w.CancelRequested {
			if next := f.nextPending(); next != nil && next.Kind == kind && next.Index == s.Index+1 {
				f.finishAttempt(s, Result{Output: map[string]any{"proven_by": kind}})
				s = nil
			}
		}
		if s == nil && !f.w.CancelRequested {
			// An await step that is to be skipped (its when is false, or
			// it is a fallback whose step did not fail) takes no signal.
			if next := f.nextPending(); next != nil && next.Kind == kind && f.skipReason(next) == "" {
				f.claim(next)
				s = next
			}
		}
		if s == nil || s.State != StepAwaiting || s.Kind != kind {
			what := "no step in flight"
			if s != nil {
				what = fmt.Sprintf("step %s (%s) is %s", s.Name, s.Kind, s.State)
			}
			return envelope.Errorf(envelope.CodeFailedPrecondition, "workflow %s of target %s is not awaiting %s: %s", f.w.ID, targetID, kind, what)
		}
		f.finishAttempt(s, res)
		return nil
	})
}

// Reconcile moves one workflow forward: it claims and dispatches steps,
// applies deadlines, and resolves claims left in doubt. It is what the
// advance job runs, level-triggered and safe to run twice or concurrently:
// every decision is made under the workflow's row lock, and a claim's
// dispatch belongs to the worker that claimed it until its lease ends.
//
// It makes at most one call to a runner (a dispatch, and a lookup if the
// dispatch is in doubt), so one job stays within its timeout; when more is
// left to dispatch it enqueues the next job.
func (e *Engine) Reconcile(ctx context.Context, id string) error {
	for round := 0; round < 2; round++ {
		var act action
		err := e.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			f, err := e.load(ctx, tx, id)
			if err != nil {
				return err
			}
			act = f.decide(round == 0)
			if round > 0 && act.kind != actNone {
				// A lookup is due as well: the next job does it.
				act, f.kick = action{}, true
			}
			return f.save(ctx, tx)
		})
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("provision: reconcile %s: %w", id, err)
		}
		switch act.kind {
		case actNone:
			return nil
		case actDispatch:
			err = e.dispatch(ctx, act)
		case actLookup:
			err = e.resolve(ctx, act)
		}
		if err != nil {
			return fmt.Errorf("provision: reconcile %s: %w", id, err)
		}
	}
	return nil
}

// dispatch hands a claimed step to its runner, after the claim committed.
func (e *Engine) dispatch(ctx context.Context, act action) error {
	runner := e.cfg.Runners[act.run.Kind]
	if runner == nil {
		return e.apply(ctx, act, func(f *flow, s *WorkflowStep) {
			f.fail(s, "no runner for kind "+s.Kind, attemptFailed, false)
		})
	}
	dctx, cancel := context.WithTimeout(ctx, e.cfg.Lease/2)
	d, err := runner.Dispatch(dctx, act.run)
	cancel()
	if ctx.Err() != nil {
		// This worker is going away. Whatever happened, the claim stands
		// and its lease tells the next worker when to ask about it.
		return ctx.Err()
	}
	switch {
	case err == nil:
		return e.apply(ctx, act, func(f *flow, s *WorkflowStep) {
			if !s.Dispatched {
				f.markDispatched(s, d.Handle)
			}
			if d.Result != nil {
				f.finishAttempt(s, *d.Result)
			}
		})
	case errors.Is(err, ErrNotDispatched):
		return e.apply(ctx, act, func(f *flow, s *WorkflowStep) {
			f.fail(s, err.Error(), attemptFailed, true)
		})
	}
	e.log.Warn("provision: dispatch failed with its outcome in doubt; asking the runner", "workflow", act.run.WorkflowID,
		"step", act.run.Name, "idempotency_key", act.run.IdempotencyKey, "err", err)
	act.reason, act.err = reasonAmbiguous, err
	return e.resolve(ctx, act)
}

// resolve asks the runner what became of a key in doubt and acts on the
// answer. A destructive key is never dispatched again: it is re-attached,
// or fenced by the runner and claimed anew under a new key, or failed as
// an unknown outcome.
func (e *Engine) resolve(ctx context.Context, act action) error {
	runner := e.cfg.Runners[act.run.Kind]
	out := Outcome{Status: OutcomeUnknown}
	if runner != nil {
		lctx, cancel := context.WithTimeout(ctx, e.cfg.Lease/2)
		var err error
		out, err = runner.Lookup(lctx, act.run)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			// Nothing is decided on a failed lookup; River retries the job
			// and the sweep comes back.
			return fmt.Errorf("lookup %s: %w", act.run.IdempotencyKey, err)
		}
	}
	return e.apply(ctx, act, func(f *flow, s *WorkflowStep) {
		switch act.reason {
		case reasonDeadline:
			if !s.Dispatched || f.now.Before(*s.Deadline) || f.w.State == WorkflowPaused {
				return
			}
		default:
			if s.Dispatched {
				return // the claiming worker recorded it after all
			}
		}
		timedOut := fmt.Sprintf("timed out after %s", s.Timeout)
		doubt := "the worker that dispatched it stopped before it recorded the dispatch"
		if act.err != nil {
			doubt = "dispatch failed: " + act.err.Error()
		}
		switch out.Status {
		case OutcomeSucceeded, OutcomeFailed:
			if !s.Dispatched {
				f.markDispatched(s, out.Handle)
			}
			res := out.Result
			if out.Status == OutcomeFailed && res.Error == "" {
				res.Error = "failed"
			}
			f.finishAttempt(s, res)
		case OutcomeRunning:
			if act.reason != reasonDeadline {
				f.markDispatched(s, out.Handle)
				return
			}
			if s.Destructive {
				f.failUnknown(s, timedOut+" and the runner still reports it running")
				return
			}
			f.fail(s, timedOut, attemptAbandoned, true)
		case OutcomeNotDispatched:
			switch act.reason {
			case reasonOrphan:
				f.endAttempt(s, attemptFenced, doubt)
				f.requeue(s)
			case reasonDeadline:
				f.fail(s, timedOut+": the runner never ran it", attemptFenced, true)
			default:
				f.fail(s, doubt, attemptFenced, true)
			}
		default:
			switch {
			case s.Destructive && act.reason == reasonDeadline:
				f.failUnknown(s, timedOut)
			case s.Destructive:
				f.failUnknown(s, doubt)
			case act.reason == reasonOrphan:
				// A step that destroys nothing may simply run again.
				f.endAttempt(s, attemptAbandoned, doubt)
				f.requeue(s)
			case act.reason == reasonDeadline:
				f.fail(s, timedOut, attemptAbandoned, true)
			default:
				f.fail(s, doubt, attemptAbandoned, true)
			}
		}
	})
}

// apply runs fn on the step an action was about, if it is still the same
// attempt in flight; anything else means another worker moved it on.
func (e *Engine) apply(ctx context.Context, act action, fn func(f *flow, s *WorkflowStep)) error {
	return e.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		f, err := e.load(ctx, tx, act.run.WorkflowID)
		if err != nil {
			return err
		}
		s := f.step(act.stepID)
		if s == nil || s.State != StepRunning || s.Attempt != act.attempt {
			return nil
		}
		fn(f, s)
		return f.save(ctx, tx)
	})
}
