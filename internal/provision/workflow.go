package provision

import (
	"embed"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Module is the migration module name: its files are
// provision/0001_provision.sql (one per dialect).
const Module = "provision"

// Migrations returns the module's tables.
func Migrations() store.Migrations { return store.Embedded(Module, migrationsFS) }

// WorkflowState is the state of a workflow.
type WorkflowState string

// Workflow states. Pending, running and paused are active: a target has at
// most one active workflow.
const (
	WorkflowPending   WorkflowState = "pending"
	WorkflowRunning   WorkflowState = "running"
	WorkflowPaused    WorkflowState = "paused"
	WorkflowSucceeded WorkflowState = "succeeded"
	WorkflowFailed    WorkflowState = "failed"
	WorkflowCancelled WorkflowState = "cancelled"
)

// Active reports whether the workflow still holds its target.
func (s WorkflowState) Active() bool {
	return s == WorkflowPending || s == WorkflowRunning || s == WorkflowPaused
}

// StepState is the state of a workflow step.
type StepState string

// Step states. Running and awaiting are in flight: a workflow has at most
// one step in flight.
const (
	StepPending   StepState = "pending"
	StepRunning   StepState = "running"
	StepAwaiting  StepState = "awaiting"
	StepSucceeded StepState = "succeeded"
	StepFailed    StepState = "failed"
	StepSkipped   StepState = "skipped"
)

// InFlight reports whether the step is running or awaiting.
func (s StepState) InFlight() bool { return s == StepRunning || s == StepAwaiting }

// Step phases: the profile's own steps, then those of a cleanup profile a
// failure ran.
const (
	PhaseMain    = "main"
	PhaseCleanup = "cleanup"
)

// Workflow is one run of a profile against a target.
type Workflow struct {
	ID       string
	TenantID string
	// TargetID is what the workflow acts on (a machine id).
	TargetID string
	Profile  string
	State    WorkflowState
	// Input is the caller's parameters (the image to write, ...), handed
	// to every step's runner.
	Input map[string]any
	// CancelRequested: Cancel was called while a dispatched step was in
	// flight; the workflow is cancelled when that step ends.
	CancelRequested bool
	// FailedStep and Reason say why a workflow failed (also while its
	// cleanup still runs).
	FailedStep string
	Reason     string
	CreatedBy  string
	CreateTime time.Time
	UpdateTime time.Time
	EndTime    *time.Time
	// PauseTime is when a paused workflow was paused.
	PauseTime *time.Time
	// Restarts counts the retries from a step (Retry).
	Restarts int
	// Steps are the workflow's steps in order (Get fills them).
	Steps []WorkflowStep

	spec spec
}

// spec is the profile as it was when the workflow started, with the cleanup
// profiles it names.
type spec struct {
	Profile  Profile            `json:"profile"`
	Cleanups map[string]Profile `json:"cleanups,omitempty"`
}

// WorkflowStep is one step of a workflow, as a row.
type WorkflowStep struct {
	ID          string
	WorkflowID  string
	Index       int
	Phase       string
	Name        string
	Kind        string
	Destructive bool
	Params      map[string]any
	Timeout     time.Duration
	Retries     int
	Backoff     time.Duration
	OnFailure   string
	// When, Acceptance and FallbackFor are the step's conditions and
	// fallback (Step); a skipped step's Error says why it was skipped.
	When        string
	Acceptance  []string
	FallbackFor string
	State       StepState
	// Attempt counts claims; each has its own idempotency key.
	Attempt int
	// Failures counts the failures the retry budget is spent on.
	Failures       int
	IdempotencyKey string
	// Dispatched: the runner acknowledged the current attempt's dispatch.
	Dispatched bool
	// Handle is the runner's id for the dispatch (a command id).
	Handle string
	// LeaseUntil: until then the worker that claimed the step owns its
	// dispatch; after it, a sweep treats the claim as orphaned.
	LeaseUntil *time.Time
	// Deadline ends the current attempt.
	Deadline *time.Time
	// NotBefore delays a retry (backoff).
	NotBefore  *time.Time
	Output     map[string]any
	Logs       string
	Error      string
	StartTime  *time.Time
	EndTime    *time.Time
	UpdateTime time.Time

	dirty bool
}

// Attempt states, as rows of provision_attempts.
const (
	attemptClaimed    = "claimed"
	attemptDispatched = "dispatched"
	attemptSucceeded  = "succeeded"
	attemptFailed     = "failed"
	attemptFenced     = "fenced"
	attemptUnknown    = "unknown"
	attemptAbandoned  = "abandoned"
)

// Attempt is one claim of a step under one idempotency key.
type Attempt struct {
	IdempotencyKey string
	StepID         string
	WorkflowID     string
	Attempt        int
	Destructive    bool
	State          string
	Handle         string
	Error          string
	ClaimTime      time.Time
	EndTime        *time.Time
}
