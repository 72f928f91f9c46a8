package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

func (a *app) budgetsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "budgets", Aliases: []string{"budget"}, Short: "Set and read a tenant's spend budget per period"}
	var tenant, confirmationID string

	var (
		period, amount, enforcement string
		thresholds                  []int32
	)
	set := &cobra.Command{
		Use:   "set --tenant T --period month|week|day --amount A [--soft] [--thresholds 50,80,100]",
		Short: "Create or replace the tenant's budget",
		Long: `Create or replace the tenant's budget: what its bookings may commit per period
(month, week from Monday, or day, in UTC) at their pools' prices, a decimal
amount in the platform's currency. A hard budget (the default) refuses a
create or extension that would pass it with SPEND_LIMIT_REACHED, and warm
pools stop refilling once it is spent; a soft one (--enforcement soft) only
alerts. A budget.threshold event (and webhook) goes out the first time a
period's committed cost reaches each threshold (default 50, 80 and 100 %).
Tenant admins and platform admins set budgets.`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			req := &apiv1.SetBudgetRequest{Tenant: t, Period: period, Amount: amount, Enforcement: enforcement, Thresholds: thresholds}
			var resp *connect.Response[apiv1.SetBudgetResponse]
			// Set replaces the tenant's budget, so repeating it is safe.
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.Budgets.Set(cmd.Context(), request(req, mutation{confirmationID: confirmationID}))
				return err
			})
			if err != nil {
				return err
			}
			return a.printBudgets(cmd, resp.Msg, resp.Msg.GetBudget())
		},
	}
	addTenantFlag(set, &tenant)
	set.Flags().StringVar(&period, "period", "month", "month, week or day (UTC)")
	set.Flags().StringVar(&amount, "amount", "", "what the period may commit, a decimal (e.g. 2500 or 99.50)")
	set.Flags().StringVar(&enforcement, "enforcement", "hard", "hard (refuse past it) or soft (alert only)")
	set.Flags().Int32SliceVar(&thresholds, "thresholds", nil, "alert thresholds in percent (default 50,80,100)")
	addConfirmationFlag(set, &confirmationID)

	get := &cobra.Command{
		Use:   "get --tenant T",
		Short: "Show the tenant's budget and what its bookings commit this period",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Budgets.Get(cmd.Context(), connect.NewRequest(&apiv1.GetBudgetRequest{Tenant: t}))
			if err != nil {
				return err
			}
			return a.printBudgets(cmd, resp.Msg, resp.Msg.GetBudget())
		},
	}
	addTenantFlag(get, &tenant)

	var limit int
	list := &cobra.Command{
		Use:   "list [--tenant T]",
		Short: "List budgets (every tenant's, for platform admins)",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.Budget, string, error) {
				resp, err := c.Budgets.List(ctx, connect.NewRequest(&apiv1.ListBudgetsRequest{Tenant: t, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetBudgets(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printBudgets(cmd, &apiv1.ListBudgetsResponse{Budgets: all}, all...)
		},
	}
	addTenantFlag(list, &tenant)
	addLimitFlag(list, &limit)

	del := &cobra.Command{
		Use:   "delete --tenant T",
		Short: "Remove the tenant's budget",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			if _, err := c.Budgets.Delete(cmd.Context(), request(&apiv1.DeleteBudgetRequest{Tenant: t}, mutation{confirmationID: confirmationID})); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "budget of %s deleted\n", t)
			return nil
		},
	}
	addTenantFlag(del, &tenant)
	addConfirmationFlag(del, &confirmationID)

	cmd.AddCommand(set, get, list, del)
	return cmd
}

func (a *app) printBudgets(cmd *cobra.Command, msg proto.Message, items ...*apiv1.Budget) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		row(w, "ID", "TENANT", "PERIOD", "FROM", "COMMITTED", "AMOUNT", "ENFORCEMENT", "THRESHOLDS")
		for _, b := range items {
			th := make([]string, len(b.GetThresholds()))
			for i, t := range b.GetThresholds() {
				th[i] = fmt.Sprintf("%d%%", t)
			}
			row(w, b.GetId(), b.GetTenantId(), b.GetPeriod(), ts(b.GetPeriodStart()), b.GetCommitted(), b.GetAmount(),
				b.GetEnforcement(), strings.Join(th, ","))
		}
	})
}
