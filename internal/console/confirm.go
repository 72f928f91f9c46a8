package console

import (
	"net/http"
	"net/url"
	"slices"

	"connectrpc.com/connect"
	"github.com/a-h/templ"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

const navConfirmations = "confirmations"

// confirmationStates are the states the page filters on; pending first,
// as the page opens on it.
var confirmationStates = []string{"pending", "approved", "used", "expired"}

// confirmationRow is a confirmation as the console lists it.
type confirmationRow struct {
	ID, Action, Resource, PrincipalID, State, ApprovedBy, Created, Expires string
	// Mine: the viewer made the request, so another person must approve.
	Mine        bool
	TenantQuery string
}

func (c *Console) confirmations(w http.ResponseWriter, r *http.Request, s *session) {
	p := page{Title: "Confirmations", Nav: navConfirmations, Viewer: &s.viewer, CSRF: s.row.CSRFToken}
	tenant := tenantOf(r, s)
	state := r.URL.Query().Get("state")
	if state == "" {
		state = "pending"
	}
	if tenant == "" {
		// A platform key lists one tenant's confirmations at a time: the
		// API wants the tenant named.
		c.render(w, r, http.StatusOK, confirmationsTenantPage(p))
		return
	}
	res, err := s.api.Confirmations.List(r.Context(), connect.NewRequest(&apiv1.ListConfirmationsRequest{
		Tenant: tenant, State: state, PageSize: pageSize, PageToken: r.URL.Query().Get("page")}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	rows := make([]confirmationRow, 0, len(res.Msg.GetConfirmations()))
	for _, x := range res.Msg.GetConfirmations() {
		row := confirmationRow{ID: x.GetId(), Action: x.GetAction(), Resource: x.GetResourceType() + " " + x.GetResourceId(),
			PrincipalID: x.GetPrincipalId(), State: x.GetState(), ApprovedBy: x.GetApprovedBy(), Created: when(x.GetCreateTime()),
			Expires: when(x.GetExpireTime()), Mine: x.GetPrincipalId() == s.viewer.PrincipalID}
		if s.viewer.TenantID == "" {
			row.TenantQuery = x.GetTenantId()
		}
		rows = append(rows, row)
	}
	q := url.Values{"state": {state}}
	if t := tenantQuery(s, tenant); t != "" {
		q.Set("tenant", t)
	}
	next := ""
	if t := res.Msg.GetNextPageToken(); t != "" {
		nq := url.Values{"state": {state}, "page": {t}}
		if tq := q.Get("tenant"); tq != "" {
			nq.Set("tenant", tq)
		}
		next = PathConfirmations + "?" + nq.Encode()
	}
	c.render(w, r, http.StatusOK, confirmationsPage(p, r.URL.RequestURI(), state, tenantQuery(s, tenant), rows, next))
}

// approveConfirmation approves with the viewer's key; the API alone
// decides who may (a person other than the requester whose role may).
func (c *Console) approveConfirmation(w http.ResponseWriter, r *http.Request, s *session) {
	tenant := tenantOf(r, s)
	_, err := s.api.Confirmations.Approve(r.Context(), connect.NewRequest(&apiv1.ApproveConfirmationRequest{Tenant: tenant, Id: r.PathValue("id")}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	http.Redirect(w, r, string(confirmationsURL(tenantQuery(s, tenant), "approved")), http.StatusSeeOther)
}

// replayField is a field of a refused form, posted again with its
// confirmation.
type replayField struct{ Name, Value string }

// confirmationRequired answers a post the API refused with
// CONFIRMATION_REQUIRED: the page says so, links to the confirmations and
// offers the same form again carrying the confirmation's id, which the API
// lets through once another person approved it. It reports whether err
// was that refusal.
func (c *Console) confirmationRequired(w http.ResponseWriter, r *http.Request, s *session, err error, nav string, back templ.SafeURL) bool {
	if client.Code(err) != "CONFIRMATION_REQUIRED" {
		return false
	}
	cfm := client.Detail(err).GetConfirmationId()
	var fields []replayField
	for name, vs := range r.PostForm {
		if name == csrfField || name == "confirmation" {
			continue
		}
		for _, v := range vs {
			fields = append(fields, replayField{Name: name, Value: v})
		}
	}
	slices.SortFunc(fields, func(a, b replayField) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	e := apiErrorOf(err)
	p := page{Title: "Approval needed", Nav: nav, Viewer: &s.viewer, CSRF: s.row.CSRFToken, Err: &e}
	// 202: the request is held, not refused (a confirmation now waits);
	// an error status would also read as a failed load in the browser.
	c.render(w, r, http.StatusAccepted, confirmationNeededPage(p, cfm, templ.SafeURL(r.URL.Path), fields,
		confirmationsURL(tenantQuery(s, tenantOf(r, s)), "pending"), back))
	return true
}

func confirmationsURL(tenant, state string) templ.SafeURL {
	q := url.Values{}
	if state != "" {
		q.Set("state", state)
	}
	if tenant != "" {
		q.Set("tenant", tenant)
	}
	u := PathConfirmations
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return templ.SafeURL(u)
}

func approveURL(id string) templ.SafeURL {
	return templ.SafeURL(PathConfirmations + "/" + url.PathEscape(id) + "/approve")
}
