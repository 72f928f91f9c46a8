package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// Machine codes of the refusals whose detail the CLI prints as a table.
const (
	codeNoCapacity    = "NO_CAPACITY"
	codeQuotaExceeded = "QUOTA_EXCEEDED"
)

// reservationCommands are `reservations` and its shorthand `reserve` (the
// same command as `reservations create`, at the top level).
func (a *app) reservationCommands() []*cobra.Command {
	return []*cobra.Command{a.reservationsCommand(), a.reservationCreateCommand("reserve")}
}

// reservationFlags are the flags of create and preview: what is asked for
// and when. The CLI checks only what it must to build the request (times
// that parse, --for not mixed with a window); the server validates the rest.
type reservationFlags struct {
	tenant, project, pool string
	model, mig, binding   string
	gpus, slots           int32
	vcpu, memoryGiB       int32
	hugepages             int32
	singleTenant          bool
	duration              time.Duration
	start, end            string
	// A gang: nodes members of gpusPerNode GPUs, one per node, in one
	// domain of topology.
	nodes, gpusPerNode int32
	topology           string
}

func (f *reservationFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	addTenantFlag(cmd, &f.tenant)
	fl.StringVar(&f.project, "project", "", "project name or id")
	fl.StringVar(&f.pool, "pool", "", "pool name or id")
	fl.Int32Var(&f.gpus, "gpus", 0, "whole GPUs, or MIG instances with --mig")
	fl.StringVar(&f.model, "model", "", "GPU model, e.g. H100 (default: any)")
	fl.StringVar(&f.mig, "mig", "", "MIG profile, e.g. 1g.10gb")
	fl.Int32Var(&f.slots, "slots", 0, "shared slots (timeslice and mps pools), instead of --gpus")
	fl.Var((*spanValue)(&f.duration), "for", "how long, starting now, e.g. 4h or 1d; at least 1m (default 1h, the server's; instead of --start/--end)")
	fl.StringVar(&f.start, "start", "", "window start: RFC 3339 or relative to now, e.g. +2h or +1d")
	fl.StringVar(&f.end, "end", "", "window end: RFC 3339 or relative to now, e.g. +6h")
	fl.Int32Var(&f.vcpu, "vcpu", 0, "vCPUs (default: the pool's per-GPU share)")
	fl.Int32Var(&f.memoryGiB, "memory-gib", 0, "memory in GiB (default: the pool's per-GPU share)")
	fl.Int32Var(&f.hugepages, "hugepages-1gi", 0, "1 GiB huge pages (default: the pool's per-GPU share)")
	fl.StringVar(&f.binding, "binding", "", "node (default: the agent applies limits), kubernetes, none (a booking only) or machine (the whole machine, leased: machines lease-accept)")
	fl.BoolVar(&f.singleTenant, "single-tenant", false, "only a node no other tenant holds anything on")
	fl.Int32Var(&f.nodes, "nodes", 0, "a gang: this many nodes, one reservation each, all placed now or none")
	fl.Int32Var(&f.gpusPerNode, "gpus-per-node", 0, "with --nodes: whole GPUs on each node (the same as --gpus)")
	fl.StringVar(&f.topology, "topology", "", "with --nodes: keep the gang in one rack, spine, ib or nvlink domain (node label topology.<name>)")
}

// request builds the create request, tenant left empty; now anchors
// relative times.
func (f *reservationFlags) request(now time.Time) (*apiv1.CreateReservationRequest, error) {
	if f.duration != 0 && (f.start != "" || f.end != "") {
		return nil, invalidArg("for", "give either --for or a --start/--end window, not both")
	}
	if f.duration < 0 {
		return nil, invalidArg("for", "must not be negative")
	}
	// A reservation shorter than a minute ends before its node has bound
	// it; 0 (unset) takes the server's default, an hour.
	if f.duration > 0 && f.duration < minReservation {
		return nil, invalidArg("for", fmt.Sprintf("must be at least %s (leave it out for an hour), got %s", minReservation, f.duration))
	}
	start, err := parseWhen("start", f.start, now)
	if err != nil {
		return nil, err
	}
	end, err := parseWhen("end", f.end, now)
	if err != nil {
		return nil, err
	}
	gpus := f.gpus
	switch {
	case f.nodes == 0 && f.gpusPerNode != 0:
		return nil, invalidArg("gpus-per-node", "applies to a gang: give --nodes too")
	case f.nodes == 0 && f.topology != "":
		return nil, invalidArg("topology", "applies to a gang: give --nodes too")
	case f.gpusPerNode != 0 && f.gpus != 0 && f.gpus != f.gpusPerNode:
		return nil, invalidArg("gpus-per-node", "give --gpus or --gpus-per-node, not both")
	case f.gpusPerNode != 0:
		gpus = f.gpusPerNode
	}
	return &apiv1.CreateReservationRequest{
		Project: f.project, Pool: f.pool,
		Gpus: gpus, Model: f.model, MigProfile: f.mig, Slots: f.slots,
		Vcpu: f.vcpu, MemoryGib: f.memoryGiB, Hugepages_1Gi: f.hugepages,
		StartTime: start, EndTime: end, DurationSeconds: int64(f.duration / time.Second),
		Binding: f.binding, SingleTenant: f.singleTenant,
	}, nil
}

// pastSkew is how far in the past a reservation time may be and still be
// taken as now (the server allows a minute).
const pastSkew = time.Minute

// parseWhen reads a reservation time flag: RFC 3339, or a duration
// relative to now (+2h, +1d; -2h parses, and is refused as in the past).
// Empty is unset (nil).
func parseWhen(field, s string, now time.Time) (*timestamppb.Timestamp, error) {
	if s == "" {
		return nil, nil
	}
	if strings.HasPrefix(s, "+") || strings.HasPrefix(s, "-") {
		d, err := parseSpan(s)
		if err != nil {
			return nil, invalidArg(field, fmt.Sprintf("relative time must be +DURATION from now such as +2h or +1d, got %q", s))
		}
		if d < -pastSkew {
			return nil, invalidArg(field, fmt.Sprintf("%s is in the past: reservation times are now or later (+2h, +1d)", s))
		}
		return timestamppb.New(now.Add(d)), nil
	}
	// An absolute time in the past is the server's to refuse (it allows a
	// minute of skew against its own clock).
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return nil, invalidArg(field, fmt.Sprintf("must be RFC 3339 (2025-01-02T15:04:05Z) or relative (+2h, +1d), got %q", s))
	}
	return timestamppb.New(t), nil
}

// parseSpan parses a duration as time.ParseDuration does, plus whole days
// in front ("1d", "2d12h", "-1d"), since reservations run for days.
func parseSpan(s string) (time.Duration, error) {
	rest, sign := s, time.Duration(1)
	if r, ok := strings.CutPrefix(rest, "-"); ok {
		rest, sign = r, -1
	} else {
		rest = strings.TrimPrefix(rest, "+")
	}
	var days time.Duration
	if i := strings.IndexByte(rest, 'd'); i > 0 {
		n, err := strconv.Atoi(rest[:i])
		if err != nil || n > 3650 {
			return 0, fmt.Errorf("bad day count in %q", s)
		}
		days, rest = time.Duration(n)*24*time.Hour, rest[i+1:]
	}
	var d time.Duration
	if rest != "" || days == 0 {
		var err error
		if d, err = time.ParseDuration(rest); err != nil || d < 0 {
			return 0, fmt.Errorf("bad duration %q", s)
		}
	}
	return sign * (days + d), nil
}

// spanValue is a duration flag that also takes days ("1d", "1d12h").
type spanValue time.Duration

// String is "" for zero, so that help shows no "(default 0s)" for a
// flag whose zero means the server's default.
func (v *spanValue) String() string {
	if *v == 0 {
		return ""
	}
	return time.Duration(*v).String()
}

// minReservation is the shortest --for the CLI sends.
const minReservation = time.Minute

func (v *spanValue) Set(s string) error {
	d, err := parseSpan(s)
	if err != nil {
		return fmt.Errorf("must be a duration such as 90m, 4h or 1d, got %q", s)
	}
	*v = spanValue(d)
	return nil
}

func (v *spanValue) Type() string { return "duration" }

// reservationCreateCommand builds `reservations create`, and `reserve`
// under use "reserve".
func (a *app) reservationCreateCommand(use string) *cobra.Command {
	var (
		f               reservationFlags
		wait            time.Duration
		confirmationID  string
		count, minCount int32
	)
	cmd := &cobra.Command{
		Use:   use + " --pool POOL --gpus N [--for 4h | --start T --end T] [--count N [--min M] | --nodes N --gpus-per-node G [--topology rack]]",
		Short: "Reserve GPUs of one node of a pool",
		Long: `Reserve GPUs (whole, MIG instances with --mig, or shared --slots) and host
resources on one node of a pool, for --for from now or over a --start/--end
window (RFC 3339, or relative such as +2h). What does not fit now stays
pending until the placer finds room.

A reservation the node is binding is waited for, up to --wait (10s), so
the answer shows it active. An explicit --wait D also waits for a pending
or future one, until it is active (or failed, canceled, ...) or D passes,
and fails unless it became active. A refusal for lack of
capacity prints, on stderr, why each class of nodes did not fit; one for
quota prints the quotas it would exceed.

--count N books an array: N reservations alike, in one request (one
authorization decision, one transaction), all placed now or none; with
--min M, at least M placed now or none. An array never waits pending and
is answered at once (--wait does not apply); it prints one row each.

--nodes N --gpus-per-node G books a gang for a multi-node job: N
reservations of G whole GPUs, each on its own node, all placed now or
none. --topology rack (or spine, ib, nvlink) keeps every node in one
domain of that network, read from the node label topology.rack (and so
on); the fullest domain that holds the gang is taken. A gang that does
not fit is refused with why, e.g. "16 nodes asked, the largest rack (r3)
has 11 that can hold a member now".`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := f.request(time.Now())
			if err != nil {
				return err
			}
			if wait < 0 {
				return invalidArg("wait", "must not be negative")
			}
			c, t, err := a.clientTenant(cmd, f.tenant)
			if err != nil {
				return err
			}
			req.Tenant = t
			// One key for every retry: a create the server committed but
			// whose answer was lost is answered again, not booked twice.
			m := newCreate(confirmationID)
			if f.nodes != 0 {
				switch {
				case cmd.Flags().Changed("count") || cmd.Flags().Changed("min"):
					return invalidArg("count", "a gang (--nodes) is its own count: one reservation per node, all or none")
				case cmd.Flags().Changed("wait"):
					return invalidArg("wait", "does not apply to a gang (--nodes): it is placed now or refused")
				}
				return a.reserveArray(cmd, c, m, &apiv1.CreateReservationsRequest{Template: req, Count: f.nodes, Gang: &apiv1.Gang{Topology: f.topology}})
			}
			if count != 1 || cmd.Flags().Changed("min") {
				if cmd.Flags().Changed("wait") {
					return invalidArg("wait", "does not apply to an array (--count): it is placed now or refused")
				}
				return a.reserveArray(cmd, c, m, &apiv1.CreateReservationsRequest{Template: req, Count: count, MinCount: minCount})
			}
			var resp *connect.Response[apiv1.CreateReservationResponse]
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.Reservations.Create(cmd.Context(), request(req, m))
				return err
			})
			if err != nil {
				return a.reportRefusal(cmd.ErrOrStderr(), err)
			}
			r := resp.Msg.GetReservation()
			var waitErr error
			strict := cmd.Flags().Changed("wait")
			switch {
			case strict && wait > 0:
				r, waitErr = a.waitReservation(cmd.Context(), c, t, r, wait)
			case !strict && r.GetState() == "binding":
				// By default a reservation the node is binding is worth a
				// short wait (the bind is a round trip to the agent); one
				// that is pending or starts later is answered at once.
				r, _ = a.waitReservation(cmd.Context(), c, t, r, wait)
			}
			if err := a.printReservations(cmd, &apiv1.CreateReservationResponse{Reservation: r}, r); err != nil {
				return err
			}
			if waitErr != nil {
				return waitErr
			}
			if strict && wait > 0 && r.GetState() != "active" {
				return connect.NewError(connect.CodeAborted, fmt.Errorf("reservation %s is %s: %s", r.GetId(), r.GetState(), whyNotActive(r)))
			}
			return nil
		},
	}
	f.add(cmd)
	cmd.Flags().DurationVar(&wait, "wait", 10*time.Second, "wait up to this long for the reservation to become active (by default only while the node binds it)")
	cmd.Flags().Int32Var(&count, "count", 1, "book an array of this many reservations alike, all placed now or none (at most 1000)")
	cmd.Flags().Int32Var(&minCount, "min", 0, "with --count: book at least this many placed now, or none (0: all of them)")
	addConfirmationFlag(cmd, &confirmationID)
	return cmd
}

// reserveArray books an array (ReservationService.CreateReservations) and
// prints one row per reservation booked, and on stderr why fewer than
// asked were.
func (a *app) reserveArray(cmd *cobra.Command, c *client.Client, m mutation, req *apiv1.CreateReservationsRequest) error {
	var resp *connect.Response[apiv1.CreateReservationsResponse]
	err := a.retry(cmd.Context(), func() (err error) {
		resp, err = c.Reservations.CreateReservations(cmd.Context(), request(req, m))
		return err
	})
	if err != nil {
		return a.reportRefusal(cmd.ErrOrStderr(), err)
	}
	if s := resp.Msg.GetShortfall(); s != "" {
		fmt.Fprintln(cmd.ErrOrStderr(), "partial array:", s)
	}
	if d := resp.Msg.GetGangDomain(); d != "" {
		fmt.Fprintf(cmd.ErrOrStderr(), "gang of %d in %s %s\n", len(resp.Msg.GetReservations()), req.GetGang().GetTopology(), d)
	}
	return a.printReservations(cmd, resp.Msg, resp.Msg.GetReservations()...)
}

// settledReservation reports whether a reservation stopped moving towards
// active: it is active, or it will never be.
func settledReservation(state string) bool {
	switch state {
	case "active", "released", "expired", "failed", "canceled":
		return true
	}
	return false
}

// waitReservation polls r until it settles or d passes. It returns the last
// state it saw, with an error when it stopped waiting before r settled.
func (a *app) waitReservation(ctx context.Context, c *client.Client, tenant string, r *apiv1.Reservation, d time.Duration) (*apiv1.Reservation, error) {
	// Five backoffs: one second by default, a few milliseconds in tests.
	poll := 5 * a.retryBackoff
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for !settledReservation(r.GetState()) {
		select {
		case <-ctx.Done():
			return r, connect.NewError(connect.CodeCanceled, fmt.Errorf("stopped waiting for reservation %s (%s)", r.GetId(), r.GetState()))
		case <-deadline.C:
			return r, connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("reservation %s still %s after %s: %s", r.GetId(), r.GetState(), d, whyNotActive(r)))
		case <-time.After(poll):
		}
		resp, err := c.Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: tenant, Reservation: r.GetId()}))
		if err != nil {
			return r, err
		}
		r = resp.Msg.GetReservation()
	}
	return r, nil
}

// whyNotActive is the reservation's own account of why it is not active:
// the pending explanation's summary, else its latest condition.
func whyNotActive(r *apiv1.Reservation) string {
	if s := r.GetExplanation().GetSummary(); s != "" {
		return s
	}
	if conds := r.GetConditions(); len(conds) > 0 {
		last := conds[len(conds)-1]
		return cmpOr(last.GetMessage(), cmpOr(last.GetReason(), last.GetType()))
	}
	return "no reason given"
}

// noCapacityError is a local NO_CAPACITY in the server's shape, so it
// prints and exits like a refused create.
func noCapacityError(msg string) error {
	cerr := connect.NewError(connect.CodeResourceExhausted, errors.New(msg))
	if d, err := connect.NewErrorDetail(&apiv1.ErrorDetail{Code: codeNoCapacity, Message: msg}); err == nil {
		cerr.AddDetail(d)
	}
	return cerr
}

// reportRefusal writes the detail of a NO_CAPACITY (why nodes did not fit)
// or QUOTA_EXCEEDED (the quotas involved) refusal to w, as tables, and
// returns err for Main to print.
func (a *app) reportRefusal(w io.Writer, err error) error {
	d := client.Detail(err)
	if d != nil && a.flagOutput != "table" {
		// -o json|yaml: the refusal's detail as the format asked, for
		// scripts; Main still prints the one-line error.
		_ = a.printer(w).print(d, nil)
		return err
	}
	switch {
	case d.GetCode() == codeNoCapacity && d.GetExplanation() != nil:
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		explanationTable(tw, d.GetExplanation())
		_ = tw.Flush()
	case d.GetCode() == codeQuotaExceeded && d.GetQuota() != nil:
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		quotaTable(tw, d.GetQuota())
		_ = tw.Flush()
	}
	return err
}

func (a *app) reservationsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "reservations",
		Aliases: []string{"reservation", "rsv"},
		Short:   "Reserve GPUs, preview where they would go, and extend, release or cancel reservations",
	}
	var tenant string

	var (
		limit                int
		project, pool, state string
		onOwned              bool
	)
	list := &cobra.Command{
		Use:   "list",
		Short: "List reservations (a tenant's, or every tenant's for platform administrators)",
		Long: `List reservations: the tenant's own, or with --on-my-pools every tenant's
reservation on the pools the tenant owns (the TENANT column names whose).`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientFleetTenant(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.Reservation, string, error) {
				resp, err := c.Reservations.List(ctx, connect.NewRequest(&apiv1.ListReservationsRequest{
					Tenant: t, Project: project, Pool: pool, State: state, PageToken: token, PageSize: size, OnOwnedPools: onOwned,
				}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetReservations(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			if onOwned {
				// The owner's listing always says whose each one is.
				return a.printer(cmd.OutOrStdout()).print(&apiv1.ListReservationsResponse{Reservations: all}, func(w io.Writer) {
					reservationRows(w, true, all...)
				})
			}
			return a.printReservations(cmd, &apiv1.ListReservationsResponse{Reservations: all}, all...)
		},
	}
	addTenantFlag(list, &tenant)
	addLimitFlag(list, &limit)
	list.Flags().StringVar(&project, "project", "", "only reservations of this project")
	list.Flags().StringVar(&pool, "pool", "", "only reservations in this pool (name, owner/name or id)")
	list.Flags().BoolVar(&onOwned, "on-my-pools", false, "every tenant's reservations on the pools the tenant owns")
	list.Flags().StringVar(&state, "state", "", "only these states, comma-separated: pending, placed, binding, active, releasing, released, expired, failed, canceled")

	get := &cobra.Command{
		Use:   "get ID",
		Short: "Show a reservation: its placement (node, atoms, NUMA, cpuset, NVLink island, score) and conditions",
		Args:  positional("ID"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Reservations.Get(cmd.Context(), connect.NewRequest(&apiv1.GetReservationRequest{Tenant: t, Reservation: argv[0]}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) { reservationDetail(w, resp.Msg.GetReservation()) })
		},
	}
	addTenantFlag(get, &tenant)

	var pf reservationFlags
	preview := &cobra.Command{
		Use:   "preview --pool POOL --gpus N [--for 4h | --start T --end T] [--nodes N --gpus-per-node G [--topology rack]]",
		Short: "Show where a reservation would go now, why nodes do not fit, and its quota effect; books nothing",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := pf.request(time.Now())
			if err != nil {
				return err
			}
			c, t, err := a.clientTenant(cmd, pf.tenant)
			if err != nil {
				return err
			}
			req.Tenant = t
			resp, err := c.Reservations.Preview(cmd.Context(), connect.NewRequest(&apiv1.PreviewReservationRequest{Request: req,
				GangNodes: pf.nodes, GangTopology: pf.topology}))
			if err != nil {
				return a.reportRefusal(cmd.ErrOrStderr(), err)
			}
			if err := a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) { previewTable(w, resp.Msg) }); err != nil {
				return err
			}
			if !resp.Msg.GetFeasible() {
				// A script can test the answer: nothing fits is a failure,
				// with the machine code and words a create would answer.
				if sum := resp.Msg.GetExplanation().GetSummary(); strings.Contains(sum, "can never hold") {
					return noCapacityError(sum)
				}
				return noCapacityError(fmt.Sprintf("no node of pool %s fits the request now", req.GetPool()))
			}
			return nil
		},
	}
	pf.add(preview)

	var (
		extendFor      time.Duration
		until          string
		confirmationID string
	)
	extend := &cobra.Command{
		Use:   "extend ID (--for 2h | --until T)",
		Short: "Move a reservation's end: --for adds to the current end, --until sets it",
		Args:  positional("ID"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			req := &apiv1.ExtendReservationRequest{Reservation: argv[0]}
			switch {
			case extendFor != 0 && until != "":
				return invalidArg("for", "give either --for or --until, not both")
			case extendFor < 0:
				return invalidArg("for", "must not be negative")
			case extendFor > 0:
				req.ExtendSeconds = int64(extendFor / time.Second)
			case until != "":
				end, err := parseWhen("until", until, time.Now())
				if err != nil {
					return err
				}
				req.EndTime = end
			default:
				return invalidArg("for", "required: pass --for or --until")
			}
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			req.Tenant = t
			// No retry: a repeated --for would extend twice.
			resp, err := c.Reservations.Extend(cmd.Context(), request(req, mutation{confirmationID: confirmationID}))
			if err != nil {
				return a.reportRefusal(cmd.ErrOrStderr(), err)
			}
			return a.printReservations(cmd, resp.Msg, resp.Msg.GetReservation())
		},
	}
	addTenantFlag(extend, &tenant)
	extend.Flags().Var((*spanValue)(&extendFor), "for", "add this much to the current end, e.g. 2h or 1d")
	extend.Flags().StringVar(&until, "until", "", "the new end: RFC 3339 or relative to now, e.g. +6h or +1d")
	addConfirmationFlag(extend, &confirmationID)

	release := &cobra.Command{
		Use:   "release ID",
		Short: "End a reservation now and free what it holds (idempotent)",
		Args:  positional("ID"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			var resp *connect.Response[apiv1.ReleaseReservationResponse]
			// Releasing twice changes nothing, so a lost answer may be retried.
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.Reservations.Release(cmd.Context(), request(&apiv1.ReleaseReservationRequest{Tenant: t, Reservation: argv[0]}, mutation{confirmationID: confirmationID}))
				return err
			})
			if err != nil {
				return err
			}
			return a.printReservations(cmd, resp.Msg, resp.Msg.GetReservation())
		},
	}
	addTenantFlag(release, &tenant)
	addConfirmationFlag(release, &confirmationID)

	cancel := &cobra.Command{
		Use:   "cancel ID",
		Short: "Withdraw a reservation that is not active yet (idempotent)",
		Args:  positional("ID"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			var resp *connect.Response[apiv1.CancelReservationResponse]
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.Reservations.Cancel(cmd.Context(), request(&apiv1.CancelReservationRequest{Tenant: t, Reservation: argv[0]}, mutation{confirmationID: confirmationID}))
				return err
			})
			if err != nil {
				return err
			}
			return a.printReservations(cmd, resp.Msg, resp.Msg.GetReservation())
		},
	}
	addTenantFlag(cancel, &tenant)
	addConfirmationFlag(cancel, &confirmationID)

	var cursor string
	watch := &cobra.Command{
		Use:   "watch [ID]",
		Short: "Print reservation changes as they happen, until interrupted",
		Long: `Print each change of the tenant's reservations (or of one, given its ID) as
it arrives: time, type, id, state and cursor as a table line under a
header, one JSON object per line with -o json. Resume where a previous
watch stopped with --cursor set to the last cursor it printed. An
interrupt ends the watch with exit 0; the server ending it exits 1 and
says which cursor to resume from.`,
		Args: func(_ *cobra.Command, argv []string) error {
			if len(argv) > 1 {
				return usagef("unexpected argument %q", argv[1])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			var id string
			if len(argv) == 1 {
				id = argv[0]
			}
			last, err := a.watchReservations(cmd, c, &apiv1.WatchReservationsRequest{Tenant: t, Reservation: id, Cursor: cursor})
			resume := "rerun to follow new changes"
			if last != "" {
				resume = "resume with --cursor " + last
			}
			return streamEnded(cmd, "reservation", err, resume)
		},
	}
	addTenantFlag(watch, &tenant)
	watch.Flags().StringVar(&cursor, "cursor", "", "resume after this cursor (default: new changes only)")

	cmd.AddCommand(a.reservationCreateCommand("create"), list, get, preview, extend, release, cancel, watch, a.reservationExecCommand())
	return cmd
}

// watchReservations prints each change until the stream ends, and returns
// the last cursor it printed.
func (a *app) watchReservations(cmd *cobra.Command, c *client.Client, req *apiv1.WatchReservationsRequest) (last string, err error) {
	ctx, cancel := context.WithCancel(cmd.Context())
	defer cancel()
	last = req.GetCursor()
	stream, err := c.Reservations.Watch(ctx, connect.NewRequest(req))
	if err != nil {
		return last, err
	}
	defer func() { _ = stream.Close() }()
	p := a.printer(cmd.OutOrStdout())
	const line = "%-20s  %-22s  %-30s  %-9s  %s\n"
	p.streamHeader(func(w io.Writer) { fmt.Fprintf(w, line, "TIME", "TYPE", "ID", "STATE", "CURSOR") })
	for stream.Receive() {
		ev := stream.Msg()
		r := ev.GetReservation()
		// The change carries no time of its own; the reservation's update
		// time is when it happened.
		err := p.line(ev, func(w io.Writer) {
			fmt.Fprintf(w, line, ts(r.GetUpdateTime()), ev.GetType(), r.GetId(), dash(r.GetState()), dash(ev.GetCursor()))
		})
		if err != nil {
			return last, err
		}
		if ev.GetCursor() != "" {
			last = ev.GetCursor()
		}
	}
	return last, stream.Err()
}

func (a *app) printReservations(cmd *cobra.Command, msg proto.Message, items ...*apiv1.Reservation) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		reservationTable(w, items...)
		// A single pending reservation answers why it waits.
		if len(items) == 1 && items[0].GetState() == "pending" && items[0].GetExplanation() != nil {
			fmt.Fprintln(w)
			explanationTable(w, items[0].GetExplanation())
		}
	})
}

func reservationTable(w io.Writer, items ...*apiv1.Reservation) {
	// Whose each reservation is shows when the rows are several tenants'
	// (a platform listing).
	mixed := false
	for _, r := range items {
		mixed = mixed || r.GetTenantId() != items[0].GetTenantId()
	}
	reservationRows(w, mixed, items...)
}

func reservationRows(w io.Writer, mixed bool, items ...*apiv1.Reservation) {
	head := []string{"ID", "STATE", "POOL", "NODE", "GPUS", "ATOMS", "START", "END"}
	if mixed {
		head = slices.Insert(head, 2, "TENANT")
	}
	row(w, head...)
	for _, r := range items {
		atoms := "-"
		if n := len(r.GetPlacement().GetAtoms()); n > 0 {
			atoms = strconv.Itoa(n)
		}
		end := ts(r.GetEndTime())
		if r.GetSpec().GetBinding() == "instance" {
			// An instance's booking lasts as long as the instance: its
			// end is a far horizon, not a date anyone chose.
			end = "while its instance lives"
		}
		cells := []string{r.GetId(), r.GetState(), dash(cmpOr(r.GetPool(), r.GetPoolId())), dash(placementNode(r.GetPlacement())),
			reservationAsk(r), atoms, ts(r.GetStartTime()), end}
		if mixed {
			cells = slices.Insert(cells, 2, dash(cmpOr(r.GetTenant(), r.GetTenantId())))
		}
		row(w, cells...)
	}
}

// reservationAsk says what was reserved: "2 × H100", "1 × 1g.10gb",
// "4 slots".
func reservationAsk(r *apiv1.Reservation) string {
	s := r.GetSpec()
	if s.GetBinding() == "instance" {
		// The host share of an instance (a sandbox's warm guest among
		// them), booked by the instance service, not a GPU request.
		ask := fmt.Sprintf("instance: %d vCPU, %d GiB", s.GetVcpu(), s.GetMemoryGib()+s.GetHugepages_1Gi())
		if s.GetGpus() > 0 {
			ask += fmt.Sprintf(", %d GPUs", s.GetGpus())
		}
		return ask
	}
	if s.GetSlots() > 0 {
		return fmt.Sprintf("%d slots", s.GetSlots())
	}
	kind := strings.TrimSpace(cmpOr(s.GetModel(), r.GetPlacement().GetGpuModel()) + " " + s.GetMigProfile())
	if kind == "" {
		return strconv.Itoa(int(s.GetGpus()))
	}
	return fmt.Sprintf("%d × %s", s.GetGpus(), kind)
}

// placementNode names a placement's node: its name, else its id.
func placementNode(p *apiv1.Placement) string {
	return cmpOr(p.GetNodeName(), p.GetNodeId())
}

// reservationDetail is `reservations get`: one field a line, then the
// placement, conditions and (while pending) the explanation.
func reservationDetail(w io.Writer, r *apiv1.Reservation) {
	s := r.GetSpec()
	row(w, "ID:", r.GetId())
	row(w, "STATE:", r.GetState())
	row(w, "TENANT:", dash(r.GetTenantId()))
	row(w, "PROJECT:", dash(r.GetProjectId()))
	row(w, "POOL:", dash(cmpOr(r.GetPool(), r.GetPoolId())))
	row(w, "GPUS:", reservationAsk(r))
	row(w, "HOST:", fmt.Sprintf("%d vCPU, %d GiB memory, %d × 1 GiB huge pages", s.GetVcpu(), s.GetMemoryGib(), s.GetHugepages_1Gi()))
	binding := dash(s.GetBinding())
	if s.GetSingleTenant() {
		binding += ", single tenant"
	}
	row(w, "BINDING:", binding)
	row(w, "START:", ts(r.GetStartTime()))
	row(w, "END:", ts(r.GetEndTime()))
	if rt := r.GetReleaseTime(); rt != nil {
		// A kubernetes binding: booked and billed from its release until
		// the node's pods let go.
		row(w, "RELEASING SINCE:", ts(rt)+", ends as "+dash(r.GetEndsAs()))
	}
	row(w, "CREATED:", ts(r.GetCreateTime())+" by "+dash(r.GetCreatedBy()))
	if p := r.GetPlacement(); p != nil {
		node := dash(p.GetNodeName())
		if p.GetNodeId() != "" && p.GetNodeId() != p.GetNodeName() {
			node += " (" + p.GetNodeId() + ")"
		}
		row(w, "NODE:", node)
		row(w, "GPU MODEL:", dash(p.GetGpuModel()))
		row(w, "ATOMS:", dash(strings.Join(p.GetAtoms(), ", ")))
		row(w, "NUMA:", topologyIndex(p.GetNuma(), "spans several"))
		row(w, "CPUSET:", dash(p.GetCpuset()))
		row(w, "NVLINK ISLAND:", topologyIndex(p.GetIsland(), "none or several"))
		if sc := p.GetScore(); sc != nil {
			row(w, "SCORE:", fmt.Sprintf("%.2f (binpack %.2f, topology %.2f, fragmentation %.2f, spread %.2f)",
				sc.GetTotal(), sc.GetBinpack(), sc.GetTopology(), sc.GetFragmentation(), sc.GetSpread()))
		}
	}
	if conds := r.GetConditions(); len(conds) > 0 {
		fmt.Fprintln(w)
		row(w, "CONDITION", "STATUS", "REASON", "MESSAGE", "UPDATED")
		for _, c := range conds {
			row(w, c.GetType(), c.GetStatus(), dash(c.GetReason()), dash(c.GetMessage()), ts(c.GetUpdateTime()))
		}
	}
	if e := r.GetExplanation(); e != nil {
		fmt.Fprintln(w)
		explanationTable(w, e)
	}
}

// topologyIndex prints a NUMA node or NVLink island; -1 means the GPUs do
// not sit on a single one.
func topologyIndex(i int32, none string) string {
	if i < 0 {
		return "- (" + none + ")"
	}
	return strconv.Itoa(int(i))
}

// previewTable is `reservations preview`: the placement Create would make,
// why nodes were rejected, and the quota effect.
func previewTable(w io.Writer, p *apiv1.PreviewReservationResponse) {
	if gang := p.GetGangPlacements(); len(gang) > 0 {
		where := "the pool"
		if d := p.GetGangDomain(); d != "" {
			where = "domain " + d
		}
		fmt.Fprintf(w, "would place the gang of %d in %s:\n", len(gang), where)
		for _, pl := range gang {
			fmt.Fprintf(w, "  %s: atoms %s\n", dash(placementNode(pl)), dash(strings.Join(pl.GetAtoms(), ", ")))
		}
	} else if pl := p.GetPlacement(); p.GetFeasible() && pl != nil {
		fmt.Fprintf(w, "would place on %s: atoms %s\n", dash(placementNode(pl)), dash(strings.Join(pl.GetAtoms(), ", ")))
		fmt.Fprintf(w, "  numa %s, nvlink island %s, cpuset %s", topologyIndex(pl.GetNuma(), "spans several"),
			topologyIndex(pl.GetIsland(), "none or several"), dash(pl.GetCpuset()))
		if sc := pl.GetScore(); sc != nil {
			fmt.Fprintf(w, ", score %.2f", sc.GetTotal())
		}
		fmt.Fprintln(w)
	} else if p.GetFeasible() {
		fmt.Fprintln(w, "would place it")
	} else {
		fmt.Fprintln(w, "no node fits")
	}
	if p.GetStartTime() != nil || p.GetEndTime() != nil {
		fmt.Fprintf(w, "window: %s to %s\n", ts(p.GetStartTime()), ts(p.GetEndTime()))
	}
	if e := p.GetExplanation(); e != nil {
		fmt.Fprintln(w)
		explanationTable(w, e)
	}
	if q := p.GetQuota(); q != nil {
		fmt.Fprintln(w)
		quotaTable(w, q)
	}
	if b := p.GetBudget(); b != nil {
		fmt.Fprintln(w)
		budgetEffectLines(w, b)
	}
}

// budgetEffectLines prints what a request costs and what it leaves of the
// tenant's budget.
func budgetEffectLines(w io.Writer, b *apiv1.BudgetEffect) {
	fmt.Fprintf(w, "cost: %s (%s an hour)\n", b.GetCost(), b.GetCostPerHour())
	if !b.GetHasBudget() {
		return
	}
	verdict := ""
	if b.GetExceeded() {
		verdict = " — passes it"
		if b.GetEnforcement() == "hard" {
			verdict += ": Create would be refused with SPEND_LIMIT_REACHED"
		}
	}
	fmt.Fprintf(w, "budget (%s) from %s: %s, %s committed, %s requested, %s left%s\n", b.GetEnforcement(), ts(b.GetPeriodStart()),
		b.GetAmount(), b.GetCommitted(), b.GetRequested(), b.GetLeft(), verdict)
}

// explanationTable prints why nodes were rejected, one line per node class,
// then the counts and the server's summary.
func explanationTable(w io.Writer, e *apiv1.Explanation) {
	if lines := e.GetLines(); len(lines) > 0 {
		row(w, "CLASS", "NODES", "REASON")
		for _, l := range lines {
			row(w, dash(l.GetClass()), strconv.Itoa(int(l.GetNodes())), dash(l.GetReason()))
		}
	}
	fmt.Fprintf(w, "%d nodes evaluated, %d feasible", e.GetEvaluated(), e.GetFeasible())
	if s := e.GetSummary(); s != "" {
		fmt.Fprintf(w, ": %s", s)
	}
	fmt.Fprintln(w)
}

// quotaTable prints each quota a request touches as used+requested/limit.
func quotaTable(w io.Writer, q *apiv1.QuotaEffect) {
	if uses := q.GetUses(); len(uses) > 0 {
		row(w, "SCOPE", "GPUS", "GPU-HOURS", "EXCEEDED")
		for _, u := range uses {
			gpus := fmt.Sprintf("%d+%d/%s", u.GetGpusUsed(), u.GetGpusRequested(), quotaUseLimit(float64(u.GetGpusLimit())))
			hours := fmt.Sprintf("%s+%s/%s", roundHours(u.GetGpuHoursUsed()), roundHours(u.GetGpuHoursRequested()), quotaUseLimit(u.GetGpuHoursLimit()))
			row(w, dash(u.GetScope()), gpus, hours, yesOrNo(u.GetExceeded()))
		}
	}
	if q.GetExceeded() {
		fmt.Fprintln(w, "quota would be exceeded")
	} else {
		fmt.Fprintln(w, "within quota")
	}
}

// quotaUseLimit prints a quota limit; a negative one is unlimited.
func quotaUseLimit(v float64) string {
	if v < 0 {
		return "unlimited"
	}
	return roundHours(v)
}

// roundHours prints a number with at most two decimals and no trailing
// zeros: 8, 0.5, 1.33.
func roundHours(v float64) string {
	return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64)
}

func yesOrNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
