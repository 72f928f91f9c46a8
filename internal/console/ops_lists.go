package console

import (
	"cmp"
	"fmt"
	"net/http"
	"strconv"

	"connectrpc.com/connect"
	"github.com/a-h/templ"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// The operator's plain lists: sites, images, the audit log and quotas with
// what each holds. Each is one API List with the filters it takes, a page
// at a time.

const (
	navSites  = "sites"
	navImages = "images"
	navAudit  = "audit"
	navQuotas = "quotas"
)

// listPage is what every plain list's page has besides its rows.
type listPage struct {
	Tenant string
	Next   templ.SafeURL
}

// listStart reads what every list takes: the tenant and the page size.
func (c *Console) listStart(w http.ResponseWriter, r *http.Request, s *session) (string, int32, bool) {
	size, bad := pageSizeOf(r.URL.Query())
	if bad != nil {
		c.fail(w, r, s, http.StatusBadRequest, *bad)
		return "", 0, false
	}
	return tenantOf(r, s), size, true
}

func nextOf(r *http.Request, path, token string) templ.SafeURL {
	if token == "" {
		return ""
	}
	return listURL(path, r.URL.Query(), token)
}

// siteRow is a site as its list shows it.
type siteRow struct {
	ID, Name, Tenant, DHCP, Networks, Description, Created string
}

func (c *Console) sites(w http.ResponseWriter, r *http.Request, s *session) {
	tenant, size, ok := c.listStart(w, r, s)
	if !ok {
		return
	}
	res, err := s.api.Sites.List(r.Context(), connect.NewRequest(&apiv1.ListSitesRequest{Tenant: tenant, PageSize: size,
		PageToken: r.URL.Query().Get("page")}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	var rows []siteRow
	for _, x := range res.Msg.GetSites() {
		nets := ""
		for i, n := range x.GetNetworks() {
			if i > 0 {
				nets += ", "
			}
			nets += n
		}
		rows = append(rows, siteRow{ID: x.GetId(), Name: x.GetName(), Tenant: x.GetTenantId(), DHCP: x.GetDhcpMode(), Networks: nets,
			Description: x.GetDescription(), Created: when(x.GetCreateTime())})
	}
	p := page{Title: "Sites", Nav: navSites, Viewer: &s.viewer, CSRF: s.row.CSRFToken}
	c.render(w, r, http.StatusOK, sitesPage(p, listPage{Tenant: tenant, Next: nextOf(r, PathSites, res.Msg.GetNextPageToken())}, rows))
}

// imageRow is an image as its list shows it.
type imageRow struct {
	ID, Name, Tenant, Kind, Visibility, Digest, Size, Signed, Created string
}

func (c *Console) images(w http.ResponseWriter, r *http.Request, s *session) {
	tenant, size, ok := c.listStart(w, r, s)
	if !ok {
		return
	}
	res, err := s.api.Images.List(r.Context(), connect.NewRequest(&apiv1.ListImagesRequest{Tenant: tenant, PageSize: size,
		PageToken: r.URL.Query().Get("page")}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	var rows []imageRow
	for _, x := range res.Msg.GetImages() {
		row := imageRow{ID: x.GetId(), Name: x.GetName(), Tenant: cmp.Or(x.GetTenantId(), "platform"), Kind: x.GetKind(),
			Visibility: x.GetVisibility(), Digest: x.GetSha256(), Size: mib(x.GetSizeBytes()), Created: when(x.GetCreateTime())}
		if len(row.Digest) > 12 {
			row.Digest = row.Digest[:12]
		}
		switch {
		case x.GetPlatformSigned():
			row.Signed = "signed by the platform"
		case x.GetTrusted():
			row.Signed = "signed by a trusted key"
		case len(x.GetSignatures()) > 0:
			row.Signed = strconv.Itoa(len(x.GetSignatures())) + " signatures, none trusted"
		default:
			row.Signed = "unsigned"
		}
		rows = append(rows, row)
	}
	p := page{Title: "Images", Nav: navImages, Viewer: &s.viewer, CSRF: s.row.CSRFToken}
	c.render(w, r, http.StatusOK, imagesPage(p, listPage{Tenant: tenant, Next: nextOf(r, PathImages, res.Msg.GetNextPageToken())}, rows))
}

func mib(n int64) string {
	if n < 1<<20 {
		return fmt.Sprintf("%d KiB", (n+1023)/1024)
	}
	return fmt.Sprintf("%d MiB", (n+(1<<20)-1)>>20)
}

// auditFilter is the audit log's GET form, as AuditService.List takes it.
type auditFilter struct {
	Tenant, Action string
}

func (c *Console) audit(w http.ResponseWriter, r *http.Request, s *session) {
	tenant, size, ok := c.listStart(w, r, s)
	if !ok {
		return
	}
	f := auditFilter{Tenant: tenant, Action: r.URL.Query().Get("action")}
	res, err := s.api.Audit.List(r.Context(), connect.NewRequest(&apiv1.ListAuditRequest{Tenant: f.Tenant, Action: f.Action, PageSize: size,
		PageToken: r.URL.Query().Get("page")}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	p := page{Title: "Audit log", Nav: navAudit, Viewer: &s.viewer, CSRF: s.row.CSRFToken}
	c.render(w, r, http.StatusOK, auditPage(p, f, res.Msg.GetEntries(), nextOf(r, PathAudit, res.Msg.GetNextPageToken())))
}

// quotaRow is a quota with what its scope holds.
type quotaRow struct {
	ID, Tenant, Project, Model, Pool, GPUs, GPUHours string
	// Over: the scope holds all the quota allows (or more).
	Over bool
}

func (c *Console) quotas(w http.ResponseWriter, r *http.Request, s *session) {
	tenant, size, ok := c.listStart(w, r, s)
	if !ok {
		return
	}
	res, err := s.api.Quotas.List(r.Context(), connect.NewRequest(&apiv1.ListQuotasRequest{Tenant: tenant, Project: r.URL.Query().Get("project"),
		PageSize: size, PageToken: r.URL.Query().Get("page")}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	var rows []quotaRow
	for _, x := range res.Msg.GetQuotas() {
		row := quotaRow{ID: x.GetId(), Tenant: x.GetTenantId(), Project: cmp.Or(x.GetProjectId(), "every project"),
			Model: cmp.Or(x.GetModel(), "every model"), Pool: cmp.Or(x.GetPoolId(), "every pool")}
		row.GPUs = fmt.Sprintf("%d of %s", x.GetGpusUsed(), limitText(x.GetGpus() < 0, strconv.Itoa(int(x.GetGpus()))))
		row.GPUHours = fmt.Sprintf("%.1f of %s", x.GetGpuHoursUsed(), limitText(x.GetGpuHours() < 0, strconv.FormatFloat(x.GetGpuHours(), 'f', 1, 64)))
		row.Over = (x.GetGpus() >= 0 && x.GetGpusUsed() >= x.GetGpus()) || (x.GetGpuHours() >= 0 && x.GetGpuHoursUsed() >= x.GetGpuHours())
		rows = append(rows, row)
	}
	p := page{Title: "Quotas and usage", Nav: navQuotas, Viewer: &s.viewer, CSRF: s.row.CSRFToken}
	c.render(w, r, http.StatusOK, quotasPage(p, listPage{Tenant: tenant, Next: nextOf(r, PathQuotas, res.Msg.GetNextPageToken())},
		r.URL.Query().Get("project"), rows))
}

func limitText(unlimited bool, n string) string {
	if unlimited {
		return "unlimited"
	}
	return n
}
