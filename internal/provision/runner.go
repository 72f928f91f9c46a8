package provision

import (
	"context"
	"errors"
	"time"
)

// StepRun is one claimed attempt of a step, as a runner sees it.
type StepRun struct {
	WorkflowID string
	StepID     string
	TenantID   string
	TargetID   string
	Profile    string
	Index      int
	Name       string
	Kind       string
	// Destructive: the runner must apply IdempotencyKey at most once.
	Destructive bool
	// Params are the step's own; Input is the workflow's.
	Params map[string]any
	Input  map[string]any
	// Attempt numbers the claims of this step from 1.
	Attempt int
	// IdempotencyKey is "<workflow id>:<step index>:<attempt>", committed
	// before Dispatch is called. A runner keys everything it sends on it
	// (the site agent's command idempotency), so a repeated delivery of the
	// same key is applied once.
	IdempotencyKey string
	// Deadline ends the attempt.
	Deadline time.Time
}

// Result is how a dispatched step ended: Error empty means it succeeded.
type Result struct {
	Error  string
	Output map[string]any
	// Logs are the last lines the step left (shown with a failure).
	Logs string
}

// Dispatched is what a runner's Dispatch returns.
type Dispatched struct {
	// Handle is the runner's id for the dispatch (a command id), kept on
	// the step.
	Handle string
	// Result, when set, means the step already finished; otherwise its
	// result arrives later through Engine.Complete.
	Result *Result
}

// OutcomeStatus is what a runner knows about an idempotency key.
type OutcomeStatus string

// Outcome statuses.
const (
	// OutcomeUnknown: the runner cannot tell. A destructive step fails with
	// an unknown outcome; nothing is dispatched again.
	OutcomeUnknown OutcomeStatus = "unknown"
	// OutcomeNotDispatched: the key never ran, and the runner has fenced it
	// so that it never will (a late delivery of it is refused). Only then
	// does the engine claim the step again, under a new key.
	OutcomeNotDispatched OutcomeStatus = "not_dispatched"
	// OutcomeRunning: the key was dispatched and has not finished.
	OutcomeRunning OutcomeStatus = "running"
	// OutcomeSucceeded and OutcomeFailed: it finished; Result says how.
	OutcomeSucceeded OutcomeStatus = "succeeded"
	OutcomeFailed    OutcomeStatus = "failed"
)

// Outcome is a runner's answer to Lookup.
type Outcome struct {
	Status OutcomeStatus
	Handle string
	Result Result
}

// ErrNotDispatched is what Dispatch wraps when it is certain the key did
// not run and will not (the site refused it, the key was fenced): the
// attempt fails as an ordinary failure. Any other Dispatch error leaves the
// dispatch in doubt, and the engine asks Lookup before doing anything else.
var ErrNotDispatched = errors.New("not dispatched")

// StepRunner carries out the steps of its kinds. The caller registers one
// per kind (Config.Runners); "await." kinds need none.
type StepRunner interface {
	// Dispatch starts run once for run.IdempotencyKey and returns when the
	// work is handed off (or done). It must be idempotent per key: the
	// engine never calls it twice for a key on its own, but a runner that
	// forwards over an at-least-once channel must dedupe there.
	Dispatch(ctx context.Context, run StepRun) (Dispatched, error)
	// Lookup answers "what happened to run.IdempotencyKey?" after a worker
	// died with the dispatch in doubt, or a step ran past its deadline.
	// Answering OutcomeNotDispatched is a promise: the key is fenced.
	Lookup(ctx context.Context, run StepRun) (Outcome, error)
}
