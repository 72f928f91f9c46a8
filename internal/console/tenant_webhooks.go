package console

import (
	"cmp"
	"net/http"
	"net/url"
	"strings"

	"connectrpc.com/connect"
	"github.com/a-h/templ"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

const navWebhooks = "webhooks"

// mayManage reports whether the viewer's role may change credentials and
// endpoints: a tenant's admin or a platform key (webhooks' mutations are
// theirs in Cedar). It only hides buttons: the API decides.
func (v *viewer) mayManage() bool {
	return v != nil && (v.TenantID == "" || v.Role == "admin")
}

// webhookRow is a webhook endpoint as the console lists it; never its
// secret.
type webhookRow struct {
	ID, URL, Types, Description, State, Created, PreviousSecretUntil string
	TenantQuery                                                      string
}

func webhookRowOf(v *viewer, x *apiv1.Webhook) webhookRow {
	row := webhookRow{ID: x.GetId(), URL: x.GetUrl(), Types: cmp.Or(strings.Join(x.GetTypes(), ", "), "every event"),
		Description: x.GetDescription(), State: x.GetState(), Created: when(x.GetCreateTime())}
	if r := x.GetDisabledReason(); r != "" {
		row.State += ": " + r
	}
	if t := x.GetPreviousSecretExpireTime(); t != nil {
		row.PreviousSecretUntil = when(t)
	}
	if v.TenantID == "" {
		row.TenantQuery = x.GetTenantId()
	}
	return row
}

// webhooksView is the webhooks page: the endpoints, and what the last
// action answered (a secret shown once, a test delivery, a refusal).
type webhooksView struct {
	Rows []webhookRow
	Next string
	// Secret is a new signing secret (create or rotate), shown once.
	Secret, SecretOf string
	Refused          *apiError
	Tenant           string
	// NeedTenant: a platform key named no tenant yet.
	NeedTenant bool
}

func (c *Console) webhooks(w http.ResponseWriter, r *http.Request, s *session) {
	c.renderWebhooks(w, r, s, http.StatusOK, webhooksView{}, "")
}

func (c *Console) renderWebhooks(w http.ResponseWriter, r *http.Request, s *session, status int, v webhooksView, notice string) {
	p := page{Title: "Webhooks", Nav: navWebhooks, Viewer: &s.viewer, CSRF: s.row.CSRFToken, Notice: notice}
	if tenantOf(r, s) == "" {
		// A platform key lists one tenant's endpoints at a time: the API
		// wants the tenant named.
		v.NeedTenant = true
		c.render(w, r, status, webhooksPage(p, v))
		return
	}
	res, err := s.api.Webhooks.List(r.Context(), connect.NewRequest(&apiv1.ListWebhooksRequest{
		Tenant: tenantOf(r, s), PageSize: pageSize, PageToken: r.URL.Query().Get("page")}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	for _, x := range res.Msg.GetWebhooks() {
		v.Rows = append(v.Rows, webhookRowOf(&s.viewer, x))
	}
	v.Next = nextPage(PathWebhooks, r, s, res.Msg.GetNextPageToken(), nil)
	v.Tenant = tenantOf(r, s)
	c.render(w, r, status, webhooksPage(p, v))
}

// createWebhook registers an endpoint; the answer shows its signing secret
// once (no-store, not a redirect: the secret is in no URL).
func (c *Console) createWebhook(w http.ResponseWriter, r *http.Request, s *session) {
	f := r.PostForm
	req := &apiv1.CreateWebhookRequest{Tenant: tenantOf(r, s), Url: strings.TrimSpace(f.Get("url")),
		Description: strings.TrimSpace(f.Get("description"))}
	for t := range strings.SplitSeq(f.Get("types"), ",") {
		if t = strings.TrimSpace(t); t != "" {
			req.Types = append(req.Types, t)
		}
	}
	res, err := s.api.Webhooks.Create(r.Context(), connect.NewRequest(req))
	if err != nil {
		e := apiErrorOf(err)
		c.renderWebhooks(w, r, s, httpStatus(err), webhooksView{Refused: &e}, "")
		return
	}
	c.renderWebhooks(w, r, s, http.StatusOK, webhooksView{Secret: res.Msg.GetSecret(), SecretOf: res.Msg.GetWebhook().GetUrl()},
		"Webhook "+res.Msg.GetWebhook().GetId()+" created.")
}

// rotateWebhook makes a new signing secret, shown once; the old one signs
// too until the API's overlap ends.
func (c *Console) rotateWebhook(w http.ResponseWriter, r *http.Request, s *session) {
	res, err := s.api.Webhooks.RotateSecret(r.Context(), connect.NewRequest(&apiv1.RotateWebhookSecretRequest{
		Tenant: tenantOf(r, s), Webhook: r.PathValue("id")}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	c.renderWebhooks(w, r, s, http.StatusOK, webhooksView{Secret: res.Msg.GetSecret(), SecretOf: res.Msg.GetWebhook().GetUrl()},
		"A new secret for "+res.Msg.GetWebhook().GetId()+"; the previous one also signs until "+
			when(res.Msg.GetWebhook().GetPreviousSecretExpireTime())+".")
}

// testWebhook queues a webhook.test event for the endpoint alone.
func (c *Console) testWebhook(w http.ResponseWriter, r *http.Request, s *session) {
	res, err := s.api.Webhooks.Test(r.Context(), connect.NewRequest(&apiv1.TestWebhookRequest{Tenant: tenantOf(r, s), Webhook: r.PathValue("id")}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	d := res.Msg.GetDelivery()
	c.renderWebhooks(w, r, s, http.StatusOK, webhooksView{},
		"Test delivery "+d.GetId()+" queued ("+d.GetState()+"); follow it with better-compute webhooks deliveries "+d.GetWebhookId()+".")
}

func (c *Console) deleteWebhook(w http.ResponseWriter, r *http.Request, s *session) {
	tenant := tenantOf(r, s)
	if _, err := s.api.Webhooks.Delete(r.Context(), connect.NewRequest(&apiv1.DeleteWebhookRequest{Tenant: tenant, Webhook: r.PathValue("id")})); err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	to := PathWebhooks
	if s.viewer.TenantID == "" && tenant != "" {
		to += "?tenant=" + url.QueryEscape(tenant)
	}
	http.Redirect(w, r, to, http.StatusSeeOther)
}

func webhookActionURL(id, action string) templ.SafeURL {
	return templ.SafeURL(PathWebhooks + "/" + url.PathEscape(id) + "/" + action)
}
