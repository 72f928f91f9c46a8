package metal

import (
	"context"
	"errors"
	"slices"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/store"
)

// The machine side of quorum batches (internal/quorum): a leaf whose
// subject is site/<id>/machine/<id> is resolved and run here, through the
// same one-step power workflow MachineService.Power starts, so its BMC call
// still goes to the site agent at most once.

// ResolveMachine reports whether machineID is a machine of tenantID at
// siteID; another tenant's machine is not found, as a missing one.
func (r *Runtime) ResolveMachine(ctx context.Context, q store.Querier, tenantID, siteID, machineID string) (bool, error) {
	m, err := MachineGet(ctx, q, tenantID, machineID, "")
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return m.SiteID == siteID && m.State != StateRetired, nil
}

// PowerTx starts a power action ("off", "cycle") on a tenant's machine in
// the caller's transaction and returns its workflow id. It refuses what
// MachineService.Power refuses: a machine that runs a workflow or whose
// state the action does not start from.
func (r *Runtime) PowerTx(ctx context.Context, tx *envelope.Tx, tenantID, machineID, action string) (string, error) {
	op, ok := PowerOps[action]
	if !ok {
		return "", envelope.Errorf(envelope.CodeInvalidArgument, "power action must be one of %v, got %q", powerActions(), truncate(action))
	}
	m, err := MachineGet(ctx, tx, tenantID, machineID, store.ForUpdate(tx))
	if errors.Is(err, store.ErrNotFound) {
		return "", envelope.NotFound("machine", machineID)
	}
	if err != nil {
		return "", err
	}
	if err := idle(m, op); err != nil {
		return "", err
	}
	if err := inMaintenance(m, op); err != nil {
		return "", err
	}
	if t := transitions[op]; !slices.Contains(t.from, m.State) {
		return "", envelope.Errorf(envelope.CodeFailedPrecondition, "machine %s is %s: %s starts from %s", m.Name, m.State, op, stateList(t.from))
	}
	w, err := r.Engine.StartTx(ctx, tx.Tx, provision.StartParams{TenantID: m.TenantID, TargetID: m.ID, Profile: op,
		Input: map[string]any{}, CreatedBy: tx.Caller().Principal.ID})
	if err != nil {
		return "", err
	}
	m.WorkflowID, m.Operation, m.UpdateTime = w.ID, op, tx.Now()
	if err := MachineUpdate(ctx, tx, &m); err != nil {
		return "", err
	}
	tx.Emit(envelope.Event{Type: "machine.power_requested", TenantID: m.TenantID, ResourceType: "Machine", ResourceID: m.ID,
		Data: map[string]any{"state": string(m.State), "from": string(m.State), "operation": op, "workflow_id": w.ID}})
	return w.ID, nil
}
