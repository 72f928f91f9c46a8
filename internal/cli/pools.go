package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/pool"
)

// poolFlags are the selector and policy flags create and update share.
type poolFlags struct {
	selector                     string
	sharing                      string
	slots                        int32
	vcpuPerGPU, memoryGiBPerGPU  int32
	hugepagesPerGPU              int32
	reserveVCPU, reserveMemory   int32
	singleTenant                 bool
	maxPending                   int32
	minDuration, maxDurationSecs int64
	startHorizon                 time.Duration
	attestor                     string
	// A provider pool's: servers rented through a provider account.
	providerAccount, serverType string
	providerImage, location     string
	// Prices per hour, decimals in the platform's currency (docs/billing.md).
	priceGPU, priceInstance   map[string]string
	priceVCPU, priceMemoryGiB string
	// memoryOvercommit is policy.memory_overcommit ("1.5").
	memoryOvercommit string
}

func (f *poolFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.selector, "selector", "", "node selector, e.g. 'gpu.model=H100,zone in (a,b),!spot,gpu'")
	fl.StringVar(&f.sharing, "sharing", "", "GPU sharing: exclusive (default), mig, timeslice, mps")
	fl.Int32Var(&f.slots, "slots", 0, "slots per GPU (1-48; timeslice and mps only)")
	fl.Int32Var(&f.vcpuPerGPU, "vcpu-per-gpu", 0, "vCPUs that come with each GPU")
	fl.Int32Var(&f.memoryGiBPerGPU, "memory-gib-per-gpu", 0, "memory (GiB) that comes with each GPU")
	fl.Int32Var(&f.hugepagesPerGPU, "hugepages-1gi-per-gpu", 0, "1 GiB huge pages that come with each GPU")
	fl.Int32Var(&f.reserveVCPU, "reserve-vcpu", 0, "vCPUs each node keeps for the host")
	fl.Int32Var(&f.reserveMemory, "reserve-memory-gib", 0, "memory (GiB) each node keeps for the host")
	fl.BoolVar(&f.singleTenant, "single-tenant", false, "nodes serve one tenant's workloads at a time")
	fl.Int32Var(&f.maxPending, "max-pending", 0, "bookings that may wait for capacity")
	fl.Int64Var(&f.minDuration, "min-duration-seconds", 0, "shortest booking (0: unbounded)")
	fl.Int64Var(&f.maxDurationSecs, "max-duration-seconds", 0, "longest booking, at most 30 days (0: unbounded)")
	fl.Var((*spanValue)(&f.startHorizon), "start-horizon", "how far ahead a reservation may start, e.g. 30d (default 90d, at most 366d)")
	fl.StringVar(&f.attestor, "require-attestor", "", "machines joining with a token for this pool must attest: tpm, x509, cloud or kubelet (docs/attestation.md)")
	fl.StringVar(&f.providerAccount, "provider-account", "", "make a provider pool: each instance is a server rented through this provider account (docs/providers.md)")
	fl.StringVar(&f.serverType, "server-type", "", "provider pool: the provider's server type, e.g. cx22")
	fl.StringVar(&f.providerImage, "provider-image", "", "provider pool: the image servers boot (an instance's --image overrides it)")
	fl.StringVar(&f.location, "location", "", "provider pool: where servers run (default the account's)")
	fl.StringToStringVar(&f.priceGPU, "price-gpu-hour", nil, "price of a GPU-hour per model, e.g. H100=2.50,*=1 (docs/billing.md)")
	fl.StringVar(&f.priceVCPU, "price-vcpu-hour", "", "price of a vCPU-hour")
	fl.StringVar(&f.priceMemoryGiB, "price-memory-gib-hour", "", "price of a GiB-hour of memory")
	fl.StringToStringVar(&f.priceInstance, "price-instance-hour", nil, "price of an instance-hour per flavor, e.g. gpu-large=20")
	fl.StringVar(&f.memoryOvercommit, "memory-overcommit", "", "overcommit nodes' memory for ballooning flavors by this ratio, 1 to 2, e.g. 1.5 (docs/instances.md)")
}

func (f *poolFlags) parseSelector() ([]*apiv1.SelectorRequirement, error) {
	reqs, err := pool.ParseSelector(f.selector)
	if err != nil {
		return nil, invalidArg("selector", err.Error())
	}
	return reqs, nil
}

func (f *poolFlags) policy() *apiv1.PoolPolicy {
	p := &apiv1.PoolPolicy{
		HostReserve: &apiv1.HostReserve{Vcpu: f.reserveVCPU, MemoryGib: f.reserveMemory},
		GpuSharing:  f.sharing, SlotsPerGpu: f.slots, SingleTenant: f.singleTenant, MaxPending: f.maxPending,
		MinDurationSeconds: f.minDuration, MaxDurationSeconds: f.maxDurationSecs,
		StartHorizonSeconds: int64(f.startHorizon / time.Second),
		RequiredAttestor:    f.attestor,
		MemoryOvercommit:    f.memoryOvercommit,
	}
	if f.vcpuPerGPU != 0 || f.memoryGiBPerGPU != 0 || f.hugepagesPerGPU != 0 {
		p.PerGpu = &apiv1.PerGpuShare{Vcpu: f.vcpuPerGPU, MemoryGib: f.memoryGiBPerGPU, Hugepages_1Gi: f.hugepagesPerGPU}
	}
	if f.providerAccount != "" || f.serverType != "" || f.providerImage != "" || f.location != "" {
		p.Provider = &apiv1.ProviderPolicy{Account: f.providerAccount, ServerType: f.serverType, Image: f.providerImage, Location: f.location}
	}
	if len(f.priceGPU) > 0 || len(f.priceInstance) > 0 || f.priceVCPU != "" || f.priceMemoryGiB != "" {
		p.Prices = &apiv1.PoolPrices{GpuHour: f.priceGPU, VcpuHour: f.priceVCPU, MemoryGibHour: f.priceMemoryGiB, InstanceHour: f.priceInstance}
	}
	return p
}

// policyChanged says whether any policy flag was given.
func policyChanged(cmd *cobra.Command) bool {
	for _, name := range []string{"sharing", "slots", "vcpu-per-gpu", "memory-gib-per-gpu", "hugepages-1gi-per-gpu",
		"reserve-vcpu", "reserve-memory-gib", "single-tenant", "max-pending", "min-duration-seconds", "max-duration-seconds", "start-horizon", "require-attestor",
		"provider-account", "server-type", "provider-image", "location",
		"price-gpu-hour", "price-vcpu-hour", "price-memory-gib-hour", "price-instance-hour", "memory-overcommit"} {
		if cmd.Flags().Changed(name) {
			return true
		}
	}
	return false
}

func (a *app) poolsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "pools", Aliases: []string{"pool"}, Short: "Create, list, update and archive a tenant's pools"}
	var tenant, confirmationID string

	var cf poolFlags
	create := &cobra.Command{
		Use:   "create NAME --tenant T --selector SEL",
		Short: "Create a pool",
		Long: `Create a pool: the tenant's nodes whose labels match the selector, and the
policy that governs them. The selector is comma-separated terms: key=value,
key in (a,b), key notin (a,b), key (exists) and !key (does not exist).`,
		Args: positional("NAME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			sel, err := cf.parseSelector()
			if err != nil {
				return err
			}
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			m := newCreate(confirmationID)
			var resp *connect.Response[apiv1.CreatePoolResponse]
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.Pools.Create(cmd.Context(), request(&apiv1.CreatePoolRequest{
					Tenant: t, Name: argv[0], Selector: sel, Policy: cf.policy(),
				}, m))
				return err
			})
			if err != nil {
				return err
			}
			return a.printPools(cmd, resp.Msg, resp.Msg.GetPool())
		},
	}
	addTenantFlag(create, &tenant)
	cf.add(create)
	addConfirmationFlag(create, &confirmationID)

	var uf poolFlags
	update := &cobra.Command{
		Use:   "update POOL",
		Short: "Replace a pool's selector (--selector) or policy (any policy flag)",
		Long: `Update an active pool. --selector replaces the selector; any policy flag
replaces the whole policy with the flags given (unset ones take defaults).`,
		Args: positional("POOL"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			req := &apiv1.UpdatePoolRequest{Pool: argv[0]}
			if cmd.Flags().Changed("selector") {
				sel, err := uf.parseSelector()
				if err != nil {
					return err
				}
				req.Selector = &apiv1.PoolSelector{Requirements: sel}
			}
			if policyChanged(cmd) {
				req.Policy = uf.policy()
			}
			if req.Selector == nil && req.Policy == nil {
				return invalidArg("selector", "nothing to update: pass --selector or a policy flag")
			}
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			req.Tenant = t
			resp, err := c.Pools.Update(cmd.Context(), request(req, mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printPools(cmd, resp.Msg, resp.Msg.GetPool())
		},
	}
	addTenantFlag(update, &tenant)
	uf.add(update)
	addConfirmationFlag(update, &confirmationID)

	get := &cobra.Command{
		Use:   "get POOL",
		Short: "Show a pool (name or id)",
		Args:  positional("POOL"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Pools.Get(cmd.Context(), connect.NewRequest(&apiv1.GetPoolRequest{Tenant: t, Pool: argv[0]}))
			if err != nil {
				return err
			}
			return a.printPools(cmd, resp.Msg, resp.Msg.GetPool())
		},
	}
	addTenantFlag(get, &tenant)

	var (
		limit    int
		archived bool
	)
	list := &cobra.Command{
		Use:   "list",
		Short: "List pools",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.Pool, string, error) {
				resp, err := c.Pools.List(ctx, connect.NewRequest(&apiv1.ListPoolsRequest{Tenant: t, IncludeArchived: archived, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetPools(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printPools(cmd, &apiv1.ListPoolsResponse{Pools: all}, all...)
		},
	}
	addTenantFlag(list, &tenant)
	addLimitFlag(list, &limit)
	list.Flags().BoolVar(&archived, "include-archived", false, "include archived pools")

	var ifIdle bool
	archive := &cobra.Command{
		Use:   "archive POOL",
		Short: "Archive a pool (idempotent)",
		Args:  positional("POOL"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Pools.Archive(cmd.Context(), request(&apiv1.ArchivePoolRequest{Tenant: t, Pool: argv[0], IfIdle: ifIdle}, mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printPools(cmd, resp.Msg, resp.Msg.GetPool())
		},
	}
	addTenantFlag(archive, &tenant)
	addConfirmationFlag(archive, &confirmationID)
	archive.Flags().BoolVar(&ifIdle, "if-idle", false, "refuse while the pool has live reservations (archiving does not end them)")

	var (
		offerTo     []string
		offerSingle bool
	)
	offer := &cobra.Command{
		Use:   "offer POOL --to all|TENANT,… [--single-tenant]",
		Short: "Offer a pool to other tenants (all, a list, or none)",
		Long: `Offer a pool the tenant owns to other tenants, who may then list it, preview
and reserve from it within their quotas. --to all offers it to every tenant,
--to acme,globex to those, --to none makes it private again. --single-tenant
keeps one consumer tenant at a time on a node. Reservations already made are
kept.`,
		Args: positional("POOL"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if !cmd.Flags().Changed("to") {
				return invalidArg("to", "is required: all, tenant names, or none")
			}
			to := offerTo
			if len(to) == 1 && to[0] == "none" {
				to = nil
			}
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Pools.Offer(cmd.Context(), request(&apiv1.OfferPoolRequest{Tenant: t, Pool: argv[0], To: to, SingleTenant: offerSingle},
				mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printPools(cmd, resp.Msg, resp.Msg.GetPool())
		},
	}
	addTenantFlag(offer, &tenant)
	offer.Flags().StringSliceVar(&offerTo, "to", nil, "all, consumer tenants (comma-separated), or none")
	offer.Flags().BoolVar(&offerSingle, "single-tenant", false, "one consumer tenant at a time on a node")
	addConfirmationFlag(offer, &confirmationID)

	cmd.AddCommand(create, list, get, update, archive, offer)
	cmd.AddCommand(a.poolsHealthCommands()...)
	return cmd
}

// offerString prints who a pool is offered to.
func offerString(p *apiv1.Pool) string {
	o := p.GetOffer()
	s := o.GetScope()
	if s == pool.OfferTenants {
		s = strings.Join(o.GetTenants(), ",")
	}
	if p.GetPolicy().GetSingleTenant() {
		s += " (single-tenant)"
	}
	return s
}

func (a *app) printPools(cmd *cobra.Command, msg proto.Message, items ...*apiv1.Pool) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		row(w, "ID", "NAME", "STATE", "OWNER", "OFFERED", "SELECTOR", "SHARING", "CREATED")
		for _, p := range items {
			sharing := p.GetPolicy().GetGpuSharing()
			if n := p.GetPolicy().GetSlotsPerGpu(); n > 0 {
				sharing = fmt.Sprintf("%s/%d", sharing, n)
			}
			if m := p.GetPolicy().GetMemoryOvercommit(); m != "" {
				sharing += ", memory x" + m
			}
			row(w, p.GetId(), p.GetName(), p.GetState(), dash(p.GetOwner()), offerString(p), dash(selectorString(p.GetSelector())), sharing, ts(p.GetCreateTime()))
		}
	})
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
