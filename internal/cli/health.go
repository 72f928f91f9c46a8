package cli

import (
	"context"
	"fmt"
	"io"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// nodesHealthCommand is `nodes health [NODE]`: the tenant's open findings
// and what they take out, or one node's GPUs, findings and remediations.
func (a *app) nodesHealthCommand() *cobra.Command {
	var (
		tenant, pool, state, minSeverity string
		limit                            int
	)
	cmd := &cobra.Command{
		Use:   "health [NODE]",
		Short: "Show what is wrong with the fleet's GPUs, or with one node",
		Long: `Without NODE, list the tenant's open health findings (--state resolved or --state ""
for others) and how many GPUs and nodes they take out. With NODE, show its status (ok,
degraded, unhealthy, maintenance), each GPU's state and the reservations holding it, its
open findings and its latest remediations. See docs/health.md.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			if len(argv) == 1 {
				resp, err := c.Health.GetNodeHealth(cmd.Context(), connect.NewRequest(&apiv1.GetNodeHealthRequest{Tenant: t, Node: argv[0]}))
				if err != nil {
					return err
				}
				return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) { nodeHealthTable(w, resp.Msg.GetHealth()) })
			}
			out := &apiv1.ListFindingsResponse{}
			token := ""
			for {
				size := int32(100)
				if limit > 0 {
					size = int32(min(100, limit-len(out.Findings)))
				}
				resp, err := c.Health.ListFindings(cmd.Context(), connect.NewRequest(&apiv1.ListFindingsRequest{Tenant: t, Pool: pool,
					State: state, MinSeverity: minSeverity, PageSize: size, PageToken: token}))
				if err != nil {
					return err
				}
				out.Findings = append(out.Findings, resp.Msg.GetFindings()...)
				out.GpusOut, out.NodesUnhealthy = resp.Msg.GetGpusOut(), resp.Msg.GetNodesUnhealthy()
				token = resp.Msg.GetNextPageToken()
				if token == "" || (limit > 0 && len(out.Findings) >= limit) {
					break
				}
			}
			return a.printer(cmd.OutOrStdout()).print(out, func(w io.Writer) {
				findingTable(w, true, out.GetFindings())
				fmt.Fprintf(w, "\n%d GPUs out of placement; %d nodes with an open error or critical finding\n", out.GetGpusOut(), out.GetNodesUnhealthy())
			})
		},
	}
	addTenantFlag(cmd, &tenant)
	addLimitFlag(cmd, &limit)
	cmd.Flags().StringVar(&pool, "pool", "", "only findings of this pool's nodes (without NODE)")
	cmd.Flags().StringVar(&state, "state", "open", "open or resolved; empty for both (without NODE)")
	cmd.Flags().StringVar(&minSeverity, "min-severity", "", "only findings at least this severe: info, warning, error, critical (without NODE)")
	return cmd
}

func nodeHealthTable(w io.Writer, h *apiv1.NodeHealth) {
	row(w, "NODE", "STATUS", "POOL", "GPUS OUT")
	row(w, h.GetNode(), h.GetStatus(), dash(h.GetPoolId()), fmt.Sprintf("%d/%d", h.GetGpusOut(), h.GetGpusTotal()))
	fmt.Fprintln(w)
	row(w, "GPU", "INDEX", "MODEL", "STATE", "RESERVATIONS", "REASON")
	for _, g := range h.GetGpus() {
		row(w, g.GetUuid(), gpuIndex(g.GetIndex()), dash(g.GetModel()), g.GetState(), fmt.Sprint(g.GetReservations()), dash(g.GetReason()))
	}
	if len(h.GetFindings()) > 0 {
		fmt.Fprintln(w)
		findingTable(w, false, h.GetFindings())
	}
	if len(h.GetRemediations()) > 0 {
		fmt.Fprintln(w)
		remediationTable(w, false, h.GetRemediations())
	}
}

func gpuIndex(i int32) string {
	if i < 0 {
		return "-"
	}
	return fmt.Sprint(i)
}

func findingTable(w io.Writer, withNode bool, fs []*apiv1.HealthFinding) {
	head := []string{"ID", "KIND", "CODE", "SEVERITY", "ACTION", "STATE", "GPU", "COUNT", "SEEN", "MESSAGE"}
	if withNode {
		head = append([]string{"NODE"}, head...)
	}
	row(w, head...)
	for _, f := range fs {
		cells := []string{f.GetId(), f.GetKind(), fmt.Sprint(f.GetCode()), f.GetSeverity(), f.GetAction(), f.GetState(),
			dash(f.GetGpuUuid()), fmt.Sprint(f.GetCount()), ts(f.GetUpdateTime()), dash(f.GetMessage())}
		if withNode {
			cells = append([]string{dash(f.GetNode())}, cells...)
		}
		row(w, cells...)
	}
}

func remediationTable(w io.Writer, withNode bool, rs []*apiv1.Remediation) {
	head := []string{"ID", "ACTION", "STATE", "GPU", "REASON", "WORKFLOW", "CREATED", "ENDED", "ERROR"}
	if withNode {
		head = append([]string{"NODE"}, head...)
	}
	row(w, head...)
	for _, r := range rs {
		cells := []string{r.GetId(), r.GetAction(), r.GetState(), dash(r.GetGpuUuid()), dash(r.GetReason()), dash(r.GetWorkflowId()),
			ts(r.GetCreateTime()), ts(r.GetEndTime()), dash(r.GetError())}
		if withNode {
			cells = append([]string{dash(r.GetNode())}, cells...)
		}
		row(w, cells...)
	}
}

func poolHealthTable(w io.Writer, h *apiv1.PoolHealth) {
	row(w, "POOL", "NODES", "UNHEALTHY", "GPUS OUT", "BUDGET", "PENDING", "BREAKER")
	row(w, h.GetPool(), fmt.Sprint(h.GetNodes()), fmt.Sprint(h.GetNodesUnhealthy()), fmt.Sprintf("%d/%d", h.GetGpusOut(), h.GetGpusTotal()),
		fmt.Sprintf("%d/%d", h.GetBudgetUsed(), h.GetBudget()), fmt.Sprint(h.GetRemediationsPending()), h.GetBreaker())
	if h.GetBreakerReason() != "" {
		fmt.Fprintf(w, "\nbreaker: %s (tripped %s)\n", h.GetBreakerReason(), ts(h.GetBreakerTripTime()))
	}
}

// poolsHealthCommands are `pools health POOL` and `pools reset-breaker POOL`.
func (a *app) poolsHealthCommands() []*cobra.Command {
	var tenant string
	health := &cobra.Command{
		Use:   "health POOL",
		Short: "Show a pool's health: capacity out, disruption budget, circuit breaker",
		Args:  positional("POOL"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Health.GetPoolHealth(cmd.Context(), connect.NewRequest(&apiv1.GetPoolHealthRequest{Tenant: t, Pool: argv[0]}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) { poolHealthTable(w, resp.Msg.GetHealth()) })
		},
	}
	addTenantFlag(health, &tenant)

	var reason string
	reset := &cobra.Command{
		Use:   "reset-breaker POOL --reason R",
		Short: "Close a pool's tripped health breaker: remediation resumes",
		Long: `Close a pool's health circuit breaker. It trips when more of the pool's nodes turn
unhealthy within its window than the policy allows, and stops every remediation in the pool
until an operator (a tenant admin or a platform admin) has looked at the cause and resets it.`,
		Args: positional("POOL"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if reason == "" {
				return invalidArg("reason", "is required: say why, for the audit log")
			}
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Health.ResetBreaker(cmd.Context(), connect.NewRequest(&apiv1.ResetBreakerRequest{Tenant: t, Pool: argv[0], Reason: reason}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) { poolHealthTable(w, resp.Msg.GetHealth()) })
		},
	}
	addTenantFlag(reset, &tenant)
	reset.Flags().StringVar(&reason, "reason", "", "why, for the audit log (required, at most 200 bytes)")
	return []*cobra.Command{health, reset}
}

// gpusCommand is `gpus quarantine` and `gpus lift`.
func (a *app) gpusCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "gpus", Aliases: []string{"gpu"}, Short: "Take a GPU out of service or put it back"}
	var (
		tenant, reason string
		rma            bool
	)
	quarantine := &cobra.Command{
		Use:   "quarantine GPU --reason R [--rma]",
		Short: "Take a GPU (its UUID) out of placement; the node stays schedulable",
		Long: `Take one GPU out of placement: no new reservation gets it, the rest of its node keeps
working, and the reservations holding it are told (condition GpuUnhealthy) but keep it.
--rma marks it for return to the vendor, which a remediation never lifts. Needs an operator:
a tenant admin or a platform admin.`,
		Args: positional("GPU"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if reason == "" {
				return invalidArg("reason", "is required: say why, for the audit log")
			}
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Health.QuarantineGpu(cmd.Context(), connect.NewRequest(&apiv1.QuarantineGpuRequest{Tenant: t, Gpu: argv[0], Reason: reason, Rma: rma}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) {
				g := resp.Msg.GetGpu()
				row(w, "GPU", "NODE", "STATE", "FINDING")
				row(w, g.GetUuid(), resp.Msg.GetFinding().GetNode(), g.GetState(), resp.Msg.GetFinding().GetId())
			})
		},
	}
	addTenantFlag(quarantine, &tenant)
	quarantine.Flags().StringVar(&reason, "reason", "", "why, for the audit log (required, at most 200 bytes)")
	quarantine.Flags().BoolVar(&rma, "rma", false, "mark the GPU for return to the vendor")

	lift := &cobra.Command{
		Use:   "lift GPU --reason R",
		Short: "Put a quarantined GPU back in placement and resolve its open findings",
		Args:  positional("GPU"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if reason == "" {
				return invalidArg("reason", "is required: say why, for the audit log")
			}
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Health.LiftGpu(cmd.Context(), connect.NewRequest(&apiv1.LiftGpuRequest{Tenant: t, Gpu: argv[0], Reason: reason}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) {
				row(w, "GPU", "STATE", "RESOLVED FINDINGS")
				row(w, resp.Msg.GetGpu().GetUuid(), resp.Msg.GetGpu().GetState(), fmt.Sprint(resp.Msg.GetResolvedFindings()))
			})
		},
	}
	addTenantFlag(lift, &tenant)
	lift.Flags().StringVar(&reason, "reason", "", "why, for the audit log (required, at most 200 bytes)")

	cmd.AddCommand(quarantine, lift)
	return cmd
}

// remediationsCommand is `remediations list`.
func (a *app) remediationsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "remediations", Aliases: []string{"remediation"}, Short: "Follow the health reconciler's GPU resets and node reboots"}
	var (
		tenant, node, pool, state string
		limit                     int
	)
	list := &cobra.Command{
		Use:   "list",
		Short: "List remediations",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.Remediation, string, error) {
				resp, err := c.Health.ListRemediations(ctx, connect.NewRequest(&apiv1.ListRemediationsRequest{Tenant: t, Node: node, Pool: pool,
					State: state, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetRemediations(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(&apiv1.ListRemediationsResponse{Remediations: all}, func(w io.Writer) {
				remediationTable(w, true, all)
			})
		},
	}
	addTenantFlag(list, &tenant)
	addLimitFlag(list, &limit)
	list.Flags().StringVar(&node, "node", "", "only this node's (name or id)")
	list.Flags().StringVar(&pool, "pool", "", "only this pool's (name or id)")
	list.Flags().StringVar(&state, "state", "", "only in this state: pending, draining, running, succeeded, failed, escalated, canceled")
	cmd.AddCommand(list)
	return cmd
}
