package cli

import (
	"context"
	"io"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// driversCommand lists the BMC drivers sites' agents report: what a
// machine's --bmc-driver may name at each site.
func (a *app) driversCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "drivers", Aliases: []string{"driver"}, Short: "Show the BMC drivers each site's agents have"}
	var tenant, site string
	list := &cobra.Command{
		Use:   "list [--site SITE]",
		Short: "List each site agent's BMC drivers (built-in and external) with versions",
		Long: `List the BMC drivers the site agents reported when their sessions opened:
the built-in ipmi and redfish, and the external drivers of each agent's
--site-drivers-dir. Without --site, every site of the tenant.`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			type siteRef struct{ name, id string }
			var sites []siteRef
			if site != "" {
				sites = append(sites, siteRef{name: site, id: site})
			} else {
				all, err := listAll(ctx, 0, func(ctx context.Context, token string, size int32) ([]*apiv1.Site, string, error) {
					resp, err := c.Sites.List(ctx, connect.NewRequest(&apiv1.ListSitesRequest{Tenant: t, PageToken: token, PageSize: size}))
					if err != nil {
						return nil, "", err
					}
					return resp.Msg.GetSites(), resp.Msg.GetNextPageToken(), nil
				})
				if err != nil {
					return err
				}
				for _, s := range all {
					sites = append(sites, siteRef{name: s.GetName(), id: s.GetId()})
				}
			}
			out := &apiv1.ListSiteDriversResponse{}
			names := map[string]string{} // site id → name, for the table
			for _, s := range sites {
				resp, err := c.Sites.ListDrivers(ctx, connect.NewRequest(&apiv1.ListSiteDriversRequest{Tenant: t, Site: s.id}))
				if err != nil {
					return err
				}
				for _, d := range resp.Msg.GetDrivers() {
					names[d.GetSiteId()] = s.name
				}
				out.Drivers = append(out.Drivers, resp.Msg.GetDrivers()...)
			}
			return a.printer(cmd.OutOrStdout()).print(out, func(w io.Writer) {
				row(w, "SITE", "AGENT", "NAME", "VERSION", "KIND", "REPORTS", "CAPABILITIES", "PATH")
				for _, d := range out.GetDrivers() {
					row(w, names[d.GetSiteId()], d.GetNodeId(), d.GetName(), d.GetVersion(), d.GetKind(), d.GetReports(),
						strings.Join(d.GetCapabilities(), ","), d.GetPath())
				}
			})
		},
	}
	addTenantFlag(list, &tenant)
	list.Flags().StringVar(&site, "site", "", "only this site (name or id)")
	cmd.AddCommand(list)
	return cmd
}
