package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

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
	cmd := &cobra.Command{Use: "events", Short: "List and follow committed changes"}
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
	cmd.AddCommand(watch, a.eventsListCommand())
	return cmd
}

func (a *app) eventsListCommand() *cobra.Command {
	var tenant, resType, resID, since, until, pageToken string
	var types []string
	var limit int
	list := &cobra.Command{
		Use:   "list",
		Short: "List stored events, newest first",
		Long: `List the events the outbox still holds, newest first: at most --limit
(default 50; 0 follows every page). When more remain, the command says which
--page-token continues the list. --since and --until are RFC 3339 or relative
to now (-24h, -7d); since is inclusive, until exclusive.`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 0 {
				return invalidArg("limit", fmt.Sprintf("must be 0 (every page) or more, got %d", limit))
			}
			now := time.Now()
			req := &apiv1.ListEventsRequest{TypePrefixes: types, ResourceType: resType, ResourceId: resID, PageToken: pageToken}
			var err error
			if req.Since, err = timeFlag("since", since, now); err != nil {
				return err
			}
			if req.Until, err = timeFlag("until", until, now); err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if req.Tenant, err = a.tenant(cmd.Context(), tenant, false); err != nil {
				return err
			}
			out := &apiv1.ListEventsResponse{}
			for {
				req.PageSize = 0
				if limit > 0 {
					req.PageSize = int32(min(limit-len(out.Events), 500))
				}
				resp, err := c.Events.List(cmd.Context(), connect.NewRequest(req))
				if err != nil {
					return err
				}
				out.Events = append(out.Events, resp.Msg.GetEvents()...)
				out.NextPageToken = resp.Msg.GetNextPageToken()
				if out.NextPageToken == "" || (limit > 0 && len(out.Events) >= limit) {
					break
				}
				if out.NextPageToken == req.PageToken {
					// A server bug would otherwise loop forever.
					return connect.NewError(connect.CodeInternal, fmt.Errorf("server repeated page token %q", out.NextPageToken))
				}
				req.PageToken = out.NextPageToken
			}
			err = a.printer(cmd.OutOrStdout()).print(out, func(w io.Writer) {
				row(w, "ID", "TIME", "TYPE", "RESOURCE", "TENANT")
				for _, ev := range out.Events {
					row(w, ev.GetId(), ts(ev.GetTime()), ev.GetType(), resource(ev.GetResourceType(), ev.GetResourceId()), dash(ev.GetTenantId()))
				}
			})
			if err == nil && out.NextPageToken != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "more events: continue with --page-token %s\n", out.NextPageToken)
			}
			return err
		},
	}
	addTenantFlag(list, &tenant)
	list.Flags().StringSliceVar(&types, "type", nil, "only events whose type starts with this prefix (repeatable)")
	list.Flags().StringVar(&resType, "resource-type", "", "only events of this resource type, e.g. Reservation")
	list.Flags().StringVar(&resID, "resource-id", "", "only events of this resource id")
	list.Flags().StringVar(&since, "since", "", "only events at or after this time (RFC 3339 or relative: -24h)")
	list.Flags().StringVar(&until, "until", "", "only events before this time (RFC 3339 or relative: -1h)")
	list.Flags().IntVar(&limit, "limit", 50, "return at most this many (0: every page)")
	list.Flags().StringVar(&pageToken, "page-token", "", "continue a previous list where it stopped")
	return list
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
