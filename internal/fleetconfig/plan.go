package fleetconfig

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"connectrpc.com/connect"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/capacity/quota"
)

// Actions a plan holds.
const (
	ActionCreate = "create"
	ActionChange = "change"
	// ActionReplace is a change the API cannot make in place (flavors and
	// IP pools have no update): apply refuses it, naming the fields.
	ActionReplace = "replace"
	ActionDelete  = "delete"
	// ActionMark records the managed mark of an object that already
	// matches its document; it changes nothing of the object.
	ActionMark = "mark"
)

// FieldDiff is one field's change, old → new; "" is unset.
type FieldDiff struct {
	Path, Old, New string
}

// Change is one object's step of a plan.
type Change struct {
	Action string
	Kind   string
	// Tenant is the tenant's name; empty for the platform's.
	Tenant string
	Name   string
	// Where is the document (file:N); empty for a delete.
	Where  string
	Fields []FieldDiff

	doc  *Document
	live liveObject
}

// Object names the change's object: Kind tenant/name, or Kind name for the
// platform's.
func (c Change) Object() string {
	if c.Tenant == "" {
		return c.Kind + " " + c.Name + " (platform)"
	}
	return c.Kind + " " + c.Tenant + "/" + c.Name
}

// Plan is what apply would do, in the order it would do it.
type Plan struct {
	Changes []Change
	// Marks are objects that match their documents but whose managed mark
	// is missing or records another spec: apply marks them after the
	// changes. They are not changes.
	Marks []Change
}

// HasChanges says whether applying the plan would change anything.
func (p *Plan) HasChanges() bool { return len(p.Changes) > 0 }

// Write prints the plan for humans.
func (p *Plan) Write(w io.Writer) {
	if !p.HasChanges() {
		fmt.Fprintln(w, "No changes: the live state matches the documents.")
		return
	}
	counts := map[string]int{}
	for _, c := range p.Changes {
		counts[c.Action]++
		mark := map[string]string{ActionCreate: "+", ActionChange: "~", ActionReplace: "!", ActionDelete: "-"}[c.Action]
		where := ""
		if c.Where != "" {
			where = "  (" + c.Where + ")"
		}
		fmt.Fprintf(w, "%s %s %s%s\n", mark, c.Action, c.Object(), where)
		for _, f := range c.Fields {
			switch c.Action {
			case ActionCreate:
				fmt.Fprintf(w, "    %s: %s\n", f.Path, f.New)
			default:
				fmt.Fprintf(w, "    %s: %s → %s\n", f.Path, unsetOr(f.Old), unsetOr(f.New))
			}
		}
		if c.Action == ActionCreate && c.Kind == KindImage {
			fmt.Fprintf(w, "    push required: a document references an image; apply refuses until it is pushed (better-compute images push)\n")
		}
		if c.Action == ActionReplace {
			fmt.Fprintf(w, "    replace required: the API cannot change %s of a %s in place; apply refuses it\n", fieldList(c.Fields), c.Kind)
		}
	}
	fmt.Fprintf(w, "Plan: %d to create, %d to change, %d to replace, %d to delete.\n",
		counts[ActionCreate], counts[ActionChange], counts[ActionReplace], counts[ActionDelete])
}

func unsetOr(s string) string { return cmp.Or(s, "(unset)") }

func fieldList(fs []FieldDiff) string {
	names := make([]string, len(fs))
	for i, f := range fs {
		names[i] = f.Path
	}
	return strings.Join(names, ", ")
}

// Options steer a plan.
type Options struct {
	// DefaultTenant is the tenant of pool and quota documents that name
	// none (the CLI's --tenant or its context's).
	DefaultTenant string
	// Prune lists objects of the covered kinds that are live in a scope
	// the documents cover but absent from them, as deletes. Quotas and
	// projects are never pruned: the API has no quota delete, and its
	// project delete does not check what the project holds.
	Prune bool
}

// liveObject is one object read from the API, as a spec.
type liveObject struct {
	kind, tenant, name string
	// id is the object's id (for a quota, the only handle it has).
	id   string
	spec any
	// mark is the object's managed mark, nil when it has none.
	mark *apiv1.ManagedMark
}

// scope is one tenant (or the platform, name "") the documents cover.
type scope struct {
	name, id string
	live     map[string]liveObject // by key
	// marks are the scope's managed marks by key, objects live or not.
	marks map[string]*apiv1.ManagedMark
}

func objKey(kind, name string) string { return kind + "/" + name }

// quotaName is a quota's identity within its tenant, its scope in words.
func quotaName(s *QuotaSpec) string {
	parts := []string{}
	if s.Project != "" {
		parts = append(parts, "project="+s.Project)
	}
	if s.Model != "" {
		parts = append(parts, "model="+quota.NormalModel(s.Model))
	}
	if s.Pool != "" {
		parts = append(parts, "pool="+s.Pool)
	}
	if len(parts) == 0 {
		return "tenant"
	}
	return strings.Join(parts, ",")
}

// docKey is the live object a document declares, within its scope: a
// quota by its scope, the others by name.
func docKey(d Document) string {
	switch s := d.Spec.(type) {
	case *QuotaSpec:
		return objKey(KindQuota, quotaName(normalize(KindQuota, s).(*QuotaSpec)))
	case *WebhookSpec:
		return objKey(KindWebhook, s.URL)
	}
	return objKey(d.Kind, d.Metadata.Name)
}

// tenantKind says whether a kind is always a tenant's (never the
// platform's).
func tenantKind(kind string) bool {
	switch kind {
	case KindProject, KindPool, KindQuota, KindSite, KindSandboxTemplate, KindWebhook, KindIAMPolicy:
		return true
	}
	return false
}

// docTenant is a document's tenant after the default.
func docTenant(d Document, def string) string {
	if d.Kind == KindTenant {
		return "" // tenants are the platform's
	}
	if d.Metadata.Tenant != "" {
		return d.Metadata.Tenant
	}
	if tenantKind(d.Kind) {
		return def
	}
	return ""
}

// MakePlan reads the live state of every scope the documents name and
// diffs it against them.
func MakePlan(ctx context.Context, c *client.Client, docs []Document, opt Options) (*Plan, error) {
	var errs DocErrors
	seen := map[string]string{}
	scopes := map[string]*scope{}
	var order []string
	for _, d := range docs {
		t := docTenant(d, opt.DefaultTenant)
		if t == "" && tenantKind(d.Kind) {
			errs = append(errs, DocError{File: d.File, Index: d.Index, Field: "metadata.tenant", Reason: "is required for a " + d.Kind + " (or pass --tenant)"})
			continue
		}
		// Load refused duplicates as written; this catches one more: a
		// document that names the default tenant and one that leaves it out.
		key := t + "|" + docKey(d)
		if prev, dup := seen[key]; dup {
			errs = append(errs, DocError{File: d.File, Index: d.Index, Field: "metadata.name", Reason: "the same " + d.Kind + " as " + prev})
			continue
		}
		seen[key] = d.Where()
		if _, ok := scopes[t]; !ok {
			scopes[t] = &scope{name: t}
			order = append(order, t)
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	declared := map[string]bool{}
	for _, d := range docs {
		if d.Kind == KindTenant {
			declared[d.Metadata.Name] = true
		}
	}
	for _, t := range order {
		err := readScope(ctx, c, scopes[t])
		if err != nil && t != "" && declared[t] && client.Code(err) == "NOT_FOUND" {
			// A tenant the documents create: nothing of it is live yet.
			scopes[t].live, scopes[t].marks = map[string]liveObject{}, map[string]*apiv1.ManagedMark{}
			continue
		}
		if err != nil {
			return nil, err
		}
	}
	plan := &Plan{}
	matched := map[string]bool{}
	for i := range docs {
		d := &docs[i]
		s := scopes[docTenant(*d, opt.DefaultTenant)]
		want := normalize(d.Kind, d.Spec)
		name := d.Metadata.Name
		key := docKey(*d)
		live, ok := s.live[key]
		matched[s.name+"|"+key] = true
		ch := Change{Kind: d.Kind, Tenant: s.name, Name: name, Where: d.Where(), doc: d, live: live}
		if !ok {
			ch.Action = ActionCreate
			ch.Fields = diff(nil, want)
			plan.Changes = append(plan.Changes, ch)
			continue
		}
		ch.Fields = diff(live.spec, withLiveDefaults(want, live.spec))
		if len(ch.Fields) == 0 {
			if live.mark == nil || live.mark.GetSpecJson() != specJSON(want) {
				// In step with its document but not marked as applied from
				// it: apply records the mark (plan lists no change).
				ch.Action = ActionMark
				plan.Marks = append(plan.Marks, ch)
			}
			continue
		}
		ch.Action = changeAction(d.Kind, ch.Fields)
		plan.Changes = append(plan.Changes, ch)
	}
	if opt.Prune {
		for _, t := range order {
			s := scopes[t]
			for key, l := range s.live {
				// Some kinds are never pruned (neverPruned says why).
				if _, never := neverPruned[l.kind]; never || matched[s.name+"|"+key] {
					continue
				}
				plan.Changes = append(plan.Changes, Change{Action: ActionDelete, Kind: l.kind, Tenant: s.name, Name: l.name, live: l})
			}
		}
	}
	sortChanges(plan.Changes)
	sortChanges(plan.Marks)
	return plan, nil
}

// sortChanges puts creates and changes first in dependency order (pools
// before the quotas that name them), then deletes in the reverse order.
func sortChanges(cs []Change) {
	rank := func(c Change) int {
		i := slices.Index(Kinds, c.Kind)
		if c.Action == ActionDelete {
			return 100 + len(Kinds) - i
		}
		return i
	}
	sort.SliceStable(cs, func(i, j int) bool {
		ri, rj := rank(cs[i]), rank(cs[j])
		if ri != rj {
			return ri < rj
		}
		if cs[i].Tenant != cs[j].Tenant {
			return cs[i].Tenant < cs[j].Tenant
		}
		return cs[i].Name < cs[j].Name
	})
}

// readScope reads every object of the covered kinds in one scope.
func readScope(ctx context.Context, c *client.Client, s *scope) error {
	s.live = map[string]liveObject{}
	put := func(kind, name, id string, spec any) {
		s.live[objKey(kind, name)] = liveObject{kind: kind, tenant: s.name, name: name, id: id, spec: normalize(kind, spec)}
	}
	platform := s.name == ""
	if !platform {
		t, err := c.Tenants.Get(ctx, connect.NewRequest(&apiv1.GetTenantRequest{Tenant: s.name}))
		if err != nil {
			return fmt.Errorf("tenant %s: %w", s.name, err)
		}
		s.id = t.Msg.GetTenant().GetId()
	}
	flavors, err := listAll(ctx, func(ctx context.Context, tok string) ([]*apiv1.Flavor, string, error) {
		r, err := c.Flavors.List(ctx, connect.NewRequest(&apiv1.ListFlavorsRequest{Tenant: s.name, PageToken: tok}))
		return msg(r).GetFlavors(), msg(r).GetNextPageToken(), err
	})
	if err != nil {
		return fmt.Errorf("list flavors: %w", err)
	}
	for _, f := range flavors {
		if f.GetTenantId() == s.id {
			put(KindFlavor, f.GetName(), f.GetId(), flavorSpec(f))
		}
	}
	ipps, err := listAll(ctx, func(ctx context.Context, tok string) ([]*apiv1.IPPool, string, error) {
		r, err := c.IPPools.List(ctx, connect.NewRequest(&apiv1.ListIPPoolsRequest{Tenant: s.name, PageToken: tok}))
		return msg(r).GetIpPools(), msg(r).GetNextPageToken(), err
	})
	if err != nil {
		return fmt.Errorf("list IP pools: %w", err)
	}
	ipPoolNames := map[string]string{}
	for _, p := range ipps {
		ipPoolNames[p.GetId()] = p.GetName()
		if p.GetTenantId() == s.id {
			put(KindIPPool, p.GetName(), p.GetId(), ipPoolSpec(p))
		}
	}
	if platform {
		if err := readMore(ctx, c, s, put, names{}); err != nil {
			return err
		}
		return readMarks(ctx, c, s)
	}
	pools, err := listAll(ctx, func(ctx context.Context, tok string) ([]*apiv1.Pool, string, error) {
		r, err := c.Pools.List(ctx, connect.NewRequest(&apiv1.ListPoolsRequest{Tenant: s.name, IncludeArchived: true, PageToken: tok}))
		return msg(r).GetPools(), msg(r).GetNextPageToken(), err
	})
	if err != nil {
		return fmt.Errorf("list pools: %w", err)
	}
	poolNames := map[string]string{}
	for _, p := range pools {
		poolNames[p.GetId()] = p.GetName()
		if p.GetTenantId() != s.id {
			continue // offered by another tenant: theirs to declare
		}
		if p.GetState() == "active" {
			put(KindPool, p.GetName(), p.GetId(), poolSpec(p))
		}
	}
	projects, err := listAll(ctx, func(ctx context.Context, tok string) ([]*apiv1.Project, string, error) {
		r, err := c.Projects.List(ctx, connect.NewRequest(&apiv1.ListProjectsRequest{Tenant: s.name, PageToken: tok}))
		return msg(r).GetProjects(), msg(r).GetNextPageToken(), err
	})
	if err != nil {
		return fmt.Errorf("list projects: %w", err)
	}
	projectNames := map[string]string{}
	for _, p := range projects {
		projectNames[p.GetId()] = p.GetName()
		put(KindProject, p.GetName(), p.GetId(), &ProjectSpec{DisplayName: p.GetDisplayName()})
	}
	quotas, err := listAll(ctx, func(ctx context.Context, tok string) ([]*apiv1.Quota, string, error) {
		r, err := c.Quotas.List(ctx, connect.NewRequest(&apiv1.ListQuotasRequest{Tenant: s.name, PageToken: tok}))
		return msg(r).GetQuotas(), msg(r).GetNextPageToken(), err
	})
	if err != nil {
		return fmt.Errorf("list quotas: %w", err)
	}
	for _, q := range quotas {
		if q.GetTenantId() != s.id {
			continue
		}
		qs := &QuotaSpec{Project: cmp.Or(projectNames[q.GetProjectId()], q.GetProjectId()), Model: q.GetModel(),
			Pool: cmp.Or(poolNames[q.GetPoolId()], q.GetPoolId())}
		if q.GetGpus() != quota.Unlimited {
			g := q.GetGpus()
			qs.GPUs = &g
		}
		if q.GetGpuHours() != quota.Unlimited {
			h := q.GetGpuHours()
			qs.GPUHours = &h
		}
		put(KindQuota, quotaName(qs), q.GetId(), qs)
	}
	if err := readMore(ctx, c, s, put, names{pools: poolNames, ipPools: ipPoolNames, projects: projectNames}); err != nil {
		return err
	}
	return readMarks(ctx, c, s)
}

// msg is a response's message, nil for the nil response of a failed call
// (whose getters then read as empty).
func msg[T any](r *connect.Response[T]) *T {
	if r == nil {
		return nil
	}
	return r.Msg
}

func listAll[T any](ctx context.Context, page func(ctx context.Context, token string) ([]T, string, error)) ([]T, error) {
	var all []T
	tok := ""
	for {
		items, next, err := page(ctx, tok)
		if err != nil {
			return nil, err
		}
		all = append(all, items...)
		if next == "" {
			return all, nil
		}
		tok = next
	}
}

func flavorSpec(f *apiv1.Flavor) *FlavorSpec {
	return &FlavorSpec{VCPUs: f.GetVcpus(), MemoryMiB: f.GetMemoryMib(), DiskGiB: f.GetDiskGib(), GPUs: f.GetGpus(), GPUModel: f.GetGpuModel(),
		NUMAAffine: f.GetNumaAffine(), Pinned: f.GetPinned(), Hugepages: f.GetHugepages(), Balloon: f.GetBalloon(),
		MinMemoryMiB: f.GetMinMemoryMib(), Description: f.GetDescription()}
}

func ipPoolSpec(p *apiv1.IPPool) *IPPoolSpec {
	return &IPPoolSpec{CIDR: p.GetCidr(), Gateway: p.GetGateway(), DNS: p.GetDns(), RangeStart: p.GetRangeStart(), RangeEnd: p.GetRangeEnd(),
		Network: p.GetNetwork(), Description: p.GetDescription()}
}

func poolSpec(p *apiv1.Pool) *PoolSpec {
	s := &PoolSpec{Selector: selectorString(p.GetSelector()), Policy: policyFromProto(p.GetPolicy())}
	switch p.GetOffer().GetScope() {
	case pool.OfferAll:
		s.OfferTo = []string{pool.OfferAll}
	case pool.OfferTenants:
		s.OfferTo = slices.Clone(p.GetOffer().GetTenants())
	}
	return s
}

func policyFromProto(p *apiv1.PoolPolicy) *PoolPolicy {
	out := &PoolPolicy{GPUSharing: p.GetGpuSharing(), SlotsPerGPU: p.GetSlotsPerGpu(), SingleTenant: p.GetSingleTenant(), MaxPending: p.GetMaxPending(),
		MinDurationSeconds: p.GetMinDurationSeconds(), MaxDurationSeconds: p.GetMaxDurationSeconds(), OnNodeLost: p.GetOnNodeLost(),
		StartHorizonSeconds: p.GetStartHorizonSeconds(), RequiredAttestor: p.GetRequiredAttestor(), MIG: p.GetMig(), MemoryOvercommit: p.GetMemoryOvercommit()}
	if g := p.GetPerGpu(); g != nil {
		out.PerGPU = &PerGPU{VCPU: g.GetVcpu(), MemoryGiB: g.GetMemoryGib(), Hugepages1Gi: g.GetHugepages_1Gi()}
	}
	// The API always returns a host reserve; an empty one is left out of
	// an export, as a document would.
	if h := p.GetHostReserve(); h.GetVcpu() != 0 || h.GetMemoryGib() != 0 {
		out.HostReserve = &HostReserve{VCPU: h.GetVcpu(), MemoryGiB: h.GetMemoryGib()}
	}
	if h := p.GetHealth(); h != nil {
		out.Health = &Health{XIDActions: h.GetXidActions(), DisruptionBudgetPercent: h.GetDisruptionBudgetPercent(), BreakerPercent: h.GetBreakerPercent(),
			BreakerWindowSeconds: h.GetBreakerWindowSeconds(), KeepReservations: h.GetKeepReservations()}
	}
	if v := p.GetProvider(); v != nil {
		out.Provider = &Provider{Account: v.GetAccount(), ServerType: v.GetServerType(), Image: v.GetImage(), Location: v.GetLocation()}
	}
	if v := p.GetPrices(); v != nil {
		out.Prices = &Prices{GPUHour: v.GetGpuHour(), VCPUHour: v.GetVcpuHour(), MemoryGiBHour: v.GetMemoryGibHour(), InstanceHour: v.GetInstanceHour()}
	}
	return out
}

func policyProto(p *PoolPolicy) *apiv1.PoolPolicy {
	if p == nil {
		return &apiv1.PoolPolicy{}
	}
	out := &apiv1.PoolPolicy{GpuSharing: p.GPUSharing, SlotsPerGpu: p.SlotsPerGPU, SingleTenant: p.SingleTenant, MaxPending: p.MaxPending,
		MinDurationSeconds: p.MinDurationSeconds, MaxDurationSeconds: p.MaxDurationSeconds, OnNodeLost: p.OnNodeLost,
		StartHorizonSeconds: p.StartHorizonSeconds, RequiredAttestor: p.RequiredAttestor, Mig: p.MIG, MemoryOvercommit: p.MemoryOvercommit}
	if g := p.PerGPU; g != nil {
		out.PerGpu = &apiv1.PerGpuShare{Vcpu: g.VCPU, MemoryGib: g.MemoryGiB, Hugepages_1Gi: g.Hugepages1Gi}
	}
	if h := p.HostReserve; h != nil {
		out.HostReserve = &apiv1.HostReserve{Vcpu: h.VCPU, MemoryGib: h.MemoryGiB}
	}
	if h := p.Health; h != nil {
		out.Health = &apiv1.HealthPolicy{XidActions: h.XIDActions, DisruptionBudgetPercent: h.DisruptionBudgetPercent, BreakerPercent: h.BreakerPercent,
			BreakerWindowSeconds: h.BreakerWindowSeconds, KeepReservations: h.KeepReservations}
	}
	if v := p.Provider; v != nil {
		out.Provider = &apiv1.ProviderPolicy{Account: v.Account, ServerType: v.ServerType, Image: v.Image, Location: v.Location}
	}
	if v := p.Prices; v != nil {
		out.Prices = &apiv1.PoolPrices{GpuHour: v.GPUHour, VcpuHour: v.VCPUHour, MemoryGibHour: v.MemoryGiBHour, InstanceHour: v.InstanceHour}
	}
	return out
}

// selectorString prints a selector in the shorthand ParseSelector reads.
func selectorString(reqs []*apiv1.SelectorRequirement) string {
	terms := make([]string, 0, len(reqs))
	for _, r := range reqs {
		switch r.GetOperator() {
		case pool.OpIn:
			if len(r.GetValues()) == 1 {
				terms = append(terms, r.GetKey()+"="+r.GetValues()[0])
			} else {
				terms = append(terms, r.GetKey()+" in ("+strings.Join(r.GetValues(), ",")+")")
			}
		case pool.OpNotIn:
			terms = append(terms, r.GetKey()+" notin ("+strings.Join(r.GetValues(), ",")+")")
		case pool.OpDoesNotExist:
			terms = append(terms, "!"+r.GetKey())
		default:
			terms = append(terms, r.GetKey())
		}
	}
	return strings.Join(terms, ",")
}

// normalize returns a copy of spec with the API's defaults filled in and
// equivalent spellings made one, so that a document and the live object
// it describes compare equal.
func normalize(kind string, spec any) any {
	if n, ok := normalizeMore(spec); ok {
		return n
	}
	switch s := spec.(type) {
	case *FlavorSpec:
		c := *s
		return &c
	case *IPPoolSpec:
		c := *s
		if p, err := netip.ParsePrefix(c.CIDR); err == nil {
			c.CIDR = p.Masked().String()
		}
		return &c
	case *QuotaSpec:
		c := *s
		c.Model = quota.NormalModel(c.Model)
		return &c
	case *PoolSpec:
		c := *s
		if reqs, err := pool.ParseSelector(c.Selector); err == nil {
			c.Selector = selectorString(reqs)
		}
		c.OfferTo = slices.Clone(c.OfferTo)
		sort.Strings(c.OfferTo)
		pol := PoolPolicy{}
		if c.Policy != nil {
			pol = *c.Policy
		}
		pol.GPUSharing = cmp.Or(pol.GPUSharing, pool.GPUSharingExclusive)
		pol.OnNodeLost = cmp.Or(pol.OnNodeLost, pool.OnNodeLostRelease)
		if pol.StartHorizonSeconds == 0 {
			pol.StartHorizonSeconds = pool.DefaultStartHorizonSeconds
		}
		c.Policy = &pol
		return &c
	}
	_ = kind
	return spec
}

// withLiveDefaults fills in what a spec leaves to the API from the live
// object, so that it is not compared: an IP pool's gateway and range, a
// project's display name.
func withLiveDefaults(want, live any) any {
	if w, ok := withLiveDefaultsMore(want, live); ok {
		return w
	}
	if p, ok := want.(*ProjectSpec); ok {
		c := *p
		c.DisplayName = cmp.Or(c.DisplayName, live.(*ProjectSpec).DisplayName)
		return &c
	}
	if ip, ok := want.(*IPPoolSpec); ok {
		l := live.(*IPPoolSpec)
		c := *ip
		c.Gateway = cmp.Or(c.Gateway, l.Gateway)
		c.RangeStart = cmp.Or(c.RangeStart, l.RangeStart)
		c.RangeEnd = cmp.Or(c.RangeEnd, l.RangeEnd)
		return &c
	}
	return want
}

// diff compares two specs field by field (old nil: a create).
func diff(old, new any) []FieldDiff {
	o, n := flatten(old), flatten(new)
	paths := map[string]bool{}
	for k := range o {
		paths[k] = true
	}
	for k := range n {
		paths[k] = true
	}
	var out []FieldDiff
	for p := range paths {
		if o[p] != n[p] {
			out = append(out, FieldDiff{Path: p, Old: o[p], New: n[p]})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// flatten maps a spec's set fields to their values as text, by dotted
// path from spec. Lists are one value.
func flatten(spec any) map[string]string {
	out := map[string]string{}
	if spec == nil {
		return out
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return out
	}
	var m map[string]any
	if json.Unmarshal(b, &m) != nil {
		return out
	}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				walk(prefix+"."+k, e)
			}
		case []any:
			b, _ := json.Marshal(x)
			out[prefix] = string(b)
		case nil:
		default:
			b, _ := json.Marshal(x)
			out[prefix] = strings.Trim(string(b), `"`)
		}
	}
	walk("spec", m)
	return out
}
