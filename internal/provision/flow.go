package provision

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

// flow is one workflow loaded in a write transaction: its transitions are
// made in memory and written by save, with their events and wake-ups.
type flow struct {
	e        *Engine
	w        *Workflow
	now      time.Time
	wDirty   bool
	newSteps []int // indexes into w.Steps to insert
	attempts []Attempt
	ends     []Attempt
	events   []envelope.Event
	wakes    []time.Time
	kick     bool
	ended    bool
	// ctx and q read the target's facts, once, when a condition needs them.
	ctx   context.Context
	q     store.Querier
	facts map[string]any
	// factsErr is why the facts could not be read.
	factsErr error
	factsSet bool
}

// Lookup reasons: why the engine asks a runner about a key.
const (
	reasonOrphan    = "orphan"    // the claiming worker's lease ran out before it recorded the dispatch
	reasonDeadline  = "deadline"  // a dispatched step ran past its deadline
	reasonAmbiguous = "ambiguous" // Dispatch failed without saying the key did not run
)

type actionKind int

const (
	actNone actionKind = iota
	actDispatch
	actLookup
)

// action is what the engine must do outside the transaction.
type action struct {
	kind    actionKind
	reason  string
	stepID  string
	attempt int
	run     StepRun
	err     error
}

func (e *Engine) load(ctx context.Context, tx store.Tx, id string) (*flow, error) {
	w, err := workflowGet(ctx, tx, id, store.ForUpdate(tx))
	if err != nil {
		return nil, err
	}
	if w.Steps, err = stepsOf(ctx, tx, id); err != nil {
		return nil, err
	}
	return &flow{e: e, w: &w, now: e.clock.Now(), ctx: ctx, q: tx}, nil
}

// save writes what changed: new steps, steps leaving flight before steps
// entering it (the one-in-flight index sees every statement), claims,
// claim ends, the workflow, events and jobs.
func (f *flow) save(ctx context.Context, tx store.Tx) error {
	if len(f.newSteps) > 0 {
		ins := make([]WorkflowStep, 0, len(f.newSteps))
		for _, i := range f.newSteps {
			ins = append(ins, f.w.Steps[i])
		}
		if err := stepsInsert(ctx, tx, ins); err != nil {
			return err
		}
	}
	var dirty []*WorkflowStep
	for i := range f.w.Steps {
		if f.w.Steps[i].dirty {
			dirty = append(dirty, &f.w.Steps[i])
		}
	}
	slices.SortStableFunc(dirty, func(a, b *WorkflowStep) int {
		return boolInt(a.State.InFlight()) - boolInt(b.State.InFlight())
	})
	for _, s := range dirty {
		if err := stepUpdate(ctx, tx, s); err != nil {
			return fmt.Errorf("step %s: %w", s.Name, err)
		}
		s.dirty = false
	}
	for i := range f.attempts {
		if err := attemptInsert(ctx, tx, &f.attempts[i]); err != nil {
			return fmt.Errorf("claim %s: %w", f.attempts[i].IdempotencyKey, err)
		}
	}
	for i := range f.ends {
		if err := attemptUpdate(ctx, tx, &f.ends[i]); err != nil {
			return err
		}
	}
	if f.wDirty {
		f.w.UpdateTime = f.now
		if err := workflowUpdate(ctx, tx, f.w); err != nil {
			return err
		}
	}
	if len(f.events) > 0 && f.e.cfg.Recorder != nil {
		if err := f.e.cfg.Recorder.InsertEvents(ctx, tx, f.events); err != nil {
			return err
		}
	}
	if f.kick {
		if err := f.e.enqueue(ctx, tx, f.w.ID, time.Time{}); err != nil {
			return err
		}
	}
	slices.SortFunc(f.wakes, time.Time.Compare)
	for i, t := range f.wakes {
		if i > 0 && t.Equal(f.wakes[i-1]) {
			continue
		}
		if err := f.e.enqueue(ctx, tx, f.w.ID, t); err != nil {
			return err
		}
	}
	if f.ended && f.e.cfg.OnEnd != nil {
		return f.e.cfg.OnEnd(ctx, tx, *f.w)
	}
	return nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (f *flow) step(id string) *WorkflowStep {
	for i := range f.w.Steps {
		if f.w.Steps[i].ID == id {
			return &f.w.Steps[i]
		}
	}
	return nil
}

func (f *flow) inFlight() *WorkflowStep {
	for i := range f.w.Steps {
		if f.w.Steps[i].State.InFlight() {
			return &f.w.Steps[i]
		}
	}
	return nil
}

// mainStep is the profile's step of that name (not a cleanup's).
func (f *flow) mainStep(name string) *WorkflowStep {
	for i := range f.w.Steps {
		if s := &f.w.Steps[i]; s.Phase == PhaseMain && s.Name == name {
			return s
		}
	}
	return nil
}

// mainSteps names the profile's steps in order.
func (f *flow) mainSteps() []string {
	var out []string
	for _, s := range f.w.Steps {
		if s.Phase == PhaseMain {
			out = append(out, s.Name)
		}
	}
	return out
}

func (f *flow) nextPending() *WorkflowStep {
	for i := range f.w.Steps {
		if f.w.Steps[i].State == StepPending {
			return &f.w.Steps[i]
		}
	}
	return nil
}

func (f *flow) emit(typ string, data map[string]any) {
	if data == nil {
		data = map[string]any{}
	}
	data["target_id"] = f.w.TargetID
	data["profile"] = f.w.Profile
	f.events = append(f.events, envelope.Event{Type: typ, TenantID: f.w.TenantID, ResourceType: "Workflow",
		ResourceID: f.w.ID, Time: f.now, Data: data})
}

func (f *flow) stepEvent(typ string, s *WorkflowStep, extra map[string]any) {
	data := map[string]any{"step": s.Name, "index": s.Index, "kind": s.Kind, "attempt": s.Attempt, "phase": s.Phase}
	for k, v := range extra {
		data[k] = v
	}
	f.emit("workflow.step_"+typ, data)
}

func (f *flow) setWorkflow(state WorkflowState) {
	f.w.State = state
	f.wDirty = true
}

func (f *flow) touch(s *WorkflowStep) {
	s.dirty = true
	s.UpdateTime = f.now
}

// decide moves the workflow as far as it can inside the transaction and
// returns what must happen outside it. Without mayClaim (a caller's
// transaction: Complete, Signal, Cancel; or an advance job that already
// dispatched once) it claims no step that dispatches, since the dispatch
// that must follow a claim belongs to an advance job; it enqueues one.
func (f *flow) decide(mayClaim bool) action {
	for range 4*len(f.w.Steps) + 8 {
		w := f.w
		if !w.State.Active() {
			return action{}
		}
		if s := f.inFlight(); s != nil {
			// A paused workflow's deadlines do not fail it: its step's
			// result is still recorded when it comes, and Resume moves the
			// deadline on by the time spent paused.
			due := w.State != WorkflowPaused && !f.now.Before(*s.Deadline)
			switch {
			case s.State == StepAwaiting && w.CancelRequested:
				f.endAttempt(s, attemptAbandoned, "cancelled")
				f.stop(s, StepFailed, "cancelled while awaiting "+s.Kind)
				continue
			case s.State == StepAwaiting && due:
				f.fail(s, fmt.Sprintf("timed out after %s waiting for %s", s.Timeout, s.Kind), attemptFailed, true)
				continue
			case s.State == StepRunning && s.Dispatched && due:
				return f.lookup(s, reasonDeadline, nil)
			case s.State == StepRunning && !s.Dispatched && !f.now.Before(*s.LeaseUntil):
				return f.lookup(s, reasonOrphan, nil)
			}
			return action{}
		}
		if w.CancelRequested {
			f.finish(WorkflowCancelled, "", "cancelled")
			return action{}
		}
		if w.State == WorkflowPaused || (w.State == WorkflowPending && !mayClaim) {
			return action{}
		}
		if w.State == WorkflowPending {
			f.setWorkflow(WorkflowRunning)
			f.emit("workflow.started", nil)
		}
		next := f.nextPending()
		if next == nil {
			// The last step ended (also in a caller's transaction: ending
			// needs no dispatch).
			if w.FailedStep != "" {
				f.finish(WorkflowFailed, w.FailedStep, w.Reason)
			} else {
				f.finish(WorkflowSucceeded, "", "")
			}
			return action{}
		}
		if next.NotBefore != nil && f.now.Before(*next.NotBefore) {
			return action{}
		}
		if why := f.skipReason(next); why != "" {
			f.stop(next, StepSkipped, why)
			f.stepEvent("skipped", next, map[string]any{"reason": why})
			continue
		}
		if !mayClaim && !IsAwait(next.Kind) {
			// Claiming an await step dispatches nothing, so any
			// transaction may; any other claim is the advance job's,
			// which must dispatch right after it commits.
			f.kick = true
			return action{}
		}
		f.claim(next)
		if IsAwait(next.Kind) {
			return action{}
		}
		return action{kind: actDispatch, stepID: next.ID, attempt: next.Attempt, run: f.run(next)}
	}
	return action{}
}

func (f *flow) lookup(s *WorkflowStep, reason string, err error) action {
	return action{kind: actLookup, reason: reason, stepID: s.ID, attempt: s.Attempt, run: f.run(s), err: err}
}

func (f *flow) run(s *WorkflowStep) StepRun {
	r := StepRun{WorkflowID: f.w.ID, StepID: s.ID, TenantID: f.w.TenantID, TargetID: f.w.TargetID, Profile: f.w.Profile,
		Index: s.Index, Name: s.Name, Kind: s.Kind, Destructive: s.Destructive, Params: s.Params, Input: f.w.Input,
		Attempt: s.Attempt, IdempotencyKey: s.IdempotencyKey}
	if s.Deadline != nil {
		r.Deadline = *s.Deadline
	}
	return r
}

// IdempotencyKey is the key of a step's attempt.
func IdempotencyKey(workflowID string, index, attempt int) string {
	return fmt.Sprintf("%s:%d:%d", workflowID, index, attempt)
}

// claim moves a step in flight under a new attempt and key. The key and the
// claim row are written in this transaction, which commits before the
// dispatch is made.
func (f *flow) claim(s *WorkflowStep) {
	s.Attempt++
	s.IdempotencyKey = IdempotencyKey(f.w.ID, s.Index, s.Attempt)
	s.State = StepRunning
	if IsAwait(s.Kind) {
		s.State = StepAwaiting
	}
	s.Dispatched, s.Handle, s.Error, s.NotBefore = false, "", "", nil
	deadline := f.now.Add(f.e.timeout(s))
	lease := f.now.Add(f.e.cfg.Lease)
	s.Deadline, s.LeaseUntil = &deadline, &lease
	if s.StartTime == nil {
		s.StartTime = &f.now
	}
	f.touch(s)
	f.attempts = append(f.attempts, Attempt{IdempotencyKey: s.IdempotencyKey, StepID: s.ID, WorkflowID: f.w.ID,
		Attempt: s.Attempt, Destructive: s.Destructive, State: attemptClaimed, ClaimTime: f.now})
	f.stepEvent("started", s, map[string]any{"idempotency_key": s.IdempotencyKey, "destructive": s.Destructive})
	f.wakes = append(f.wakes, deadline)
	if s.State == StepRunning {
		f.wakes = append(f.wakes, lease)
	}
}

func (f *flow) endAttempt(s *WorkflowStep, state, msg string) {
	end := f.now
	f.ends = append(f.ends, Attempt{IdempotencyKey: s.IdempotencyKey, State: state, Handle: s.Handle, Error: msg, EndTime: &end})
}

// markDispatched records the runner's acknowledgement of the current key.
func (f *flow) markDispatched(s *WorkflowStep, handle string) {
	s.Dispatched, s.Handle, s.LeaseUntil = true, handle, nil
	f.touch(s)
	f.ends = append(f.ends, Attempt{IdempotencyKey: s.IdempotencyKey, State: attemptDispatched, Handle: handle})
}

// stop ends a step in a final state.
func (f *flow) stop(s *WorkflowStep, state StepState, msg string) {
	s.State, s.Error = state, msg
	s.Dispatched, s.LeaseUntil, s.NotBefore = false, nil, nil
	s.EndTime = &f.now
	f.touch(s)
}

// finishAttempt applies a step's result. A success whose output fails an
// acceptance check is a failure (retried like any other).
func (f *flow) finishAttempt(s *WorkflowStep, res Result) {
	s.Output, s.Logs = res.Output, res.Logs
	if res.Error == "" {
		res.Error = f.rejected(s)
	}
	if res.Error == "" {
		f.endAttempt(s, attemptSucceeded, "")
		f.stop(s, StepSucceeded, "")
		f.stepEvent("succeeded", s, nil)
		return
	}
	f.fail(s, res.Error, attemptFailed, true)
}

// fail ends the current attempt as a failure: it is retried after a backoff
// while the retry budget lasts, else the step fails and its on_failure
// rule applies.
func (f *flow) fail(s *WorkflowStep, msg, attemptState string, retryable bool) {
	f.endAttempt(s, attemptState, msg)
	s.Failures++
	if retryable && !f.w.CancelRequested && s.Failures <= s.Retries {
		s.State, s.Error = StepPending, msg
		s.Dispatched, s.LeaseUntil, s.Deadline = false, nil, nil
		nb := f.now.Add(backoff(s))
		s.NotBefore = &nb
		f.touch(s)
		f.stepEvent("retrying", s, map[string]any{"error": msg, "not_before": nb})
		f.wakes = append(f.wakes, nb)
		return
	}
	f.stop(s, StepFailed, msg)
	f.stepEvent("failed", s, map[string]any{"error": msg})
	f.onFailure(s)
}

// rerun puts an ended step back to run again, as a retry from a step
// does: a fresh retry budget and no result. Its attempt count goes on, so
// its next claim carries a key never used before and a site agent that
// applied the old one applies the new one too.
func (f *flow) rerun(s *WorkflowStep) {
	s.State, s.Failures, s.Error, s.Output, s.Logs = StepPending, 0, "", nil, ""
	s.Dispatched, s.Handle, s.LeaseUntil, s.Deadline, s.NotBefore = false, "", nil, nil, nil
	s.StartTime, s.EndTime = nil, nil
	f.touch(s)
}

// requeue puts a step back to be claimed again under a new key without
// spending its retry budget: the runner fenced a key that never ran.
func (f *flow) requeue(s *WorkflowStep) {
	s.State = StepPending
	s.Dispatched, s.LeaseUntil, s.Deadline, s.NotBefore = false, nil, nil, nil
	f.touch(s)
	f.stepEvent("requeued", s, nil)
	f.kick = true
}

// failUnknown fails a destructive step whose dispatch may have happened
// and whose outcome the runner cannot tell: nothing is dispatched again,
// no on_failure rule runs (a cleanup could be destructive too), and the
// workflow fails for an operator to resolve.
func (f *flow) failUnknown(s *WorkflowStep, msg string) {
	f.endAttempt(s, attemptUnknown, msg)
	msg = "unknown outcome: " + msg
	f.stop(s, StepFailed, msg)
	f.stepEvent("failed", s, map[string]any{"error": msg, "unknown_outcome": true, "idempotency_key": s.IdempotencyKey})
	f.finish(WorkflowFailed, s.Name, fmt.Sprintf("step %s: %s (idempotency key %s); check the machine before running it again", s.Name, msg, s.IdempotencyKey))
}

func (f *flow) onFailure(s *WorkflowStep) {
	if fb := f.fallbackOf(s); fb != nil {
		// The fallback runs instead of the rule; its own failure applies
		// the rule it inherited.
		f.stepEvent("fallback", s, map[string]any{"fallback": fb.Name})
		return
	}
	r, err := ParseOnFailure(s.OnFailure)
	if err != nil {
		r = OnFailureRule{Action: OnFailureFail}
	}
	reason := fmt.Sprintf("step %s failed: %s", s.Name, s.Error)
	switch {
	case r.Action == OnFailureContinue:
	case r.Action == OnFailureGoto:
		for i := range f.w.Steps {
			t := &f.w.Steps[i]
			if t.Phase == s.Phase && t.Name == r.Target {
				f.skipBetween(s.Index, t.Index)
				return
			}
		}
		f.finish(WorkflowFailed, s.Name, reason)
	case r.Action == OnFailureRun && s.Phase == PhaseMain:
		cleanup, ok := f.w.spec.Cleanups[r.Target]
		if !ok {
			f.finish(WorkflowFailed, s.Name, reason+"; cleanup profile "+r.Target+" is missing")
			return
		}
		f.skipBetween(s.Index, int(^uint(0)>>1))
		f.w.FailedStep, f.w.Reason = s.Name, reason
		f.wDirty = true
		f.appendSteps(PhaseCleanup, cleanup)
		f.emit("workflow.cleanup_started", map[string]any{"cleanup": cleanup.Name, "failed_step": s.Name})
	default:
		if f.w.FailedStep != "" {
			// A cleanup step failed: keep the failure that started it first.
			reason = f.w.Reason + "; cleanup " + reason
			f.finish(WorkflowFailed, f.w.FailedStep, reason)
			return
		}
		if c := f.w.spec.Profile.Cleanup; len(c) > 0 && s.Phase == PhaseMain {
			f.skipBetween(s.Index, int(^uint(0)>>1))
			f.w.FailedStep, f.w.Reason = s.Name, reason
			f.wDirty = true
			f.appendSteps(PhaseCleanup, Profile{Name: f.w.Profile, Steps: c})
			f.emit("workflow.cleanup_started", map[string]any{"cleanup": "cleanup", "failed_step": s.Name})
			return
		}
		f.finish(WorkflowFailed, s.Name, reason)
	}
}

// fallbackOf is the pending fallback step of s, if it has one.
func (f *flow) fallbackOf(s *WorkflowStep) *WorkflowStep {
	for i := range f.w.Steps {
		t := &f.w.Steps[i]
		if t.Phase == s.Phase && t.Index == s.Index+1 && t.FallbackFor == s.Name && t.State == StepPending {
			return t
		}
	}
	return nil
}

// skipReason says why a step whose turn came does not run: a fallback
// whose step did not fail, or a when that is false.
func (f *flow) skipReason(s *WorkflowStep) string {
	if s.FallbackFor != "" {
		for _, t := range f.w.Steps {
			if t.Phase == s.Phase && t.Index == s.Index-1 && t.Name == s.FallbackFor && t.State != StepFailed {
				return fmt.Sprintf("fallback for %s, which did not fail", s.FallbackFor)
			}
		}
	}
	if s.When == "" {
		return ""
	}
	c, err := ParseCond(s.When, RootInput, RootMachine)
	if err != nil {
		// Validated at start; a row that no longer parses runs nothing.
		return fmt.Sprintf("when %q does not parse: %v", s.When, err)
	}
	if !c.Eval(f.env(nil)) {
		return fmt.Sprintf("when %s is false", s.When)
	}
	return ""
}

// rejected is the first acceptance check the step's output fails, as an
// error message; "" when all hold.
func (f *flow) rejected(s *WorkflowStep) string {
	if len(s.Acceptance) == 0 {
		return ""
	}
	env := f.env(s.Output)
	for _, a := range s.Acceptance {
		c, err := ParseCond(a, RootOutput, RootInput, RootMachine)
		if err != nil {
			return fmt.Sprintf("acceptance %q does not parse: %v", a, err)
		}
		if !c.Eval(env) {
			if f.factsErr != nil {
				return fmt.Sprintf("acceptance %s is false (machine facts unreadable: %v)", a, f.factsErr)
			}
			return fmt.Sprintf("acceptance %s is false", a)
		}
	}
	return ""
}

// env is what conditions see: the workflow's input, the target's facts
// and, for acceptance, the step's output.
func (f *flow) env(output map[string]any) map[string]any {
	if !f.factsSet && f.e.cfg.Facts != nil && f.q != nil {
		f.facts, f.factsErr = f.e.cfg.Facts(f.ctx, f.q, f.w.TargetID)
		f.factsSet = true
	}
	env := map[string]any{RootInput: f.w.Input, RootMachine: f.facts}
	if output != nil {
		env[RootOutput] = output
	}
	return env
}

// skipBetween skips the pending steps strictly between two indexes.
func (f *flow) skipBetween(from, to int) {
	for i := range f.w.Steps {
		t := &f.w.Steps[i]
		if t.State == StepPending && t.Index > from && t.Index < to {
			f.stop(t, StepSkipped, "")
		}
	}
}

// finish ends the workflow; pending steps are skipped.
func (f *flow) finish(state WorkflowState, failedStep, reason string) {
	f.skipBetween(-1, int(^uint(0)>>1))
	f.setWorkflow(state)
	f.w.PauseTime = nil
	if failedStep != "" {
		f.w.FailedStep = failedStep
	}
	f.w.Reason = reason
	f.w.CancelRequested = false
	f.w.EndTime = &f.now
	f.ended = true
	data := map[string]any{}
	if reason != "" {
		data["reason"] = reason
	}
	if f.w.FailedStep != "" && state == WorkflowFailed {
		data["failed_step"] = f.w.FailedStep
	}
	f.emit("workflow."+string(state), data)
}

// appendSteps adds a profile's steps after the workflow's last.
func (f *flow) appendSteps(phase string, p Profile) {
	next := 0
	for _, s := range f.w.Steps {
		next = max(next, s.Index+1)
	}
	for i, ps := range p.Steps {
		f.w.Steps = append(f.w.Steps, WorkflowStep{
			ID: envelope.NewID("wfs", f.now), WorkflowID: f.w.ID, Index: next + i, Phase: phase, Name: ps.Name, Kind: ps.Kind,
			Destructive: ps.Destructive, Params: ps.Params, Timeout: ps.Timeout, Retries: ps.Retries, Backoff: ps.Backoff,
			OnFailure: ps.OnFailure, When: ps.When, Acceptance: ps.Acceptance, FallbackFor: ps.FallbackFor,
			State: StepPending, UpdateTime: f.now,
		})
		f.newSteps = append(f.newSteps, len(f.w.Steps)-1)
	}
}

// backoff is the wait before retry n (n = failures so far): Backoff
// doubled per earlier failure, at most MaxBackoff.
func backoff(s *WorkflowStep) time.Duration {
	b := s.Backoff
	if b <= 0 {
		b = time.Second
	}
	for i := 1; i < s.Failures && b < MaxBackoff; i++ {
		b *= 2
	}
	return min(b, MaxBackoff)
}
