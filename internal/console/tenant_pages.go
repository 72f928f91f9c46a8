package console

import (
	"cmp"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/a-h/templ"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// Nav values of the tenant pages (navItems in nav.go names them).
const (
	navUsage   = "usage"
	navAPIKeys = "api-keys"
)

// usagePageSize is how many hourly windows one usage page lists.
const usagePageSize = 200

// usageRow is one hour of one metric of one reservation.
type usageRow struct {
	Hour, Metric, Reservation, Project, Quantity string
	// Partial: the hour is still open; its quantity may still grow.
	Partial bool
}

// usageTotal is one metric's sum over the windows a page lists.
type usageTotal struct {
	Metric, Quantity string
	Windows          int
	sum              float64
}

func usageQuantity(q float64) string { return strconv.FormatFloat(q, 'f', 2, 64) }

// usage lists the tenant's hourly usage windows (UsageService.List), newest
// as the API orders them, with each metric's total over the page.
func (c *Console) usage(w http.ResponseWriter, r *http.Request, s *session) {
	p := page{Title: "Usage", Nav: navUsage, Viewer: &s.viewer, CSRF: s.row.CSRFToken}
	q := r.URL.Query()
	metric := strings.TrimSpace(q.Get("metric"))
	res, err := s.api.Usage.List(r.Context(), connect.NewRequest(&apiv1.ListUsageRequest{
		Tenant: tenantOf(r, s), Metric: metric, PageSize: usagePageSize, PageToken: q.Get("page")}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	sums := map[string]*usageTotal{}
	rows := make([]usageRow, 0, len(res.Msg.GetWindows()))
	for _, x := range res.Msg.GetWindows() {
		rows = append(rows, usageRow{Hour: when(x.GetWindowStart()), Metric: x.GetMetric(), Reservation: x.GetReservationId(),
			Project: x.GetProjectId(), Quantity: usageQuantity(x.GetQuantity()), Partial: x.GetPartial()})
		t := sums[x.GetMetric()]
		if t == nil {
			t = &usageTotal{Metric: x.GetMetric()}
			sums[x.GetMetric()] = t
		}
		t.Windows++
		t.sum += x.GetQuantity()
	}
	totals := make([]usageTotal, 0, len(sums))
	var gpuHours float64
	for m, t := range sums {
		t.Quantity = usageQuantity(t.sum)
		totals = append(totals, *t)
		if strings.HasPrefix(m, "gpu.") {
			gpuHours += t.sum
		}
	}
	slices.SortFunc(totals, func(a, b usageTotal) int { return cmp.Compare(a.Metric, b.Metric) })
	var extra url.Values
	if metric != "" {
		extra = url.Values{"metric": {metric}}
	}
	next := nextPage(PathUsage, r, s, res.Msg.GetNextPageToken(), extra)
	tenant := ""
	if s.viewer.TenantID == "" {
		tenant = q.Get("tenant")
	}
	c.render(w, r, http.StatusOK, usagePage(p, usageView{Metric: metric, Tenant: tenant, Rows: rows, Totals: totals,
		GPUHours: usageQuantity(gpuHours), Next: next}))
}

type usageView struct {
	Metric, Tenant string
	Rows           []usageRow
	Totals         []usageTotal
	GPUHours       string
	Next           string
}

// apiKeyRow is an API key as the console lists it; never its secret.
type apiKeyRow struct {
	ID, Name, Role, Kind, Prefix, Created, Expires, State string
	Live                                                  bool
	TenantQuery                                           string
}

func apiKeyRowOf(v *viewer, k *apiv1.ApiKey, now time.Time) apiKeyRow {
	row := apiKeyRow{ID: k.GetId(), Name: k.GetName(), Role: k.GetRole(), Kind: k.GetKind(), Prefix: k.GetPrefix(),
		Created: when(k.GetCreateTime()), Expires: "never", State: "live", Live: true}
	if k.GetExpireTime() != nil {
		row.Expires = when(k.GetExpireTime())
		if !k.GetExpireTime().AsTime().After(now) {
			row.State, row.Live = "expired", false
		}
	}
	if k.GetRevokeTime() != nil {
		row.State, row.Live = "revoked "+when(k.GetRevokeTime()), false
	}
	if v.TenantID == "" {
		row.TenantQuery = k.GetTenantId()
	}
	return row
}

// apiKeys lists the tenant's API keys (ApiKeyService.List; credentials are
// the tenant admin's, and the API refuses the others), with a create form
// and a revoke button for each live one.
func (c *Console) apiKeys(w http.ResponseWriter, r *http.Request, s *session) {
	c.renderAPIKeys(w, r, s, http.StatusOK, nil, nil)
}

// createdKey is a key just made: its secret, shown on that one answer.
type createdKey struct {
	Row    apiKeyRow
	Secret string
}

func (c *Console) renderAPIKeys(w http.ResponseWriter, r *http.Request, s *session, status int, created *createdKey, refused *apiError) {
	p := page{Title: "API keys", Nav: navAPIKeys, Viewer: &s.viewer, CSRF: s.row.CSRFToken}
	q := r.URL.Query()
	revoked := q.Get("revoked") != ""
	res, err := s.api.ApiKeys.List(r.Context(), connect.NewRequest(&apiv1.ListApiKeysRequest{
		Tenant: tenantOf(r, s), PageSize: pageSize, PageToken: q.Get("page"), IncludeRevoked: revoked}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	now := c.cfg.Clock.Now()
	rows := make([]apiKeyRow, 0, len(res.Msg.GetApiKeys()))
	for _, k := range res.Msg.GetApiKeys() {
		rows = append(rows, apiKeyRowOf(&s.viewer, k, now))
	}
	var extra url.Values
	if revoked {
		extra = url.Values{"revoked": {"1"}}
	}
	next := nextPage(PathAPIKeys, r, s, res.Msg.GetNextPageToken(), extra)
	c.render(w, r, status, apiKeysPage(p, apiKeysView{Rows: rows, Next: next, Revoked: revoked, Created: created, Refused: refused,
		Tenant: tenantOf(r, s)}))
}

type apiKeysView struct {
	Rows    []apiKeyRow
	Next    string
	Revoked bool
	Created *createdKey
	Refused *apiError
	// Tenant is the tenant a platform key's form acts in.
	Tenant string
}

// createAPIKey makes a key with the viewer's key and answers the list with
// the new secret shown once: the answer is not cached (no-store) and no
// later page has it.
func (c *Console) createAPIKey(w http.ResponseWriter, r *http.Request, s *session) {
	f := r.PostForm
	req := &apiv1.CreateApiKeyRequest{Tenant: tenantOf(r, s), Name: strings.TrimSpace(f.Get("name")), Role: f.Get("role")}
	if ttl := strings.TrimSpace(f.Get("ttl")); ttl != "" {
		d, err := parseTenantSpan(ttl)
		if err != nil || d <= 0 {
			c.renderAPIKeys(w, r, s, http.StatusBadRequest, nil, fieldRefusal("ttl", fmt.Sprintf("must be a span such as 30d or 12h, got %q", ttl)))
			return
		}
		req.TtlSeconds = int64(d / time.Second)
	}
	res, err := s.api.ApiKeys.Create(r.Context(), connect.NewRequest(req))
	if err != nil {
		e := apiErrorOf(err)
		c.renderAPIKeys(w, r, s, httpStatus(err), nil, &e)
		return
	}
	c.renderAPIKeys(w, r, s, http.StatusOK, &createdKey{Row: apiKeyRowOf(&s.viewer, res.Msg.GetApiKey(), c.cfg.Clock.Now()),
		Secret: res.Msg.GetSecret()}, nil)
}

// revokeAPIKey revokes a key with the viewer's key, then shows the list.
func (c *Console) revokeAPIKey(w http.ResponseWriter, r *http.Request, s *session) {
	tenant := tenantOf(r, s)
	_, err := s.api.ApiKeys.Revoke(r.Context(), connect.NewRequest(&apiv1.RevokeApiKeyRequest{Tenant: tenant, Id: r.PathValue("id")}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	to := PathAPIKeys + "?revoked=1"
	if s.viewer.TenantID == "" && tenant != "" {
		to += "&tenant=" + url.QueryEscape(tenant)
	}
	http.Redirect(w, r, to, http.StatusSeeOther)
}

// nextPage is the link to a list's next page: its token, the list's own
// query values, and for a platform key the tenant it lists.
func nextPage(base string, r *http.Request, s *session, token string, extra url.Values) string {
	if token == "" {
		return ""
	}
	v := url.Values{"page": {token}}
	for k, vs := range extra {
		v[k] = vs
	}
	if t := r.URL.Query().Get("tenant"); s.viewer.TenantID == "" && t != "" {
		v.Set("tenant", t)
	}
	return base + "?" + v.Encode()
}

func revokeKeyURL(id string) templ.SafeURL {
	return templ.SafeURL(PathAPIKeys + "/" + url.PathEscape(id) + "/revoke")
}
