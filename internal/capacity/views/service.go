package views

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// Timeline bounds.
const (
	// DefaultTimelineSpan is how far a timeline reaches when the request
	// gives no end.
	DefaultTimelineSpan = 24 * time.Hour
	// DefaultTimelineStep spaces the points when the request gives no step.
	DefaultTimelineStep = time.Hour
	// MaxTimelinePoints bounds one timeline.
	MaxTimelinePoints = 1000
	// MaxTimelineSpan bounds how far a timeline reaches. It is checked
	// before the points are counted: a span beyond ~292 years does not fit
	// a time.Duration, so end.Sub(start) saturates and would let the point
	// count pass.
	MaxTimelineSpan = 10 * 366 * 24 * time.Hour
)

// Service serves the CapacityService API.
type Service struct {
	env *envelope.Envelope
}

// NewService returns the capacity handlers.
func NewService(env *envelope.Envelope) *Service { return &Service{env: env} }

var _ apiv1connect.CapacityServiceHandler = (*Service)(nil)

// Summary returns one row per GPU model and atom kind over the pools of a
// tenant, or of every tenant for platform administrators. free and pending
// are the sums of the pools' own.
func (s *Service) Summary(ctx context.Context, req *connect.Request[apiv1.CapacitySummaryRequest]) (*connect.Response[apiv1.CapacitySummaryResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	if msg.GetTenant() != "" {
		vs.Ref("tenant", msg.GetTenant(), "tnt")
	}
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	tenantID, err := s.authorizeTenant(ctx, msg.GetTenant())
	if err != nil {
		return nil, err
	}
	rows, pending, err := s.read(ctx, tenantID)
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	type modelKind struct{ model, kind string }
	sums := map[modelKind]*apiv1.CapacityRow{}
	for _, r := range rows {
		mk := modelKind{r.Model, r.Kind}
		sum := sums[mk]
		if sum == nil {
			sum = &apiv1.CapacityRow{Model: r.Model, Kind: r.Kind}
			sums[mk] = sum
		}
		sum.Total += int32(r.Total)
		sum.Booked += int32(r.Booked)
		sum.Quarantined += int32(r.Quarantined)
		sum.Free += int32(r.Free())
		// A pool's pending reservations count once per model and kind it
		// holds (rows are unique per pool, model and kind).
		sum.Pending += int32(pending[r.PoolID].Count)
	}
	out := &apiv1.CapacitySummaryResponse{}
	for _, r := range sums {
		out.Rows = append(out.Rows, r)
	}
	slices.SortFunc(out.Rows, func(a, b *apiv1.CapacityRow) int {
		return cmp.Or(cmp.Compare(a.GetModel(), b.GetModel()), cmp.Compare(a.GetKind(), b.GetKind()))
	})
	return connect.NewResponse(out), nil
}

// ByPool returns one row per pool, GPU model and atom kind, of one pool or
// of every pool of a tenant (of every tenant for platform administrators).
// A pool with pending reservations and no atoms gets a row with an empty
// model and kind, so waiting demand shows.
func (s *Service) ByPool(ctx context.Context, req *connect.Request[apiv1.CapacityByPoolRequest]) (*connect.Response[apiv1.CapacityByPoolResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	if msg.GetTenant() != "" {
		vs.Ref("tenant", msg.GetTenant(), "tnt")
	}
	if msg.GetPool() != "" {
		validatePoolRef(&vs, msg.GetTenant(), msg.GetPool())
	}
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var (
		tenantID string
		only     string
		err      error
	)
	if msg.GetPool() != "" {
		r, err := s.authorizePool(ctx, msg.GetTenant(), msg.GetPool())
		if err != nil {
			return nil, err
		}
		tenantID, only = r.TenantID, r.ID
	} else if tenantID, err = s.authorizeTenant(ctx, msg.GetTenant()); err != nil {
		return nil, err
	}
	rows, pending, err := s.read(ctx, tenantID)
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.CapacityByPoolResponse{}
	shown := map[string]bool{}
	for _, r := range rows {
		if only != "" && r.PoolID != only {
			continue
		}
		shown[r.PoolID] = true
		out.Rows = append(out.Rows, rowProto(r, pending[r.PoolID].Count))
	}
	for _, p := range pending {
		if shown[p.PoolID] || (only != "" && p.PoolID != only) {
			continue
		}
		out.Rows = append(out.Rows, &apiv1.CapacityRow{PoolId: p.PoolID, Pool: p.PoolName, Pending: int32(p.Count)})
	}
	slices.SortStableFunc(out.Rows, func(a, b *apiv1.CapacityRow) int {
		return cmp.Or(cmp.Compare(a.GetPool(), b.GetPool()), cmp.Compare(a.GetPoolId(), b.GetPoolId()),
			cmp.Compare(a.GetModel(), b.GetModel()), cmp.Compare(a.GetKind(), b.GetKind()))
	})
	return connect.NewResponse(out), nil
}

// Timeline returns a pool's GPUs booked and in total, one point every step
// from start to end (defaults: now, now+24h, one hour).
func (s *Service) Timeline(ctx context.Context, req *connect.Request[apiv1.CapacityTimelineRequest]) (*connect.Response[apiv1.CapacityTimelineResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	if msg.GetTenant() != "" {
		vs.Ref("tenant", msg.GetTenant(), "tnt")
	}
	validatePoolRef(&vs, msg.GetTenant(), msg.GetPool())
	start, end, step := timelineBounds(&vs, msg, s.env.Clock().Now())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	p, err := s.authorizePool(ctx, msg.GetTenant(), msg.GetPool())
	if err != nil {
		return nil, err
	}
	var points []Point
	if err := s.env.Resolve(ctx, "capacity", func(ctx context.Context, q store.Querier) (err error) {
		points, err = Timeline(ctx, q, p.ID, start, end, step)
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.CapacityTimelineResponse{}
	for _, pt := range points {
		out.Points = append(out.Points, &apiv1.TimelinePoint{Time: timestamppb.New(pt.Time), Booked: int32(pt.Booked), Total: int32(pt.Total)})
	}
	return connect.NewResponse(out), nil
}

// timelineBounds applies the defaults and checks the bounds, naming
// start_time, end_time or step_seconds.
func timelineBounds(vs *envelope.Violations, msg *apiv1.CapacityTimelineRequest, now time.Time) (start, end time.Time, step time.Duration) {
	start = now.UTC().Truncate(time.Second)
	if ts := msg.GetStartTime(); ts != nil {
		if err := ts.CheckValid(); err != nil {
			vs.Add("start_time", "is not a valid time: %v", err)
			return
		}
		start = ts.AsTime()
	}
	end = start.Add(DefaultTimelineSpan)
	if ts := msg.GetEndTime(); ts != nil {
		if err := ts.CheckValid(); err != nil {
			vs.Add("end_time", "is not a valid time: %v", err)
			return
		}
		end = ts.AsTime()
	}
	step = DefaultTimelineStep
	switch n := msg.GetStepSeconds(); {
	case n < 0:
		vs.Add("step_seconds", "must not be negative (0 means one hour), got %d", n)
		return
	case n > 0:
		step = time.Duration(min(n, int64(365*24*3600))) * time.Second
	}
	if end.Before(start) {
		vs.Add("end_time", "must not be before start_time (%s), got %s", start.Format(time.RFC3339), end.Format(time.RFC3339))
		return
	}
	if end.After(start.Add(MaxTimelineSpan)) {
		vs.Add("end_time", "is more than %d days after start_time (%s), got %s", MaxTimelineSpan/(24*time.Hour),
			start.Format(time.RFC3339), end.Format(time.RFC3339))
		return
	}
	if n := end.Sub(start)/step + 1; n > MaxTimelinePoints {
		vs.Add("step_seconds", "gives %d points from start_time to end_time; at most %d: widen the step or shorten the span", n, MaxTimelinePoints)
	}
	return start, end, step
}

// Rebuild recomputes every rollup from atoms, memberships, reservations and
// bookings, replaces the stored ones and says which keys differed. It is a
// platform action: the rollups span every tenant.
func (s *Service) Rebuild(ctx context.Context, req *connect.Request[apiv1.RebuildCapacityRequest]) (*connect.Response[apiv1.RebuildCapacityResponse], error) {
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.RebuildCapacityResponse]{
		Draft: func(context.Context, store.Querier) (iam.Resource, error) {
			return tenancy.PlatformResource(), nil
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.RebuildCapacityResponse, error) {
			mismatches, rows, err := Rebuild(ctx, tx)
			if err != nil {
				return nil, err
			}
			res := tenancy.PlatformResource()
			tx.Emit(envelope.Event{Type: "capacity.rebuilt", ResourceType: res.Type, ResourceID: res.ID,
				Data: map[string]any{"mismatches": len(mismatches), "rows": rows}})
			return &apiv1.RebuildCapacityResponse{Mismatches: mismatches, Rows: int32(rows)}, nil
		},
	})
}

// authorizeTenant makes the read decision on the tenant a request names, or
// on the platform when it names none, and returns the tenant's id ("" for
// the platform).
func (s *Service) authorizeTenant(ctx context.Context, ref string) (string, error) {
	if ref == "" {
		return "", s.env.AuthorizeRead(ctx, tenancy.PlatformResource())
	}
	t, err := tenancy.AuthorizeTenantRead(ctx, s.env, ref)
	return t.ID, err
}

// validatePoolRef checks a pool reference; a pool named by name needs its
// tenant, because names are unique only within one.
func validatePoolRef(vs *envelope.Violations, tenant, ref string) {
	pool.ValidateVisibleRef(vs, "pool", ref)
	if tenant == "" && ref != "" && !strings.HasPrefix(ref, pool.IDPrefix+"_") {
		vs.Add("tenant", "is required to name a pool by name (or give the pool's id)")
	}
}

// authorizePool resolves a pool — the tenant's own or one offered to it —
// and makes the read decision on it (on the consumer tenant for an offered
// pool: it is the consumer's view of what it may book). A pool that is not
// found is decided as an unknown pool of its tenant (or of the platform
// when the tenant is not found either), so a stranger learns nothing, and
// only then reported NOT_FOUND.
func (s *Service) authorizePool(ctx context.Context, tenantRef, ref string) (pool.Pool, error) {
	var (
		t           tenancy.Tenant
		tenantFound = tenantRef == ""
		p           pool.Pool
		found       bool
		amb         *pool.Ambiguous
	)
	if err := s.env.Resolve(ctx, "pool", func(ctx context.Context, q store.Querier) error {
		if tenantRef == "" {
			got, err := pool.Get(ctx, q, "", ref)
			switch {
			case errors.Is(err, store.ErrNotFound):
				return nil
			case err != nil:
				return err
			}
			p, found = got, true
			return nil
		}
		var err error
		if t, tenantFound, err = tenancy.LookupTenant(ctx, q, tenantRef); err != nil || !tenantFound {
			return err
		}
		p, found, amb, err = pool.ResolveVisible(ctx, q, t.ID, ref)
		return err
	}); err != nil {
		return pool.Pool{}, s.env.Fail(ctx, err)
	}
	res := iam.Resource{Type: "Pool", ID: "unknown", TenantID: t.ID}
	switch {
	case found && tenantRef != "" && p.TenantID != t.ID:
		res = tenancy.TenantResource(t)
	case found:
		res = pool.Resource(p)
	}
	if err := s.env.AuthorizeRead(ctx, res); err != nil {
		return pool.Pool{}, err
	}
	switch {
	case !tenantFound:
		return pool.Pool{}, s.env.Fail(ctx, envelope.NotFound("tenant", tenantRef))
	case amb != nil:
		return pool.Pool{}, s.env.Fail(ctx, amb.Err())
	case !found:
		return pool.Pool{}, s.env.Fail(ctx, envelope.NotFound("pool", ref))
	}
	return p, nil
}

// DefaultConsumerWindow is how far back ByConsumer sums usage when the
// request gives no start.
const DefaultConsumerWindow = 30 * 24 * time.Hour

// ByConsumer shows an owner, per pool it owns and per consumer tenant, the
// live reservations, the GPUs they hold and the GPU-hours used. The
// decision is a read of the owner's tenant: consumers' rows on its pools
// are its pools' business.
func (s *Service) ByConsumer(ctx context.Context, req *connect.Request[apiv1.CapacityByConsumerRequest]) (*connect.Response[apiv1.CapacityByConsumerResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	vs.Ref("tenant", msg.GetTenant(), "tnt")
	if msg.GetPool() != "" {
		vs.Ref("pool", msg.GetPool(), pool.IDPrefix)
	}
	now := s.env.Clock().Now()
	to, from := now, now.Add(-DefaultConsumerWindow)
	for _, b := range []struct {
		field string
		ts    *timestamppb.Timestamp
		dst   *time.Time
	}{{"start_time", msg.GetStartTime(), &from}, {"end_time", msg.GetEndTime(), &to}} {
		if b.ts == nil {
			continue
		}
		if err := b.ts.CheckValid(); err != nil {
			vs.Add(b.field, "is not a valid time: %v", err)
			continue
		}
		*b.dst = b.ts.AsTime()
	}
	if to.Before(from) {
		vs.Add("end_time", "must not be before start_time (%s), got %s", from.Format(time.RFC3339), to.Format(time.RFC3339))
	}
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	t, err := tenancy.AuthorizeTenantRead(ctx, s.env, msg.GetTenant())
	if err != nil {
		return nil, err
	}
	var rows []ConsumerRow
	if err := s.env.Resolve(ctx, "capacity", func(ctx context.Context, q store.Querier) error {
		poolID := ""
		if msg.GetPool() != "" {
			p, err := pool.Get(ctx, q, t.ID, msg.GetPool())
			if errors.Is(err, store.ErrNotFound) {
				return envelope.NotFound("pool", msg.GetPool())
			}
			if err != nil {
				return err
			}
			poolID = p.ID
		}
		var err error
		rows, err = ByConsumer(ctx, q, t.ID, poolID, from, to)
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.CapacityByConsumerResponse{}
	for _, r := range rows {
		out.Rows = append(out.Rows, &apiv1.ConsumerRow{PoolId: r.PoolID, Pool: r.PoolName, TenantId: r.TenantID, Tenant: r.TenantName,
			Reservations: int32(r.Reservations), Gpus: int32(r.GPUs), GpuHours: r.GPUHours})
	}
	return connect.NewResponse(out), nil
}

// read returns the stored rollups, booked counted at this instant, and the
// pending counts of a tenant's pools (every tenant's for "") from one
// snapshot.
func (s *Service) read(ctx context.Context, tenantID string) ([]Row, map[string]PendingCount, error) {
	var (
		rows    []Row
		pending map[string]PendingCount
	)
	err := s.env.Resolve(ctx, "capacity", func(ctx context.Context, q store.Querier) (err error) {
		if rows, err = Stored(ctx, q, tenantID); err != nil {
			return err
		}
		now, err := BookedNow(ctx, q, tenantID, s.env.Clock().Now())
		if err != nil {
			return err
		}
		// The rollup's booked counts future bookings too; these views say
		// what is held now.
		for i := range rows {
			rows[i].Booked = now[rows[i].Key]
		}
		pending, err = Pending(ctx, q, tenantID)
		return err
	})
	return rows, pending, err
}

func rowProto(r Row, pending int) *apiv1.CapacityRow {
	return &apiv1.CapacityRow{
		PoolId: r.PoolID, Pool: r.PoolName, Model: r.Model, Kind: r.Kind,
		Total: int32(r.Total), Booked: int32(r.Booked), Quarantined: int32(r.Quarantined), Free: int32(r.Free()),
		Pending: int32(pending),
	}
}
