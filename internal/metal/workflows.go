package metal

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"connectrpc.com/connect"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// workflowOp is an operator's change to one workflow, decided on the
// workflow's machine: apply runs in the mutation's transaction with the
// machine locked.
type workflowOp func(ctx context.Context, tx *envelope.Tx, m *Machine, w provision.Workflow) (provision.Workflow, error)

// changeWorkflow runs op on the workflow a request names. A workflow of
// another tenant's machine (or of no machine) is NOT_FOUND, after the
// decision, as GetWorkflow answers it.
func changeWorkflow[Req, Res any](ctx context.Context, s *MachineService, req *connect.Request[Req], tenant, workflow string,
	validate func(vs *envelope.Violations), op workflowOp, wrap func(m *apiv1.Machine, w *apiv1.MachineWorkflow) *Res) (*connect.Response[Res], error) {
	var r machineRef
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[Res]{
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			tenancy.ValidateScope(&vs, tenant)
			vs.ID("workflow", workflow, WorkflowIDPrefix)
			if validate != nil {
				validate(&vs)
			}
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			r, err = lookupWorkflowMachine(ctx, q, tenant, workflow)
			return r.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*Res, error) {
			if err := r.notFound(); err != nil {
				return nil, err
			}
			m, err := lockMachine(ctx, tx, r)
			if err != nil {
				return nil, err
			}
			w, err := provision.Get(ctx, tx, workflow)
			if err != nil {
				return nil, err
			}
			if w, err = op(ctx, tx, &m, w); err != nil {
				return nil, err
			}
			if m, err = MachineGet(ctx, tx, m.TenantID, m.ID, ""); err != nil {
				return nil, err
			}
			return wrap(MachineProto(m), WorkflowProto(w, false)), nil
		},
	})
}

// lookupWorkflowMachine resolves the machine of the workflow id names, in
// the scope tenantRef names; a workflow of a machine outside it is a miss.
func lookupWorkflowMachine(ctx context.Context, q store.Querier, tenantRef, id string) (machineRef, error) {
	r := machineRef{name: id, noun: "workflow", typ: "Machine", res: MachineResource}
	var err error
	if r.scope, err = tenancy.LookupScope(ctx, q, tenantRef); err != nil || !r.Found {
		return r, err
	}
	w, err := provision.Get(ctx, q, id)
	if errors.Is(err, store.ErrNotFound) {
		return r, nil
	}
	if err != nil {
		return r, err
	}
	m, err := MachineByID(ctx, q, w.TargetID, "")
	if errors.Is(err, store.ErrNotFound) {
		return r, nil
	}
	if err != nil {
		return r, err
	}
	r.obj, r.found = m, m.TenantID == r.ID()
	return r, nil
}

// PauseWorkflow pauses a machine's active workflow: the step in flight
// ends and is recorded, the next one waits for ResumeWorkflow.
func (s *MachineService) PauseWorkflow(ctx context.Context, req *connect.Request[apiv1.PauseMachineWorkflowRequest]) (*connect.Response[apiv1.PauseMachineWorkflowResponse], error) {
	return changeWorkflow(ctx, s, req, req.Msg.GetTenant(), req.Msg.GetWorkflow(), nil,
		func(ctx context.Context, tx *envelope.Tx, m *Machine, w provision.Workflow) (provision.Workflow, error) {
			return s.rt.Engine.PauseTx(ctx, tx.Tx, w.ID)
		},
		func(m *apiv1.Machine, w *apiv1.MachineWorkflow) *apiv1.PauseMachineWorkflowResponse {
			return &apiv1.PauseMachineWorkflowResponse{Machine: m, Workflow: w}
		})
}

// ResumeWorkflow lets a paused workflow go on.
func (s *MachineService) ResumeWorkflow(ctx context.Context, req *connect.Request[apiv1.ResumeMachineWorkflowRequest]) (*connect.Response[apiv1.ResumeMachineWorkflowResponse], error) {
	return changeWorkflow(ctx, s, req, req.Msg.GetTenant(), req.Msg.GetWorkflow(), nil,
		func(ctx context.Context, tx *envelope.Tx, m *Machine, w provision.Workflow) (provision.Workflow, error) {
			return s.rt.Engine.ResumeTx(ctx, tx.Tx, w.ID)
		},
		func(m *apiv1.Machine, w *apiv1.MachineWorkflow) *apiv1.ResumeMachineWorkflowResponse {
			return &apiv1.ResumeMachineWorkflowResponse{Machine: m, Workflow: w}
		})
}

// AbortWorkflow is Abort addressed by the workflow: the same cancel, and
// only of the machine's active workflow, so that an id read a moment ago
// never cancels whatever the machine runs now.
func (s *MachineService) AbortWorkflow(ctx context.Context, req *connect.Request[apiv1.AbortMachineWorkflowRequest]) (*connect.Response[apiv1.AbortMachineWorkflowResponse], error) {
	return changeWorkflow(ctx, s, req, req.Msg.GetTenant(), req.Msg.GetWorkflow(), nil,
		func(ctx context.Context, tx *envelope.Tx, m *Machine, w provision.Workflow) (provision.Workflow, error) {
			if m.WorkflowID != w.ID {
				return provision.Workflow{}, envelope.Errorf(envelope.CodeFailedPrecondition,
					"workflow %s is %s: it is not machine %s's active workflow, nothing to abort", w.ID, w.State, m.Name)
			}
			return s.abortTx(ctx, tx, m)
		},
		func(m *apiv1.Machine, w *apiv1.MachineWorkflow) *apiv1.AbortMachineWorkflowResponse {
			return &apiv1.AbortMachineWorkflowResponse{Machine: m, Workflow: w}
		})
}

// RetryWorkflow restarts a failed or paused workflow at a step. A failed
// one must still be the last thing that happened to its machine: the
// machine is failed by it, holds nothing else, and goes back to the
// operation's -ing state.
func (s *MachineService) RetryWorkflow(ctx context.Context, req *connect.Request[apiv1.RetryMachineWorkflowRequest]) (*connect.Response[apiv1.RetryMachineWorkflowResponse], error) {
	from := req.Msg.GetFromStep()
	return changeWorkflow(ctx, s, req, req.Msg.GetTenant(), req.Msg.GetWorkflow(),
		func(vs *envelope.Violations) {
			if from == "" {
				vs.Add("from_step", "is required: the name of the step to restart at (workflows get shows them)")
			}
			vs.MaxLen("from_step", from, 100)
		},
		func(ctx context.Context, tx *envelope.Tx, m *Machine, w provision.Workflow) (provision.Workflow, error) {
			if w.State == provision.WorkflowFailed {
				if err := s.reopenable(ctx, tx, m, w, from); err != nil {
					return provision.Workflow{}, err
				}
			} else if w.State.Active() && m.WorkflowID != w.ID {
				return provision.Workflow{}, envelope.Errorf(envelope.CodeFailedPrecondition,
					"workflow %s is not machine %s's active workflow", w.ID, m.Name)
			}
			wasFailed := w.State == provision.WorkflowFailed
			w, err := s.rt.Engine.RetryTx(ctx, tx.Tx, w.ID, from)
			if err != nil || !wasFailed {
				return w, err
			}
			prev := m.State
			m.State, m.WorkflowID, m.Operation, m.UpdateTime = transitions[w.Profile].running, w.ID, w.Profile, tx.Now()
			m.FailedOperation, m.FailedStep, m.FailureReason, m.FailureLogs = "", "", "", ""
			if err := MachineUpdate(ctx, tx, m); err != nil {
				return provision.Workflow{}, err
			}
			tx.Emit(envelope.Event{Type: "machine." + string(m.State), TenantID: m.TenantID, ResourceType: "Machine", ResourceID: m.ID,
				Data: map[string]any{"state": string(m.State), "from": string(prev), "operation": w.Profile, "workflow_id": w.ID,
					"retried_from_step": from}})
			return w, nil
		},
		func(m *apiv1.Machine, w *apiv1.MachineWorkflow) *apiv1.RetryMachineWorkflowResponse {
			return &apiv1.RetryMachineWorkflowResponse{Machine: m, Workflow: w}
		})
}

// reopenable refuses to bring a failed workflow back unless the machine is
// still as that failure left it, and unless the steps to run again can:
// when the workflow failed, its ramdisk's discovery token and node went
// with it, so a step that runs in the ramdisk needs the ramdisk boot run
// again first (a wipe would otherwise have no key to attest it with).
func (s *MachineService) reopenable(ctx context.Context, tx *envelope.Tx, m *Machine, w provision.Workflow, from string) error {
	t, ok := transitions[w.Profile]
	if !ok || t.running == "" || leaseOp(w.Profile) {
		return envelope.Errorf(envelope.CodeFailedPrecondition,
			"workflow %s (%s) cannot be retried once it failed: only a lifecycle operation's can (%v); start %s anew",
			w.ID, w.Profile, retryableOps(), w.Profile)
	}
	if err := idle(*m, w.Profile); err != nil {
		return err
	}
	if err := inMaintenance(*m, w.Profile); err != nil {
		return err
	}
	later, err := provision.List(ctx, tx, provision.ListParams{TargetID: m.ID, After: w.ID, Limit: 1})
	if err != nil {
		return err
	}
	if m.State != StateFailed || m.FailedOperation != w.Profile || len(later) > 0 {
		return envelope.Errorf(envelope.CodeFailedPrecondition,
			"machine %s is %s and workflow %s is no longer its last: only the workflow that left a machine failed can be retried",
			m.Name, m.State, w.ID)
	}
	full, err := provision.Get(ctx, tx, w.ID)
	if err != nil {
		return err
	}
	rerun, booted, boot := false, false, ""
	for _, st := range full.Steps {
		if st.Phase != provision.PhaseMain {
			continue
		}
		rerun = rerun || st.Name == from
		mode, _ := st.Params["boot"].(string)
		ramdiskBoot := st.Kind == KindPowerCycle && (mode == BootRamdisk || mode == BootRescue)
		switch {
		case !rerun && ramdiskBoot:
			boot = st.Name
		case !rerun && st.State == provision.StepSucceeded && attested(w.Profile, st.Kind):
			// The end of the operation checks this step's signed record
			// with the key of the ramdisk that ran it, which is gone.
			return envelope.Invalid(envelope.Violation{Field: "from_step", Reason: fmt.Sprintf(
				"step %s's signed record is checked with the key of the ramdisk that ran it, which went down when the workflow failed: retry from %s",
				st.Name, cmp.Or(boot, "the ramdisk boot"))})
		case !rerun:
		case ramdiskBoot:
			booted = true
		case !booted && slices.Contains(RamdiskKinds, st.Kind):
			return envelope.Invalid(envelope.Violation{Field: "from_step", Reason: fmt.Sprintf(
				"step %s runs in the machine's ramdisk, which went down when the workflow failed: retry from the ramdisk boot before it",
				st.Name)})
		}
	}
	return nil
}

// attested reports whether an operation's end checks a step of kind with
// the ramdisk's key: every wipe's erase record, and a commission's
// inventory (the firmware baseline).
func attested(op, kind string) bool {
	return kind == KindDiskWipe || (op == OpCommission && kind == KindInventory)
}

// retryableOps are the operations whose failed workflow RetryWorkflow
// brings back.
func retryableOps() []string {
	var out []string
	for op, t := range transitions {
		if t.running != "" && !leaseOp(op) {
			out = append(out, op)
		}
	}
	slices.Sort(out)
	return out
}

// abortTx cancels a machine's active workflow (Abort, AbortWorkflow).
func (s *MachineService) abortTx(ctx context.Context, tx *envelope.Tx, m *Machine) (provision.Workflow, error) {
	if m.WorkflowID == "" {
		return provision.Workflow{}, envelope.Errorf(envelope.CodeFailedPrecondition, "machine %s is %s: no workflow is active to abort", m.Name, m.State)
	}
	w, err := s.rt.Engine.CancelTx(ctx, tx.Tx, m.WorkflowID)
	if err != nil {
		return provision.Workflow{}, err
	}
	tx.Emit(envelope.Event{Type: "machine.abort_requested", TenantID: m.TenantID, ResourceType: "Machine", ResourceID: m.ID,
		Data: map[string]any{"state": string(m.State), "operation": m.Operation, "workflow_id": w.ID}})
	return w, nil
}
