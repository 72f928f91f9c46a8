package fleetconfig

import (
	"cmp"
	"context"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// The kinds beyond the first five: tenants, sites, image references,
// sandbox templates, webhooks and IAM policies. Each has its reader (the
// live objects of one scope as specs), its normal form, and its calls.

// The API's sandbox template defaults (internal/sandbox), which a document
// may leave out.
const (
	defaultSandboxTTL    = time.Hour
	defaultSandboxMaxTTL = 24 * time.Hour
)

// Image visibilities.
const (
	visibilityPrivate = "private"
	visibilityPublic  = "public"
)

var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// inPlaceFields are the fields of a kind the API changes in place; a
// change to any other is a replace, which apply refuses. nil means every
// field changes in place; a kind absent changes nothing in place.
var inPlaceFields = map[string][]string{
	KindPool: nil, KindQuota: nil, KindSite: nil, KindWebhook: nil, KindIAMPolicy: nil,
	KindTenant: {"spec.suspended"},
	KindImage:  {"spec.visibility"},
}

// changeAction is the action for a live object whose spec differs from its
// document's in fields.
func changeAction(kind string, fields []FieldDiff) string {
	inPlace, ok := inPlaceFields[kind]
	if !ok {
		return ActionReplace
	}
	if inPlace == nil {
		return ActionChange
	}
	for _, f := range fields {
		// A public image cannot be made private again.
		if !slices.Contains(inPlace, f.Path) || kind == KindImage && f.Path == "spec.visibility" && f.New != visibilityPublic {
			return ActionReplace
		}
	}
	return ActionChange
}

// neverPruned are the kinds --prune leaves alone, and why.
var neverPruned = map[string]string{
	KindQuota:     "the API has no quota delete",
	KindProject:   "a project's delete does not ask what it still holds",
	KindTenant:    "a tenant's delete removes everything it owns",
	KindImage:     "apply could not bring an image's bytes back",
	KindIAMPolicy: "the API has no policy delete",
}

// validateMore checks the new kinds' documents as validate does the first
// five's.
func validateMore(d Document, add func(field, format string, args ...any)) {
	switch s := d.Spec.(type) {
	case *TenantSpec:
		if d.Metadata.Tenant != "" {
			add("metadata.tenant", "a Tenant is the platform's: leave it out")
		}
	case *ImageSpec:
		if !sha256Hex.MatchString(s.SHA256) {
			add("spec.sha256", "is required: 64 lower-case hex digits")
		}
		if s.Kind == "" {
			add("spec.kind", "is required: raw, qcow2, kernel, initrd or ramdisk")
		} else if !slices.Contains([]string{"raw", "qcow2", "kernel", "initrd", "ramdisk"}, s.Kind) {
			add("spec.kind", "must be raw, qcow2, kernel, initrd or ramdisk, got %q", s.Kind)
		}
		if s.Visibility != "" && s.Visibility != visibilityPrivate && s.Visibility != visibilityPublic {
			add("spec.visibility", "must be private or public, got %q", s.Visibility)
		}
	case *SandboxTemplateSpec:
		if s.Flavor == "" {
			add("spec.flavor", "is required")
		}
		for _, f := range []struct{ field, v string }{{"spec.defaultTTL", s.DefaultTTL}, {"spec.maxTTL", s.MaxTTL}} {
			if f.v == "" {
				continue
			}
			if dur, err := time.ParseDuration(f.v); err != nil || dur <= 0 {
				add(f.field, "must be a positive duration such as 30m or 4h, got %q", f.v)
			}
		}
		if s.WarmMin < 0 || s.WarmMax < 0 {
			add("spec.warmMin", "warmMin and warmMax must not be negative")
		}
	case *WebhookSpec:
		if s.URL == "" {
			add("spec.url", "is required")
		} else if !strings.HasPrefix(s.URL, "https://") && !strings.HasPrefix(s.URL, "http://") {
			add("spec.url", "must be an http(s) URL, got %q", s.URL)
		}
	case *IAMPolicySpec:
		if strings.TrimSpace(s.Text) == "" {
			add("spec.text", "is required: the Cedar policy")
		}
	}
}

// normalizeMore is normalize for the new kinds.
func normalizeMore(spec any) (any, bool) {
	switch s := spec.(type) {
	case *TenantSpec:
		c := *s
		return &c, true
	case *SiteSpec:
		c := *s
		c.Networks = slices.Clone(c.Networks)
		sort.Strings(c.Networks)
		return &c, true
	case *ImageSpec:
		c := *s
		c.SHA256 = strings.ToLower(c.SHA256)
		c.Visibility = cmp.Or(c.Visibility, visibilityPrivate)
		return &c, true
	case *SandboxTemplateSpec:
		c := *s
		def := parseDur(c.DefaultTTL, defaultSandboxTTL)
		c.DefaultTTL = durString(def)
		c.MaxTTL = durString(parseDur(c.MaxTTL, max(defaultSandboxMaxTTL, def)))
		if len(c.Env) == 0 {
			c.Env = nil
		}
		return &c, true
	case *WebhookSpec:
		c := *s
		c.Types = slices.Clone(c.Types)
		sort.Strings(c.Types)
		return &c, true
	case *IAMPolicySpec:
		// The API keeps the text as given; a YAML block adds a newline.
		return &IAMPolicySpec{Text: strings.TrimSpace(s.Text)}, true
	}
	return nil, false
}

// parseDur reads a validated duration, def when empty.
func parseDur(s string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(s); err == nil && s != "" {
		return d
	}
	return def
}

// durString prints a duration the shortest way: 1h, 30m, 1h30m, 90s.
func durString(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// withLiveDefaultsMore fills in what a new kind's document leaves to the
// API, from the live object.
func withLiveDefaultsMore(want, live any) (any, bool) {
	switch w := want.(type) {
	case *TenantSpec:
		c := *w
		c.DisplayName = cmp.Or(c.DisplayName, live.(*TenantSpec).DisplayName)
		return &c, true
	case *SiteSpec:
		c := *w
		c.DHCPMode = cmp.Or(c.DHCPMode, live.(*SiteSpec).DHCPMode)
		return &c, true
	case *SandboxTemplateSpec:
		l := live.(*SandboxTemplateSpec)
		c := *w
		c.Image = cmp.Or(c.Image, l.Image)
		c.Pool = cmp.Or(c.Pool, l.Pool)
		c.IPPool = cmp.Or(c.IPPool, l.IPPool)
		c.NetworkPolicy = cmp.Or(c.NetworkPolicy, l.NetworkPolicy)
		return &c, true
	}
	return want, false
}

// names maps ids to names for the references a live object holds.
type names struct {
	pools, ipPools, projects map[string]string
}

// readMore reads the new kinds of one scope: the platform's tenants and
// images, or a tenant's sites, images, sandbox templates, webhooks and
// policies.
func readMore(ctx context.Context, c *client.Client, s *scope, put func(kind, name, id string, spec any), ids names) error {
	images, err := listAll(ctx, func(ctx context.Context, tok string) ([]*apiv1.Image, string, error) {
		r, err := c.Images.List(ctx, connect.NewRequest(&apiv1.ListImagesRequest{Tenant: s.name, PageToken: tok}))
		return msg(r).GetImages(), msg(r).GetNextPageToken(), err
	})
	if err != nil {
		return fmt.Errorf("list images: %w", err)
	}
	for _, im := range images {
		if im.GetTenantId() == s.id {
			put(KindImage, im.GetName(), im.GetId(), &ImageSpec{Kind: im.GetKind(), SHA256: im.GetSha256(), Visibility: im.GetVisibility()})
		}
	}
	if s.name == "" {
		tenants, err := listAll(ctx, func(ctx context.Context, tok string) ([]*apiv1.Tenant, string, error) {
			r, err := c.Tenants.List(ctx, connect.NewRequest(&apiv1.ListTenantsRequest{PageToken: tok}))
			return msg(r).GetTenants(), msg(r).GetNextPageToken(), err
		})
		switch {
		case client.Code(err) == "PERMISSION_DENIED":
			// A tenant's key reads the platform's flavors but not its
			// tenants: a Tenant document plans as a create the API refuses.
		case err != nil:
			return fmt.Errorf("list tenants: %w", err)
		}
		for _, t := range tenants {
			put(KindTenant, t.GetName(), t.GetId(), &TenantSpec{DisplayName: t.GetDisplayName(), Suspended: t.GetState() == "suspended"})
		}
		return nil
	}
	sites, err := listAll(ctx, func(ctx context.Context, tok string) ([]*apiv1.Site, string, error) {
		r, err := c.Sites.List(ctx, connect.NewRequest(&apiv1.ListSitesRequest{Tenant: s.name, PageToken: tok}))
		return msg(r).GetSites(), msg(r).GetNextPageToken(), err
	})
	if err != nil {
		return fmt.Errorf("list sites: %w", err)
	}
	for _, st := range sites {
		if st.GetTenantId() == s.id {
			put(KindSite, st.GetName(), st.GetId(), &SiteSpec{Networks: st.GetNetworks(), DHCPMode: st.GetDhcpMode(), Description: st.GetDescription()})
		}
	}
	tpls, err := listAll(ctx, func(ctx context.Context, tok string) ([]*apiv1.SandboxTemplate, string, error) {
		r, err := c.SandboxTemplates.List(ctx, connect.NewRequest(&apiv1.ListSandboxTemplatesRequest{Tenant: s.name, PageToken: tok}))
		return msg(r).GetTemplates(), msg(r).GetNextPageToken(), err
	})
	if err != nil {
		return fmt.Errorf("list sandbox templates: %w", err)
	}
	for _, t := range tpls {
		if t.GetTenantId() != s.id || t.GetState() != "active" {
			continue // a deleted template drains its warm guests: it is gone
		}
		put(KindSandboxTemplate, t.GetName(), t.GetId(), &SandboxTemplateSpec{Image: t.GetImage(), Flavor: t.GetFlavor(),
			Pool: cmp.Or(ids.pools[t.GetPoolId()], t.GetPoolId()), IPPool: cmp.Or(ids.ipPools[t.GetIpPoolId()], t.GetIpPoolId()),
			Project: cmp.Or(ids.projects[t.GetProjectId()], t.GetProjectId()), DefaultTTL: durString(t.GetDefaultTtl().AsDuration()),
			MaxTTL: durString(t.GetMaxTtl().AsDuration()), WarmMin: t.GetWarmMin(), WarmMax: t.GetWarmMax(), Env: t.GetEnv(),
			NetworkPolicy: t.GetNetworkPolicy()})
	}
	hooks, err := listAll(ctx, func(ctx context.Context, tok string) ([]*apiv1.Webhook, string, error) {
		r, err := c.Webhooks.List(ctx, connect.NewRequest(&apiv1.ListWebhooksRequest{Tenant: s.name, PageToken: tok}))
		return msg(r).GetWebhooks(), msg(r).GetNextPageToken(), err
	})
	if err != nil {
		return fmt.Errorf("list webhooks: %w", err)
	}
	for _, h := range hooks {
		if h.GetTenantId() == s.id {
			put(KindWebhook, h.GetUrl(), h.GetId(), &WebhookSpec{URL: h.GetUrl(), Types: h.GetTypes(), Description: h.GetDescription()})
		}
	}
	policies, err := listAll(ctx, func(ctx context.Context, tok string) ([]*apiv1.Policy, string, error) {
		r, err := c.Policies.List(ctx, connect.NewRequest(&apiv1.ListPoliciesRequest{Tenant: s.name, PageToken: tok}))
		return msg(r).GetPolicies(), msg(r).GetNextPageToken(), err
	})
	if err != nil {
		return fmt.Errorf("list IAM policies: %w", err)
	}
	for _, p := range policies {
		if p.GetTenantId() == s.id {
			put(KindIAMPolicy, p.GetId(), p.GetId(), &IAMPolicySpec{Text: p.GetText()})
		}
	}
	return nil
}

// applyMore makes a create or change of a new kind.
func applyMore(ctx context.Context, c *client.Client, ch Change, out func(format string, args ...any)) (bool, error) {
	create := ch.Action == ActionCreate
	switch s := ch.doc.Spec.(type) {
	case *TenantSpec:
		if create {
			if _, err := c.Tenants.Create(ctx, mutation(&apiv1.CreateTenantRequest{Name: ch.Name, DisplayName: s.DisplayName}, true)); err != nil {
				return true, err
			}
			if !s.Suspended {
				return true, nil
			}
		}
		var err error
		if s.Suspended {
			_, err = c.Tenants.Suspend(ctx, mutation(&apiv1.SuspendTenantRequest{Tenant: ch.Name}, false))
		} else {
			_, err = c.Tenants.Resume(ctx, mutation(&apiv1.ResumeTenantRequest{Tenant: ch.Name}, false))
		}
		return true, err
	case *SiteSpec:
		if create {
			_, err := c.Sites.Create(ctx, mutation(&apiv1.CreateSiteRequest{Tenant: ch.Tenant, Name: ch.Name, Networks: s.Networks,
				DhcpMode: s.DHCPMode, Description: s.Description}, true))
			return true, err
		}
		req := &apiv1.UpdateSiteRequest{Tenant: ch.Tenant, Site: ch.live.id, Networks: s.Networks, UpdateNetworks: true, Description: &s.Description}
		if s.DHCPMode != "" {
			req.DhcpMode = &s.DHCPMode
		}
		_, err := c.Sites.Update(ctx, mutation(req, false))
		return true, err
	case *ImageSpec:
		if create {
			return true, &Refusal{Code: "PUSH_REQUIRED", Field: "spec.sha256",
				Reason: fmt.Sprintf("an Image document references an image, it does not carry one: push it first (better-compute images push %s …), then apply", ch.Name)}
		}
		_, err := c.Images.Promote(ctx, mutation(&apiv1.PromoteImageRequest{Tenant: ch.Tenant, Image: ch.live.id}, false))
		return true, err
	case *SandboxTemplateSpec:
		req := &apiv1.CreateSandboxTemplateRequest{Tenant: ch.Tenant, Name: ch.Name, Image: s.Image, Flavor: s.Flavor, Pool: s.Pool,
			IpPool: s.IPPool, WarmMin: s.WarmMin, WarmMax: s.WarmMax, Env: s.Env, NetworkPolicy: s.NetworkPolicy, Project: s.Project}
		if s.DefaultTTL != "" {
			req.DefaultTtl = durationpb.New(parseDur(s.DefaultTTL, defaultSandboxTTL))
		}
		if s.MaxTTL != "" {
			req.MaxTtl = durationpb.New(parseDur(s.MaxTTL, defaultSandboxMaxTTL))
		}
		_, err := c.SandboxTemplates.Create(ctx, mutation(req, true))
		return true, err
	case *WebhookSpec:
		if create {
			r, err := c.Webhooks.Create(ctx, mutation(&apiv1.CreateWebhookRequest{Tenant: ch.Tenant, Url: s.URL, Types: s.Types, Description: s.Description}, true))
			if err == nil {
				// The secret is shown once by the create; apply's output
				// often ends in CI logs, so it is not printed.
				out("  webhook %s signs with a secret not shown here: better-compute webhooks rotate-secret %s --tenant %s hands one out\n",
					r.Msg.GetWebhook().GetId(), r.Msg.GetWebhook().GetId(), ch.Tenant)
			}
			return true, err
		}
		_, err := c.Webhooks.Update(ctx, mutation(&apiv1.UpdateWebhookRequest{Tenant: ch.Tenant, Webhook: ch.live.id, Types: s.Types, UpdateTypes: true,
			Description: &s.Description}, false))
		return true, err
	case *IAMPolicySpec:
		_, err := c.Policies.Put(ctx, mutation(&apiv1.PutPolicyRequest{Tenant: ch.Tenant, Id: ch.Name, Text: s.Text}, false))
		return true, err
	}
	return false, nil
}

// deleteMore prunes a new kind's object.
func deleteMore(ctx context.Context, c *client.Client, ch Change) (bool, error) {
	var err error
	switch ch.Kind {
	case KindSite:
		// The API refuses a site that still has machines.
		_, err = c.Sites.Delete(ctx, mutation(&apiv1.DeleteSiteRequest{Tenant: ch.Tenant, Site: ch.live.id}, false))
	case KindSandboxTemplate:
		// Its warm guests drain; its running sandboxes run to their end.
		_, err = c.SandboxTemplates.Delete(ctx, mutation(&apiv1.DeleteSandboxTemplateRequest{Tenant: ch.Tenant, Template: ch.live.id}, false))
	case KindWebhook:
		_, err = c.Webhooks.Delete(ctx, mutation(&apiv1.DeleteWebhookRequest{Tenant: ch.Tenant, Webhook: ch.live.id}, false))
	default:
		return false, nil
	}
	return true, err
}

// webhookDocName names an exported webhook's document after its url:
// https://hooks.example.com/bc → hooks-example-com-bc.
func webhookDocName(url string) string {
	_, rest, _ := strings.Cut(url, "://")
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(rest) {
		ok := r >= 'a' && r <= 'z' || r >= '0' && r <= '9'
		if ok {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	return cmp.Or(strings.TrimSuffix(b.String(), "-"), "webhook")
}
