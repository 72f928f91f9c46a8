package cli

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

func (a *app) capacityCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "capacity",
		Short: "Read GPU capacity by model and pool, over time; rebuild the rollups",
		Long: `Capacity counts atoms (whole GPUs, MIG instances, shared slots) per pool,
GPU model and kind: total, booked by placed/binding/active reservations,
quarantined, free (total - booked - quarantined) and the pool's pending
reservations.

--tenant defaults to the context's tenant, else the token's; a platform
token without one reads every tenant.`,
	}
	var tenant string

	summary := &cobra.Command{
		Use:   "summary",
		Short: "Capacity per GPU model and kind over the tenant's pools",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Capacity.Summary(cmd.Context(), connect.NewRequest(&apiv1.CapacitySummaryRequest{Tenant: t}))
			if err != nil {
				return err
			}
			return a.printCapacity(cmd, resp.Msg, false, resp.Msg.GetRows())
		},
	}
	addTenantFlag(summary, &tenant)

	var byPoolRef string
	byPool := &cobra.Command{
		Use:   "by-pool [--pool P]",
		Short: "Capacity per pool, GPU model and kind",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Capacity.ByPool(cmd.Context(), connect.NewRequest(&apiv1.CapacityByPoolRequest{Tenant: t, Pool: byPoolRef}))
			if err != nil {
				return err
			}
			return a.printCapacity(cmd, resp.Msg, true, resp.Msg.GetRows())
		},
	}
	addTenantFlag(byPool, &tenant)
	byPool.Flags().StringVar(&byPoolRef, "pool", "", "one pool (name or id); default every pool")

	var (
		tlPool, tlStart, tlEnd string
		tlStep                 time.Duration
	)
	timeline := &cobra.Command{
		Use:   "timeline --pool P [--start T] [--end T] [--step D]",
		Short: "A pool's GPUs booked and in total, point by point",
		Long: `Timeline prints a pool's GPUs booked (by placed, binding and active
reservations) and in total at every step from start to end: by default
from now to 24 hours on, every hour, at most 1000 points. Times are
RFC 3339 or relative to now (+2h, -30m).`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if tlPool == "" {
				return invalidArg("pool", "required: pass --pool")
			}
			now := time.Now()
			req := &apiv1.CapacityTimelineRequest{Pool: tlPool}
			var err error
			if req.StartTime, err = timeFlag("start", tlStart, now); err != nil {
				return err
			}
			if req.EndTime, err = timeFlag("end", tlEnd, now); err != nil {
				return err
			}
			if req.StepSeconds, err = stepSeconds(tlStep); err != nil {
				return err
			}
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			req.Tenant = t
			resp, err := c.Capacity.Timeline(cmd.Context(), connect.NewRequest(req))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) {
				row(w, "TIME", "BOOKED", "TOTAL")
				for _, p := range resp.Msg.GetPoints() {
					row(w, ts(p.GetTime()), itoa(p.GetBooked()), itoa(p.GetTotal()))
				}
			})
		},
	}
	addTenantFlag(timeline, &tenant)
	timeline.Flags().StringVar(&tlPool, "pool", "", "pool name or id (required)")
	timeline.Flags().StringVar(&tlStart, "start", "", "first point: RFC 3339 or relative to now (default now)")
	timeline.Flags().StringVar(&tlEnd, "end", "", "last point: RFC 3339 or relative to now (default start + 24h)")
	timeline.Flags().DurationVar(&tlStep, "step", 0, "spacing of the points, whole seconds (default 1h)")

	var confirmationID string
	rebuild := &cobra.Command{
		Use:   "rebuild",
		Short: "Recompute every capacity rollup and say which differed (platform administrators)",
		Long: `Rebuild recomputes the capacity rollups of every pool from atoms, pool
membership, reservations and bookings, replaces the stored ones, and lists
the rollups whose stored value differed. A healthy installation reports
none.`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			resp, err := c.Capacity.Rebuild(cmd.Context(), request(&apiv1.RebuildCapacityRequest{}, mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) {
				fmt.Fprintf(w, "rebuilt %d rollups; %d differed\n", resp.Msg.GetRows(), len(resp.Msg.GetMismatches()))
				for _, m := range resp.Msg.GetMismatches() {
					fmt.Fprintf(w, "  %s\n", m)
				}
			})
		},
	}
	addConfirmationFlag(rebuild, &confirmationID)

	var bcPool string
	byConsumer := &cobra.Command{
		Use:   "by-consumer [--pool P]",
		Short: "What each consumer tenant holds on the tenant's pools, and has used (30 days)",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Capacity.ByConsumer(cmd.Context(), connect.NewRequest(&apiv1.CapacityByConsumerRequest{Tenant: t, Pool: bcPool}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) {
				row(w, "POOL", "TENANT", "RESERVATIONS", "GPUS", "GPU-HOURS")
				for _, r := range resp.Msg.GetRows() {
					row(w, r.GetPool(), r.GetTenant(), strconv.Itoa(int(r.GetReservations())), strconv.Itoa(int(r.GetGpus())),
						strconv.FormatFloat(r.GetGpuHours(), 'f', 1, 64))
				}
			})
		},
	}
	addTenantFlag(byConsumer, &tenant)
	byConsumer.Flags().StringVar(&bcPool, "pool", "", "one pool the tenant owns (name or id); default every pool")

	cmd.AddCommand(summary, byPool, timeline, rebuild, byConsumer)
	return cmd
}

func (a *app) printCapacity(cmd *cobra.Command, msg proto.Message, byPool bool, rows []*apiv1.CapacityRow) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		head := []string{"MODEL", "KIND", "TOTAL", "BOOKED", "QUARANTINED", "FREE", "PENDING"}
		if byPool {
			head = append([]string{"POOL"}, head...)
		}
		row(w, head...)
		for _, r := range shortModelRows(rows) {
			cols := []string{dash(r.GetModel()), dash(r.GetKind()), itoa(r.GetTotal()), itoa(r.GetBooked()),
				itoa(r.GetQuarantined()), itoa(r.GetFree()), itoa(r.GetPending())}
			if byPool {
				cols = append([]string{dash(cmpOr(r.GetPool(), r.GetPoolId()))}, cols...)
			}
			row(w, cols...)
		}
	})
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }

// shortModel is a capacity model ("H100 80GB", the model and memory that
// tell MIG layouts apart) by the name nodes, reservations, the gpu.model
// label and --model use ("H100").
func shortModel(m string) string {
	short, _, _ := strings.Cut(m, " ")
	return short
}

// shortModelRows renames rows to the short model and sums the rows that
// then share pool, model and kind (an A100 40GB and 80GB pool). Pending is
// a pool's count, repeated on each of its rows, so it is kept, not summed.
func shortModelRows(rows []*apiv1.CapacityRow) []*apiv1.CapacityRow {
	type key struct{ pool, model, kind string }
	var out []*apiv1.CapacityRow
	at := map[key]*apiv1.CapacityRow{}
	for _, r := range rows {
		k := key{r.GetPoolId(), shortModel(r.GetModel()), r.GetKind()}
		if cur := at[k]; cur != nil {
			cur.Total += r.GetTotal()
			cur.Booked += r.GetBooked()
			cur.Quarantined += r.GetQuarantined()
			cur.Free += r.GetFree()
			cur.Pending = max(cur.Pending, r.GetPending())
			continue
		}
		c := proto.CloneOf(r)
		c.Model = k.model
		at[k] = c
		out = append(out, c)
	}
	return out
}

// timeFlag reads a time flag: RFC 3339, or a duration relative to now with
// a sign (+2h, -24h). Empty is unset (nil).
func timeFlag(field, s string, now time.Time) (*timestamppb.Timestamp, error) {
	if s == "" {
		return nil, nil
	}
	if strings.HasPrefix(s, "+") || strings.HasPrefix(s, "-") {
		d, err := parseSpan(s)
		if err != nil {
			return nil, invalidArg(field, fmt.Sprintf("relative time must be a signed duration such as +2h, -24h or -7d, got %q", s))
		}
		return timestamppb.New(now.Add(d)), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return nil, invalidArg(field, fmt.Sprintf("must be RFC 3339 (2025-01-02T15:04:05Z) or relative (+2h, -24h), got %q", s))
	}
	return timestamppb.New(t), nil
}

// stepSeconds converts --step to whole seconds; 0 leaves the server's
// default.
func stepSeconds(d time.Duration) (int64, error) {
	if d < 0 || d%time.Second != 0 {
		return 0, invalidArg("step", fmt.Sprintf("must be a positive whole number of seconds, got %s", d))
	}
	return int64(d / time.Second), nil
}
