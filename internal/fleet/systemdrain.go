package fleet

import (
	"context"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

// SystemDrain moves an active node to draining and queues its node.drain
// command for a module acting on its own (the health reconciler), in the
// caller's transaction: the same change an operator's Drain makes, with the
// caller named as its author. It reports whether the node was active.
func SystemDrain(ctx context.Context, tx store.Tx, deps Deps, rec envelope.Recorder, nodeID, reason, by string, now time.Time) (bool, error) {
	n, err := NodeGet(ctx, tx, "", nodeID)
	if err != nil {
		return false, err
	}
	ok, err := NodeUpdateState(ctx, tx, &NodeUpdateStateParams{ID: n.ID, From: []string{NodeActive}, To: NodeDraining})
	if err != nil || !ok {
		return false, err
	}
	if err := deps.stateChanged(ctx, tx, n.ID); err != nil {
		return false, err
	}
	params, err := paramsJSON(map[string]any{"reason": reason})
	if err != nil {
		return false, err
	}
	cmd, _, err := CommandInsert(ctx, tx, &CommandInsertParams{
		ID: envelope.NewID(CommandIDPrefix, now), TenantID: n.TenantID, NodeID: n.ID, Kind: KindNodeDrain, Params: params,
		CreatedBy: by, Deadline: now.Add(time.Duration(defaultDeadline) * time.Second), CreateTime: now, Signer: deps.Signer,
	})
	if err != nil {
		return false, fmt.Errorf("queue node.drain: %w", err)
	}
	deps.notify(tx, n.ID)
	if rec != nil {
		if err := rec.InsertEvents(ctx, tx, []envelope.Event{
			{Type: "node.draining", TenantID: n.TenantID, ResourceType: "Node", ResourceID: n.ID, Time: now, Data: map[string]any{"name": n.Name, "reason": reason, "by": by}},
			{Type: "command.created", TenantID: n.TenantID, ResourceType: "Command", ResourceID: cmd.ID, Time: now, Data: map[string]any{"node_id": n.ID, "kind": KindNodeDrain, "seq": cmd.Seq}},
		}); err != nil {
			return false, err
		}
	}
	return true, nil
}

// SystemUndrain returns a draining or drained node to service for a module
// acting on its own, cancelling its open node.drain commands. It reports
// whether the node was draining or drained.
func SystemUndrain(ctx context.Context, tx store.Tx, deps Deps, rec envelope.Recorder, nodeID, by string, now time.Time) (bool, error) {
	n, err := NodeGet(ctx, tx, "", nodeID)
	if err != nil {
		return false, err
	}
	ok, err := NodeUpdateState(ctx, tx, &NodeUpdateStateParams{ID: n.ID, From: []string{NodeDraining, NodeDrained}, To: NodeActive})
	if err != nil || !ok {
		return false, err
	}
	if err := deps.stateChanged(ctx, tx, n.ID); err != nil {
		return false, err
	}
	canceled, err := CommandCancel(ctx, tx, &CommandCancelParams{NodeID: n.ID, Kind: KindNodeDrain, Message: "node undrained by " + by})
	if err != nil {
		return false, err
	}
	if canceled > 0 {
		deps.notify(tx, n.ID)
	}
	if rec != nil {
		if err := rec.InsertEvents(ctx, tx, []envelope.Event{{Type: "node.undrained", TenantID: n.TenantID, ResourceType: "Node", ResourceID: n.ID,
			Time: now, Data: map[string]any{"name": n.Name, "canceled_commands": canceled, "by": by}}}); err != nil {
			return false, err
		}
	}
	return true, nil
}
