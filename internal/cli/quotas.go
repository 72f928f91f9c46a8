package cli

import (
	"context"
	"fmt"
	"io"
	"math"
	"strconv"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/quota"
)

func (a *app) quotasCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "quotas", Aliases: []string{"quota"}, Short: "Set and read the GPU quotas of a tenant and its projects"}
	var tenant, project, confirmationID string

	var (
		model, poolRef string
		gpus           int32
		gpuHours       float64
	)
	set := &cobra.Command{
		Use:   "set --tenant T [--project P] [--model M] [--pool P] [--gpus N] [--gpu-hours H]",
		Short: "Create or replace the quota of one scope",
		Long: `Create or replace the quota of one scope: the tenant, or one of its projects
(--project), optionally counted only for one GPU model (--model) or one pool
(--pool). --gpus bounds the GPUs held at once, --gpu-hours the GPU-hours booked
in all; a limit left out is unlimited, so setting a scope again without a flag
lifts that limit. A tenant-wide quota is the platform's to set; tenant admins
set their projects' quotas.`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			req := &apiv1.SetQuotaRequest{Tenant: t, Project: project, Model: model, Pool: poolRef}
			if cmd.Flags().Changed("gpus") {
				req.Gpus = &gpus
			}
			if cmd.Flags().Changed("gpu-hours") {
				req.GpuHours = &gpuHours
			}
			var resp *connect.Response[apiv1.SetQuotaResponse]
			// Set replaces the scope's quota, so repeating it is safe.
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.Quotas.Set(cmd.Context(), request(req, mutation{confirmationID: confirmationID}))
				return err
			})
			if err != nil {
				return err
			}
			return a.printQuotas(cmd, resp.Msg, resp.Msg.GetQuota())
		},
	}
	addTenantFlag(set, &tenant)
	set.Flags().StringVar(&project, "project", "", "project name or id (default: a tenant-wide quota)")
	set.Flags().StringVar(&model, "model", "", "count only this GPU model, e.g. H100 (default: every model)")
	set.Flags().StringVar(&poolRef, "pool", "", "count only this pool, name or id (default: every pool)")
	set.Flags().Int32Var(&gpus, "gpus", 0, "GPUs held at once (default: unlimited)")
	set.Flags().Float64Var(&gpuHours, "gpu-hours", 0, "GPU-hours booked in all (default: unlimited)")
	addConfirmationFlag(set, &confirmationID)

	get := &cobra.Command{
		Use:   "get QUOTA",
		Short: "Show a quota (id) and what its scope holds",
		Args:  positional("QUOTA"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Quotas.Get(cmd.Context(), connect.NewRequest(&apiv1.GetQuotaRequest{Tenant: t, Quota: argv[0]}))
			if err != nil {
				return err
			}
			return a.printQuotas(cmd, resp.Msg, resp.Msg.GetQuota())
		},
	}
	addTenantFlag(get, &tenant)

	var limit int
	list := &cobra.Command{
		Use:   "list [--tenant T] [--project P]",
		Short: "List quotas with what their scopes hold",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			resolve := a.clientFleetTenant
			if project != "" {
				// A project is named within its tenant.
				resolve = a.clientTenant
			}
			c, t, err := resolve(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.Quota, string, error) {
				resp, err := c.Quotas.List(ctx, connect.NewRequest(&apiv1.ListQuotasRequest{Tenant: t, Project: project, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetQuotas(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printQuotas(cmd, &apiv1.ListQuotasResponse{Quotas: all}, all...)
		},
	}
	addTenantFlag(list, &tenant)
	list.Flags().StringVar(&project, "project", "", "only this project's quotas (name or id)")
	addLimitFlag(list, &limit)

	cmd.AddCommand(set, list, get)
	return cmd
}

func (a *app) printQuotas(cmd *cobra.Command, msg proto.Message, items ...*apiv1.Quota) error {
	var nb nameBook
	if a.flagOutput == "table" {
		if c, err := a.client(); err == nil {
			var ids []string
			for _, q := range items {
				ids = append(ids, q.GetTenantId())
			}
			nb = a.names(cmd.Context(), c, ids...)
		}
	}
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		row(w, "ID", "TENANT", "SCOPE", "GPUS", "GPU-HOURS", "UPDATED")
		for _, q := range items {
			// The scope by names (project/web/model=H100/pool=h100); the
			// API message keeps the ids.
			scope := quota.Quota{ProjectID: nb.project(q.GetProjectId()), Model: q.GetModel(), PoolID: nb.pool(q.GetPoolId())}.Scope()
			row(w, q.GetId(), nb.tenant(q.GetTenantId()), scope,
				fmt.Sprintf("%d/%s", q.GetGpusUsed(), quotaLimitString(float64(q.GetGpus()))),
				fmt.Sprintf("%s/%s", quotaHoursString(q.GetGpuHoursUsed()), quotaLimitString(q.GetGpuHours())),
				ts(q.GetUpdateTime()))
		}
	})
}

// quotaLimitString prints a quota limit; -1 is unlimited.
func quotaLimitString(l float64) string {
	if l == quota.Unlimited {
		return "unlimited"
	}
	return quotaHoursString(l)
}

// quotaHoursString prints at most two decimals, without trailing zeros.
func quotaHoursString(h float64) string {
	return strconv.FormatFloat(math.Round(h*100)/100, 'f', -1, 64)
}

// nameBook maps the ids rows carry (tenants, projects, pools) to names, so
// tables print what operators typed. It is filled best effort: an id the
// caller may not read, or a failed lookup, prints as the id.
type nameBook struct {
	tenants, projects, pools map[string]string
}

func (n nameBook) tenant(id string) string  { return cmpOr(n.tenants[id], id) }
func (n nameBook) project(id string) string { return cmpOr(n.projects[id], id) }
func (n nameBook) pool(id string) string    { return cmpOr(n.pools[id], id) }

// names looks up the names of the tenants given by id, and of their
// projects and pools: one call per tenant and kind.
func (a *app) names(ctx context.Context, c *client.Client, tenantIDs ...string) nameBook {
	n := nameBook{tenants: map[string]string{}, projects: map[string]string{}, pools: map[string]string{}}
	seen := map[string]bool{}
	for _, id := range tenantIDs {
		if id == "" || seen[id] {
			continue
		}
		seen[id] = true
		if t, err := c.Tenants.Get(ctx, connect.NewRequest(&apiv1.GetTenantRequest{Tenant: id})); err == nil {
			n.tenants[id] = t.Msg.GetTenant().GetName()
		}
		projects, _ := listAll(ctx, 0, func(ctx context.Context, token string, size int32) ([]*apiv1.Project, string, error) {
			resp, err := c.Projects.List(ctx, connect.NewRequest(&apiv1.ListProjectsRequest{Tenant: id, PageToken: token, PageSize: size}))
			if err != nil {
				return nil, "", err
			}
			return resp.Msg.GetProjects(), resp.Msg.GetNextPageToken(), nil
		})
		for _, p := range projects {
			n.projects[p.GetId()] = p.GetName()
		}
		pools, _ := listAll(ctx, 0, func(ctx context.Context, token string, size int32) ([]*apiv1.Pool, string, error) {
			resp, err := c.Pools.List(ctx, connect.NewRequest(&apiv1.ListPoolsRequest{Tenant: id, IncludeArchived: true, PageToken: token, PageSize: size}))
			if err != nil {
				return nil, "", err
			}
			return resp.Msg.GetPools(), resp.Msg.GetNextPageToken(), nil
		})
		for _, p := range pools {
			n.pools[p.GetId()] = p.GetName()
		}
	}
	return n
}
