package console

import (
	"context"
	"net/http"
	"net/url"

	"connectrpc.com/connect"
	"github.com/a-h/templ"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

const navMachines = "machines"

// machineLive is what a machine's parts refresh on: its own events and its
// workflows' (a workflow event names the machine as its target).
const machineLive = "machine.*,workflow.*"

// workflowPages bounds how many pages of a machine's workflows (oldest
// first) the machine page reads to find its latest one.
const workflowPages = 20

// machineRow is a machine as the console lists it.
type machineRow struct {
	ID, Name, Site, State, Operation, WorkflowID, Image, Profile string
	FailedStep, FailureReason, Maintenance, Lease, Updated       string
	// TenantQuery names the machine's tenant in links and forms, for a
	// platform key only.
	TenantQuery string
}

func machineRowOf(v *viewer, m *apiv1.Machine) machineRow {
	row := machineRow{ID: m.GetId(), Name: m.GetName(), Site: m.GetSiteId(), State: m.GetState(), Operation: m.GetOperation(),
		WorkflowID: m.GetWorkflowId(), Image: m.GetImageName(), Profile: m.GetHardwareProfile(), FailedStep: m.GetFailedStep(),
		FailureReason: m.GetFailureReason(), Maintenance: m.GetMaintenanceReason(), Lease: m.GetLeaseId(), Updated: when(m.GetUpdateTime())}
	if v.TenantID == "" {
		row.TenantQuery = m.GetTenantId()
	}
	return row
}

// Idle: no workflow runs, so a lifecycle action may start one.
func (m machineRow) Idle() bool { return m.WorkflowID == "" }

func (c *Console) machines(w http.ResponseWriter, r *http.Request, s *session) {
	p := page{Title: "Machines", Nav: navMachines, Viewer: &s.viewer, CSRF: s.row.CSRFToken}
	tenant := tenantOf(r, s)
	res, err := s.api.Machines.List(r.Context(), connect.NewRequest(&apiv1.ListMachinesRequest{
		Tenant: tenant, PageSize: pageSize, PageToken: r.URL.Query().Get("page")}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	rows := make([]machineRow, 0, len(res.Msg.GetMachines()))
	for _, m := range res.Msg.GetMachines() {
		rows = append(rows, machineRowOf(&s.viewer, m))
	}
	next := ""
	if t := res.Msg.GetNextPageToken(); t != "" {
		q := url.Values{"page": {t}}
		if s.viewer.TenantID == "" && tenant != "" {
			q.Set("tenant", tenant)
		}
		next = PathMachines + "?" + q.Encode()
	}
	c.render(w, r, http.StatusOK, machinesPage(p, r.URL.RequestURI(), rows, next))
}

// stepRow is one step of a workflow as the machine page shows it.
type stepRow struct {
	Index                           int32
	Phase, Name, Kind, State, Error string
	Attempts                        int32
	Destructive                     bool
	Start, End                      string
}

// workflowView is a machine's latest workflow with its steps.
type workflowView struct {
	ID, Operation, State, FailedStep, Reason, CreatedBy, Created, Ended string
	CancelRequested                                                     bool
	Steps                                                               []stepRow
}

// Summary is the workflow's caption.
func (wf workflowView) Summary() string {
	state := wf.State
	if wf.CancelRequested {
		state += " (abort requested)"
	}
	return "Workflow " + wf.ID + ": " + wf.Operation + ", " + state + ", started " + wf.Created + " by " + wf.CreatedBy
}

func (c *Console) machine(w http.ResponseWriter, r *http.Request, s *session) {
	ctx := r.Context()
	tenant := tenantOf(r, s)
	res, err := s.api.Machines.Get(ctx, connect.NewRequest(&apiv1.GetMachineRequest{Tenant: tenant, Machine: r.PathValue("id")}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	m := machineRowOf(&s.viewer, res.Msg.GetMachine())
	wf, err := latestWorkflow(ctx, s.api, tenant, m.ID)
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	// The BMC is asked through the site agent; a machine whose agent is
	// away still has a page.
	var power string
	if ps, err := s.api.Machines.GetPowerStatus(ctx, connect.NewRequest(&apiv1.GetMachinePowerStatusRequest{Tenant: tenant, Machine: m.ID})); err == nil {
		power = ps.Msg.GetPower()
	} else {
		power = "unknown (" + apiErrorOf(err).Message + ")"
	}
	p := page{Title: "Machine " + m.Name, Nav: navMachines, Viewer: &s.viewer, CSRF: s.row.CSRFToken}
	c.render(w, r, http.StatusOK, machinePage(p, r.URL.RequestURI(), m, power, wf))
}

// latestWorkflow is the machine's newest workflow with its steps, nil when
// it has run none. The API lists them oldest first.
func latestWorkflow(ctx context.Context, api *client.Client, tenant, machineID string) (*workflowView, error) {
	var last, token string
	for range workflowPages {
		res, err := api.Machines.ListWorkflows(ctx, connect.NewRequest(&apiv1.ListMachineWorkflowsRequest{
			Tenant: tenant, Machine: machineID, PageSize: 100, PageToken: token}))
		if err != nil {
			return nil, err
		}
		if ws := res.Msg.GetWorkflows(); len(ws) > 0 {
			last = ws[len(ws)-1].GetId()
		}
		if token = res.Msg.GetNextPageToken(); token == "" {
			break
		}
	}
	if last == "" {
		return nil, nil
	}
	res, err := api.Machines.GetWorkflow(ctx, connect.NewRequest(&apiv1.GetMachineWorkflowRequest{Tenant: tenant, Workflow: last}))
	if err != nil {
		return nil, err
	}
	x := res.Msg.GetWorkflow()
	v := &workflowView{ID: x.GetId(), Operation: x.GetOperation(), State: x.GetState(), FailedStep: x.GetFailedStep(),
		Reason: x.GetReason(), CreatedBy: x.GetCreatedBy(), Created: when(x.GetCreateTime()), Ended: when(x.GetEndTime()),
		CancelRequested: x.GetCancelRequested()}
	for _, st := range x.GetSteps() {
		v.Steps = append(v.Steps, stepRow{Index: st.GetIndex(), Phase: st.GetPhase(), Name: st.GetName(), Kind: st.GetKind(),
			State: st.GetState(), Error: st.GetError(), Attempts: st.GetAttempts(), Destructive: st.GetDestructive(),
			Start: when(st.GetStartTime()), End: when(st.GetEndTime())})
	}
	return v, nil
}

// machineAction starts a lifecycle action with the viewer's key (one
// decision, one audit row), then shows the machine. A request a policy
// wants confirmed says so and links to the confirmations; posted again
// with the approved confirmation's id it is the API's replay.
func (c *Console) machineAction(w http.ResponseWriter, r *http.Request, s *session) {
	ctx := r.Context()
	id, tenant := r.PathValue("id"), tenantOf(r, s)
	confirm := func(req connect.AnyRequest) {
		if cfm := r.PostForm.Get("confirmation"); cfm != "" {
			req.Header().Set(client.HeaderConfirmationID, cfm)
		}
	}
	var err error
	action := r.PathValue("action")
	switch action {
	case "commission":
		req := connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: tenant, Machine: id, BurnIn: r.PostForm.Get("burn_in") == "on"})
		confirm(req)
		_, err = s.api.Machines.Commission(ctx, req)
	case "deploy":
		req := connect.NewRequest(&apiv1.DeployMachineRequest{Tenant: tenant, Machine: id, Image: r.PostForm.Get("image"), Profile: r.PostForm.Get("profile")})
		confirm(req)
		_, err = s.api.Machines.Deploy(ctx, req)
	case "release":
		req := connect.NewRequest(&apiv1.ReleaseMachineRequest{Tenant: tenant, Machine: id})
		confirm(req)
		_, err = s.api.Machines.Release(ctx, req)
	case "abort":
		req := connect.NewRequest(&apiv1.AbortMachineRequest{Tenant: tenant, Machine: id})
		confirm(req)
		_, err = s.api.Machines.Abort(ctx, req)
	case "power":
		req := connect.NewRequest(&apiv1.PowerMachineRequest{Tenant: tenant, Machine: id, Action: r.PostForm.Get("power")})
		confirm(req)
		_, err = s.api.Machines.Power(ctx, req)
	default:
		c.notFound(w, r)
		return
	}
	if err != nil {
		if c.confirmationRequired(w, r, s, err, navMachines, machineURL(id, tenantQuery(s, tenant))) {
			return
		}
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	http.Redirect(w, r, string(machineURL(id, tenantQuery(s, tenant))), http.StatusSeeOther)
}

// tenantQuery is the tenant links carry: only a platform key's.
func tenantQuery(s *session, tenant string) string {
	if s.viewer.TenantID != "" {
		return ""
	}
	return tenant
}

func machineURL(id, tenant string) templ.SafeURL {
	u := PathMachines + "/" + url.PathEscape(id)
	if tenant != "" {
		u += "?tenant=" + url.QueryEscape(tenant)
	}
	return templ.SafeURL(u)
}

func machineActionURL(id, action string) templ.SafeURL {
	return templ.SafeURL(PathMachines + "/" + url.PathEscape(id) + "/" + action)
}
