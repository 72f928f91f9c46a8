package provision

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

// activeIndex is the partial unique index that holds one active workflow
// per target.
const activeIndex = "provision_workflows_active"

const workflowColumns = `id, tenant_id, target_id, profile, spec, input, state, cancel_requested, failed_step, reason,
	created_by, create_time, update_time, end_time, pause_time, restarts`

func scanWorkflow(r store.Row) (Workflow, error) {
	var (
		w           Workflow
		spec, input string
		state       string
	)
	err := r.Scan(&w.ID, &w.TenantID, &w.TargetID, &w.Profile, &spec, &input, &state, &w.CancelRequested, &w.FailedStep, &w.Reason,
		&w.CreatedBy, &w.CreateTime, &w.UpdateTime, &w.EndTime, &w.PauseTime, &w.Restarts)
	if err != nil {
		return Workflow{}, err
	}
	w.State = WorkflowState(state)
	w.CreateTime, w.UpdateTime, w.EndTime, w.PauseTime = w.CreateTime.UTC(), w.UpdateTime.UTC(), utc(w.EndTime), utc(w.PauseTime)
	if err := json.Unmarshal([]byte(spec), &w.spec); err != nil {
		return Workflow{}, fmt.Errorf("workflow %s: spec: %w", w.ID, err)
	}
	if err := json.Unmarshal([]byte(input), &w.Input); err != nil {
		return Workflow{}, fmt.Errorf("workflow %s: input: %w", w.ID, err)
	}
	return w, nil
}

// workflowInsert writes a new workflow row. A second active workflow on the
// target fails with store.ErrUnique on activeIndex.
func workflowInsert(ctx context.Context, tx store.Tx, w *Workflow) error {
	spec, err := json.Marshal(w.spec)
	if err != nil {
		return err
	}
	input, err := jsonObject(w.Input)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO provision_workflows (`+workflowColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)`,
		w.ID, w.TenantID, w.TargetID, w.Profile, string(spec), input, string(w.State), w.CancelRequested, w.FailedStep, w.Reason,
		w.CreatedBy, w.CreateTime, w.UpdateTime, w.EndTime, w.PauseTime, w.Restarts)
	return err
}

// workflowUpdate writes a workflow's mutable columns. A retry that makes
// an ended workflow active on a target that has another active one fails
// with store.ErrUnique on activeIndex.
func workflowUpdate(ctx context.Context, tx store.Tx, w *Workflow) error {
	_, err := tx.Exec(ctx, `UPDATE provision_workflows SET state = $2, cancel_requested = $3, failed_step = $4, reason = $5,
		update_time = $6, end_time = $7, pause_time = $8, restarts = $9 WHERE id = $1`,
		w.ID, string(w.State), w.CancelRequested, w.FailedStep, w.Reason, w.UpdateTime, w.EndTime, w.PauseTime, w.Restarts)
	return err
}

// workflowGet reads one workflow; forUpdate locks its row (PostgreSQL),
// which every transaction that changes a workflow or its steps takes first.
func workflowGet(ctx context.Context, tx store.Querier, id string, lock string) (Workflow, error) {
	return scanWorkflow(tx.QueryRow(ctx, `SELECT `+workflowColumns+` FROM provision_workflows WHERE id = $1`+lock, id))
}

// workflowActive reads the active workflow of a target.
func workflowActive(ctx context.Context, q store.Querier, targetID string, lock string) (Workflow, error) {
	return scanWorkflow(q.QueryRow(ctx, `SELECT `+workflowColumns+` FROM provision_workflows
		WHERE target_id = $1 AND state IN ('pending', 'running', 'paused')`+lock, targetID))
}

// ListParams filters List. Empty fields match everything; After is the id
// the page continues after.
type ListParams struct {
	TenantID string
	TargetID string
	State    WorkflowState
	After    string
	Limit    int
}

// List returns workflows in id (creation) order, without their steps.
func List(ctx context.Context, q store.Querier, p ListParams) ([]Workflow, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = 100
	}
	rows, err := q.Query(ctx, `SELECT `+workflowColumns+` FROM provision_workflows
		WHERE ($1 = '' OR tenant_id = $1) AND ($2 = '' OR target_id = $2) AND ($3 = '' OR state = $3) AND id > $4
		ORDER BY id LIMIT $5`, p.TenantID, p.TargetID, string(p.State), p.After, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Workflow
	for rows.Next() {
		w, err := scanWorkflow(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	return out, rows.Err()
}

// workflowsDue lists active workflows that have something to do now: not
// started, cancel requested, an in-flight step past its deadline (unless
// paused) or past its claim lease, or no step in flight and none waiting out a backoff.
func workflowsDue(ctx context.Context, q store.Querier, limit int) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT w.id FROM provision_workflows w
		WHERE w.state IN ('pending', 'running', 'paused') AND (
			w.state = 'pending' OR w.cancel_requested
			OR EXISTS (SELECT 1 FROM provision_steps s WHERE s.workflow_id = w.id AND (
				(w.state <> 'paused' AND s.state IN ('running', 'awaiting') AND s.deadline <= compute_now())
				OR (s.state = 'running' AND NOT s.dispatched AND s.lease_until <= compute_now())))
			OR (w.state = 'running'
				AND NOT EXISTS (SELECT 1 FROM provision_steps s WHERE s.workflow_id = w.id AND s.state IN ('running', 'awaiting'))
				AND NOT EXISTS (SELECT 1 FROM provision_steps s WHERE s.workflow_id = w.id AND s.state = 'pending' AND s.not_before > compute_now())))
		ORDER BY w.id LIMIT $1`, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

const stepColumns = `id, workflow_id, idx, phase, name, kind, destructive, params, timeout_ms, retries, backoff_ms, on_failure,
	rules, state, attempt, failures, idempotency_key, dispatched, handle, lease_until, deadline, not_before, output, logs, error,
	start_time, end_time, update_time`

// stepsOf reads a workflow's steps in order.
func stepsOf(ctx context.Context, q store.Querier, workflowID string) ([]WorkflowStep, error) {
	rows, err := q.Query(ctx, `SELECT `+stepColumns+` FROM provision_steps WHERE workflow_id = $1 ORDER BY idx`, workflowID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []WorkflowStep
	for rows.Next() {
		var (
			s                 WorkflowStep
			params, output    string
			rules             string
			state             string
			timeoutMS, backMS int64
		)
		if err := rows.Scan(&s.ID, &s.WorkflowID, &s.Index, &s.Phase, &s.Name, &s.Kind, &s.Destructive, &params, &timeoutMS,
			&s.Retries, &backMS, &s.OnFailure, &rules, &state, &s.Attempt, &s.Failures, &s.IdempotencyKey, &s.Dispatched, &s.Handle,
			&s.LeaseUntil, &s.Deadline, &s.NotBefore, &output, &s.Logs, &s.Error, &s.StartTime, &s.EndTime, &s.UpdateTime); err != nil {
			return nil, err
		}
		s.State = StepState(state)
		s.LeaseUntil, s.Deadline, s.NotBefore = utc(s.LeaseUntil), utc(s.Deadline), utc(s.NotBefore)
		s.StartTime, s.EndTime, s.UpdateTime = utc(s.StartTime), utc(s.EndTime), s.UpdateTime.UTC()
		s.Timeout = time.Duration(timeoutMS) * time.Millisecond
		s.Backoff = time.Duration(backMS) * time.Millisecond
		if err := json.Unmarshal([]byte(params), &s.Params); err != nil {
			return nil, fmt.Errorf("step %s: params: %w", s.ID, err)
		}
		if err := json.Unmarshal([]byte(output), &s.Output); err != nil {
			return nil, fmt.Errorf("step %s: output: %w", s.ID, err)
		}
		var r stepRules
		if err := json.Unmarshal([]byte(rules), &r); err != nil {
			return nil, fmt.Errorf("step %s: rules: %w", s.ID, err)
		}
		s.When, s.Acceptance, s.FallbackFor = r.When, r.Acceptance, r.FallbackFor
		out = append(out, s)
	}
	return out, rows.Err()
}

// stepsInsert writes new steps in one statement.
func stepsInsert(ctx context.Context, tx store.Tx, steps []WorkflowStep) error {
	rows := make([][]any, 0, len(steps))
	for _, s := range steps {
		params, err := jsonObject(s.Params)
		if err != nil {
			return err
		}
		rules, err := json.Marshal(stepRules{When: s.When, Acceptance: s.Acceptance, FallbackFor: s.FallbackFor})
		if err != nil {
			return err
		}
		rows = append(rows, []any{s.ID, s.WorkflowID, s.Index, s.Phase, s.Name, s.Kind, s.Destructive, params,
			s.Timeout.Milliseconds(), s.Retries, s.Backoff.Milliseconds(), s.OnFailure, string(rules), string(s.State), s.UpdateTime})
	}
	return store.InsertRows(ctx, tx, `INSERT INTO provision_steps (id, workflow_id, idx, phase, name, kind, destructive, params,
		timeout_ms, retries, backoff_ms, on_failure, rules, state, update_time)`, "", rows)
}

// stepRules is a step's rules column: its conditions and fallback.
type stepRules struct {
	When        string   `json:"when,omitempty"`
	Acceptance  []string `json:"acceptance,omitempty"`
	FallbackFor string   `json:"fallback_for,omitempty"`
}

// stepUpdate writes a step's mutable columns.
func stepUpdate(ctx context.Context, tx store.Tx, s *WorkflowStep) error {
	output, err := jsonObject(s.Output)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE provision_steps SET state = $2, attempt = $3, failures = $4, idempotency_key = $5,
		dispatched = $6, handle = $7, lease_until = $8, deadline = $9, not_before = $10, output = $11, logs = $12, error = $13,
		start_time = $14, end_time = $15, update_time = $16 WHERE id = $1`,
		s.ID, string(s.State), s.Attempt, s.Failures, s.IdempotencyKey, s.Dispatched, s.Handle, s.LeaseUntil, s.Deadline,
		s.NotBefore, output, s.Logs, s.Error, s.StartTime, s.EndTime, s.UpdateTime)
	return err
}

const attemptColumns = `idempotency_key, step_id, workflow_id, attempt, destructive, state, handle, error, claim_time, end_time`

func scanAttempt(r store.Row) (Attempt, error) {
	var a Attempt
	err := r.Scan(&a.IdempotencyKey, &a.StepID, &a.WorkflowID, &a.Attempt, &a.Destructive, &a.State, &a.Handle, &a.Error,
		&a.ClaimTime, &a.EndTime)
	a.ClaimTime, a.EndTime = a.ClaimTime.UTC(), utc(a.EndTime)
	return a, err
}

// utc keeps times in UTC whichever store read them (pgx reads local time).
func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// attemptInsert records a claim; a key claimed before fails with
// store.ErrUnique.
func attemptInsert(ctx context.Context, tx store.Tx, a *Attempt) error {
	_, err := tx.Exec(ctx, `INSERT INTO provision_attempts (`+attemptColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
		a.IdempotencyKey, a.StepID, a.WorkflowID, a.Attempt, a.Destructive, a.State, a.Handle, a.Error, a.ClaimTime, a.EndTime)
	return err
}

// attemptUpdate writes what became of a claim.
func attemptUpdate(ctx context.Context, tx store.Tx, a *Attempt) error {
	_, err := tx.Exec(ctx, `UPDATE provision_attempts SET state = $2, handle = $3, error = $4, end_time = $5 WHERE idempotency_key = $1`,
		a.IdempotencyKey, a.State, a.Handle, a.Error, a.EndTime)
	return err
}

// attemptGet reads one claim by its key.
func attemptGet(ctx context.Context, q store.Querier, key string) (Attempt, error) {
	return scanAttempt(q.QueryRow(ctx, `SELECT `+attemptColumns+` FROM provision_attempts WHERE idempotency_key = $1`, key))
}

// Attempts lists a workflow's claims in claim order.
func Attempts(ctx context.Context, q store.Querier, workflowID string) ([]Attempt, error) {
	rows, err := q.Query(ctx, `SELECT `+attemptColumns+` FROM provision_attempts WHERE workflow_id = $1 ORDER BY claim_time, step_id, attempt`, workflowID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Attempt
	for rows.Next() {
		a, err := scanAttempt(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

func jsonObject(m map[string]any) (string, error) {
	if m == nil {
		return "{}", nil
	}
	b, err := json.Marshal(m)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// isActiveConflict reports whether err is the one-active-workflow index
// refusing an insert.
func isActiveConflict(err error) bool {
	if !errors.Is(err, store.ErrUnique) {
		return false
	}
	c := store.ConstraintOf(err)
	// SQLite names the columns of a failed UNIQUE ("provision_workflows.target_id").
	return c == activeIndex || c == "provision_workflows.target_id"
}
