package cli

import (
	"context"
	"io"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

func (a *app) tenantsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "tenants", Aliases: []string{"tenant"}, Short: "Manage tenants (organizations)"}

	var displayName, confirmationID string
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a tenant (platform administrators)",
		Args:  positional("NAME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			m := newCreate(confirmationID)
			var resp *connect.Response[apiv1.CreateTenantResponse]
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.Tenants.Create(cmd.Context(), request(&apiv1.CreateTenantRequest{Name: argv[0], DisplayName: displayName}, m))
				return err
			})
			if err != nil {
				return err
			}
			return a.printTenants(cmd, resp.Msg, resp.Msg.GetTenant())
		},
	}
	create.Flags().StringVar(&displayName, "display-name", "", "human-friendly name")
	addConfirmationFlag(create, &confirmationID)

	var limit int
	list := &cobra.Command{
		Use:   "list",
		Short: "List tenants",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.Tenant, string, error) {
				resp, err := c.Tenants.List(ctx, connect.NewRequest(&apiv1.ListTenantsRequest{PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetTenants(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printTenants(cmd, &apiv1.ListTenantsResponse{Tenants: all}, all...)
		},
	}
	addLimitFlag(list, &limit)

	get := &cobra.Command{
		Use:   "get NAME",
		Short: "Show a tenant",
		Args:  positional("NAME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			resp, err := c.Tenants.Get(cmd.Context(), connect.NewRequest(&apiv1.GetTenantRequest{Tenant: argv[0]}))
			if err != nil {
				return err
			}
			return a.printTenants(cmd, resp.Msg, resp.Msg.GetTenant())
		},
	}
	suspend := &cobra.Command{
		Use:   "suspend NAME",
		Short: "Suspend a tenant: its keys still read, every mutation is refused; running work keeps running (platform administrators)",
		Args:  positional("NAME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			resp, err := c.Tenants.Suspend(cmd.Context(), connect.NewRequest(&apiv1.SuspendTenantRequest{Tenant: argv[0]}))
			if err != nil {
				return err
			}
			return a.printTenants(cmd, resp.Msg, resp.Msg.GetTenant())
		},
	}
	resume := &cobra.Command{
		Use:   "resume NAME",
		Short: "Lift a tenant's suspension (platform administrators)",
		Args:  positional("NAME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			resp, err := c.Tenants.Resume(cmd.Context(), connect.NewRequest(&apiv1.ResumeTenantRequest{Tenant: argv[0]}))
			if err != nil {
				return err
			}
			return a.printTenants(cmd, resp.Msg, resp.Msg.GetTenant())
		},
	}
	var dryRun bool
	var deleteConfirmation string
	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a suspended tenant and every row it owns but its audit log (--dry-run lists them; otherwise a human confirms)",
		Args:  positional("NAME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			resp, err := c.Tenants.Delete(cmd.Context(), request(&apiv1.DeleteTenantRequest{Tenant: argv[0], DryRun: dryRun}, mutation{confirmationID: deleteConfirmation}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) {
				row(w, "TABLE", "ID")
				for _, r := range resp.Msg.GetRows() {
					row(w, r.GetTable(), r.GetId())
				}
				// Live work the delete waits for, after the rows.
				for _, b := range resp.Msg.GetBlocking() {
					row(w, "blocked-by", b)
				}
			})
		},
	}
	del.Flags().BoolVar(&dryRun, "dry-run", false, "list what would be deleted and change nothing")
	addConfirmationFlag(del, &deleteConfirmation)
	cmd.AddCommand(create, list, get, suspend, resume, del)
	return cmd
}

// printTenants prints msg (the API's response) as JSON or YAML, or items as
// a table.
func (a *app) printTenants(cmd *cobra.Command, msg proto.Message, items ...*apiv1.Tenant) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		row(w, "NAME", "ID", "DISPLAY NAME", "STATE", "CREATED")
		for _, t := range items {
			row(w, t.GetName(), t.GetId(), dash(t.GetDisplayName()), dash(t.GetState()), ts(t.GetCreateTime()))
		}
	})
}

func (a *app) projectsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "projects", Aliases: []string{"project"}, Short: "Manage a tenant's projects"}

	var tenant, displayName, confirmationID string
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a project",
		Args:  positional("NAME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			m := newCreate(confirmationID)
			var resp *connect.Response[apiv1.CreateProjectResponse]
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.Projects.Create(cmd.Context(), request(&apiv1.CreateProjectRequest{Tenant: t, Name: argv[0], DisplayName: displayName}, m))
				return err
			})
			if err != nil {
				return err
			}
			return a.printProjects(cmd, resp.Msg, resp.Msg.GetProject())
		},
	}
	addTenantFlag(create, &tenant)
	create.Flags().StringVar(&displayName, "display-name", "", "human-friendly name")
	addConfirmationFlag(create, &confirmationID)

	var limit int
	var prefix string
	list := &cobra.Command{
		Use:   "list",
		Short: "List projects",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.Project, string, error) {
				resp, err := c.Projects.List(ctx, connect.NewRequest(&apiv1.ListProjectsRequest{Tenant: t, NamePrefix: prefix, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetProjects(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printProjects(cmd, &apiv1.ListProjectsResponse{Projects: all}, all...)
		},
	}
	addTenantFlag(list, &tenant)
	addLimitFlag(list, &limit)
	list.Flags().StringVar(&prefix, "prefix", "", "only projects whose name starts with this")

	get := &cobra.Command{
		Use:   "get NAME",
		Short: "Show a project",
		Args:  positional("NAME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Projects.Get(cmd.Context(), connect.NewRequest(&apiv1.GetProjectRequest{Tenant: t, Project: argv[0]}))
			if err != nil {
				return err
			}
			return a.printProjects(cmd, resp.Msg, resp.Msg.GetProject())
		},
	}
	addTenantFlag(get, &tenant)

	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a project",
		Args:  positional("NAME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			// No retry: a repeated delete could answer NOT_FOUND for a delete
			// that in fact succeeded.
			resp, err := c.Projects.Delete(cmd.Context(), request(&apiv1.DeleteProjectRequest{Tenant: t, Project: argv[0]}, mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) {
				row(w, "project "+argv[0]+" deleted")
			})
		},
	}
	addTenantFlag(del, &tenant)
	addConfirmationFlag(del, &confirmationID)

	cmd.AddCommand(create, list, get, del)
	return cmd
}

func (a *app) printProjects(cmd *cobra.Command, msg proto.Message, items ...*apiv1.Project) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		tenants := map[string]string{}
		if c, err := a.client(); err == nil {
			for _, p := range items {
				id := p.GetTenantId()
				if _, done := tenants[id]; done {
					continue
				}
				tenants[id] = ""
				if t, err := c.Tenants.Get(cmd.Context(), connect.NewRequest(&apiv1.GetTenantRequest{Tenant: id})); err == nil {
					tenants[id] = t.Msg.GetTenant().GetName()
				}
			}
		}
		row(w, "NAME", "ID", "TENANT", "DISPLAY NAME", "CREATED")
		for _, p := range items {
			row(w, p.GetName(), p.GetId(), cmpOr(tenants[p.GetTenantId()], p.GetTenantId()), dash(p.GetDisplayName()), ts(p.GetCreateTime()))
		}
	})
}

// clientTenant returns the client and the resolved, required tenant.
func (a *app) clientTenant(cmd *cobra.Command, flag string) (*client.Client, string, error) {
	c, err := a.client()
	if err != nil {
		return nil, "", err
	}
	t, err := a.tenant(cmd.Context(), flag, true)
	if err != nil {
		return nil, "", err
	}
	return c, t, nil
}
