package metal

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// Site limits.
const (
	MaxSiteNetworks    = 32
	maxDescriptionLen  = 1024
	maxHardwareProfile = 128
)

// SiteService serves the SiteService API.
type SiteService struct {
	env *envelope.Envelope
}

// NewSiteService returns the site handlers.
func NewSiteService(env *envelope.Envelope) *SiteService { return &SiteService{env: env} }

var _ apiv1connect.SiteServiceHandler = (*SiteService)(nil)

// SiteResource projects a site into the authorization model.
func SiteResource(s Site) iam.Resource {
	return iam.Resource{Type: "Site", ID: s.ID, TenantID: s.TenantID, Attrs: map[string]any{"name": s.Name}}
}

// parseNetworks checks a site's networks: CIDRs, at least one, canonical
// (host bits zero), no duplicates. It returns them sorted.
func parseNetworks(vs *envelope.Violations, field string, in []string) []string {
	switch {
	case len(in) == 0:
		vs.Add(field, "is required: at least one provisioning network as a CIDR (10.0.0.0/24)")
		return nil
	case len(in) > MaxSiteNetworks:
		vs.Add(field, "must list at most %d networks, got %d", MaxSiteNetworks, len(in))
		return nil
	}
	out := make([]string, 0, len(in))
	for i, n := range in {
		p, err := netip.ParsePrefix(n)
		switch {
		case err != nil:
			vs.Add(fmt.Sprintf("%s[%d]", field, i), "must be a CIDR such as 10.0.0.0/24, got %q", truncate(n))
			continue
		case p.Masked() != p:
			vs.Add(fmt.Sprintf("%s[%d]", field, i), "has host bits set: did you mean %s?", p.Masked())
			continue
		case slices.Contains(out, p.String()):
			vs.Add(fmt.Sprintf("%s[%d]", field, i), "repeats %s", p)
			continue
		}
		out = append(out, p.String())
	}
	sort.Strings(out)
	return out
}

func validDHCPMode(vs *envelope.Violations, field, mode string) {
	if mode != DHCPFull && mode != DHCPProxy {
		vs.Add(field, "must be %q or %q, got %q", DHCPFull, DHCPProxy, truncate(mode))
	}
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// inNetworks reports whether host (an IP literal) falls in one of the
// networks.
func inNetworks(host string, networks []string) bool {
	a, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	a = a.Unmap()
	for _, n := range networks {
		if p, err := netip.ParsePrefix(n); err == nil && p.Contains(a) {
			return true
		}
	}
	return false
}

// siteRef is a site resolved for a draft or a read.
type siteRef = ref[Site]

func lookupSite(ctx context.Context, q store.Querier, tenantRef, name string) (siteRef, error) {
	return lookupRef(ctx, q, tenantRef, name, "site", "Site", SiteGet, SiteResource)
}

// Create adds a site.
func (s *SiteService) Create(ctx context.Context, req *connect.Request[apiv1.CreateSiteRequest]) (*connect.Response[apiv1.CreateSiteResponse], error) {
	msg := req.Msg
	var (
		sc   scope
		nets []string
		mode = msg.GetDhcpMode()
	)
	if mode == "" {
		mode = DHCPFull
	}
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.CreateSiteResponse]{
		Validate: func() error {
			var vs envelope.Violations
			tenancy.ValidateScope(&vs, msg.GetTenant())
			vs.Name("name", msg.GetName())
			nets = parseNetworks(&vs, "networks", msg.GetNetworks())
			validDHCPMode(&vs, "dhcp_mode", mode)
			vs.MaxLen("description", msg.GetDescription(), maxDescriptionLen)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			if sc, err = tenancy.LookupScope(ctx, q, msg.GetTenant()); err != nil || !sc.Found {
				return iam.Resource{Type: "Site", ID: iam.DraftID}, err
			}
			return iam.Resource{Type: "Site", ID: iam.DraftID, TenantID: sc.ID(), Attrs: map[string]any{"name": msg.GetName()}}, nil
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.CreateSiteResponse, error) {
			if err := sc.NotFound(); err != nil {
				return nil, err
			}
			now := tx.Now()
			site := Site{ID: envelope.NewID(SiteIDPrefix, now), TenantID: sc.ID(), Name: msg.GetName(), Networks: nets,
				DHCPMode: mode, Description: msg.GetDescription(), CreateTime: now, UpdateTime: now}
			if err := SiteInsert(ctx, tx, &site); err != nil {
				if errors.Is(err, store.ErrUnique) {
					return nil, envelope.Errorf(envelope.CodeAlreadyExists, "a site named %q already exists", site.Name)
				}
				return nil, err
			}
			tx.SetResource(site.ID, "")
			tx.Emit(envelope.Event{Type: "site.created", TenantID: site.TenantID, ResourceType: "Site", ResourceID: site.ID,
				Data: map[string]any{"name": site.Name, "networks": site.Networks, "dhcp_mode": site.DHCPMode}})
			return &apiv1.CreateSiteResponse{Site: SiteProto(site)}, nil
		},
	})
}

// Get reads a site.
func (s *SiteService) Get(ctx context.Context, req *connect.Request[apiv1.GetSiteRequest]) (*connect.Response[apiv1.GetSiteResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	tenancy.ValidateScope(&vs, msg.GetTenant())
	vs.Ref("site", msg.GetSite(), SiteIDPrefix)
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var r siteRef
	if err := s.env.Resolve(ctx, "site", func(ctx context.Context, q store.Querier) (err error) {
		r, err = lookupSite(ctx, q, msg.GetTenant(), msg.GetSite())
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, r.resource()); err != nil {
		return nil, err
	}
	if err := r.notFound(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	return connect.NewResponse(&apiv1.GetSiteResponse{Site: SiteProto(r.obj)}), nil
}

// List lists a tenant's sites.
func (s *SiteService) List(ctx context.Context, req *connect.Request[apiv1.ListSitesRequest]) (*connect.Response[apiv1.ListSitesResponse], error) {
	sites, next, err := tenancy.ListPage(ctx, s.env, req.Msg, "sites",
		func(ctx context.Context, q store.Querier, sc scope, after string, limit int) ([]Site, error) {
			return SiteList(ctx, q, sc.ID(), after, limit)
		}, func(site Site) string { return site.ID })
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListSitesResponse{NextPageToken: next}
	for _, site := range sites {
		out.Sites = append(out.Sites, SiteProto(site))
	}
	return connect.NewResponse(out), nil
}

// Update changes a site's networks, DHCP mode or description. Networks
// that an enrolled machine's BMC needs cannot be removed.
func (s *SiteService) Update(ctx context.Context, req *connect.Request[apiv1.UpdateSiteRequest]) (*connect.Response[apiv1.UpdateSiteResponse], error) {
	msg := req.Msg
	var (
		r    siteRef
		nets []string
	)
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.UpdateSiteResponse]{
		Validate: func() error {
			var vs envelope.Violations
			tenancy.ValidateScope(&vs, msg.GetTenant())
			vs.Ref("site", msg.GetSite(), SiteIDPrefix)
			if msg.GetUpdateNetworks() {
				nets = parseNetworks(&vs, "networks", msg.GetNetworks())
			} else if len(msg.GetNetworks()) > 0 {
				vs.Add("networks", "is set without update_networks: set update_networks to replace the site's networks")
			}
			if msg.DhcpMode != nil {
				validDHCPMode(&vs, "dhcp_mode", msg.GetDhcpMode())
			}
			if msg.Description != nil {
				vs.MaxLen("description", msg.GetDescription(), maxDescriptionLen)
			}
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			r, err = lookupSite(ctx, q, msg.GetTenant(), msg.GetSite())
			return r.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.UpdateSiteResponse, error) {
			if err := r.notFound(); err != nil {
				return nil, err
			}
			site, err := SiteGet(ctx, tx, r.obj.TenantID, r.obj.ID, store.ForUpdate(tx))
			if errors.Is(err, store.ErrNotFound) {
				return nil, envelope.NotFound("site", msg.GetSite())
			}
			if err != nil {
				return nil, err
			}
			changed := map[string]any{}
			if msg.GetUpdateNetworks() {
				hosts, err := MachineHostsOfSite(ctx, tx, site.ID)
				if err != nil {
					return nil, err
				}
				names := make([]string, 0, len(hosts))
				for name := range hosts {
					names = append(names, name)
				}
				sort.Strings(names)
				for _, name := range names {
					if !inNetworks(hosts[name], nets) {
						return nil, envelope.Invalid(envelope.Violation{Field: "networks",
							Reason: fmt.Sprintf("must keep the BMC address %s of machine %s in a network (retire the machine first)", hosts[name], name)})
					}
				}
				site.Networks, changed["networks"] = nets, nets
			}
			if msg.DhcpMode != nil {
				site.DHCPMode, changed["dhcp_mode"] = msg.GetDhcpMode(), msg.GetDhcpMode()
			}
			if msg.Description != nil {
				site.Description, changed["description"] = msg.GetDescription(), msg.GetDescription()
			}
			site.UpdateTime = tx.Now()
			if err := SiteUpdate(ctx, tx, &site); err != nil {
				return nil, err
			}
			tx.Emit(envelope.Event{Type: "site.updated", TenantID: site.TenantID, ResourceType: "Site", ResourceID: site.ID, Data: changed})
			return &apiv1.UpdateSiteResponse{Site: SiteProto(site)}, nil
		},
	})
}

// Delete removes a site that has no machines left but retired ones (which
// go with it).
func (s *SiteService) Delete(ctx context.Context, req *connect.Request[apiv1.DeleteSiteRequest]) (*connect.Response[apiv1.DeleteSiteResponse], error) {
	msg := req.Msg
	var r siteRef
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.DeleteSiteResponse]{
		Validate: func() error {
			var vs envelope.Violations
			tenancy.ValidateScope(&vs, msg.GetTenant())
			vs.Ref("site", msg.GetSite(), SiteIDPrefix)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			r, err = lookupSite(ctx, q, msg.GetTenant(), msg.GetSite())
			return r.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.DeleteSiteResponse, error) {
			if err := r.notFound(); err != nil {
				return nil, err
			}
			site, err := SiteGet(ctx, tx, r.obj.TenantID, r.obj.ID, store.ForUpdate(tx))
			if errors.Is(err, store.ErrNotFound) {
				return nil, envelope.NotFound("site", msg.GetSite())
			}
			if err != nil {
				return nil, err
			}
			n, err := MachineCountActive(ctx, tx, site.ID)
			if err != nil {
				return nil, err
			}
			if n > 0 {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition,
					"site %s still has %d machine(s) that are not retired: retire them first", site.Name, n)
			}
			if err := RetiredMachinesDelete(ctx, tx, site.ID); err != nil {
				return nil, err
			}
			if _, err := SiteDelete(ctx, tx, site.ID); err != nil {
				return nil, err
			}
			tx.Emit(envelope.Event{Type: "site.deleted", TenantID: site.TenantID, ResourceType: "Site", ResourceID: site.ID,
				Data: map[string]any{"name": site.Name}})
			return &apiv1.DeleteSiteResponse{}, nil
		},
	})
}

// SiteProto converts a site for the API.
func SiteProto(s Site) *apiv1.Site {
	return &apiv1.Site{Id: s.ID, TenantId: s.TenantID, Name: s.Name, Networks: s.Networks, DhcpMode: s.DHCPMode,
		Description: s.Description, CreateTime: timestamppb.New(s.CreateTime), UpdateTime: timestamppb.New(s.UpdateTime)}
}
