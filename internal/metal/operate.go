package metal

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sort"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/quorum"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// WorkflowIDPrefix starts a workflow id (the provision engine's).
const WorkflowIDPrefix = "wf"

// platformTenant is the tenant the engine runs the platform's machines'
// workflows under.
const platformTenant = "platform"

// powerActions are the actions Power takes, in the order messages list them.
func powerActions() []string {
	out := make([]string, 0, len(PowerOps))
	for a := range PowerOps {
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}

// Power turns an idle machine on or off or cycles it: a one-step workflow
// whose BMC call the site agent makes at most once. The machine keeps its
// lifecycle state.
func (s *MachineService) Power(ctx context.Context, req *connect.Request[apiv1.PowerMachineRequest]) (*connect.Response[apiv1.PowerMachineResponse], error) {
	action := req.Msg.GetAction()
	return start(ctx, s, req, req.Msg.GetTenant(), req.Msg.GetMachine(), PowerOps[action],
		func(vs *envelope.Violations) {
			if _, ok := PowerOps[action]; !ok {
				vs.Add("action", "must be one of %v, got %q (status is a read: machines power MACHINE status, MachineService.GetPowerStatus)", powerActions(), truncate(action))
			}
		}, quorumGate(action),
		func(m *apiv1.Machine) *apiv1.PowerMachineResponse { return &apiv1.PowerMachineResponse{Machine: m} })
}

// powerKinds are the step kinds of the power actions, the names
// fleet.DestructiveKinds knows them by.
var powerKinds = map[string]string{"on": KindPowerOn, "off": KindPowerOff, "cycle": KindPowerCycle}

// quorumGate refuses a destructive power action (off, cycle) on a machine
// of a tenant that has approvers: it runs only in an approved command
// batch (internal/quorum), which calls Runtime.PowerTx itself.
func quorumGate(action string) prepareFunc {
	return func(ctx context.Context, tx *envelope.Tx, m *Machine) (map[string]any, error) {
		if err := quorumGateKind(ctx, tx, m, powerKinds[action], "power "+action); err != nil {
			return nil, err
		}
		return map[string]any{}, nil
	}
}

// quorumGateKind refuses a destructive kind on a machine of a tenant that
// has approvers: it runs only as a leaf of an approved command batch.
func quorumGateKind(ctx context.Context, tx *envelope.Tx, m *Machine, kind, what string) error {
	if _, destructive := fleet.Destructive(kind); !destructive || m.TenantID == "" {
		return nil
	}
	set, err := quorum.ApproverSetCurrent(ctx, tx, m.TenantID)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return envelope.Errorf(envelope.CodeQuorumRequired,
		"%s is destructive and this tenant requires %d of its %d approvers for it: propose it as a command batch "+
			"(better-compute batches create --leaf %s,site/%s/machine/%s), then commands run --batch ID",
		what, set.Threshold, len(set.Keys), kind, m.SiteID, m.ID)
}

// GetPowerStatus asks the site agent of the machine's site to read its
// power from the BMC.
func (s *MachineService) GetPowerStatus(ctx context.Context, req *connect.Request[apiv1.GetMachinePowerStatusRequest]) (*connect.Response[apiv1.GetMachinePowerStatusResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	tenancy.ValidateScope(&vs, msg.GetTenant())
	vs.Ref("machine", msg.GetMachine(), MachineIDPrefix)
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var r machineRef
	if err := s.env.Resolve(ctx, "machine", func(ctx context.Context, q store.Querier) (err error) {
		r, err = lookupMachine(ctx, q, msg.GetTenant(), msg.GetMachine())
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, r.resource()); err != nil {
		return nil, err
	}
	if err := r.notFound(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if r.obj.State == StateRetired {
		return nil, s.env.Fail(ctx, envelope.Errorf(envelope.CodeFailedPrecondition, "machine %s is retired: its BMC is no longer the site's", r.obj.Name))
	}
	st, err := s.rt.PowerStatus(ctx, r.obj.ID)
	if err != nil {
		var apiErr *envelope.Error
		if !errors.As(err, &apiErr) {
			// The BMC's (already scrubbed) answer, as the caller needs it.
			err = envelope.Errorf(envelope.CodeUnavailable, "machine %s: the site agent could not read the power: %v", r.obj.Name, err)
		}
		return nil, s.env.Fail(ctx, err)
	}
	return connect.NewResponse(&apiv1.GetMachinePowerStatusResponse{Power: string(st)}), nil
}

// Abort cancels a machine's active workflow with the engine's cancel: at
// once when no dispatched step is in flight, else when that step ends (a
// BMC call or a wipe is not taken back halfway). When the workflow ends the
// machine is failed — what its disk holds is no longer known — except
// after a power action, which leaves the machine's state as it was.
func (s *MachineService) Abort(ctx context.Context, req *connect.Request[apiv1.AbortMachineRequest]) (*connect.Response[apiv1.AbortMachineResponse], error) {
	msg := req.Msg
	var r machineRef
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.AbortMachineResponse]{
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			tenancy.ValidateScope(&vs, msg.GetTenant())
			vs.Ref("machine", msg.GetMachine(), MachineIDPrefix)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			r, err = lookupMachine(ctx, q, msg.GetTenant(), msg.GetMachine())
			return r.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.AbortMachineResponse, error) {
			if err := r.notFound(); err != nil {
				return nil, err
			}
			m, err := lockMachine(ctx, tx, r)
			if err != nil {
				return nil, err
			}
			w, err := s.abortTx(ctx, tx, &m)
			if err != nil {
				return nil, err
			}
			return &apiv1.AbortMachineResponse{Machine: MachineProto(m), Workflow: WorkflowProto(w, false)}, nil
		},
	})
}

// workflowStates lists the states a workflow list is filtered by.
var workflowStates = []provision.WorkflowState{provision.WorkflowPending, provision.WorkflowRunning, provision.WorkflowPaused,
	provision.WorkflowSucceeded, provision.WorkflowFailed, provision.WorkflowCancelled}

// ListWorkflows lists a tenant's machine workflows in creation order, by
// machine and state.
func (s *MachineService) ListWorkflows(ctx context.Context, req *connect.Request[apiv1.ListMachineWorkflowsRequest]) (*connect.Response[apiv1.ListMachineWorkflowsResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	tenancy.ValidateScope(&vs, msg.GetTenant())
	if msg.GetMachine() != "" {
		vs.Ref("machine", msg.GetMachine(), MachineIDPrefix)
	}
	if st := msg.GetState(); st != "" && !slices.Contains(workflowStates, provision.WorkflowState(st)) {
		vs.Add("state", "must be one of %v, got %q", workflowStates, truncate(st))
	}
	vs.PageSize("page_size", msg.GetPageSize())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	filter := msg.GetTenant() + "|" + msg.GetMachine() + "|" + msg.GetState()
	after, err := envelope.DecodePageToken("page_token", msg.GetPageToken(), filter)
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var r machineRef
	if err := s.env.Resolve(ctx, "tenant", func(ctx context.Context, q store.Querier) (err error) {
		if msg.GetMachine() != "" {
			r, err = lookupMachine(ctx, q, msg.GetTenant(), msg.GetMachine())
			return err
		}
		r.scope, err = tenancy.LookupScope(ctx, q, msg.GetTenant())
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	// A list is decided on its scope, with or without a machine.
	if err := s.env.AuthorizeRead(ctx, r.Resource()); err != nil {
		return nil, err
	}
	if err := r.NotFound(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if msg.GetMachine() != "" && !r.found {
		return nil, s.env.Fail(ctx, envelope.NotFound("machine", msg.GetMachine()))
	}
	limit := envelope.PageSize(msg.GetPageSize())
	var ws []provision.Workflow
	if err := s.env.Resolve(ctx, "workflows", func(ctx context.Context, q store.Querier) (err error) {
		ws, err = provision.List(ctx, q, provision.ListParams{TenantID: cmp.Or(r.ID(), platformTenant), TargetID: r.obj.ID,
			State: provision.WorkflowState(msg.GetState()), After: after, Limit: limit + 1})
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.ListMachineWorkflowsResponse{}
	for n, w := range ws {
		if n == limit {
			out.NextPageToken = envelope.EncodePageToken(ws[n-1].ID, filter)
			break
		}
		out.Workflows = append(out.Workflows, WorkflowProto(w, false))
	}
	return connect.NewResponse(out), nil
}

// GetWorkflow shows a workflow of one of the tenant's machines with its
// steps; a workflow of another tenant's machine is NOT_FOUND.
func (s *MachineService) GetWorkflow(ctx context.Context, req *connect.Request[apiv1.GetMachineWorkflowRequest]) (*connect.Response[apiv1.GetMachineWorkflowResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	tenancy.ValidateScope(&vs, msg.GetTenant())
	vs.ID("workflow", msg.GetWorkflow(), WorkflowIDPrefix)
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var (
		sc    tenancy.Scope
		w     provision.Workflow
		m     Machine
		found bool
	)
	if err := s.env.Resolve(ctx, "workflow", func(ctx context.Context, q store.Querier) (err error) {
		if sc, err = tenancy.LookupScope(ctx, q, msg.GetTenant()); err != nil || !sc.Found {
			return err
		}
		w, err = provision.Get(ctx, q, msg.GetWorkflow())
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		m, err = MachineByID(ctx, q, w.TargetID, "")
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		found = err == nil && m.TenantID == sc.ID()
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	res := sc.Missing("Machine")
	if found {
		res = MachineResource(m)
	}
	if err := s.env.AuthorizeRead(ctx, res); err != nil {
		return nil, err
	}
	if err := sc.NotFound(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if !found {
		return nil, s.env.Fail(ctx, envelope.NotFound("workflow", msg.GetWorkflow()))
	}
	return connect.NewResponse(&apiv1.GetMachineWorkflowResponse{Workflow: WorkflowProto(w, true)}), nil
}

// maxStepLogs bounds the logs a step shows: the tail is what says why.
const maxStepLogs = 4 << 10

// WorkflowProto converts a workflow for the API, with its steps when
// steps is set.
func WorkflowProto(w provision.Workflow, steps bool) *apiv1.MachineWorkflow {
	p := &apiv1.MachineWorkflow{Id: w.ID, TenantId: w.TenantID, MachineId: w.TargetID, Operation: w.Profile, State: string(w.State),
		CancelRequested: w.CancelRequested, FailedStep: w.FailedStep, Reason: w.Reason, CreatedBy: w.CreatedBy,
		CreateTime: timestamppb.New(w.CreateTime), UpdateTime: timestamppb.New(w.UpdateTime), EndTime: ts(w.EndTime)}
	if p.TenantId == platformTenant {
		p.TenantId = ""
	}
	if !steps {
		return p
	}
	for _, s := range w.Steps {
		logs := s.Logs
		if len(logs) > maxStepLogs {
			logs = "…" + logs[len(logs)-maxStepLogs:]
			logs = strings.ToValidUTF8(logs, "")
		}
		p.Steps = append(p.Steps, &apiv1.MachineWorkflowStep{Index: int32(s.Index), Phase: s.Phase, Name: s.Name, Kind: s.Kind,
			Destructive: s.Destructive, State: string(s.State), Attempts: int32(s.Attempt), Failures: int32(s.Failures),
			Error: s.Error, Logs: logs, StartTime: ts(s.StartTime), EndTime: ts(s.EndTime)})
	}
	return p
}

func ts(t *time.Time) *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return timestamppb.New(*t)
}
