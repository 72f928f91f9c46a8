package cli

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// usageFilter are the flags list and export share.
type usageFilter struct {
	project, start, end string
}

func (f *usageFilter) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.project, "project", "", "one project (name or id)")
	cmd.Flags().StringVar(&f.start, "start", "", "first window: RFC 3339 or relative to now (-24h)")
	cmd.Flags().StringVar(&f.end, "end", "", "windows starting before this: RFC 3339 or relative to now")
	// --from and --to name a billing period as capacity by-consumer does.
	cmd.Flags().StringVar(&f.start, "from", "", "the same as --start")
	cmd.Flags().StringVar(&f.end, "to", "", "the same as --end")
	cmd.MarkFlagsMutuallyExclusive("start", "from")
	cmd.MarkFlagsMutuallyExclusive("end", "to")
}

func (f *usageFilter) times(now time.Time) (start, end *timestamppb.Timestamp, err error) {
	s, err := timeFlag("start", f.start, now)
	if err != nil {
		return nil, nil, err
	}
	e, err := timeFlag("end", f.end, now)
	if err != nil {
		return nil, nil, err
	}
	return s, e, nil
}

func (a *app) usageCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "List and export hourly usage of reservations",
		Long: `Usage is kept per reservation, metric and hour once the hour has closed:
gpu.<model>.hours, vcpu.hours and memoryGiB.hours, each the amount times
the hours the reservation was active in that window.

--tenant defaults to the context's tenant, else the token's; a platform
token without one reads every tenant.`,
	}
	var tenant string

	var (
		lf     usageFilter
		metric string
		limit  int
	)
	list := &cobra.Command{
		Use:   "list [--metric M] [--start T] [--end T]",
		Short: "List usage windows by time",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			start, end, err := lf.times(time.Now())
			if err != nil {
				return err
			}
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.UsageWindow, string, error) {
				resp, err := c.Usage.List(ctx, connect.NewRequest(&apiv1.ListUsageRequest{Tenant: t, Project: lf.project, Metric: metric,
					StartTime: start, EndTime: end, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetWindows(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			var nb nameBook
			if a.flagOutput == "table" {
				var ids []string
				for _, u := range all {
					ids = append(ids, u.GetTenantId())
				}
				nb = a.names(cmd.Context(), c, ids...)
			}
			return a.printer(cmd.OutOrStdout()).print(&apiv1.ListUsageResponse{Windows: all}, func(w io.Writer) {
				row(w, "WINDOW", "TENANT", "PROJECT", "RESERVATION", "METRIC", "QUANTITY")
				totals := map[string]float64{}
				var metrics []string
				for _, u := range all {
					window := ts(u.GetWindowStart())
					if u.GetPartial() {
						// The hour still open: so far, not recorded yet.
						window += " (open)"
					}
					row(w, window, nb.tenant(u.GetTenantId()), dash(nb.project(u.GetProjectId())), u.GetReservationId(), u.GetMetric(),
						quantityString(u.GetQuantity()))
					if _, ok := totals[u.GetMetric()]; !ok {
						metrics = append(metrics, u.GetMetric())
					}
					totals[u.GetMetric()] += u.GetQuantity()
				}
				slices.Sort(metrics)
				for _, m := range metrics {
					row(w, "TOTAL", "", "", "", m, quantityString(totals[m]))
				}
			})
		},
	}
	addTenantFlag(list, &tenant)
	lf.add(list)
	list.Flags().StringVar(&metric, "metric", "", "one metric: gpu.<model>.hours, vcpu.hours or memoryGiB.hours")
	addLimitFlag(list, &limit)

	var (
		ef     usageFilter
		format string
		file   string
	)
	export := &cobra.Command{
		Use:   "export --format csv|jsonl|cloudevents [--from T] [--to T] [-f FILE]",
		Short: "Export usage windows as CSV, JSON lines or CloudEvents",
		Long: `Export writes every closed window starting in [--from, --to) in one
document, to FILE or to standard output: CSV with the header
tenant_id,project_id,reservation_id,metric,window_start,quantity,idempotency_key,revision,pool_id,
JSON lines with the same fields (jsonl), or CloudEvents 1.0 structured
events, one JSON object a line, of type com.bettercompute.usage.window.
The document is written as is whatever --output says.`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch format {
			case "csv", "jsonl", "cloudevents":
			default:
				return invalidArg("format", fmt.Sprintf("must be csv, jsonl or cloudevents, got %q", format))
			}
			start, end, err := ef.times(time.Now())
			if err != nil {
				return err
			}
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Usage.Export(cmd.Context(), connect.NewRequest(&apiv1.ExportUsageRequest{Tenant: t, Project: ef.project,
				StartTime: start, EndTime: end, Format: format}))
			if err != nil {
				return err
			}
			data := resp.Msg.GetData()
			if file == "" || file == "-" {
				_, err := cmd.OutOrStdout().Write(data)
				return err
			}
			// Usage is a tenant's billing data: keep it to the user.
			if err := os.WriteFile(file, data, 0o600); err != nil {
				return fmt.Errorf("write %s: %w", file, err)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %d bytes (%s) to %s\n", len(data), resp.Msg.GetContentType(), file)
			return nil
		},
	}
	addTenantFlag(export, &tenant)
	ef.add(export)
	export.Flags().StringVar(&format, "format", "csv", "csv, jsonl or cloudevents")
	export.Flags().StringVarP(&file, "file", "f", "", "write to this file (default standard output)")

	cmd.AddCommand(list, export)
	return cmd
}

// quantityString prints a usage quantity with at most four decimals.
func quantityString(q float64) string {
	return strconv.FormatFloat(math.Round(q*1e4)/1e4, 'f', -1, 64)
}
