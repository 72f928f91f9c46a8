package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/store"
)

// StepKeyPrefix marks a fleet command that carries a workflow step: its
// idempotency key is the step's, prefixed, and the app completes the step
// when the command ends (the same prefix the ramdisk steps use).
const StepKeyPrefix = "step:"

// fenceCode marks the canceled command a Lookup leaves under a key that was
// never dispatched, so a later delivery of it is refused.
const fenceCode = "NEVER_DISPATCHED"

// NodeCommands runs remediation steps (gpu.reset, node.reboot) as signed
// fleet commands on the workflow's target node; the step completes when
// the node reports the command ended.
type NodeCommands struct {
	DB       *store.DB
	Signer   fleet.CommandSigner
	Notifier fleet.CommandNotifier
}

var _ provision.StepRunner = (*NodeCommands)(nil)

// Dispatch queues the step's command on the node, once per key.
func (r *NodeCommands) Dispatch(ctx context.Context, run provision.StepRun) (provision.Dispatched, error) {
	var cmd fleet.Command
	err := r.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		n, err := fleet.NodeGet(ctx, tx, "", run.TargetID)
		if errors.Is(err, store.ErrNotFound) || (err == nil && n.State == fleet.NodeRetired) {
			return fmt.Errorf("%w: node %s is gone", provision.ErrNotDispatched, run.TargetID)
		}
		if err != nil {
			return err
		}
		params := map[string]any{}
		if gpu, _ := run.Input["gpu"].(string); gpu != "" {
			params["gpu"] = gpu
		}
		if id, _ := run.Input["remediation_id"].(string); id != "" {
			params["reason"] = "remediation " + id
		}
		b, err := json.Marshal(params)
		if err != nil {
			return fmt.Errorf("%w: %w", provision.ErrNotDispatched, err)
		}
		now := r.DB.Clock().Now()
		deadline := run.Deadline
		if deadline.IsZero() {
			deadline = now.Add(time.Hour)
		}
		c, inserted, err := fleet.CommandInsert(ctx, tx, &fleet.CommandInsertParams{
			ID: envelope.NewID(fleet.CommandIDPrefix, now), TenantID: n.TenantID, NodeID: n.ID, Kind: run.Kind, Params: string(b),
			IdempotencyKey: StepKeyPrefix + run.IdempotencyKey, CreatedBy: "system:health", Deadline: deadline, CreateTime: now,
			Signer: r.Signer,
		})
		if err != nil {
			return err
		}
		cmd = c
		if c.State == fleet.CommandCanceled && c.FailureCode == fenceCode {
			return fmt.Errorf("%w: key %s is fenced", provision.ErrNotDispatched, run.IdempotencyKey)
		}
		if inserted && r.Notifier != nil {
			r.Notifier.NotifyCommand(tx, n.ID)
		}
		return nil
	})
	if err != nil {
		return provision.Dispatched{}, err
	}
	return provision.Dispatched{Handle: cmd.ID}, nil
}

// Lookup answers from the command row; a key never dispatched is fenced
// with a canceled command under it.
func (r *NodeCommands) Lookup(ctx context.Context, run provision.StepRun) (provision.Outcome, error) {
	var out provision.Outcome
	err := r.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		key := StepKeyPrefix + run.IdempotencyKey
		c, err := fleet.CommandByKey(ctx, tx, run.TargetID, key)
		if errors.Is(err, store.ErrNotFound) {
			now := r.DB.Clock().Now()
			n, err := fleet.NodeGet(ctx, tx, "", run.TargetID)
			if errors.Is(err, store.ErrNotFound) {
				out = provision.Outcome{Status: provision.OutcomeNotDispatched}
				return nil
			}
			if err != nil {
				return err
			}
			c, _, err = fleet.CommandInsert(ctx, tx, &fleet.CommandInsertParams{
				ID: envelope.NewID(fleet.CommandIDPrefix, now), TenantID: n.TenantID, NodeID: n.ID, Kind: run.Kind,
				IdempotencyKey: key, CreatedBy: "system:health", Deadline: now, CreateTime: now, Signer: r.Signer,
			})
			if err != nil {
				return err
			}
			if _, err := fleet.CommandUpdate(ctx, tx, &fleet.CommandUpdateParams{ID: c.ID, FromState: c.State, State: fleet.CommandCanceled,
				Message: "fenced: the step's dispatch was never recorded", FailureCode: fenceCode}); err != nil {
				return err
			}
			out = provision.Outcome{Status: provision.OutcomeNotDispatched}
			return nil
		}
		if err != nil {
			return err
		}
		if c.State == fleet.CommandCanceled && c.FailureCode == fenceCode {
			out = provision.Outcome{Status: provision.OutcomeNotDispatched}
			return nil
		}
		out = Outcome(c)
		return nil
	})
	return out, err
}

// Outcome is what a step's command row says of the step.
func Outcome(c fleet.Command) provision.Outcome {
	out := provision.Outcome{Handle: c.ID}
	var result map[string]any
	if c.Result != "" {
		_ = json.Unmarshal([]byte(c.Result), &result)
	}
	switch c.State {
	case fleet.CommandSucceeded:
		out.Status, out.Result = provision.OutcomeSucceeded, provision.Result{Output: result}
	case fleet.CommandFailed, fleet.CommandCanceled, fleet.CommandExpired:
		parts := []string{c.Kind + " " + c.State}
		for _, p := range []string{c.FailureCode, c.Message} {
			if p != "" {
				parts = append(parts, p)
			}
		}
		out.Status = provision.OutcomeFailed
		out.Result = provision.Result{Error: strings.Join(parts, ": "), Output: result}
	default:
		out.Status = provision.OutcomeRunning
	}
	return out
}
