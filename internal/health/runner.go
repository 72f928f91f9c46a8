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
//
// A reboot of a node whose agent is not answering goes to its machine's
// BMC instead, when the node is a deployed machine's (MachineOf) and a BMC
// runner is wired: a power cycle that boots the disk, keyed on the same
// step.
type NodeCommands struct {
	DB       *store.DB
	Signer   fleet.CommandSigner
	Notifier fleet.CommandNotifier
	// BMC runs power.cycle steps against a machine (the machine
	// lifecycle's runner); MachineOf names the machine a node was deployed
	// on ("" for none). Both nil: reboots go to the node only.
	BMC       provision.StepRunner
	MachineOf func(ctx context.Context, q store.Querier, nodeID string) (string, error)
}

// KindPowerCycle is the machine lifecycle's BMC power cycle step kind.
const KindPowerCycle = "power.cycle"

// viaBMC returns the run to hand the BMC runner instead of the node: a
// reboot of a node that is not ready (any readiness for a lookup: the node
// may be back by then), deployed on a machine, with no command under the
// step's key.
func (r *NodeCommands) viaBMC(ctx context.Context, run provision.StepRun, lookup bool) (provision.StepRun, bool, error) {
	if run.Kind != KindNodeReboot || r.BMC == nil || r.MachineOf == nil {
		return run, false, nil
	}
	var machineID string
	ready := true
	err := r.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		if _, err := fleet.CommandByKey(ctx, tx, run.TargetID, StepKeyPrefix+run.IdempotencyKey); err == nil {
			return nil // already with the node: it stays there
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		n, err := fleet.NodeGet(ctx, tx, "", run.TargetID)
		if err != nil {
			return err
		}
		ready = n.Liveness == fleet.LivenessReady
		if ready && !lookup {
			return nil
		}
		machineID, err = r.MachineOf(ctx, tx, run.TargetID)
		return err
	})
	if err != nil || machineID == "" {
		return run, false, err
	}
	bmc := run
	bmc.TargetID, bmc.Kind, bmc.Params = machineID, KindPowerCycle, map[string]any{"boot": "disk"}
	return bmc, true, nil
}

var _ provision.StepRunner = (*NodeCommands)(nil)

// Dispatch queues the step's command on the node, once per key (or hands
// a reboot of an unresponsive machine's node to its BMC).
func (r *NodeCommands) Dispatch(ctx context.Context, run provision.StepRun) (provision.Dispatched, error) {
	if bmc, ok, err := r.viaBMC(ctx, run, false); err != nil {
		return provision.Dispatched{}, err
	} else if ok {
		return r.BMC.Dispatch(ctx, bmc)
	}
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
	if bmc, ok, err := r.viaBMC(ctx, run, true); err != nil {
		return provision.Outcome{}, err
	} else if ok {
		return r.BMC.Lookup(ctx, bmc)
	}
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
