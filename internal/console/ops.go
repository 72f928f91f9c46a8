package console

import (
	"cmp"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"github.com/a-h/templ"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// The operator's pages: nodes (a node's GPUs by NVLink island and NUMA
// node), pools and their offers. Each reads through the public API with
// the viewer's key; the API decides what each may see.

const (
	navNodes = "nodes"
	navPools = "pools"
)

// opsPageSize is how many rows one page of an operator's list shows
// unless its link asks for another size (?size=, 1 to maxOpsPageSize).
const (
	opsPageSize    = 50
	maxOpsPageSize = 200
)

// pageSizeOf is the page size a list's link asks for.
func pageSizeOf(q url.Values) (int32, *apiError) {
	v := q.Get("size")
	if v == "" {
		return opsPageSize, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxOpsPageSize {
		return 0, &apiError{Code: "INVALID_ARGUMENT", Message: fmt.Sprintf("size: must be a number from 1 to %d, got %q", maxOpsPageSize, v)}
	}
	return int32(n), nil
}

// listURL is path with the query q (empty values dropped) and, when next
// is set, the API's page token as page.
func listURL(path string, q url.Values, next string) templ.SafeURL {
	v := url.Values{}
	for k, vals := range q {
		if k != "page" && len(vals) > 0 && vals[0] != "" {
			v.Set(k, vals[0])
		}
	}
	if next != "" {
		v.Set("page", next)
	}
	if len(v) == 0 {
		return templ.SafeURL(path)
	}
	return templ.SafeURL(path + "?" + v.Encode())
}

// itemURL is a detail page's link, naming the item's tenant for a platform
// key (a tenant's viewer always reads their own).
func itemURL(base, id, tenant string) templ.SafeURL {
	u := base + "/" + url.PathEscape(id)
	if tenant != "" {
		u += "?tenant=" + url.QueryEscape(tenant)
	}
	return templ.SafeURL(u)
}

// platformTenant is the tenant to name in links: the item's, for a
// platform key only.
func platformTenant(v *viewer, tenantID string) string {
	if v.TenantID == "" {
		return tenantID
	}
	return ""
}

// nodeFilter is the nodes list's GET form, as the API's List takes it.
type nodeFilter struct {
	Tenant, Project, State, Liveness string
}

// nodeStates and nodeLiveness are the values NodeService.List filters by.
var (
	nodeStates   = []string{"joining", "active", "draining", "drained", "retired"}
	nodeLiveness = []string{"ready", "unreachable", "lost"}
)

// nodeRow is a node as the list shows it.
type nodeRow struct {
	ID, Name, Tenant, Pool, State, Liveness, Model, Labels, Heartbeat string
	GPUs                                                              int32
	URL                                                               templ.SafeURL
}

func nodeRowOf(v *viewer, n *apiv1.Node) nodeRow {
	return nodeRow{ID: n.GetId(), Name: n.GetName(), Tenant: n.GetTenantId(), Pool: cmp.Or(n.GetPool(), "—"),
		State: n.GetState(), Liveness: n.GetLiveness(), Model: cmp.Or(n.GetGpuModel(), "—"), Labels: labelsText(n.GetLabels()),
		Heartbeat: when(n.GetLastHeartbeat()), GPUs: n.GetGpuCount(), URL: itemURL(PathNodes, n.GetId(), platformTenant(v, n.GetTenantId()))}
}

// labelsText is a label map as key=value pairs in key order.
func labelsText(m map[string]string) string {
	keys := slices.Sorted(maps.Keys(m))
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ", ")
}

func (c *Console) nodes(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	f := nodeFilter{Tenant: tenantOf(r, s), Project: q.Get("project"), State: q.Get("state"), Liveness: q.Get("liveness")}
	size, bad := pageSizeOf(q)
	if bad != nil {
		c.fail(w, r, s, http.StatusBadRequest, *bad)
		return
	}
	res, err := s.api.Nodes.List(r.Context(), connect.NewRequest(&apiv1.ListNodesRequest{Tenant: f.Tenant, Project: f.Project,
		State: f.State, Liveness: f.Liveness, PageSize: size, PageToken: q.Get("page")}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	rows := make([]nodeRow, 0, len(res.Msg.GetNodes()))
	for _, n := range res.Msg.GetNodes() {
		rows = append(rows, nodeRowOf(&s.viewer, n))
	}
	next := ""
	if t := res.Msg.GetNextPageToken(); t != "" {
		next = string(listURL(PathNodes, q, t))
	}
	p := page{Title: "Nodes", Nav: navNodes, Viewer: &s.viewer, CSRF: s.row.CSRFToken}
	c.render(w, r, http.StatusOK, nodesPage(p, f, rows, templ.SafeURL(next)))
}

// gpuCell is one GPU of a node page with its state and holders.
type gpuCell struct {
	Index                                int32
	UUID, Model, Memory, PCI, MIG, State string
	// Reason is why a GPU is out of service.
	Reason  string
	Holders []holder
}

// holder is a reservation holding a GPU; URL is empty when the viewer
// cannot open it (another tenant's, on an offered pool).
type holder struct {
	ID  string
	URL templ.SafeURL
}

// numaGroup is the GPUs of one island on one NUMA node.
type numaGroup struct {
	Label, CPUs string
	GPUs        []gpuCell
}

// islandGroup is the GPUs one NVLink island joins, by NUMA node.
type islandGroup struct {
	Label string
	NUMA  []numaGroup
}

// nodeView is what the node page shows.
type nodeView struct {
	Node         nodeRow
	Project      string
	Mode, Agent  string
	Attestor     string
	Health       string
	GPUsOut      int32
	Derived      string
	Conditions   []*apiv1.NodeCondition
	Islands      []islandGroup
	Findings     []*apiv1.HealthFinding
	Inventoried  bool
	HoldersKnown bool
}

// GPU states as the node page names them (and its CSS classes).
const (
	gpuFree        = "free"
	gpuBooked      = "booked"
	gpuQuarantined = "quarantined"
	gpuUnhealthy   = "unhealthy"
)

// liveStates are the reservation states that hold GPUs.
const liveStates = "placed,binding,active"

// maxHolderPages bounds the reservation pages a node page reads to find
// its GPUs' holders.
const maxHolderPages = 10

func (c *Console) node(w http.ResponseWriter, r *http.Request, s *session) {
	ctx := r.Context()
	res, err := s.api.Nodes.Get(ctx, connect.NewRequest(&apiv1.GetNodeRequest{Tenant: tenantOf(r, s), Node: r.PathValue("id")}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	n := res.Msg.GetNode()
	// The node's own tenant from here on: a platform key reads any.
	tenant := n.GetTenantId()
	inv, err := s.api.Inventory.Get(ctx, connect.NewRequest(&apiv1.GetInventoryRequest{Tenant: tenant, Node: n.GetId()}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	health, err := s.api.Health.GetNodeHealth(ctx, connect.NewRequest(&apiv1.GetNodeHealthRequest{Tenant: tenant, Node: n.GetId()}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	v := nodeView{Node: nodeRowOf(&s.viewer, n), Project: n.GetProjectId(), Mode: n.GetMode(), Agent: n.GetAgentVersion(),
		Attestor: n.GetAttestor(), Health: health.Msg.GetHealth().GetStatus(), GPUsOut: health.Msg.GetHealth().GetGpusOut(),
		Derived: labelsText(n.GetDerivedLabels()), Conditions: n.GetConditions(), Findings: openFindings(health.Msg.GetHealth().GetFindings()),
		Inventoried: len(inv.Msg.GetGpus()) > 0}
	holders, known := map[string][]holder{}, false
	if n.GetPool() != "" {
		holders, err = c.gpuHolders(r, s, tenant, n)
		if err != nil {
			c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
			return
		}
		known = true
	}
	v.HoldersKnown = known
	v.Islands = gpuLayout(inv.Msg, health.Msg.GetHealth().GetGpus(), holders)
	p := page{Title: "Node " + n.GetName(), Nav: navNodes, Viewer: &s.viewer, CSRF: s.row.CSRFToken}
	c.render(w, r, http.StatusOK, nodePage(p, v))
}

// gpuHolders maps each GPU UUID of node n to the reservations holding it:
// the live reservations on the node's pool, every tenant's where the pool
// is offered (the API lists those to the pool's owner).
func (c *Console) gpuHolders(r *http.Request, s *session, tenant string, n *apiv1.Node) (map[string][]holder, error) {
	out := map[string][]holder{}
	token := ""
	for range maxHolderPages {
		res, err := s.api.Reservations.List(r.Context(), connect.NewRequest(&apiv1.ListReservationsRequest{Tenant: tenant, Pool: n.GetPool(),
			State: liveStates, OnOwnedPools: true, PageSize: 200, PageToken: token}))
		if err != nil {
			return nil, err
		}
		for _, x := range res.Msg.GetReservations() {
			if x.GetPlacement().GetNodeId() != n.GetId() {
				continue
			}
			h := holder{ID: x.GetId()}
			// A tenant's viewer opens only their own reservations.
			if s.viewer.TenantID == "" || x.GetTenantId() == s.viewer.TenantID {
				h.URL = reservationURL(x.GetId(), platformTenant(&s.viewer, x.GetTenantId()))
			}
			seen := map[string]bool{}
			for _, atom := range x.GetPlacement().GetAtoms() {
				// Atoms: <uuid>, <uuid>/mig/<profile>/<n>, <uuid>/s<k>.
				uuid, _, _ := strings.Cut(atom, "/")
				if !seen[uuid] {
					seen[uuid] = true
					out[uuid] = append(out[uuid], h)
				}
			}
		}
		token = res.Msg.GetNextPageToken()
		if token == "" {
			break
		}
	}
	return out, nil
}

func openFindings(fs []*apiv1.HealthFinding) []*apiv1.HealthFinding {
	var out []*apiv1.HealthFinding
	for _, f := range fs {
		if f.GetState() == "open" {
			out = append(out, f)
		}
	}
	return out
}

// gpuLayout groups the inventory's GPUs by NVLink island (the GPUs its
// links join: connected components, numbered by their lowest GPU index)
// and then by NUMA node, each GPU with its state.
func gpuLayout(inv *apiv1.GetInventoryResponse, health []*apiv1.GpuHealth, holders map[string][]holder) []islandGroup {
	gpus := slices.Clone(inv.GetGpus())
	slices.SortFunc(gpus, func(a, b *apiv1.Gpu) int { return cmp.Compare(a.GetIndex(), b.GetIndex()) })
	parent := map[string]string{}
	var find func(string) string
	find = func(u string) string {
		if p, ok := parent[u]; ok && p != u {
			parent[u] = find(p)
			return parent[u]
		}
		return u
	}
	linked := map[string]bool{}
	for _, l := range inv.GetNvlinks() {
		a, b := find(l.GetGpuUuid()), find(l.GetPeerUuid())
		linked[l.GetGpuUuid()], linked[l.GetPeerUuid()] = true, true
		if a != b {
			parent[b] = a
		}
	}
	cpus := map[int32]string{}
	for _, nn := range inv.GetNumaNodes() {
		cpus[nn.GetId()] = nn.GetCpus()
	}
	byUUID := map[string]*apiv1.GpuHealth{}
	for _, h := range health {
		byUUID[h.GetUuid()] = h
	}
	var islands []islandGroup
	at := map[string]int{}
	for _, g := range gpus {
		key, label := "", "No NVLink"
		if linked[g.GetUuid()] {
			key = find(g.GetUuid())
		}
		i, ok := at[key]
		if !ok {
			if key != "" {
				label = "NVLink island " + strconv.Itoa(len(islands))
			}
			i = len(islands)
			at[key] = i
			islands = append(islands, islandGroup{Label: label})
		}
		cell := gpuCell{Index: g.GetIndex(), UUID: g.GetUuid(), Model: g.GetModel(), PCI: g.GetPciBusId(),
			Memory: fmt.Sprintf("%d GiB", g.GetMemoryMib()/1024), MIG: migText(g), Holders: holders[g.GetUuid()]}
		h := byUUID[g.GetUuid()]
		switch {
		case h.GetState() == "quarantined":
			cell.State, cell.Reason = gpuQuarantined, h.GetReason()
		case h.GetState() == "rma":
			cell.State, cell.Reason = gpuUnhealthy, cmp.Or(h.GetReason(), "marked for RMA")
		case len(cell.Holders) > 0 || h.GetReservations() > 0:
			cell.State = gpuBooked
		default:
			cell.State = gpuFree
		}
		isl := &islands[i]
		numa := "NUMA node " + strconv.Itoa(int(g.GetNumaNode()))
		if g.GetNumaNode() < 0 {
			numa = "NUMA node unknown"
		}
		j := slices.IndexFunc(isl.NUMA, func(n numaGroup) bool { return n.Label == numa })
		if j < 0 {
			isl.NUMA = append(isl.NUMA, numaGroup{Label: numa, CPUs: cpus[g.GetNumaNode()]})
			j = len(isl.NUMA) - 1
		}
		isl.NUMA[j].GPUs = append(isl.NUMA[j].GPUs, cell)
	}
	for i := range islands {
		slices.SortStableFunc(islands[i].NUMA, func(a, b numaGroup) int { return cmp.Compare(a.Label, b.Label) })
	}
	return islands
}

func migText(g *apiv1.Gpu) string {
	if g.GetMigMode() != "enabled" {
		return "off"
	}
	profiles := make([]string, 0, len(g.GetMigInstances()))
	for _, m := range g.GetMigInstances() {
		profiles = append(profiles, m.GetProfile())
	}
	if len(profiles) == 0 {
		return "on, no instances"
	}
	return "on: " + strings.Join(profiles, ", ")
}

// poolRow is a pool as the list and its page show it.
type poolRow struct {
	ID, Name, Tenant, Owner, State, Selector, Offer, Created string
	URL                                                      templ.SafeURL
}

func poolRowOf(v *viewer, x *apiv1.Pool) poolRow {
	return poolRow{ID: x.GetId(), Name: x.GetName(), Tenant: x.GetTenantId(), Owner: cmp.Or(x.GetOwner(), x.GetTenantId()),
		State: x.GetState(), Selector: selectorText(x.GetSelector()), Offer: offerText(x.GetOffer()), Created: when(x.GetCreateTime()),
		URL: itemURL(PathPools, x.GetId(), platformTenant(v, x.GetTenantId()))}
}

// selectorText is a pool's selector as the CLI takes it.
func selectorText(sel []*apiv1.SelectorRequirement) string {
	if len(sel) == 0 {
		return "every node of the tenant"
	}
	parts := make([]string, 0, len(sel))
	for _, r := range sel {
		switch r.GetOperator() {
		case "Exists", "DoesNotExist":
			parts = append(parts, r.GetKey()+" "+r.GetOperator())
		default:
			parts = append(parts, r.GetKey()+" "+r.GetOperator()+" ("+strings.Join(r.GetValues(), ", ")+")")
		}
	}
	return strings.Join(parts, "; ")
}

// offerText says to whom besides its owner a pool is offered.
func offerText(o *apiv1.PoolOffer) string {
	switch o.GetScope() {
	case "", "private":
		return "not offered (the owner only)"
	case "all":
		return "offered to every tenant"
	default:
		return "offered to " + strings.Join(o.GetTenants(), ", ")
	}
}

func (c *Console) pools(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	tenant := tenantOf(r, s)
	archived := q.Get("archived") == "1"
	size, bad := pageSizeOf(q)
	if bad != nil {
		c.fail(w, r, s, http.StatusBadRequest, *bad)
		return
	}
	res, err := s.api.Pools.List(r.Context(), connect.NewRequest(&apiv1.ListPoolsRequest{Tenant: tenant, IncludeArchived: archived,
		PageSize: size, PageToken: q.Get("page")}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	rows := make([]poolRow, 0, len(res.Msg.GetPools()))
	for _, x := range res.Msg.GetPools() {
		rows = append(rows, poolRowOf(&s.viewer, x))
	}
	next := ""
	if t := res.Msg.GetNextPageToken(); t != "" {
		next = string(listURL(PathPools, q, t))
	}
	p := page{Title: "Pools and offers", Nav: navPools, Viewer: &s.viewer, CSRF: s.row.CSRFToken}
	c.render(w, r, http.StatusOK, poolsPage(p, tenant, archived, rows, templ.SafeURL(next)))
}

func (c *Console) pool(w http.ResponseWriter, r *http.Request, s *session) {
	ctx := r.Context()
	res, err := s.api.Pools.Get(ctx, connect.NewRequest(&apiv1.GetPoolRequest{Tenant: tenantOf(r, s), Pool: r.PathValue("id")}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	x := res.Msg.GetPool()
	capRes, err := s.api.Capacity.ByPool(ctx, connect.NewRequest(&apiv1.CapacityByPoolRequest{Tenant: x.GetTenantId(), Pool: x.GetId()}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	var rows []capacityRow
	var total capacityRow
	for _, y := range capRes.Msg.GetRows() {
		row := capacityRow{Pool: y.GetPool(), Model: y.GetModel(), Kind: y.GetKind(), Total: y.GetTotal(), Free: y.GetFree(),
			Booked: y.GetBooked(), Quarantined: y.GetQuarantined(), Pending: y.GetPending()}
		rows = append(rows, row)
		total.Total += row.Total
		total.Free += row.Free
		total.Booked += row.Booked
		total.Quarantined += row.Quarantined
		total.Pending += row.Pending
	}
	slices.SortFunc(rows, func(a, b capacityRow) int { return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.Kind, b.Kind)) })
	p := page{Title: "Pool " + x.GetName(), Nav: navPools, Viewer: &s.viewer, CSRF: s.row.CSRFToken}
	c.render(w, r, http.StatusOK, poolPage(p, poolRowOf(&s.viewer, x), rows, total))
}
