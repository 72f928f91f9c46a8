package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/gateway"
	"github.com/better-compute/better-compute/internal/metal"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/store"
)

// The commissioning ramdisk's wiring: the gateway admits ramdisks with the
// machine lifecycle's discovery tokens, and the lifecycle's ramdisk steps
// run as fleet commands on the ramdisk node, completed when the node
// reports them done.

// discovery adapts metal's discovery tokens to the gateway's port; rt is
// set once the lifecycle is built (after the gateway).
type discovery struct{ rt *metal.Runtime }

func (d *discovery) ClaimDiscovery(ctx context.Context, tx store.Tx, token string, macs []string, csrSHA string) (gateway.DiscoveryClaim, error) {
	if d.rt == nil {
		return gateway.DiscoveryClaim{}, &gateway.DiscoveryRefusedError{Reason: "this replica runs no machine lifecycle"}
	}
	c, err := d.rt.ClaimDiscoveryTx(ctx, tx, token, macs, csrSHA)
	var r *metal.DiscoveryRefusal
	if errors.As(err, &r) {
		return gateway.DiscoveryClaim{}, &gateway.DiscoveryRefusedError{TokenID: r.TokenID, MachineID: r.MachineID, TenantID: r.TenantID, Reason: r.Reason}
	}
	if err != nil {
		return gateway.DiscoveryClaim{}, err
	}
	return gateway.DiscoveryClaim(c), nil
}

func (d *discovery) DiscoveryJoined(ctx context.Context, tx store.Tx, c gateway.DiscoveryClaim, nodeID string, publicKeyDER []byte) error {
	return d.rt.DiscoveryJoinedTx(ctx, tx, metal.DiscoveryClaim(c), nodeID, publicKeyDER)
}

// stepKeyPrefix marks a command that carries a lifecycle step: its
// idempotency key is the step's, prefixed.
const stepKeyPrefix = "step:"

// fenceCode marks the canceled command a Lookup leaves under a key that was
// never dispatched. A later Lookup of the same key (two sweeps may ask about
// one orphaned claim at once) must answer "never dispatched" again, not
// "failed": the step is claimed anew, not failed.
const fenceCode = "NEVER_DISPATCHED"

// ramdiskCommands runs ramdisk steps as fleet commands on the machine's
// ramdisk node (metal.RamdiskAgent).
type ramdiskCommands struct {
	db     *store.DB
	notify fleet.CommandNotifier
	signer fleet.CommandSigner
	rt     *metal.Runtime
}

func (r *ramdiskCommands) Dispatch(ctx context.Context, t metal.Target, nodeID string, run provision.StepRun) (provision.Dispatched, error) {
	var cmd fleet.Command
	err := r.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		n, err := fleet.NodeGet(ctx, tx, "", nodeID)
		if err != nil {
			return err
		}
		if n.State == fleet.NodeRetired {
			return fmt.Errorf("%w: ramdisk node %s is retired", provision.ErrNotDispatched, n.Name)
		}
		key := stepKeyPrefix + run.IdempotencyKey
		if c, err := fleet.CommandByKey(ctx, tx, nodeID, key); err == nil {
			// A repeated dispatch: the command is already there, and no
			// second join token is minted for it.
			if c.State == fleet.CommandCanceled {
				return fmt.Errorf("%w: key %s is fenced", provision.ErrNotDispatched, run.IdempotencyKey)
			}
			cmd = c
			return nil
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		p, err := r.rt.RamdiskStepParams(ctx, tx, run, nodeID)
		if err != nil {
			return fmt.Errorf("%w: %w", provision.ErrNotDispatched, err)
		}
		b, err := json.Marshal(p)
		if err != nil {
			return fmt.Errorf("%w: %w", provision.ErrNotDispatched, err)
		}
		params := string(b)
		now := r.db.Clock().Now()
		deadline := run.Deadline
		if deadline.IsZero() {
			deadline = now.Add(time.Hour)
		}
		c, inserted, err := fleet.CommandInsert(ctx, tx, &fleet.CommandInsertParams{
			ID: envelope.NewID(fleet.CommandIDPrefix, now), TenantID: n.TenantID, NodeID: n.ID, Kind: run.Kind, Params: params,
			IdempotencyKey: stepKeyPrefix + run.IdempotencyKey, CreatedBy: "system:metal", Deadline: deadline, CreateTime: now,
			Signer: r.signer,
		})
		if err != nil {
			return err
		}
		cmd = c
		if !inserted {
			if c.State == fleet.CommandCanceled {
				return fmt.Errorf("%w: key %s is fenced", provision.ErrNotDispatched, run.IdempotencyKey)
			}
			return nil // a repeated dispatch: the command is already there
		}
		if r.notify != nil {
			r.notify.NotifyCommand(tx, n.ID)
		}
		return nil
	})
	if err != nil {
		return provision.Dispatched{}, err
	}
	return provision.Dispatched{Handle: cmd.ID}, nil
}

// Lookup answers from the command row. A key never dispatched is fenced
// with a canceled command under it, so a late dispatch cannot apply it.
func (r *ramdiskCommands) Lookup(ctx context.Context, _ metal.Target, nodeID string, run provision.StepRun) (provision.Outcome, error) {
	var out provision.Outcome
	err := r.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		key := stepKeyPrefix + run.IdempotencyKey
		c, err := fleet.CommandByKey(ctx, tx, nodeID, key)
		if errors.Is(err, store.ErrNotFound) {
			now := r.db.Clock().Now()
			n, err := fleet.NodeGet(ctx, tx, "", nodeID)
			if err != nil {
				return err
			}
			c, _, err = fleet.CommandInsert(ctx, tx, &fleet.CommandInsertParams{
				ID: envelope.NewID(fleet.CommandIDPrefix, now), TenantID: n.TenantID, NodeID: nodeID, Kind: run.Kind,
				IdempotencyKey: key, CreatedBy: "system:metal", Deadline: now, CreateTime: now, Signer: r.signer,
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
		out = commandOutcome(c)
		return nil
	})
	return out, err
}

func commandOutcome(c fleet.Command) provision.Outcome {
	out := provision.Outcome{Handle: c.ID}
	var result map[string]any
	if c.Result != "" {
		_ = json.Unmarshal([]byte(c.Result), &result)
	}
	switch c.State {
	case fleet.CommandSucceeded:
		out.Status, out.Result = provision.OutcomeSucceeded, provision.Result{Output: result}
	case fleet.CommandFailed, fleet.CommandCanceled, fleet.CommandExpired:
		out.Status = provision.OutcomeFailed
		out.Result = provision.Result{Error: commandError(c.State, c.FailureCode, c.Message), Output: result}
	default:
		out.Status = provision.OutcomeRunning
	}
	return out
}

func commandError(state, code, msg string) string {
	parts := []string{"ramdisk command " + state}
	if code != "" {
		parts = append(parts, code)
	}
	if msg != "" {
		parts = append(parts, msg)
	}
	return strings.Join(parts, ": ")
}

// commandDone completes the lifecycle step a finished ramdisk command
// carried, in the transaction that records the command's end.
func commandDone(rt func() *metal.Runtime) func(ctx context.Context, tx store.Tx, c fleet.Command, state, message string, result map[string]any) error {
	return func(ctx context.Context, tx store.Tx, c fleet.Command, state, message string, result map[string]any) error {
		key, ok := strings.CutPrefix(c.IdempotencyKey, stepKeyPrefix)
		if !ok || rt() == nil {
			return nil
		}
		res := provision.Result{Output: result}
		if state != fleet.CommandSucceeded {
			res.Error = commandError(state, "", message)
		}
		err := rt().Engine.CompleteTx(ctx, tx, key, res)
		var apiErr *envelope.Error
		if errors.As(err, &apiErr) && apiErr.Code == envelope.CodeNotFound {
			return nil // the workflow is gone: the command's row is its record
		}
		return err
	}
}

// retireRamdiskNodes retires the nodes of a ramdisk boot that ended: their
// sessions and renewals are refused from then on, and their certificates
// (at most 2 h) are never renewed.
func retireRamdiskNodes(rec envelope.Recorder, clk clock.Clock) func(ctx context.Context, tx store.Tx, nodeIDs []string) error {
	return func(ctx context.Context, tx store.Tx, nodeIDs []string) error {
		for _, id := range nodeIDs {
			n, err := fleet.NodeGet(ctx, tx, "", id)
			if errors.Is(err, store.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			ok, err := fleet.NodeUpdateState(ctx, tx, &fleet.NodeUpdateStateParams{ID: id,
				From: []string{fleet.NodeJoining, fleet.NodeActive, fleet.NodeDraining, fleet.NodeDrained}, To: fleet.NodeRetired})
			if err != nil {
				return err
			}
			if ok {
				if err := rec.InsertEvents(ctx, tx, []envelope.Event{{Type: "node.retired", TenantID: n.TenantID, ResourceType: "Node",
					ResourceID: id, Time: clk.Now(), Data: map[string]any{"reason": "the ramdisk boot ended"}}}); err != nil {
					return err
				}
			}
		}
		return nil
	}
}

// deployNodeTokens mints a deploy's node join token: a join_tokens row of
// role node in the machine's tenant, labelled with the machine, created by
// the lifecycle, and the sealed token, which goes only into the configure
// command (sealed again, to the ramdisk's key) — never into a log or a row.
func deployNodeTokens(sealer fleet.TokenSealer, rec envelope.Recorder, clk clock.Clock) func(ctx context.Context, tx store.Tx, req metal.NodeTokenRequest) (string, error) {
	return func(ctx context.Context, tx store.Tx, req metal.NodeTokenRequest) (string, error) {
		now := clk.Now()
		labels := map[string]string{metal.MachineLabel: req.MachineID}
		b, err := json.Marshal(labels)
		if err != nil {
			return "", err
		}
		jt := fleet.JoinToken{ID: envelope.NewID(fleet.JoinTokenIDPrefix, now), TenantID: req.TenantID, Labels: string(b),
			CreatedBy: "system:metal", CreateTime: now, ExpireTime: now.Add(req.TTL), Role: fleet.RoleNode}
		if err := fleet.JoinTokenInsert(ctx, tx, &jt); err != nil {
			return "", err
		}
		token, err := sealer.SealJoinToken(fleet.JoinClaims{TokenID: jt.ID, TenantID: jt.TenantID, Labels: labels, ExpiresAt: jt.ExpireTime})
		if err != nil {
			return "", err
		}
		if err := rec.InsertEvents(ctx, tx, []envelope.Event{{Type: "jointoken.created", TenantID: jt.TenantID, ResourceType: "JoinToken",
			ResourceID: jt.ID, Time: now, Data: map[string]any{"role": jt.Role, "machine_id": req.MachineID, "workflow_id": req.WorkflowID,
				"expire_time": jt.ExpireTime.UTC().Format(time.RFC3339)}}}); err != nil {
			return "", err
		}
		return token, nil
	}
}
