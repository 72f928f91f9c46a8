package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// Flavors and IP pools, like images, are a tenant's or the platform's: a
// platform key without a tenant works on the platform's (imagesClient).

func (a *app) flavorsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "flavors", Aliases: []string{"flavor"}, Short: "Manage instance flavors (the platform's, which every tenant sees, or a tenant's own)"}
	var (
		tenant, confirmationID, gpuModel, description string
		vcpus, diskGiB, gpus                          int32
		memoryMiB, minMemoryMiB                       int64
		numaAffine, pinned, hugepages, balloon        bool
		limit                                         int
	)
	create := &cobra.Command{
		Use:   "create NAME --vcpus N --memory-mib M --disk-gib D [--gpus G [--gpu-model M]] [--numa-affine] [--pinned] [--hugepages] [--balloon [--min-memory-mib F]]",
		Short: "Add a flavor; without --tenant a platform admin adds a platform flavor",
		Args:  positional("NAME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			m := newCreate(confirmationID)
			var resp *connect.Response[apiv1.CreateFlavorResponse]
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.Flavors.Create(cmd.Context(), request(&apiv1.CreateFlavorRequest{Tenant: t, Name: argv[0], Vcpus: vcpus,
					MemoryMib: memoryMiB, DiskGib: diskGiB, Gpus: gpus, GpuModel: gpuModel, NumaAffine: numaAffine, Pinned: pinned,
					Hugepages: hugepages, Description: description, Balloon: balloon, MinMemoryMib: minMemoryMiB}, m))
				return err
			})
			if err != nil {
				return err
			}
			return a.printFlavors(cmd, resp.Msg, resp.Msg.GetFlavor())
		},
	}
	create.Flags().StringVar(&tenant, "tenant", "", imagesTenantHelp)
	fl := create.Flags()
	fl.Int32Var(&vcpus, "vcpus", 0, "virtual CPUs")
	fl.Int64Var(&memoryMiB, "memory-mib", 0, "memory in MiB")
	fl.Int32Var(&diskGiB, "disk-gib", 0, "root disk in GiB")
	fl.Int32Var(&gpus, "gpus", 0, "GPUs passed through")
	fl.StringVar(&gpuModel, "gpu-model", "", "the GPU model the GPUs must be (default any)")
	fl.BoolVar(&numaAffine, "numa-affine", false, "CPUs, memory and GPUs on one NUMA node")
	fl.BoolVar(&pinned, "pinned", false, "dedicated host CPUs, isolated ones first")
	fl.BoolVar(&hugepages, "hugepages", false, "back guest memory with the host's hugepages")
	fl.BoolVar(&balloon, "balloon", false, "let the host balloon guest memory back (pools with --memory-overcommit book less; not with --hugepages or --gpus)")
	fl.Int64Var(&minMemoryMiB, "min-memory-mib", 0, "with --balloon: the least memory the balloon leaves a guest (default what the instance books)")
	fl.StringVar(&description, "description", "", "what the flavor is for")
	addConfirmationFlag(create, &confirmationID)

	get := &cobra.Command{
		Use:   "get FLAVOR",
		Short: "Show a flavor (the tenant's or the platform's)",
		Args:  positional("FLAVOR"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Flavors.Get(cmd.Context(), connect.NewRequest(&apiv1.GetFlavorRequest{Tenant: t, Flavor: argv[0]}))
			if err != nil {
				return err
			}
			return a.printFlavors(cmd, resp.Msg, resp.Msg.GetFlavor())
		},
	}
	get.Flags().StringVar(&tenant, "tenant", "", imagesTenantHelp)

	list := &cobra.Command{
		Use:   "list",
		Short: "List a tenant's flavors and the platform's",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.Flavor, string, error) {
				resp, err := c.Flavors.List(ctx, connect.NewRequest(&apiv1.ListFlavorsRequest{Tenant: t, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetFlavors(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printFlavors(cmd, &apiv1.ListFlavorsResponse{Flavors: all}, all...)
		},
	}
	list.Flags().StringVar(&tenant, "tenant", "", imagesTenantHelp)
	addLimitFlag(list, &limit)

	del := &cobra.Command{
		Use:   "delete FLAVOR",
		Short: "Delete a flavor of the tenant (or, as a platform admin, of the platform)",
		Args:  positional("FLAVOR"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Flavors.Delete(cmd.Context(), request(&apiv1.DeleteFlavorRequest{Tenant: t, Flavor: argv[0]}, mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) { fmt.Fprintf(w, "deleted %s\n", argv[0]) })
		},
	}
	del.Flags().StringVar(&tenant, "tenant", "", imagesTenantHelp)
	addConfirmationFlag(del, &confirmationID)

	cmd.AddCommand(create, list, get, del)
	return cmd
}

func (a *app) printFlavors(cmd *cobra.Command, msg proto.Message, items ...*apiv1.Flavor) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		row(w, "ID", "NAME", "OWNER", "VCPUS", "MEMORY", "DISK", "GPUS", "PLACEMENT")
		for _, f := range items {
			owner := f.GetTenantId()
			if owner == "" {
				owner = "platform"
			}
			gpus := strconv.Itoa(int(f.GetGpus()))
			if f.GetGpuModel() != "" {
				gpus += " " + f.GetGpuModel()
			}
			var place []string
			for _, fl := range []struct {
				name string
				on   bool
			}{{"numa-affine", f.GetNumaAffine()}, {"pinned", f.GetPinned()}, {"hugepages", f.GetHugepages()}, {"balloon", f.GetBalloon()}} {
				if fl.on {
					place = append(place, fl.name)
				}
			}
			row(w, f.GetId(), f.GetName(), owner, strconv.Itoa(int(f.GetVcpus())), fmt.Sprintf("%d MiB", f.GetMemoryMib()),
				fmt.Sprintf("%d GiB", f.GetDiskGib()), gpus, strings.Join(place, ","))
		}
	})
}

func (a *app) ipPoolsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "ip-pools", Aliases: []string{"ip-pool"}, Short: "Manage IP pools (IPAM): the addresses, gateway and nameservers guests get"}
	var (
		tenant, confirmationID, cidr, gateway, rangeStart, rangeEnd, network, description string
		dns                                                                               []string
		limit                                                                             int
	)
	create := &cobra.Command{
		Use:   "create NAME --cidr CIDR [--gateway IP] [--dns IP,…] [--range-start IP --range-end IP] [--network N]",
		Short: "Add an IP pool; the gateway defaults to the first host, the range to every other host",
		Args:  positional("NAME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			m := newCreate(confirmationID)
			var resp *connect.Response[apiv1.CreateIPPoolResponse]
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.IPPools.Create(cmd.Context(), request(&apiv1.CreateIPPoolRequest{Tenant: t, Name: argv[0], Cidr: cidr,
					Gateway: gateway, Dns: dns, RangeStart: rangeStart, RangeEnd: rangeEnd, Network: network, Description: description}, m))
				return err
			})
			if err != nil {
				return err
			}
			return a.printIPPools(cmd, resp.Msg, resp.Msg.GetIpPool())
		},
	}
	create.Flags().StringVar(&tenant, "tenant", "", imagesTenantHelp)
	fl := create.Flags()
	fl.StringVar(&cidr, "cidr", "", "the IPv4 network (10.20.0.0/24)")
	fl.StringVar(&gateway, "gateway", "", "the guests' gateway (default the network's first host)")
	fl.StringSliceVar(&dns, "dns", nil, "nameservers guests get, comma-separated")
	fl.StringVar(&rangeStart, "range-start", "", "first address leased (default the first host after the gateway)")
	fl.StringVar(&rangeEnd, "range-end", "", "last address leased (default the last host)")
	fl.StringVar(&network, "network", "", "the site or host network the pool serves (dc1/br0)")
	fl.StringVar(&description, "description", "", "what the pool is for")
	addConfirmationFlag(create, &confirmationID)

	get := &cobra.Command{
		Use:   "get POOL [--leases]",
		Short: "Show an IP pool; --leases lists its leases",
		Args:  positional("POOL"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			if leases, _ := cmd.Flags().GetBool("leases"); leases {
				resp, err := c.IPPools.ListLeases(cmd.Context(), connect.NewRequest(&apiv1.ListIPLeasesRequest{Tenant: t, IpPool: argv[0]}))
				if err != nil {
					return err
				}
				return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) {
					row(w, "ADDRESS", "HOLDER", "MAC", "SINCE")
					for _, l := range resp.Msg.GetLeases() {
						row(w, l.GetAddress(), l.GetHolder(), l.GetMac(), ts(l.GetCreateTime()))
					}
				})
			}
			resp, err := c.IPPools.Get(cmd.Context(), connect.NewRequest(&apiv1.GetIPPoolRequest{Tenant: t, IpPool: argv[0]}))
			if err != nil {
				return err
			}
			return a.printIPPools(cmd, resp.Msg, resp.Msg.GetIpPool())
		},
	}
	get.Flags().StringVar(&tenant, "tenant", "", imagesTenantHelp)
	get.Flags().Bool("leases", false, "list the pool's leases instead")

	list := &cobra.Command{
		Use:   "list",
		Short: "List a tenant's IP pools",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.IPPool, string, error) {
				resp, err := c.IPPools.List(ctx, connect.NewRequest(&apiv1.ListIPPoolsRequest{Tenant: t, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetIpPools(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printIPPools(cmd, &apiv1.ListIPPoolsResponse{IpPools: all}, all...)
		},
	}
	list.Flags().StringVar(&tenant, "tenant", "", imagesTenantHelp)
	addLimitFlag(list, &limit)

	del := &cobra.Command{
		Use:   "delete POOL",
		Short: "Delete an IP pool without leases",
		Args:  positional("POOL"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.IPPools.Delete(cmd.Context(), request(&apiv1.DeleteIPPoolRequest{Tenant: t, IpPool: argv[0]}, mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) { fmt.Fprintf(w, "deleted %s\n", argv[0]) })
		},
	}
	del.Flags().StringVar(&tenant, "tenant", "", imagesTenantHelp)
	addConfirmationFlag(del, &confirmationID)

	cmd.AddCommand(create, list, get, del)
	return cmd
}

func (a *app) printIPPools(cmd *cobra.Command, msg proto.Message, items ...*apiv1.IPPool) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		row(w, "ID", "NAME", "CIDR", "GATEWAY", "RANGE", "DNS", "LEASED", "NETWORK")
		for _, p := range items {
			row(w, p.GetId(), p.GetName(), p.GetCidr(), p.GetGateway(), p.GetRangeStart()+"-"+p.GetRangeEnd(),
				strings.Join(p.GetDns(), ","), fmt.Sprintf("%d/%d", p.GetLeased(), p.GetSize()), p.GetNetwork())
		}
	})
}
