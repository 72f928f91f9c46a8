package console

import (
	"cmp"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/a-h/templ"
	"google.golang.org/protobuf/types/known/durationpb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

const (
	navInstances = "instances"
	navSandboxes = "sandboxes"
)

// instanceRow is an instance as the console shows it.
type instanceRow struct {
	ID, Name, State, Flavor, Image, Address, SSHAddress, Node, Pool, Reservation, Policy, Message, Created, Project string
	Conditions                                                                                                      []string
	TenantQuery                                                                                                     string
}

func instanceRowOf(v *viewer, x *apiv1.Instance) instanceRow {
	row := instanceRow{ID: x.GetId(), Name: x.GetName(), State: x.GetState(), Flavor: x.GetFlavor(), Image: x.GetImage(),
		Address: cmp.Or(x.GetAddress(), "—"), SSHAddress: x.GetSshAddress(), Node: cmp.Or(x.GetNodeName(), x.GetNodeId(), "not placed yet"),
		Pool: x.GetPoolId(), Reservation: x.GetReservationId(), Policy: x.GetNetworkPolicy(), Message: x.GetMessage(),
		Created: when(x.GetCreateTime()), Project: x.GetProjectId()}
	for _, c := range x.GetConditions() {
		row.Conditions = append(row.Conditions, strings.TrimSpace(fmt.Sprintf("%s %s: %s %s (%s)", c.GetType(), c.GetStatus(),
			c.GetReason(), c.GetMessage(), when(c.GetUpdateTime()))))
	}
	if v.TenantID == "" {
		row.TenantQuery = x.GetTenantId()
	}
	return row
}

// Stoppable and Startable say which of stop and start the instance's state
// offers; the API still decides.
func (r instanceRow) Stoppable() bool { return r.State == "running" }
func (r instanceRow) Startable() bool { return r.State == "stopped" }

// Deletable: not already on its way out.
func (r instanceRow) Deletable() bool { return r.State != "deleting" && r.State != "deleted" }

// instanceForm is the create form as typed.
type instanceForm struct {
	Tenant, Name, Flavor, Image, IPPool, Pool, Policy, SSHKeys, Project string
}

func (c *Console) instances(w http.ResponseWriter, r *http.Request, s *session) {
	c.renderInstances(w, r, s, http.StatusOK, instanceForm{Policy: "egress"}, nil)
}

func (c *Console) renderInstances(w http.ResponseWriter, r *http.Request, s *session, status int, f instanceForm, refused *apiError) {
	p := page{Title: "Instances", Nav: navInstances, Viewer: &s.viewer, CSRF: s.row.CSRFToken}
	res, err := s.api.Instances.List(r.Context(), connect.NewRequest(&apiv1.ListInstancesRequest{
		Tenant: tenantOf(r, s), PageSize: pageSize, PageToken: r.URL.Query().Get("page")}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	rows := make([]instanceRow, 0, len(res.Msg.GetInstances()))
	for _, x := range res.Msg.GetInstances() {
		rows = append(rows, instanceRowOf(&s.viewer, x))
	}
	next := nextPage(PathInstances, r, s, res.Msg.GetNextPageToken(), nil)
	c.render(w, r, status, instancesPage(p, rows, next, f, refused))
}

func (c *Console) instance(w http.ResponseWriter, r *http.Request, s *session) {
	res, err := s.api.Instances.Get(r.Context(), connect.NewRequest(&apiv1.GetInstanceRequest{Tenant: tenantOf(r, s), Instance: r.PathValue("id")}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	row := instanceRowOf(&s.viewer, res.Msg.GetInstance())
	p := page{Title: "Instance " + row.Name, Nav: navInstances, Viewer: &s.viewer, CSRF: s.row.CSRFToken}
	c.render(w, r, http.StatusOK, instancePage(p, row))
}

// createInstance creates an instance with the viewer's key and shows it; a
// refusal comes back above the form as it was typed.
func (c *Console) createInstance(w http.ResponseWriter, r *http.Request, s *session) {
	v := r.PostForm
	f := instanceForm{Tenant: v.Get("tenant"), Name: strings.TrimSpace(v.Get("name")), Flavor: strings.TrimSpace(v.Get("flavor")),
		Image: strings.TrimSpace(v.Get("image")), IPPool: strings.TrimSpace(v.Get("ip_pool")), Pool: strings.TrimSpace(v.Get("pool")),
		Policy: v.Get("network_policy"), SSHKeys: v.Get("ssh_keys"), Project: strings.TrimSpace(v.Get("project"))}
	req := &apiv1.CreateInstanceRequest{Tenant: tenantOf(r, s), Name: f.Name, Flavor: f.Flavor, Image: f.Image, IpPool: f.IPPool,
		Pool: f.Pool, NetworkPolicy: f.Policy, Project: f.Project}
	for k := range strings.Lines(f.SSHKeys) {
		if k = strings.TrimSpace(k); k != "" {
			req.SshKeys = append(req.SshKeys, k)
		}
	}
	res, err := s.api.Instances.Create(r.Context(), connect.NewRequest(req))
	if err != nil {
		e := apiErrorOf(err)
		c.renderInstances(w, r, s, httpStatus(err), f, &e)
		return
	}
	x := res.Msg.GetInstance()
	http.Redirect(w, r, string(workloadURL(PathInstances, x.GetId(), instanceRowOf(&s.viewer, x).TenantQuery)), http.StatusSeeOther)
}

// instanceAction runs stop, start or delete with the viewer's key, then
// shows the instance (or, after a delete, the list).
func (c *Console) instanceAction(action string) func(http.ResponseWriter, *http.Request, *session) {
	return func(w http.ResponseWriter, r *http.Request, s *session) {
		ctx, tenant, id := r.Context(), tenantOf(r, s), r.PathValue("id")
		var err error
		switch action {
		case "stop":
			_, err = s.api.Instances.Stop(ctx, connect.NewRequest(&apiv1.StopInstanceRequest{Tenant: tenant, Instance: id}))
		case "start":
			_, err = s.api.Instances.Start(ctx, connect.NewRequest(&apiv1.StartInstanceRequest{Tenant: tenant, Instance: id}))
		case "delete":
			_, err = s.api.Instances.Delete(ctx, connect.NewRequest(&apiv1.DeleteInstanceRequest{Tenant: tenant, Instance: id}))
		}
		if err != nil {
			c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
			return
		}
		q := ""
		if s.viewer.TenantID == "" {
			q = tenant
		}
		http.Redirect(w, r, string(workloadURL(PathInstances, id, q)), http.StatusSeeOther)
	}
}

// sandboxRow is a sandbox as the console shows it.
type sandboxRow struct {
	ID, Template, State, Origin, Address, Node, Instance, Expires, Created string
	TenantQuery                                                            string
}

func sandboxRowOf(v *viewer, x *apiv1.Sandbox) sandboxRow {
	row := sandboxRow{ID: x.GetId(), Template: x.GetTemplate(), State: x.GetState(), Origin: x.GetOrigin(),
		Address: cmp.Or(x.GetAddress(), "—"), Node: cmp.Or(x.GetNodeId(), "—"), Instance: x.GetInstanceId(),
		Expires: when(x.GetExpireTime()), Created: when(x.GetCreateTime())}
	if v.TenantID == "" {
		row.TenantQuery = x.GetTenantId()
	}
	return row
}

// Deletable: not already on its way out.
func (r sandboxRow) Deletable() bool { return r.State != "deleting" && r.State != "deleted" }

type sandboxForm struct{ Tenant, Template, TTL string }

func (c *Console) sandboxes(w http.ResponseWriter, r *http.Request, s *session) {
	c.renderSandboxes(w, r, s, http.StatusOK, sandboxForm{}, nil)
}

func (c *Console) renderSandboxes(w http.ResponseWriter, r *http.Request, s *session, status int, f sandboxForm, refused *apiError) {
	p := page{Title: "Sandboxes", Nav: navSandboxes, Viewer: &s.viewer, CSRF: s.row.CSRFToken}
	res, err := s.api.Sandboxes.List(r.Context(), connect.NewRequest(&apiv1.ListSandboxesRequest{
		Tenant: tenantOf(r, s), PageSize: pageSize, PageToken: r.URL.Query().Get("page")}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	rows := make([]sandboxRow, 0, len(res.Msg.GetSandboxes()))
	for _, x := range res.Msg.GetSandboxes() {
		rows = append(rows, sandboxRowOf(&s.viewer, x))
	}
	next := nextPage(PathSandboxes, r, s, res.Msg.GetNextPageToken(), nil)
	c.render(w, r, status, sandboxesPage(p, rows, next, f, refused))
}

func (c *Console) sandbox(w http.ResponseWriter, r *http.Request, s *session) {
	res, err := s.api.Sandboxes.Get(r.Context(), connect.NewRequest(&apiv1.GetSandboxRequest{Tenant: tenantOf(r, s), Sandbox: r.PathValue("id")}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	row := sandboxRowOf(&s.viewer, res.Msg.GetSandbox())
	p := page{Title: "Sandbox " + row.ID, Nav: navSandboxes, Viewer: &s.viewer, CSRF: s.row.CSRFToken}
	c.render(w, r, http.StatusOK, sandboxPage(p, row))
}

func (c *Console) createSandbox(w http.ResponseWriter, r *http.Request, s *session) {
	f := sandboxForm{Tenant: r.PostForm.Get("tenant"), Template: strings.TrimSpace(r.PostForm.Get("template")), TTL: strings.TrimSpace(r.PostForm.Get("ttl"))}
	req := &apiv1.CreateSandboxRequest{Tenant: tenantOf(r, s), Template: f.Template}
	if f.TTL != "" {
		d, err := parseTenantSpan(f.TTL)
		if err != nil || d <= 0 {
			c.renderSandboxes(w, r, s, http.StatusBadRequest, f, fieldRefusal("ttl", fmt.Sprintf("must be a span such as 30m or 2h, got %q", f.TTL)))
			return
		}
		req.Ttl = durationpb.New(d.Round(time.Second))
	}
	res, err := s.api.Sandboxes.Create(r.Context(), connect.NewRequest(req))
	if err != nil {
		e := apiErrorOf(err)
		c.renderSandboxes(w, r, s, httpStatus(err), f, &e)
		return
	}
	x := res.Msg.GetSandbox()
	http.Redirect(w, r, string(workloadURL(PathSandboxes, x.GetId(), sandboxRowOf(&s.viewer, x).TenantQuery)), http.StatusSeeOther)
}

func (c *Console) deleteSandbox(w http.ResponseWriter, r *http.Request, s *session) {
	tenant, id := tenantOf(r, s), r.PathValue("id")
	if _, err := s.api.Sandboxes.Delete(r.Context(), connect.NewRequest(&apiv1.DeleteSandboxRequest{Tenant: tenant, Sandbox: id})); err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	q := ""
	if s.viewer.TenantID == "" {
		q = tenant
	}
	http.Redirect(w, r, string(workloadURL(PathSandboxes, id, q)), http.StatusSeeOther)
}

// workloadURL is an instance's or sandbox's page (base PathInstances or
// PathSandboxes), or with action the URL its form posts to.
func workloadURL(base, id, tenant string, action ...string) templ.SafeURL {
	u := base + "/" + url.PathEscape(id)
	for _, a := range action {
		u += "/" + a
	}
	if tenant != "" && len(action) == 0 {
		u += "?tenant=" + url.QueryEscape(tenant)
	}
	return templ.SafeURL(u)
}
