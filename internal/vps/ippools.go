package vps

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// IP pool limits.
const (
	// MinPrefixLen bounds a pool's network at a /8 (16M addresses).
	MinPrefixLen = 8
	// MaxPrefixLen is a /30: a network, a gateway, one guest, a broadcast.
	MaxPrefixLen  = 30
	MaxDNSServers = 8
	maxNetworkLen = 128
)

// IPPoolService serves the IPPoolService API.
type IPPoolService struct {
	env *envelope.Envelope
}

// NewIPPoolService returns the IP pool handlers.
func NewIPPoolService(env *envelope.Envelope) *IPPoolService { return &IPPoolService{env: env} }

var _ apiv1connect.IPPoolServiceHandler = (*IPPoolService)(nil)

// IPPoolResource projects a pool into the authorization model.
func IPPoolResource(p IPPool) iam.Resource {
	return iam.Resource{Type: "IPPool", ID: p.ID, TenantID: p.TenantID, Attrs: map[string]any{"name": p.Name, "cidr": p.CIDR}}
}

type ipPoolRef = ref[IPPool]

func lookupIPPool(ctx context.Context, q store.Querier, tenantRef, name string) (ipPoolRef, error) {
	return lookupRef(ctx, q, tenantRef, name, "ip pool", "IPPool", false, IPPoolGet, IPPoolResource)
}

// poolPlan is a checked pool request: the network, the gateway, the range
// (as integers) and the nameservers.
type poolPlan struct {
	prefix                netip.Prefix
	gateway               netip.Addr
	dns                   []string
	rangeFirst, rangeLast int64
}

// planPool checks a pool request. The network is IPv4, canonical, /8 to
// /30; the gateway (default: the first host) and the range (default: every
// host but the gateway) are host addresses of it, and the range leaves the
// gateway out.
func planPool(vs *envelope.Violations, msg *apiv1.CreateIPPoolRequest) poolPlan {
	var pl poolPlan
	p, err := netip.ParsePrefix(msg.GetCidr())
	switch {
	case msg.GetCidr() == "":
		vs.Add("cidr", "is required: an IPv4 network such as 10.20.0.0/24")
		return pl
	case err != nil:
		vs.Add("cidr", "must be an IPv4 network such as 10.20.0.0/24, got %q", truncate(msg.GetCidr()))
		return pl
	case !p.Addr().Is4():
		vs.Add("cidr", "must be IPv4: guests get IPv4 leases")
		return pl
	case p.Masked() != p:
		vs.Add("cidr", "has host bits set: did you mean %s?", p.Masked())
		return pl
	case p.Bits() < MinPrefixLen || p.Bits() > MaxPrefixLen:
		vs.Add("cidr", "must be a /%d to a /%d network, got /%d", MinPrefixLen, MaxPrefixLen, p.Bits())
		return pl
	}
	pl.prefix = p
	network := addrOrdinal(p.Addr())
	broadcast := network + (int64(1) << (32 - p.Bits())) - 1
	isHost := func(field string, a netip.Addr) bool {
		n := addrOrdinal(a)
		switch {
		case !p.Contains(a):
			vs.Add(field, "must be an address of %s, got %s", p, a)
		case n == network || n == broadcast:
			vs.Add(field, "must be a host address of %s, not its network or broadcast address %s", p, a)
		default:
			return true
		}
		return false
	}
	parse := func(field, s string) (netip.Addr, bool) {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is4() {
			vs.Add(field, "must be an IPv4 address, got %q", truncate(s))
			return a, false
		}
		return a, isHost(field, a)
	}
	ok := true
	pl.gateway = ordinalAddr(network + 1)
	if msg.GetGateway() != "" {
		pl.gateway, ok = parse("gateway", msg.GetGateway())
	}
	gw := addrOrdinal(pl.gateway)
	first, last := network+1, broadcast-1
	switch gw {
	case first:
		first++
	case last:
		last--
	}
	if msg.GetRangeStart() != "" {
		a, good := parse("range_start", msg.GetRangeStart())
		ok = ok && good
		first = addrOrdinal(a)
	}
	if msg.GetRangeEnd() != "" {
		a, good := parse("range_end", msg.GetRangeEnd())
		ok = ok && good
		last = addrOrdinal(a)
	}
	switch {
	case !ok:
	case first > last:
		vs.Add("range_end", "must not come before range_start %s, got %s", ordinalAddr(first), ordinalAddr(last))
	case gw >= first && gw <= last:
		vs.Add("range_start", "the range %s-%s contains the gateway %s: guests would be leased the gateway's address",
			ordinalAddr(first), ordinalAddr(last), pl.gateway)
	}
	pl.rangeFirst, pl.rangeLast = first, last
	if len(msg.GetDns()) > MaxDNSServers {
		vs.Add("dns", "must list at most %d nameservers, got %d", MaxDNSServers, len(msg.GetDns()))
	}
	for i, d := range msg.GetDns() {
		a, err := netip.ParseAddr(d)
		if err != nil {
			vs.Add(fmt.Sprintf("dns[%d]", i), "must be an IP address, got %q", truncate(d))
			continue
		}
		pl.dns = append(pl.dns, a.String())
	}
	if pl.dns == nil {
		pl.dns = []string{}
	}
	vs.MaxLen("network", msg.GetNetwork(), maxNetworkLen)
	vs.MaxLen("description", msg.GetDescription(), maxDescriptionLen)
	return pl
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// Create adds an IP pool.
func (s *IPPoolService) Create(ctx context.Context, req *connect.Request[apiv1.CreateIPPoolRequest]) (*connect.Response[apiv1.CreateIPPoolResponse], error) {
	msg := req.Msg
	var (
		sc scope
		pl poolPlan
	)
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.CreateIPPoolResponse]{
		// A refusal past the decision (a name taken, a pool with leases)
		// stays on record.
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			tenancy.ValidateScope(&vs, msg.GetTenant())
			vs.Name("name", msg.GetName())
			pl = planPool(&vs, msg)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			if sc, err = tenancy.LookupScope(ctx, q, msg.GetTenant()); err != nil || !sc.Found {
				return iam.Resource{Type: "IPPool", ID: iam.DraftID}, err
			}
			return iam.Resource{Type: "IPPool", ID: iam.DraftID, TenantID: sc.ID(),
				Attrs: map[string]any{"name": msg.GetName(), "cidr": pl.prefix.String()}}, nil
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.CreateIPPoolResponse, error) {
			if err := sc.NotFound(); err != nil {
				return nil, err
			}
			now := tx.Now()
			p := IPPool{ID: envelope.NewID(IPPoolIDPrefix, now), TenantID: sc.ID(), Name: msg.GetName(), CIDR: pl.prefix.String(),
				Gateway: pl.gateway.String(), DNS: pl.dns, RangeFirst: pl.rangeFirst, RangeLast: pl.rangeLast,
				Network: msg.GetNetwork(), Description: msg.GetDescription(), CreateTime: now}
			if err := IPPoolInsert(ctx, tx, &p); err != nil {
				if errors.Is(err, store.ErrUnique) {
					return nil, envelope.Errorf(envelope.CodeAlreadyExists, "an ip pool named %q already exists in %s", p.Name, sc.Name())
				}
				return nil, err
			}
			tx.SetResource(p.ID, "")
			tx.Emit(envelope.Event{Type: "ip_pool.created", TenantID: p.TenantID, ResourceType: "IPPool", ResourceID: p.ID,
				Data: map[string]any{"name": p.Name, "cidr": p.CIDR, "gateway": p.Gateway, "size": p.Size()}})
			return &apiv1.CreateIPPoolResponse{IpPool: IPPoolProto(p)}, nil
		},
	})
}

// read resolves and authorizes a pool read.
func (s *IPPoolService) read(ctx context.Context, tenant, pool string) (ipPoolRef, error) {
	var vs envelope.Violations
	tenancy.ValidateScope(&vs, tenant)
	vs.Ref("ip_pool", pool, IPPoolIDPrefix)
	if err := vs.Err(); err != nil {
		return ipPoolRef{}, s.env.Fail(ctx, err)
	}
	var r ipPoolRef
	if err := s.env.Resolve(ctx, "ip pool", func(ctx context.Context, q store.Querier) (err error) {
		r, err = lookupIPPool(ctx, q, tenant, pool)
		return err
	}); err != nil {
		return r, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, r.resource()); err != nil {
		return r, err
	}
	if err := r.notFound(); err != nil {
		return r, s.env.Fail(ctx, err)
	}
	return r, nil
}

// Get reads a pool with its lease count.
func (s *IPPoolService) Get(ctx context.Context, req *connect.Request[apiv1.GetIPPoolRequest]) (*connect.Response[apiv1.GetIPPoolResponse], error) {
	r, err := s.read(ctx, req.Msg.GetTenant(), req.Msg.GetIpPool())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&apiv1.GetIPPoolResponse{IpPool: IPPoolProto(r.obj)}), nil
}

// ListLeases lists a pool's leases by address.
func (s *IPPoolService) ListLeases(ctx context.Context, req *connect.Request[apiv1.ListIPLeasesRequest]) (*connect.Response[apiv1.ListIPLeasesResponse], error) {
	r, err := s.read(ctx, req.Msg.GetTenant(), req.Msg.GetIpPool())
	if err != nil {
		return nil, err
	}
	var leases []IPLease
	if err := s.env.Resolve(ctx, "leases", func(ctx context.Context, q store.Querier) (err error) {
		leases, err = IPLeaseList(ctx, q, r.obj.ID)
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.ListIPLeasesResponse{}
	for _, l := range leases {
		out.Leases = append(out.Leases, &apiv1.IPLease{Address: l.Address, PoolId: l.PoolID, Holder: l.Holder, Mac: l.MAC,
			CreateTime: timestamppb.New(l.CreateTime)})
	}
	return connect.NewResponse(out), nil
}

// List lists the scope's pools and the platform's, which a tenant's
// instances lease from too (as flavors list the platform's).
func (s *IPPoolService) List(ctx context.Context, req *connect.Request[apiv1.ListIPPoolsRequest]) (*connect.Response[apiv1.ListIPPoolsResponse], error) {
	pools, next, err := tenancy.ListPage(ctx, s.env, req.Msg, "ip pools",
		func(ctx context.Context, q store.Querier, sc scope, after string, limit int) ([]IPPool, error) {
			return IPPoolListOwners(ctx, q, sc.ID(), "", after, limit)
		}, func(p IPPool) string { return p.ID })
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListIPPoolsResponse{NextPageToken: next}
	for _, p := range pools {
		out.IpPools = append(out.IpPools, IPPoolProto(p))
	}
	return connect.NewResponse(out), nil
}

// Delete removes a pool that has no leases.
func (s *IPPoolService) Delete(ctx context.Context, req *connect.Request[apiv1.DeleteIPPoolRequest]) (*connect.Response[apiv1.DeleteIPPoolResponse], error) {
	msg := req.Msg
	var r ipPoolRef
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.DeleteIPPoolResponse]{
		// A refusal past the decision (a name taken, a pool with leases)
		// stays on record.
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			tenancy.ValidateScope(&vs, msg.GetTenant())
			vs.Ref("ip_pool", msg.GetIpPool(), IPPoolIDPrefix)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			r, err = lookupIPPool(ctx, q, msg.GetTenant(), msg.GetIpPool())
			return r.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.DeleteIPPoolResponse, error) {
			if err := r.notFound(); err != nil {
				return nil, err
			}
			p, err := IPPoolLock(ctx, tx, r.obj.ID)
			if errors.Is(err, store.ErrNotFound) {
				return nil, envelope.NotFound("ip pool", msg.GetIpPool())
			}
			if err != nil {
				return nil, err
			}
			leased, err := IPLeaseOrdinals(ctx, tx, p.ID)
			if err != nil {
				return nil, err
			}
			if len(leased) > 0 {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition,
					"ip pool %s still has %d lease(s): delete the instances that hold them first", p.Name, len(leased))
			}
			if err := IPPoolDelete(ctx, tx, p.ID); err != nil {
				return nil, err
			}
			tx.Emit(envelope.Event{Type: "ip_pool.deleted", TenantID: p.TenantID, ResourceType: "IPPool", ResourceID: p.ID,
				Data: map[string]any{"name": p.Name}})
			return &apiv1.DeleteIPPoolResponse{}, nil
		},
	})
}

// IPPoolProto converts a pool for the API.
func IPPoolProto(p IPPool) *apiv1.IPPool {
	return &apiv1.IPPool{Id: p.ID, TenantId: p.TenantID, Name: p.Name, Cidr: p.CIDR, Gateway: p.Gateway, Dns: p.DNS,
		RangeStart: ordinalAddr(p.RangeFirst).String(), RangeEnd: ordinalAddr(p.RangeLast).String(), Network: p.Network,
		Size: p.Size(), Leased: p.Leased, Description: p.Description, CreateTime: timestamppb.New(p.CreateTime)}
}
