package cli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

func (a *app) auditCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "audit", Short: "Read the audit log"}
	var tenant, action string
	var limit int
	list := &cobra.Command{
		Use:   "list",
		Short: "List audit entries (a tenant's, or platform-wide for platform administrators)",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			t, err := a.tenant(cmd.Context(), tenant, false)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.AuditEntry, string, error) {
				resp, err := c.Audit.List(ctx, connect.NewRequest(&apiv1.ListAuditRequest{Tenant: t, Action: action, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetEntries(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(&apiv1.ListAuditResponse{Entries: all}, func(w io.Writer) {
				row(w, "TIME", "ACTION", "RESOURCE", "PRINCIPAL", "DECISION", "RESULT", "TENANT")
				for _, e := range all {
					row(w, ts(e.GetTime()), e.GetAction(), resource(e.GetResourceType(), e.GetResourceId()),
						dash(e.GetPrincipalId()), dash(e.GetDecision()), dash(e.GetResult()), dash(e.GetTenantId()))
				}
			})
		},
	}
	addTenantFlag(list, &tenant)
	list.Flags().StringVar(&action, "action", "", "only entries of this action, e.g. projects.create")
	addLimitFlag(list, &limit)
	cmd.AddCommand(list)
	return cmd
}

func (a *app) eventsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "events", Short: "Follow committed changes"}
	var tenant, after string
	var types []string
	watch := &cobra.Command{
		Use:   "watch",
		Short: "Print events as they happen, until interrupted",
		Long: `Print each event as it arrives: one line per event as a table, one JSON
object per line with -o json. Resume where a previous watch stopped with
--after set to the last event id it printed.`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			t, err := a.tenant(cmd.Context(), tenant, false)
			if err != nil {
				return err
			}
			p := a.printer(cmd.OutOrStdout())
			err = c.Watch(cmd.Context(), &apiv1.WatchEventsRequest{Tenant: t, After: after, TypePrefixes: types}, func(ev *apiv1.Event) error {
				return p.line(ev, func(w io.Writer) {
					fmt.Fprintf(w, "%s  %s  %-24s  %s  %s\n", ev.GetId(), ts(ev.GetTime()), ev.GetType(),
						resource(ev.GetResourceType(), ev.GetResourceId()), dash(ev.GetTenantId()))
				})
			})
			if errors.Is(err, context.Canceled) || cmd.Context().Err() != nil {
				// Interrupting is how a watch is meant to end.
				return nil //nolint:nilerr // the cancellation is the user's Ctrl-C, not a failure
			}
			return err
		},
	}
	addTenantFlag(watch, &tenant)
	watch.Flags().StringVar(&after, "after", "", "resume after this event id (default: new events only)")
	watch.Flags().StringSliceVar(&types, "type", nil, "only events whose type starts with this prefix (repeatable)")
	cmd.AddCommand(watch)
	return cmd
}
