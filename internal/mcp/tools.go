package mcp

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// maxSpan bounds a duration argument; the API refuses more than 30 days
// anyway, this only keeps the arithmetic far from overflow.
const maxSpan = 3650 * 24 * time.Hour

// parseSpan reads a duration as time.ParseDuration does, plus whole days
// in front ("1d", "2d12h"), since reservations run for days.
func parseSpan(field, s string) (time.Duration, error) {
	bad := func() error {
		return invalid(field, "must be a positive duration such as 30m, 4h, 1d or 2d12h, got %q", s)
	}
	rest := s
	var days time.Duration
	if i := strings.IndexByte(rest, 'd'); i > 0 {
		n, err := strconv.Atoi(rest[:i])
		if err != nil || n < 0 || n > 3650 {
			return 0, bad()
		}
		days, rest = time.Duration(n)*24*time.Hour, rest[i+1:]
	}
	var d time.Duration
	if rest != "" || days == 0 {
		var err error
		if d, err = time.ParseDuration(rest); err != nil {
			return 0, bad()
		}
	}
	total := days + d
	if total <= 0 || d < 0 || total > maxSpan {
		return 0, bad()
	}
	if total%time.Second != 0 {
		return 0, invalid(field, "must be whole seconds, got %q", s)
	}
	return total, nil
}

// mutation wraps msg with the replay header when the agent retries with an
// approved confirmation.
func mutation[T any](msg *T, confirmationID string) *connect.Request[T] {
	req := connect.NewRequest(msg)
	if confirmationID != "" {
		req.Header().Set(client.HeaderConfirmationID, confirmationID)
	}
	return req
}

// Paging is the page arguments of the list tools.
type Paging struct {
	PageSize  int32  `json:"page_size,omitempty" jsonschema:"at most this many (default 100, at most 500)"`
	PageToken string `json:"page_token,omitempty" jsonschema:"next_page_token of the previous call"`
}

// --- list_pools ---------------------------------------------------------

// ListPoolsInput is list_pools' arguments.
type ListPoolsInput struct {
	Tenant          string `json:"tenant,omitempty" jsonschema:"tenant name or id (default: the key's tenant)"`
	IncludeArchived bool   `json:"include_archived,omitempty" jsonschema:"list archived pools too"`
	Paging
}

// PoolsOutput is list_pools' result.
type PoolsOutput struct {
	Pools         []Pool `json:"pools"`
	NextPageToken string `json:"next_page_token,omitempty"`
	Outcome
}

// --- capacity_summary ---------------------------------------------------

// TenantInput is the arguments of a tool that needs only a tenant.
type TenantInput struct {
	Tenant string `json:"tenant,omitempty" jsonschema:"tenant name or id (default: the key's tenant)"`
}

// CapacityOutput is capacity_summary's result.
type CapacityOutput struct {
	Rows []CapacityRow `json:"rows"`
	Outcome
}

// --- reserve_gpus and preview_reservation -------------------------------

// ReserveInput is reserve_gpus' and preview_reservation's arguments.
type ReserveInput struct {
	Tenant     string `json:"tenant,omitempty" jsonschema:"tenant name or id (default: the key's tenant)"`
	Project    string `json:"project,omitempty" jsonschema:"project name or id (default: the project named default, or the tenant's only project)"`
	Pool       string `json:"pool" jsonschema:"pool name or id; a pool another tenant offers is owner/name"`
	GPUs       int32  `json:"gpus,omitempty" jsonschema:"whole GPUs, or MIG instances with mig_profile"`
	Model      string `json:"model,omitempty" jsonschema:"GPU model, e.g. H100 (default: any)"`
	MIGProfile string `json:"mig_profile,omitempty" jsonschema:"MIG profile, e.g. 1g.10gb"`
	Slots      int32  `json:"slots,omitempty" jsonschema:"shared slots on timeslice and mps pools, instead of gpus"`
	VCPU       int32  `json:"vcpu,omitempty" jsonschema:"vCPUs (default: the pool's per-GPU share)"`
	MemoryGiB  int32  `json:"memory_gib,omitempty" jsonschema:"memory in GiB (default: the pool's per-GPU share)"`
	Duration   string `json:"duration,omitempty" jsonschema:"how long from now, e.g. 30m, 4h, 1d (default 1h)"`
	Binding    string `json:"binding,omitempty" jsonschema:"node (default), kubernetes, none (a booking only) or machine (a whole machine under a lease)"`
	// ConfirmationID replays a call held for a human (reserve_gpus only).
	ConfirmationID string `json:"confirmation_id,omitempty" jsonschema:"an approved confirmation, when retrying a call that answered CONFIRMATION_REQUIRED"`
}

// createFields maps the API's field names to the tool's arguments.
var createFields = map[string]string{"duration_seconds": "duration", "memory_gib": "memory_gib",
	"Bc-Confirmation-Id": "confirmation_id"}

func (in ReserveInput) request(tenant string) (*apiv1.CreateReservationRequest, error) {
	var secs int64
	if in.Duration != "" {
		d, err := parseSpan("duration", in.Duration)
		if err != nil {
			return nil, err
		}
		secs = int64(d / time.Second)
	}
	return &apiv1.CreateReservationRequest{Tenant: tenant, Project: in.Project, Pool: in.Pool,
		Gpus: in.GPUs, Model: in.Model, MigProfile: in.MIGProfile, Slots: in.Slots, Vcpu: in.VCPU, MemoryGib: in.MemoryGiB,
		DurationSeconds: secs, Binding: in.Binding}, nil
}

// PreviewOutput is preview_reservation's result.
type PreviewOutput struct {
	Feasible    bool         `json:"feasible" jsonschema:"whether reserve_gpus would place it now"`
	Placement   *Placement   `json:"placement,omitempty"`
	Explanation *Explanation `json:"explanation,omitempty" jsonschema:"why nodes were or were not feasible, by node class"`
	Quota       *Quota       `json:"quota,omitempty" jsonschema:"what the request would do to every quota covering it"`
	Start       string       `json:"start,omitempty"`
	End         string       `json:"end,omitempty"`
	Outcome
}

// ReservationOutput is the result of the tools that create or change one
// reservation.
type ReservationOutput struct {
	Reservation *Reservation `json:"reservation,omitempty"`
	Outcome
}

// --- list_reservations --------------------------------------------------

// ListReservationsInput is list_reservations' arguments.
type ListReservationsInput struct {
	Tenant  string `json:"tenant,omitempty" jsonschema:"tenant name or id (default: the key's tenant)"`
	Project string `json:"project,omitempty" jsonschema:"only this project's"`
	Pool    string `json:"pool,omitempty" jsonschema:"only this pool's"`
	State   string `json:"state,omitempty" jsonschema:"only in this state: pending, placed, binding, active, releasing, released, expired, failed or canceled"`
	Paging
}

// ReservationsOutput is list_reservations' result.
type ReservationsOutput struct {
	Reservations  []Reservation `json:"reservations"`
	NextPageToken string        `json:"next_page_token,omitempty"`
	Outcome
}

// --- extend_reservation and release_reservation -------------------------

// ExtendInput is extend_reservation's arguments.
type ExtendInput struct {
	Tenant         string `json:"tenant,omitempty" jsonschema:"tenant name or id (default: the key's tenant)"`
	Reservation    string `json:"reservation" jsonschema:"the reservation's id"`
	By             string `json:"by" jsonschema:"how much longer, e.g. 2h or 1d; an agent's extension past a day's lifetime needs a human"`
	ConfirmationID string `json:"confirmation_id,omitempty" jsonschema:"an approved confirmation, when retrying a call that answered CONFIRMATION_REQUIRED"`
}

var extendFields = map[string]string{"extend_seconds": "by", "Bc-Confirmation-Id": "confirmation_id"}

// ReleaseInput is release_reservation's arguments.
type ReleaseInput struct {
	Tenant         string `json:"tenant,omitempty" jsonschema:"tenant name or id (default: the key's tenant)"`
	Reservation    string `json:"reservation" jsonschema:"the reservation's id"`
	ConfirmationID string `json:"confirmation_id,omitempty" jsonschema:"an approved confirmation, when retrying a call that answered CONFIRMATION_REQUIRED"`
}

// --- list_nodes ---------------------------------------------------------

// ListNodesInput is list_nodes' arguments.
type ListNodesInput struct {
	Tenant   string `json:"tenant,omitempty" jsonschema:"tenant name or id (default: the key's tenant)"`
	Project  string `json:"project,omitempty" jsonschema:"only this project's"`
	State    string `json:"state,omitempty" jsonschema:"only in this state: joining, active, draining, drained or retired"`
	Liveness string `json:"liveness,omitempty" jsonschema:"only with this liveness: ready, unreachable or lost"`
	Paging
}

// NodesOutput is list_nodes' result.
type NodesOutput struct {
	Nodes         []Node `json:"nodes"`
	NextPageToken string `json:"next_page_token,omitempty"`
	Outcome
}

// --- usage --------------------------------------------------------------

// UsageInput is usage's arguments.
type UsageInput struct {
	Tenant  string `json:"tenant,omitempty" jsonschema:"tenant name or id (default: the key's tenant)"`
	Project string `json:"project,omitempty" jsonschema:"only this project's"`
	Metric  string `json:"metric,omitempty" jsonschema:"only this metric: gpu.<model>.hours, vcpu.hours or memoryGiB.hours"`
	Since   string `json:"since,omitempty" jsonschema:"only windows that start within this long before now, e.g. 24h or 7d"`
	Paging
}

// UsageOutput is usage's result.
type UsageOutput struct {
	Windows       []UsageWindow `json:"windows"`
	NextPageToken string        `json:"next_page_token,omitempty"`
	Outcome
}

var pagingFields = map[string]string{}

func (s *Server) addTools(srv *sdk.Server) {
	readOnly := &sdk.ToolAnnotations{ReadOnlyHint: true}
	addTool(s, srv, &sdk.Tool{Name: "list_pools", Annotations: readOnly,
		Description: "List the GPU pools this tenant may reserve from: its own and those other tenants offer it (owner says whose)."},
		func(in ListPoolsInput) string { return in.Tenant }, pagingFields,
		func(ctx context.Context, c call, in ListPoolsInput) (*PoolsOutput, error) {
			res, err := c.api.Pools.List(ctx, connect.NewRequest(&apiv1.ListPoolsRequest{Tenant: c.tenant,
				IncludeArchived: in.IncludeArchived, PageSize: in.PageSize, PageToken: in.PageToken}))
			if err != nil {
				return nil, err
			}
			return &PoolsOutput{Pools: mapAll(res.Msg.GetPools(), poolOf), NextPageToken: res.Msg.GetNextPageToken()}, nil
		})
	addTool(s, srv, &sdk.Tool{Name: "capacity_summary", Annotations: readOnly,
		Description: "GPUs total, booked, quarantined, free and pending, by pool and model, for every pool the tenant may use."},
		func(in TenantInput) string { return in.Tenant }, nil,
		func(ctx context.Context, c call, in TenantInput) (*CapacityOutput, error) {
			res, err := c.api.Capacity.Summary(ctx, connect.NewRequest(&apiv1.CapacitySummaryRequest{Tenant: c.tenant}))
			if err != nil {
				return nil, err
			}
			return &CapacityOutput{Rows: mapAll(res.Msg.GetRows(), capacityRowOf)}, nil
		})
	addTool(s, srv, &sdk.Tool{Name: "preview_reservation", Annotations: readOnly,
		Description: "Say whether reserve_gpus with these arguments would be placed now, where, what it does to quotas, and why nodes do not fit, by node class. Reserves nothing."},
		func(in ReserveInput) string { return in.Tenant }, createFields,
		func(ctx context.Context, c call, in ReserveInput) (*PreviewOutput, error) {
			if in.ConfirmationID != "" {
				return nil, invalid("confirmation_id", "a preview needs no confirmation")
			}
			req, err := in.request(c.tenant)
			if err != nil {
				return nil, err
			}
			res, err := c.api.Reservations.Preview(ctx, connect.NewRequest(&apiv1.PreviewReservationRequest{Request: req}))
			if err != nil {
				return nil, err
			}
			m := res.Msg
			return &PreviewOutput{Feasible: m.GetFeasible(), Placement: placementOf(m.GetPlacement()),
				Explanation: explanationOf(m.GetExplanation()), Quota: quotaOf(m.GetQuota()),
				Start: timeOf(m.GetStartTime()), End: timeOf(m.GetEndTime())}, nil
		})
	addTool(s, srv, &sdk.Tool{Name: "reserve_gpus",
		Description: "Reserve GPUs (or MIG instances, or shared slots) from a pool, starting now, for a duration. Answers the reservation; a pending one says why in its explanation."},
		func(in ReserveInput) string { return in.Tenant }, createFields,
		func(ctx context.Context, c call, in ReserveInput) (*ReservationOutput, error) {
			req, err := in.request(c.tenant)
			if err != nil {
				return nil, err
			}
			res, err := c.api.Reservations.Create(ctx, mutation(req, in.ConfirmationID))
			if err != nil {
				return nil, err
			}
			return &ReservationOutput{Reservation: reservationOf(res.Msg.GetReservation())}, nil
		})
	addTool(s, srv, &sdk.Tool{Name: "list_reservations", Annotations: readOnly,
		Description: "List the tenant's GPU reservations, newest first, optionally by project, pool or state."},
		func(in ListReservationsInput) string { return in.Tenant }, pagingFields,
		func(ctx context.Context, c call, in ListReservationsInput) (*ReservationsOutput, error) {
			res, err := c.api.Reservations.List(ctx, connect.NewRequest(&apiv1.ListReservationsRequest{Tenant: c.tenant,
				Project: in.Project, Pool: in.Pool, State: in.State, PageSize: in.PageSize, PageToken: in.PageToken}))
			if err != nil {
				return nil, err
			}
			return &ReservationsOutput{Reservations: mapAll(res.Msg.GetReservations(), reservationValue), NextPageToken: res.Msg.GetNextPageToken()}, nil
		})
	addTool(s, srv, &sdk.Tool{Name: "extend_reservation",
		Description: "Keep a reservation longer: its end moves by the given duration."},
		func(in ExtendInput) string { return in.Tenant }, extendFields,
		func(ctx context.Context, c call, in ExtendInput) (*ReservationOutput, error) {
			if in.By == "" {
				return nil, invalid("by", "required, e.g. 2h or 1d")
			}
			d, err := parseSpan("by", in.By)
			if err != nil {
				return nil, err
			}
			res, err := c.api.Reservations.Extend(ctx, mutation(&apiv1.ExtendReservationRequest{Tenant: c.tenant,
				Reservation: in.Reservation, ExtendSeconds: int64(d / time.Second)}, in.ConfirmationID))
			if err != nil {
				return nil, err
			}
			return &ReservationOutput{Reservation: reservationOf(res.Msg.GetReservation())}, nil
		})
	addTool(s, srv, &sdk.Tool{Name: "release_reservation", Annotations: &sdk.ToolAnnotations{DestructiveHint: ptr(true)},
		Description: "Release a reservation now: its GPUs go back to the pool."},
		func(in ReleaseInput) string { return in.Tenant }, map[string]string{"Bc-Confirmation-Id": "confirmation_id"},
		func(ctx context.Context, c call, in ReleaseInput) (*ReservationOutput, error) {
			res, err := c.api.Reservations.Release(ctx, mutation(&apiv1.ReleaseReservationRequest{Tenant: c.tenant,
				Reservation: in.Reservation}, in.ConfirmationID))
			if err != nil {
				return nil, err
			}
			return &ReservationOutput{Reservation: reservationOf(res.Msg.GetReservation())}, nil
		})
	addTool(s, srv, &sdk.Tool{Name: "list_nodes", Annotations: readOnly,
		Description: "List the tenant's GPU nodes with their state, liveness, pool and GPUs."},
		func(in ListNodesInput) string { return in.Tenant }, pagingFields,
		func(ctx context.Context, c call, in ListNodesInput) (*NodesOutput, error) {
			res, err := c.api.Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{Tenant: c.tenant, Project: in.Project,
				State: in.State, Liveness: in.Liveness, PageSize: in.PageSize, PageToken: in.PageToken}))
			if err != nil {
				return nil, err
			}
			return &NodesOutput{Nodes: mapAll(res.Msg.GetNodes(), nodeOf), NextPageToken: res.Msg.GetNextPageToken()}, nil
		})
	addTool(s, srv, &sdk.Tool{Name: "usage", Annotations: readOnly,
		Description: "Metered usage (GPU-hours by model, vCPU-hours, memory GiB-hours) in hourly windows, per reservation."},
		func(in UsageInput) string { return in.Tenant }, map[string]string{"start_time": "since"},
		func(ctx context.Context, c call, in UsageInput) (*UsageOutput, error) {
			req := &apiv1.ListUsageRequest{Tenant: c.tenant, Project: in.Project, Metric: in.Metric, PageSize: in.PageSize, PageToken: in.PageToken}
			if in.Since != "" {
				d, err := parseSpan("since", in.Since)
				if err != nil {
					return nil, err
				}
				// The API's clock is the one that counts; the caller's is
				// close enough to choose a window.
				req.StartTime = timestamppb.New(time.Now().Add(-d))
			}
			res, err := c.api.Usage.List(ctx, connect.NewRequest(req))
			if err != nil {
				return nil, err
			}
			return &UsageOutput{Windows: mapAll(res.Msg.GetWindows(), usageOf), NextPageToken: res.Msg.GetNextPageToken()}, nil
		})
	registerBatchTools(s, srv)
}

// ProposeBatchInput is a proposed batch of destructive commands.
type ProposeBatchInput struct {
	Tenant      string           `json:"tenant,omitempty" jsonschema:"tenant name or id (default: the key's tenant)"`
	Description string           `json:"description,omitempty" jsonschema:"what the batch is for, for the approvers"`
	Leaves      []BatchLeafInput `json:"leaves" jsonschema:"the commands, in order"`
	TTL         string           `json:"ttl,omitempty" jsonschema:"how long the batch waits for approvals, e.g. 4h or 2d (default 1d, at most 7d)"`
}

// BatchLeafInput is one proposed command.
type BatchLeafInput struct {
	Kind    string         `json:"kind" jsonschema:"a destructive command kind: disk.wipe or image.write (a node), power.off or power.cycle (a machine)"`
	Subject string         `json:"subject" jsonschema:"the node id (a commissioning ramdisk), or site/<site id>/machine/<machine id> for a power kind"`
	Params  map[string]any `json:"params,omitempty" jsonschema:"the command's params"`
}

// BatchOutput is a proposed batch.
type BatchOutput struct {
	Batch *CommandBatch `json:"batch,omitempty"`
	Outcome
}

var batchFields = map[string]string{"ttl_seconds": "ttl"}

// registerBatchTools adds propose_command_batch. There is deliberately no
// tool to approve or run a batch: approval is a human approver's
// signature with a key an agent never holds (docs/quorum.md).
func registerBatchTools(s *Server, srv *sdk.Server) {
	addTool(s, srv, &sdk.Tool{Name: "propose_command_batch",
		Description: "Propose a batch of destructive commands (disk.wipe, image.write on nodes; power.off, power.cycle on machines) of the tenant. " +
			"It runs only after a quorum of the tenant's human approvers signed it; this tool cannot approve or run it."},
		func(in ProposeBatchInput) string { return in.Tenant }, batchFields,
		func(ctx context.Context, c call, in ProposeBatchInput) (*BatchOutput, error) {
			req := &apiv1.CreateCommandBatchRequest{Tenant: c.tenant, Description: in.Description}
			if in.TTL != "" {
				d, err := parseSpan("ttl", in.TTL)
				if err != nil {
					return nil, err
				}
				req.TtlSeconds = int64(d / time.Second)
			}
			for i, l := range in.Leaves {
				st, err := structpb.NewStruct(l.Params)
				if err != nil {
					return nil, invalid(fmt.Sprintf("leaves[%d].params", i), "must be a JSON object: %v", err)
				}
				req.Leaves = append(req.Leaves, &apiv1.CommandBatchLeafSpec{Kind: l.Kind, Subject: l.Subject, Params: st})
			}
			res, err := c.api.CommandBatches.Create(ctx, connect.NewRequest(req))
			if err != nil {
				return nil, err
			}
			return &BatchOutput{Batch: batchOf(res.Msg.GetBatch())}, nil
		})
}

func ptr[T any](v T) *T { return &v }

func mapAll[S any, T any](in []S, f func(S) T) []T {
	out := make([]T, 0, len(in))
	for _, v := range in {
		out = append(out, f(v))
	}
	return out
}

func timeOf(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return ""
	}
	return ts.AsTime().UTC().Format(time.RFC3339)
}
