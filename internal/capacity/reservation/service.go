package reservation

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/events"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// EventSource is the outbox as the Watch method reads it.
type EventSource = events.Source

// Service serves ReservationService.
type Service struct {
	env    *envelope.Envelope
	engine *Engine
	events EventSource
	poll   time.Duration
}

var _ apiv1connect.ReservationServiceHandler = (*Service)(nil)

// NewService returns the reservation handlers.
func NewService(env *envelope.Envelope, engine *Engine, events EventSource) *Service {
	engine.placers.Env = env
	return &Service{env: env, engine: engine, events: events, poll: time.Second}
}

// Bounds on requests.
const (
	MaxGPUs   = 1024
	MaxSlots  = 48 * 64
	MaxVCPU   = 4096
	MaxMemory = 64 * 1024
	// StartSkew is how far in the past a start may be and still mean now.
	StartSkew = time.Minute
	// DefaultDuration is a reservation's length when the request gives none.
	DefaultDuration = time.Hour
)

var modelRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9 .-]{0,31}$`)

// knownModels are GPU products a request may name before any node of that
// model has joined.
var knownModels = []string{"A10", "A100", "A16", "A2", "A30", "A40", "B100", "B200", "B300", "GB200", "GH200", "H100", "H200", "H20",
	"H800", "L4", "L40", "L40S", "MI250", "MI300X", "RTX6000", "T4", "V100"}

// Resource projects a reservation into the authorization model.
func Resource(r Reservation) iam.Resource {
	return iam.Resource{Type: "Reservation", ID: r.ID, TenantID: r.TenantID, ProjectID: r.ProjectID, Attrs: map[string]any{
		"pool": r.PoolID, "state": r.State, "gpus": r.GPUs + r.Slots, "binding": r.Binding,
		"lifetimeSeconds": int64(r.EndsAt.Sub(r.StartsAt) / time.Second),
	}}
}

// Proto converts a reservation for the API.
func Proto(r Reservation, poolName string) *apiv1.Reservation {
	out := &apiv1.Reservation{
		Id: r.ID, TenantId: r.TenantID, ProjectId: r.ProjectID, PoolId: r.PoolID, Pool: poolName, State: r.State,
		Spec: &apiv1.ReservationSpec{Gpus: int32(r.GPUs), Model: r.Model, MigProfile: r.MIGProfile, Slots: int32(r.Slots),
			Vcpu: int32(r.VCPU), MemoryGib: int32(r.MemoryGiB), Hugepages_1Gi: int32(r.Hugepages1Gi), Binding: r.Binding,
			SingleTenant: r.SingleTenant},
		StartTime: timestamppb.New(r.StartsAt), EndTime: timestamppb.New(r.EndsAt), Explanation: decodeExplanation(r.Explanation),
		CreatedBy: r.CreatedBy, CreateTime: timestamppb.New(r.CreateTime), UpdateTime: timestamppb.New(r.UpdateTime),
		EndsAs: r.EndsAs,
	}
	if r.ReleaseTime != nil {
		out.ReleaseTime = timestamppb.New(*r.ReleaseTime)
	}
	if r.NodeID != "" {
		p := r.Placement
		out.Placement = &apiv1.Placement{NodeId: r.NodeID, NodeName: p.NodeName, GpuModel: r.GPUModel, Atoms: p.Atoms,
			Numa: int32(p.NUMA), Cpuset: p.CPUSet, Island: int32(p.Island),
			Score: &apiv1.PlacementScore{Binpack: p.Score[0], Topology: p.Score[1], Fragmentation: p.Score[2], Spread: p.Score[3], Total: p.Score[4]}}
	}
	for _, c := range r.Conditions {
		out.Conditions = append(out.Conditions, &apiv1.ReservationCondition{Type: c.Type, Status: c.Status, Reason: c.Reason,
			Message: c.Message, UpdateTime: timestamppb.New(c.UpdateTime)})
	}
	return out
}

var errNoDefaultProject = errors.New("required: the tenant has several projects and none is named default")

// Get reads a reservation.
func (s *Service) Get(ctx context.Context, req *connect.Request[apiv1.GetReservationRequest]) (*connect.Response[apiv1.GetReservationResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	validateRef(&vs, msg.GetTenant(), msg.GetReservation())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var r ref
	if err := s.env.Resolve(ctx, "reservation", func(ctx context.Context, q store.Querier) (err error) {
		r, err = lookup(ctx, q, msg.GetTenant(), msg.GetReservation())
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, r.resource()); err != nil {
		return nil, err
	}
	if err := r.notFound(msg.GetTenant(), msg.GetReservation()); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := Proto(r.r, r.poolName)
	out.Tenant = r.tenant.Name
	return connect.NewResponse(&apiv1.GetReservationResponse{Reservation: out}), nil
}

var allStates = []string{StatePending, StatePlaced, StateBinding, StateActive, StateReleasing, StateReleased, StateExpired, StateFailed, StateCanceled}

// List lists reservations: a tenant's, or every tenant's for platform admins.
func (s *Service) List(ctx context.Context, req *connect.Request[apiv1.ListReservationsRequest]) (*connect.Response[apiv1.ListReservationsResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	if msg.GetTenant() != "" {
		vs.Ref("tenant", msg.GetTenant(), "tnt")
	}
	vs.PageSize("page_size", msg.GetPageSize())
	var states []string
	for _, st := range strings.Split(msg.GetState(), ",") {
		if st = strings.TrimSpace(st); st == "" {
			continue
		}
		if !slices.Contains(allStates, st) {
			vs.Add("state", "unknown state %q (one of %s)", truncate(st), strings.Join(allStates, ", "))
			continue
		}
		states = append(states, st)
	}
	if (msg.GetProject() != "" || msg.GetPool() != "" || msg.GetOnOwnedPools()) && msg.GetTenant() == "" {
		vs.Add("tenant", "is required with project, pool or on_owned_pools")
	}
	if msg.GetOnOwnedPools() && msg.GetProject() != "" {
		vs.Add("project", "names the tenant's own projects: it does not go with on_owned_pools")
	}
	if msg.GetPool() != "" {
		pool.ValidateVisibleRef(&vs, "pool", msg.GetPool())
	}
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	filter := strings.Join([]string{msg.GetTenant(), msg.GetProject(), msg.GetPool(), msg.GetState(), fmt.Sprint(msg.GetOnOwnedPools())}, "/")
	after, err := envelope.DecodePageToken("page_token", msg.GetPageToken(), filter)
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	p := &ListParams{States: states, After: after, Limit: envelope.PageSize(msg.GetPageSize())}
	scope := tenancy.PlatformResource()
	if msg.GetTenant() != "" {
		t, err := tenancy.AuthorizeTenantRead(ctx, s.env, msg.GetTenant())
		if err != nil {
			return nil, err
		}
		p.TenantID, scope = t.ID, tenancy.TenantResource(t)
		if msg.GetOnOwnedPools() {
			// The owner reads every reservation on its pools: its
			// decision is the read of its own tenant, made above.
			p.TenantID, p.PoolOwnerID = "", t.ID
		}
	} else if err := s.env.AuthorizeRead(ctx, scope); err != nil {
		return nil, err
	}
	var (
		rs      []Reservation
		names   = map[string]string{}
		tenants = map[string]string{}
	)
	if err := s.env.Resolve(ctx, "reservation", func(ctx context.Context, q store.Querier) (err error) {
		if msg.GetProject() != "" {
			pr, err := tenancy.ProjectGet(ctx, q, p.TenantID, msg.GetProject())
			if err != nil {
				return err
			}
			p.ProjectID = pr.ID
		}
		if msg.GetPool() != "" {
			var pl pool.Pool
			if p.PoolOwnerID != "" {
				pl, err = pool.Get(ctx, q, p.PoolOwnerID, msg.GetPool())
			} else {
				var found bool
				var amb *pool.Ambiguous
				pl, found, amb, err = pool.ResolveVisible(ctx, q, p.TenantID, msg.GetPool())
				switch {
				case err != nil:
				case amb != nil:
					err = amb.Err()
				case !found:
					err = store.ErrNotFound
				}
			}
			if err != nil {
				return err
			}
			p.PoolID, names[pl.ID] = pl.ID, pl.Name
		}
		if rs, err = List(ctx, q, p); err != nil {
			return err
		}
		for _, r := range rs {
			if _, ok := names[r.PoolID]; !ok {
				pl, err := pool.Get(ctx, q, "", r.PoolID)
				if err == nil {
					names[r.PoolID] = pl.Name
				} else {
					names[r.PoolID] = ""
				}
			}
			if _, ok := tenants[r.TenantID]; !ok {
				t, found, err := tenancy.LookupTenant(ctx, q, r.TenantID)
				if err != nil {
					return err
				}
				if found {
					tenants[r.TenantID] = t.Name
				}
			}
		}
		return nil
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	// Rows are decided per project outside the read transaction: a decision
	// may read tenant policies itself.
	rf := s.env.NewReadFilter(scope)
	if p.ProjectID != "" {
		if err := rf.RequireProject(ctx, p.TenantID, p.ProjectID); err != nil {
			return nil, err
		}
	}
	out := &apiv1.ListReservationsResponse{}
	for _, r := range rs {
		ok := true
		// A consumer's reservation on the owner's pool is not in one of
		// the owner's projects: the owner's tenant read covers it.
		if p.PoolOwnerID == "" || r.TenantID == p.PoolOwnerID {
			var err error
			if ok, err = rf.Readable(ctx, r.TenantID, r.ProjectID); err != nil {
				return nil, err
			}
		}
		if ok {
			pr := Proto(r, names[r.PoolID])
			pr.Tenant = tenants[r.TenantID]
			out.Reservations = append(out.Reservations, pr)
		}
	}
	// The cursor follows the rows read, not the rows shown, so a page
	// thinned by the filter still leads on to the next one.
	if len(rs) == p.Limit {
		out.NextPageToken = envelope.EncodePageToken(rs[len(rs)-1].ID, filter)
	}
	return connect.NewResponse(out), nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// Watch streams the tenant's reservation changes (or one reservation's),
// after the cursor, then live ones.
func (s *Service) Watch(ctx context.Context, req *connect.Request[apiv1.WatchReservationsRequest], stream *connect.ServerStream[apiv1.WatchReservationsResponse]) error {
	msg := req.Msg
	var vs envelope.Violations
	vs.Ref("tenant", msg.GetTenant(), "tnt")
	if msg.GetReservation() != "" {
		vs.ID("reservation", msg.GetReservation(), IDPrefix)
	}
	after := events.ParseCursor(&vs, msg.GetCursor())
	if err := vs.Err(); err != nil {
		return s.env.Fail(ctx, err)
	}
	var (
		tenantID string
		scope    iam.Resource
	)
	if msg.GetReservation() != "" {
		var r ref
		if err := s.env.Resolve(ctx, "reservation", func(ctx context.Context, q store.Querier) (err error) {
			r, err = lookup(ctx, q, msg.GetTenant(), msg.GetReservation())
			return err
		}); err != nil {
			return s.env.Fail(ctx, err)
		}
		if err := s.env.AuthorizeRead(ctx, r.resource()); err != nil {
			return err
		}
		if err := r.notFound(msg.GetTenant(), msg.GetReservation()); err != nil {
			return s.env.Fail(ctx, err)
		}
		tenantID, scope = r.tenant.ID, r.resource()
	} else {
		t, err := tenancy.AuthorizeTenantRead(ctx, s.env, msg.GetTenant())
		if err != nil {
			return err
		}
		tenantID, scope = t.ID, tenancy.TenantResource(t)
	}
	return events.ResourceWatch[Reservation, apiv1.WatchReservationsResponse]{
		Env: s.env, Events: s.events, Poll: s.poll, TenantID: tenantID, Scope: scope,
		ResourceType: "Reservation", Only: msg.GetReservation(), After: after, FromNow: msg.GetCursor() == "",
		Load: func(ctx context.Context, q store.Querier, id string) (Reservation, bool, error) {
			r, err := Get(ctx, q, tenantID, id)
			if errors.Is(err, store.ErrNotFound) {
				return r, false, nil
			}
			return r, err == nil, err
		},
		Owner: func(r Reservation) (string, string) { return r.TenantID, r.ProjectID },
		Message: func(typ string, r Reservation, cursor string) *apiv1.WatchReservationsResponse {
			return &apiv1.WatchReservationsResponse{Type: typ, Reservation: Proto(r, ""), Cursor: cursor}
		},
		Send: stream.Send,
	}.Run(ctx)
}
