package console

import "github.com/a-h/templ"

// Pages the console's navigation names, in the order it shows them. Each
// page's handler is registered in New; a test keeps the two together.
const (
	PathNodes         = "/console/nodes"
	PathPools         = "/console/pools"
	PathMachines      = "/console/machines"
	PathSites         = "/console/sites"
	PathImages        = "/console/images"
	PathEvents        = "/console/events"
	PathAudit         = "/console/audit"
	PathQuotas        = "/console/quotas"
	PathUsage         = "/console/usage"
	PathInstances     = "/console/instances"
	PathSandboxes     = "/console/sandboxes"
	PathAPIKeys       = "/console/api-keys"
	PathWebhooks      = "/console/webhooks"
	PathConfirmations = "/console/confirmations"
)

// navItem is one link of the console's navigation. Nav is the value a
// page's page.Nav carries to mark the link current.
type navItem struct {
	Nav, Label, Path string
	// Operator: shown to platform keys and to a tenant's admins and
	// operators, who run their own tenant's machines. It only hides the
	// link: the API decides what each page may read.
	Operator bool
	// Admin: shown to platform keys and to a tenant's admins, the only
	// ones the API lets read it.
	Admin bool
}

var navItems = []navItem{
	{Nav: navOverview, Label: "Fleet overview", Path: PathOverview},
	{Nav: "nodes", Label: "Nodes", Path: PathNodes, Operator: true},
	{Nav: "pools", Label: "Pools and offers", Path: PathPools, Operator: true},
	{Nav: "machines", Label: "Machines", Path: PathMachines, Operator: true},
	{Nav: "sites", Label: "Sites", Path: PathSites, Operator: true},
	{Nav: "images", Label: "Images", Path: PathImages, Operator: true},
	{Nav: navReservations, Label: "Reservations", Path: PathReservations},
	{Nav: "instances", Label: "Instances", Path: PathInstances},
	{Nav: "sandboxes", Label: "Sandboxes", Path: PathSandboxes},
	{Nav: "usage", Label: "Usage", Path: PathUsage},
	{Nav: "quotas", Label: "Quotas", Path: PathQuotas, Operator: true},
	{Nav: "confirmations", Label: "Confirmations", Path: PathConfirmations},
	{Nav: "events", Label: "Events", Path: PathEvents},
	{Nav: "audit", Label: "Audit", Path: PathAudit, Operator: true},
	{Nav: "api-keys", Label: "API keys", Path: PathAPIKeys, Admin: true},
	{Nav: "webhooks", Label: "Webhooks", Path: PathWebhooks},
}

// isOperator reports whether the viewer runs machines: a platform key, or a
// tenant's admin or operator.
func (v *viewer) isOperator() bool {
	return v != nil && (v.TenantID == "" || v.Role == "admin" || v.Role == "operator")
}

// isAdmin reports whether the viewer administers a tenant or the platform.
func (v *viewer) isAdmin() bool {
	return v != nil && (v.TenantID == "" || v.Role == "admin")
}

// NavPathsFor is the pages the navigation shows a person of role in a
// tenant (tenantID empty: a platform key).
func NavPathsFor(tenantID, role string) []string {
	var out []string
	for _, it := range navFor(&viewer{TenantID: tenantID, Role: role}) {
		out = append(out, it.Path)
	}
	return out
}

// navFor is the navigation the viewer sees.
func navFor(v *viewer) []navItem {
	out := make([]navItem, 0, len(navItems))
	for _, it := range navItems {
		if (!it.Operator || v.isOperator()) && (!it.Admin || v.isAdmin()) {
			out = append(out, it)
		}
	}
	return out
}

// NavPaths is every page the console's navigation names, in its order: the
// pages the browser tests and the first-paint benchmark open.
func NavPaths() []string {
	out := make([]string, 0, len(navItems))
	for _, it := range navItems {
		out = append(out, it.Path)
	}
	return out
}

func (it navItem) URL() templ.SafeURL { return templ.SafeURL(it.Path) }
