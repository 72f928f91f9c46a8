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
	cmd := &cobra.Command{Use: "audit", Short: "Read the audit log and verify it: signed checkpoints, inclusion and consistency proofs"}
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
	cmd.AddCommand(a.auditTreeCommands()...)
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
			const line = "%-6s  %-20s  %-24s  %s  %s\n"
			p.streamHeader(func(w io.Writer) { fmt.Fprintf(w, line, "ID", "TIME", "TYPE", "RESOURCE", "TENANT") })
			last := after
			err = c.Watch(cmd.Context(), &apiv1.WatchEventsRequest{Tenant: t, After: after, TypePrefixes: types}, func(ev *apiv1.Event) error {
				last = ev.GetId()
				return p.line(ev, func(w io.Writer) {
					fmt.Fprintf(w, line, ev.GetId(), ts(ev.GetTime()), ev.GetType(),
						resource(ev.GetResourceType(), ev.GetResourceId()), dash(ev.GetTenantId()))
				})
			})
			resume := "rerun to follow new events"
			if last != "" {
				resume = "resume with --after " + last
			}
			return streamEnded(cmd, "event", err, resume)
		},
	}
	addTenantFlag(watch, &tenant)
	watch.Flags().StringVar(&after, "after", "", "resume after this event id (default: new events only)")
	watch.Flags().StringSliceVar(&types, "type", nil, "only events whose type starts with this prefix (repeatable)")
	cmd.AddCommand(watch)
	return cmd
}

// streamHeader writes a watch's column names before its first line, for
// the table format only: json and yaml lines are the API's messages.
func (p printer) streamHeader(header func(w io.Writer)) {
	if p.format == "table" {
		header(p.w)
	}
}

// streamEnded is what a watch returns once its stream is over. Interrupting
// is how a watch is meant to end (exit 0); the server ending the stream, or
// the connection failing, is not, so it is an error that says how to resume.
// what names the stream ("event", "reservation"); resume is the hint.
func streamEnded(cmd *cobra.Command, what string, err error, resume string) error {
	if errors.Is(err, context.Canceled) || cmd.Context().Err() != nil {
		return nil //nolint:nilerr // the cancellation is the user's Ctrl-C, not a failure
	}
	if err == nil {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("the server ended the %s stream; %s", what, resume))
	}
	msg := err.Error()
	var ce *connect.Error
	if errors.As(err, &ce) {
		msg = ce.Message()
	}
	return connect.NewError(connect.CodeOf(err), fmt.Errorf("the %s stream failed: %s; %s", what, msg, resume))
}
