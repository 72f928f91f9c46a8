package reservation

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"

	"connectrpc.com/connect"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/capacity/booking"
	"github.com/better-compute/better-compute/internal/capacity/budget"
	"github.com/better-compute/better-compute/internal/capacity/migplan"
	"github.com/better-compute/better-compute/internal/capacity/placement"
	"github.com/better-compute/better-compute/internal/capacity/placer"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/capacity/quota"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/store/dirversion"
	"github.com/better-compute/better-compute/internal/tenancy"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// spec is a validated create request, defaults not yet filled from the pool.
type spec struct {
	msg      *apiv1.CreateReservationRequest
	now      time.Time
	start    time.Time
	end      time.Time
	binding  string
	duration bool
}

func validateCreate(vs *envelope.Violations, msg *apiv1.CreateReservationRequest, now time.Time) spec {
	sp := spec{msg: msg, now: now, binding: msg.GetBinding()}
	vs.Ref("tenant", msg.GetTenant(), "tnt")
	if msg.GetProject() != "" {
		vs.Ref("project", msg.GetProject(), "prj")
	}
	pool.ValidateVisibleRef(vs, "pool", msg.GetPool())
	gpus, slots := msg.GetGpus(), msg.GetSlots()
	switch {
	case gpus < 0:
		vs.Add("gpus", "must not be negative, got %d", gpus)
	case slots < 0:
		vs.Add("slots", "must not be negative, got %d", slots)
	case gpus == 0 && slots == 0:
		vs.Add("gpus", "ask for at least one GPU (or slots), got 0")
	case gpus > 0 && slots > 0:
		vs.Add("slots", "ask for GPUs or slots, not both")
	case gpus > MaxGPUs:
		vs.Add("gpus", "at most %d, got %d", MaxGPUs, gpus)
	case slots > MaxSlots:
		vs.Add("slots", "at most %d, got %d", MaxSlots, slots)
	}
	if m := msg.GetModel(); m != "" {
		if !modelRE.MatchString(m) {
			vs.Add("model", "must be a GPU model such as H100, got %q", truncate(m))
		}
	}
	if p := msg.GetMigProfile(); p != "" {
		if slots > 0 {
			vs.Add("mig_profile", "MIG instances are counted in gpus, not slots")
		} else if preq := (placement.Request{GPUs: max(int(gpus), 1), MIGProfile: p}); preq.Validate() != nil {
			vs.Add("mig_profile", "%q is not a MIG profile of any supported GPU", truncate(p))
		}
	}
	for _, f := range []struct {
		name     string
		v, limit int32
	}{{"vcpu", msg.GetVcpu(), MaxVCPU}, {"memory_gib", msg.GetMemoryGib(), MaxMemory}, {"hugepages_1gi", msg.GetHugepages_1Gi(), MaxMemory}} {
		if f.v < 0 {
			vs.Add(f.name, "must not be negative, got %d", f.v)
		} else if f.v > f.limit {
			vs.Add(f.name, "at most %d, got %d", f.limit, f.v)
		}
	}
	switch sp.binding {
	case "":
		sp.binding = BindingNode
	case BindingNode, BindingKubernetes, BindingNone:
	case BindingMachine:
		// A whole machine: its GPUs, nothing shared or partitioned.
		switch {
		case slots > 0:
			vs.Add("slots", "binding machine leases whole GPUs: give gpus, the machine's GPU count")
		case msg.GetMigProfile() != "":
			vs.Add("mig_profile", "binding machine leases the whole machine: MIG layouts are the lessee's")
		}
	default:
		vs.Add("binding", "must be node, kubernetes, none or machine, got %q", truncate(sp.binding))
	}
	// The window: a start and an end, or a duration from the start (now
	// when no start is given).
	hasDur := msg.GetDurationSeconds() != 0
	sp.start = now
	if msg.GetStartTime() != nil {
		if err := msg.GetStartTime().CheckValid(); err != nil {
			vs.Add("start_time", "is not a valid time")
		} else {
			sp.start = msg.GetStartTime().AsTime()
			if sp.start.Before(now.Add(-StartSkew)) {
				vs.Add("start_time", "is in the past (%s)", sp.start.Format(time.RFC3339))
			}
			if sp.start.Before(now) {
				sp.start = now
			}
		}
	}
	switch {
	case hasDur && msg.GetEndTime() != nil:
		vs.Add("end_time", "give end_time or duration_seconds, not both")
	case hasDur:
		if msg.GetDurationSeconds() < 0 {
			vs.Add("duration_seconds", "must be positive, got %d", msg.GetDurationSeconds())
		} else if msg.GetDurationSeconds() > pool.MaxDurationSeconds {
			vs.Add("duration_seconds", "at most %d (30 days), got %d", pool.MaxDurationSeconds, msg.GetDurationSeconds())
		}
		sp.end = sp.start.Add(time.Duration(msg.GetDurationSeconds()) * time.Second)
		sp.duration = true
	case msg.GetEndTime() != nil:
		if err := msg.GetEndTime().CheckValid(); err != nil {
			vs.Add("end_time", "is not a valid time")
		} else {
			sp.end = msg.GetEndTime().AsTime()
			if !sp.end.After(sp.start) {
				vs.Add("end_time", "must be after the start (%s)", sp.start.Format(time.RFC3339))
			} else if sp.end.Sub(sp.start) > pool.MaxDurationSeconds*time.Second {
				vs.Add("end_time", "the window may last at most 30 days")
			}
		}
	default:
		sp.end = sp.start.Add(DefaultDuration)
		sp.duration = true
	}
	sp.start, sp.end = sp.start.UTC().Truncate(booking.Resolution), sp.end.UTC().Truncate(booking.Resolution)
	return sp
}

// target is what a create or preview resolves before its decision.
type target struct {
	tenant       tenancy.Tenant
	tenantFound  bool
	project      tenancy.Project
	projectFound bool
	pool         pool.Pool
	poolFound    bool
	policy       *apiv1.PoolPolicy
	modelKnown   bool
	// ix is the placer's index, set once the create runs in its batch.
	ix            *placer.Index
	projectReason string
	// ambiguous: several owners offer the tenant a pool of that name.
	ambiguous *pool.Ambiguous
}

// resolve reads what a create or preview names: the tenant, project and
// pool from the directory cache at the request's directory version (see
// store/dirversion), so a create re-reads none of them — nor re-decodes the
// pool's policy — until one changes. A create's Apply still reads the pool
// again under the placer's lock.
func (s *Service) resolve(ctx context.Context, q store.Querier, sp *spec) (target, error) {
	var t target
	var err error
	msg := sp.msg
	if t.tenant, t.tenantFound, err = tenancy.CachedTenant(ctx, q, msg.GetTenant()); err != nil || !t.tenantFound {
		return t, err
	}
	switch p, perr := cachedProject(ctx, q, t.tenant.ID, msg.GetProject()); {
	case perr == nil:
		t.project, t.projectFound = p, true
	case errors.Is(perr, store.ErrNotFound) && msg.GetProject() == "":
		// Nothing named and nothing to default to: say what to do, not
		// "not found" about a project the caller never named.
		t.projectReason = fmt.Sprintf("required: tenant %s has no project yet; create one (projects create --tenant %s default)", t.tenant.Name, t.tenant.Name)
	case errors.Is(perr, store.ErrNotFound):
		t.projectReason = "not found"
	case errors.Is(perr, errNoDefaultProject):
		t.projectReason = perr.Error()
	default:
		return t, perr
	}
	// The tenant's own pool, or one offered to it.
	p, found, amb, err := pool.ResolveVisibleCached(ctx, q, t.tenant.ID, msg.GetPool())
	switch {
	case err != nil:
		return t, err
	case found:
		t.pool, t.poolFound = p.Pool, true
		t.policy = p.Policy
	}
	t.ambiguous = amb
	t.modelKnown = msg.GetModel() == ""
	for _, m := range knownModels {
		if placement.ModelMatches(msg.GetModel(), m) {
			t.modelKnown = true
		}
	}
	if !t.modelKnown {
		var n int
		if err := countModelAtoms(ctx, q, msg.GetModel()).Scan(&n); err != nil {
			return t, err
		}
		t.modelKnown = n > 0
	}
	return t, nil
}

// DefaultProjectCacheName names the cache of the project a create that
// names none resolves to, in dirversion's statistics.
const DefaultProjectCacheName = "reservation.default_project"

// defaultProjects caches defaultProject's answer for a request that names
// no project, by tenant id, at the request's directory version: a project
// created or deleted (which may change the answer) moves the version on.
var defaultProjects = dirversion.NewCache[string, tenancy.Project](DefaultProjectCacheName, 10000)

// cachedProject is defaultProject answered from the directory cache when it
// can be; errors (no such project, no default) are read afresh every time.
func cachedProject(ctx context.Context, q store.Querier, tenantID, ref string) (tenancy.Project, error) {
	if ref != "" {
		return tenancy.CachedProject(ctx, q, tenantID, ref)
	}
	if p, ok := defaultProjects.Get(ctx, tenantID); ok {
		return p, nil
	}
	p, err := defaultProject(ctx, q, tenantID, "")
	if err == nil {
		defaultProjects.Put(ctx, tenantID, p)
	}
	return p, err
}

// defaultProject resolves a project reference, or picks the tenant's project
// named "default", or its only project.
func defaultProject(ctx context.Context, q store.Querier, tenantID, ref string) (tenancy.Project, error) {
	if ref != "" {
		return tenancy.ProjectGet(ctx, q, tenantID, ref)
	}
	if p, err := tenancy.ProjectGet(ctx, q, tenantID, "default"); err == nil || !errors.Is(err, store.ErrNotFound) {
		return p, err
	}
	ps, err := tenancy.ProjectList(ctx, q, tenantID, "", "", 2)
	if err != nil {
		return tenancy.Project{}, err
	}
	if len(ps) == 1 {
		return ps[0], nil
	}
	if len(ps) == 0 {
		return tenancy.Project{}, store.ErrNotFound
	}
	return tenancy.Project{}, errNoDefaultProject
}

// check turns what resolve found into the errors a caller may see, after
// the decision.
func (t *target) check(sp *spec) error {
	msg := sp.msg
	if !t.tenantFound {
		return envelope.NotFound("tenant", msg.GetTenant())
	}
	// The pool and the request's own fields are checked before a
	// defaulted project: the error a caller sees first is about what it
	// asked for (an unknown pool, a model the pool lacks), not about a
	// project it did not name.
	if !t.projectFound && msg.GetProject() != "" {
		return envelope.NotFound("project", msg.GetProject())
	}
	if t.ambiguous != nil {
		return t.ambiguous.Err()
	}
	if !t.poolFound {
		return envelope.NotFound("pool", msg.GetPool())
	}
	if t.pool.State != pool.StateActive {
		return envelope.Errorf(envelope.CodeFailedPrecondition, "pool %s is archived", t.pool.Name)
	}
	var vs envelope.Violations
	if !t.modelKnown {
		// Say what the pool has, so the next try names one of them.
		have := "it has no GPUs"
		if t.ix != nil {
			have = placer.ModelsPhrase(placer.PoolModels(placer.Pristine(t.ix.Static().Nodes)))
		}
		vs.Add("model", "unknown GPU model %q; pool %s: %s", truncate(msg.GetModel()), t.pool.Name, have)
	}
	pol := t.policy
	d := sp.end.Sub(sp.start)
	field := "end_time"
	if sp.duration {
		field = "duration_seconds"
	}
	if h := pool.StartHorizon(pol); sp.start.After(sp.now.Add(h)) {
		vs.Add("start_time", "pool %s books at most %d days ahead (policy.start_horizon_seconds), asked %s",
			t.pool.Name, h/(24*time.Hour), sp.start.Format(time.RFC3339))
	}
	if minD := time.Duration(pol.GetMinDurationSeconds()) * time.Second; minD > 0 && d < minD {
		vs.Add(field, "pool %s books at least %s, asked %s", t.pool.Name, minD, d)
	}
	if maxD := time.Duration(pol.GetMaxDurationSeconds()) * time.Second; maxD > 0 && d > maxD {
		vs.Add(field, "pool %s books at most %s, asked %s", t.pool.Name, maxD, d)
	}
	switch sharing := pol.GetGpuSharing(); {
	case msg.GetMigProfile() != "" && sharing != pool.GPUSharingMIG:
		vs.Add("mig_profile", "pool %s shares GPUs as %s, not MIG", t.pool.Name, sharing)
	case msg.GetSlots() > 0 && sharing != pool.GPUSharingTimeslice && sharing != pool.GPUSharingMPS:
		vs.Add("slots", "pool %s shares GPUs as %s; slots need timeslice or mps", t.pool.Name, sharing)
	case msg.GetGpus() > 0 && msg.GetMigProfile() == "" && (sharing == pool.GPUSharingMIG || sharing == pool.GPUSharingTimeslice || sharing == pool.GPUSharingMPS):
		vs.Add("gpus", "pool %s shares GPUs as %s: ask for mig_profile or slots", t.pool.Name, sharing)
	}
	if !t.projectFound {
		vs.Add("project", "%s", t.projectReason)
	}
	return vs.Err()
}

// newReservation builds the row a create writes, host defaults filled.
func (t *target) newReservation(sp *spec, now time.Time, createdBy string) Reservation {
	msg := sp.msg
	r := Reservation{
		ID: envelope.NewID(IDPrefix, now), TenantID: t.tenant.ID, ProjectID: t.project.ID, PoolID: t.pool.ID, State: StatePending,
		GPUs: int(msg.GetGpus()), Model: strings.ToUpper(msg.GetModel()), MIGProfile: msg.GetMigProfile(), Slots: int(msg.GetSlots()),
		VCPU: int(msg.GetVcpu()), MemoryGiB: int(msg.GetMemoryGib()), Hugepages1Gi: int(msg.GetHugepages_1Gi()),
		// A single-tenant pool asks it of every reservation.
		Binding: sp.binding, SingleTenant: msg.GetSingleTenant() || t.policy.GetSingleTenant() || sp.binding == BindingMachine, StartsAt: sp.start, EndsAt: sp.end,
		Placement: PlacementRecord{NUMA: -1, Island: -1}, Explanation: "{}", CreatedBy: createdBy, CreateTime: now, UpdateTime: now,
	}
	// Host resources default to the pool's per-GPU share, or else the
	// smallest host's, for whole GPUs.
	if r.MIGProfile == "" && r.Slots == 0 {
		share := t.policy.GetPerGpu()
		if r.VCPU == 0 {
			if share != nil {
				r.VCPU = r.GPUs * int(share.GetVcpu())
			} else if t.ix != nil {
				v, _ := t.ix.Share()
				r.VCPU = r.GPUs * v
			}
		}
		if r.MemoryGiB == 0 {
			if share != nil {
				r.MemoryGiB = r.GPUs * int(share.GetMemoryGib())
			} else if t.ix != nil {
				_, m := t.ix.Share()
				r.MemoryGiB = r.GPUs * m
			}
		}
		if r.Hugepages1Gi == 0 && share != nil {
			r.Hugepages1Gi = r.GPUs * int(share.GetHugepages_1Gi())
		}
	}
	return r
}

// draftResource is the reservation a create asks for, as the decision sees
// it: gpus is one reservation's, totalGpus all count of them (an array's
// count × gpus; a create's count is 1), so a policy can bound either.
func draftResource(t *target, sp *spec, count int) iam.Resource {
	if !t.tenantFound {
		return iam.Resource{Type: "Reservation", ID: iam.DraftID}
	}
	gpus := int(sp.msg.GetGpus() + sp.msg.GetSlots())
	return iam.Resource{Type: "Reservation", ID: iam.DraftID, TenantID: t.tenant.ID, ProjectID: t.project.ID, Attrs: map[string]any{
		"pool": t.pool.ID, "gpus": gpus, "totalGpus": count * gpus, "binding": sp.binding,
		"lifetimeSeconds": int64(sp.end.Sub(sp.start) / time.Second),
	}}
}

// Create books a reservation: placed inline when it fits, pending when it
// may fit later, NO_CAPACITY when no node of the pool could ever hold it.
// After the decision the create goes to the pool's placer, which commits it
// in a batch with others.
func (s *Service) Create(ctx context.Context, req *connect.Request[apiv1.CreateReservationRequest]) (*connect.Response[apiv1.CreateReservationResponse], error) {
	if url, err := s.ownerURL(ctx, poolNamed(ctx, req.Msg)); err != nil || url != "" {
		if err != nil {
			return nil, s.env.Fail(ctx, err)
		}
		return placer.Forward[apiv1.CreateReservationRequest, apiv1.CreateReservationResponse](ctx, &s.engine.placers, url, apiv1connect.ReservationServiceCreateProcedure, req)
	}
	var sp spec
	var t target
	// refused is the reservation a pool with mig: auto refused for want of
	// capacity: counted, once the refusal is final, as demand for the MIG
	// repartitioner (the refused create's own transaction writes nothing).
	var refused *Reservation
	defer func() {
		if refused != nil {
			s.countRefusal(ctx, refused)
		}
	}()
	now := s.env.Clock().Now()
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.CreateReservationResponse]{
		Validate: func() error {
			var vs envelope.Violations
			sp = validateCreate(&vs, req.Msg, now)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			t, err = s.resolve(ctx, q, &sp)
			return draftResource(&t, &sp, 1), err
		},
		Submit: func(ctx context.Context, write func(ctx context.Context, b *envelope.Batch) error) error {
			if !t.poolFound {
				// Nothing to place: Apply answers NOT_FOUND alone.
				return s.env.CommitAlone(ctx, write)
			}
			if err := s.precheckBudget(ctx, &t, &sp, now); err != nil {
				return err
			}
			return s.engine.placers.SubmitMutation(ctx, t.pool.ID, t.tenant.ID, false, write)
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.CreateReservationResponse, error) {
			b := placer.BatchOf(ctx)
			if b != nil {
				// Re-read under the batch's lock: a pool archived or
				// changed since the decision is what the create sees.
				p, err := b.LockPool(ctx, t.pool.ID)
				if err != nil {
					return nil, envelope.FromStore(err, "pool")
				}
				t.pool, t.policy, t.ix = *p, poolPolicy(*p), b.Index()
			}
			if err := t.check(&sp); err != nil {
				return nil, err
			}
			r := t.newReservation(&sp, tx.Now(), tx.Caller().Principal.ID)
			evs, err := s.engine.create(ctx, b, &r, &t, tx.Now(), true)
			refused = nil
			if err != nil {
				if apiErr := (*envelope.Error)(nil); errors.As(err, &apiErr) && apiErr.Code == envelope.CodeNoCapacity &&
					r.MIGProfile != "" && t.policy.GetMig() == pool.MIGAuto {
					refused = &r
				}
				return nil, err
			}
			tx.SetResource(r.ID, "")
			for _, ev := range evs {
				tx.Emit(ev)
			}
			out := Proto(r, t.pool.Name)
			out.Tenant = t.tenant.Name
			return &apiv1.CreateReservationResponse{Reservation: out}, nil
		},
	})
}

// create places r inline or queues it, checks quota, and stages it in the
// placer's batch. Everything that can refuse it comes before anything is
// staged or written. queue: what does not fit now may wait pending (a
// create); otherwise (an array's member) it is refused with a *notNow.
func (e *Engine) create(ctx context.Context, b *placer.Batch, r *Reservation, t *target, now time.Time, queue bool) ([]envelope.Event, error) {
	placed, ex, err := e.placers.Place(ctx, b, r, now)
	if err != nil {
		var re *placement.RequestError
		if errors.As(err, &re) {
			return nil, envelope.Invalid(envelope.Violation{Field: re.Field, Reason: re.Reason})
		}
		return nil, err
	}
	if !placed {
		// Could it ever fit? Against the pool with nothing booked: if not,
		// waiting is pointless and the caller hears why now.
		if err := e.neverFits(t, r); err != nil {
			return nil, err
		}
		if !queue {
			return nil, &notNow{ex: ex}
		}
		maxPending := int(t.policy.GetMaxPending())
		if maxPending == 0 {
			maxPending = pool.DefaultMaxPending
		}
		// The placer is the pool's only creator and counts the batch's own
		// pending ones, so the count cannot be raced past the limit.
		pending, err := b.PendingCount(ctx, r.PoolID)
		if err != nil {
			return nil, err
		}
		if maxPending < 0 || pending >= maxPending {
			return nil, noCapacity(t.pool.Name, ex, fmt.Sprintf("nothing fits now and the pool's queue is full (%d waiting)", pending))
		}
		b.AddPending()
		r.Explanation = explanationJSON(placer.ExplanationProto(ex))
	}
	if err := b.CheckQuota(ctx, charge(r)); err != nil {
		return nil, err
	}
	evs := []envelope.Event{event("reservation.created", r, map[string]any{"gpus": r.GPUs, "slots": r.Slots})}
	if placed {
		more, err := e.held(ctx, b, r, now)
		if err != nil {
			return nil, err
		}
		evs = append(evs, more...)
	}
	if err := stageInsert(ctx, b, r); err != nil {
		return nil, err
	}
	return evs, nil
}

// neverFits answers, for r that found no room now, whether it could fit
// the pool at all: nil when it could with nothing booked; the caller's
// mistake (400) when it never could; worth a retry (429) when it could
// only once nodes come back (healthy, schedulable, GPUs out of
// quarantine).
func (e *Engine) neverFits(t *target, r *Reservation) error {
	static := t.ix.Static()
	res, err := placement.Place(static.Snap, placer.Request(r), placement.Options{Limit: 1})
	if err != nil || len(res.Plans) > 0 {
		return err
	}
	nodes := placer.Pristine(static.Nodes)
	again, err := placement.Place(placement.NewSnapshot(slices.Clone(nodes)), placer.Request(r), placement.Options{Limit: 1})
	if err != nil {
		return err
	}
	if len(again.Plans) == 0 {
		if migCouldHold(t, nodes, r) {
			// A pool whose MIG layouts follow demand queues it: the
			// repartitioner reads the queue and gives an idle GPU a
			// layout with this profile.
			return nil
		}
		return placer.NeverFits(t.pool.Name, nodes, r, res.Explanation)
	}
	return noCapacity(t.pool.Name, res.Explanation, "no node that could hold it is healthy and schedulable now")
}

func noCapacity(poolName string, ex placement.Explanation, why string) error {
	msg := fmt.Sprintf("no capacity in pool %s: %s", poolName, why)
	if s := ex.String(); s != "" {
		msg += " (" + s + ")"
	}
	return &envelope.Error{Code: envelope.CodeNoCapacity, Message: msg, Explanation: placer.ExplanationProto(ex)}
}

// poolNamed returns the id of the pool a create names, for ownerURL.
func poolNamed(ctx context.Context, msg *apiv1.CreateReservationRequest) func(q store.Querier) (string, error) {
	return func(q store.Querier) (string, error) {
		t, found, err := tenancy.CachedTenant(ctx, q, msg.GetTenant())
		if err != nil || !found {
			return "", err
		}
		p, found, _, err := pool.ResolveVisibleCached(ctx, q, t.ID, msg.GetPool())
		if err != nil || !found {
			return "", err
		}
		return p.Pool.ID, nil
	}
}

// Preview answers what Create would do now, booking nothing. It reads the
// pool's one index, its placer's, so it runs where the placer does: a
// preview of a pool another replica places is forwarded there.
func (s *Service) Preview(ctx context.Context, req *connect.Request[apiv1.PreviewReservationRequest]) (*connect.Response[apiv1.PreviewReservationResponse], error) {
	msg := req.Msg.GetRequest()
	if msg == nil {
		return nil, s.env.Fail(ctx, envelope.Invalid(envelope.Violation{Field: "request", Reason: "is required"}))
	}
	if url, err := s.ownerURL(ctx, poolNamed(ctx, msg)); err != nil || url != "" {
		if err != nil {
			return nil, s.env.Fail(ctx, err)
		}
		return placer.Forward[apiv1.PreviewReservationRequest, apiv1.PreviewReservationResponse](ctx, &s.engine.placers, url, apiv1connect.ReservationServicePreviewProcedure, req)
	}
	var vs envelope.Violations
	sp := validateCreate(&vs, msg, s.env.Clock().Now())
	gangNodes, topology := int(req.Msg.GetGangNodes()), req.Msg.GetGangTopology()
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, prefixed(err, "request."))
	}
	if err := validateGangPreview(gangNodes, topology, msg); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var t target
	if err := s.env.Resolve(ctx, "reservation", func(ctx context.Context, q store.Querier) (err error) {
		t, err = s.resolve(ctx, q, &sp)
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, draftResource(&t, &sp, max(gangNodes, 1))); err != nil {
		return nil, err
	}
	if t.poolFound && t.pool.State == pool.StateActive {
		// Loaded only now, for a caller the decision allowed.
		ix, err := s.engine.placers.ReadIndex(ctx, t.pool.ID)
		if err != nil {
			return nil, s.env.Fail(ctx, err)
		}
		t.ix = ix
	}
	if err := t.check(&sp); err != nil {
		return nil, s.env.Fail(ctx, prefixed(err, "request."))
	}
	r := t.newReservation(&sp, s.env.Clock().Now(), "")
	if gangNodes > 0 {
		out, err := s.previewGang(ctx, &t, &r, gangNodes, topology)
		if err != nil {
			return nil, s.env.Fail(ctx, err)
		}
		return connect.NewResponse(out), nil
	}
	snap := t.ix.Snapshot(r.StartsAt, r.EndsAt, placer.ShapeOf(r.MIGProfile, r.Slots), r.GPUs+r.Slots, placer.CandidateLimit, s.engine.placers.Rng())
	res, err := placement.Place(snap.Snap, placer.Request(&r), placement.Options{Limit: 1})
	if err == nil && len(res.Plans) == 0 {
		snap = t.ix.Snapshot(r.StartsAt, r.EndsAt, "", 0, 0, nil)
		res, err = placement.Place(snap.Snap, placer.Request(&r), placement.Options{Limit: 1})
	}
	if err != nil {
		var re *placement.RequestError
		if errors.As(err, &re) {
			return nil, s.env.Fail(ctx, envelope.Invalid(envelope.Violation{Field: "request." + re.Field, Reason: re.Reason}))
		}
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.PreviewReservationResponse{Explanation: placer.ExplanationProto(res.Explanation),
		StartTime: timestamppb.New(r.StartsAt), EndTime: timestamppb.New(r.EndsAt)}
	if len(res.Plans) == 0 {
		// Say first what no waiting cures: a binding no node supports.
		if why := placer.BindingUnsupported(t.pool.Name, placer.Pristine(t.ix.Static().Nodes), &r); why != "" {
			out.Explanation.Summary = strings.TrimSuffix(why+"; "+out.Explanation.GetSummary(), "; ")
		} else if err := s.engine.neverFits(&t, &r); err != nil {
			// The answer Create gives: a request no node could ever hold
			// says so, rather than "nothing fits now".
			var ee *envelope.Error
			if !errors.As(err, &ee) {
				return nil, s.env.Fail(ctx, err)
			}
			if strings.Contains(ee.Message, "can never hold") {
				out.Explanation.Summary = ee.Message
			}
		}
	}
	// Priced on the model it would be placed on, as Create prices it.
	priced := r
	if len(res.Plans) > 0 {
		p := res.Plans[0]
		rec := r
		if err := (&placer.Placers{}).RecordPlan(&rec, &p, snap.Nodes[p.NodeID]); err != nil {
			return nil, s.env.Fail(ctx, err)
		}
		out.Feasible = true
		out.Placement = Proto(rec, t.pool.Name).GetPlacement()
		priced = rec
	}
	if err := s.env.Resolve(ctx, "quota", func(ctx context.Context, q store.Querier) (err error) {
		if out.Quota, err = quota.Effect(ctx, q, charge(&r)); err != nil {
			return err
		}
		out.Budget, err = budget.Effect(ctx, q, charge(&priced))
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	return connect.NewResponse(out), nil
}

// precheckBudget refuses, before the create takes a turn in the placer, a
// request that would pass its tenant's hard budget whatever it is placed
// on (budget.Precheck); the placer's batch checks it again at commit.
func (s *Service) precheckBudget(ctx context.Context, t *target, sp *spec, now time.Time) error {
	if err := t.check(sp); err != nil {
		// Apply answers what is wrong with the request.
		return nil //nolint:nilerr // the refusal is Apply's to give, after the decision
	}
	r := t.newReservation(sp, now, "")
	return s.env.Resolve(ctx, "budget", func(ctx context.Context, q store.Querier) error {
		return budget.Precheck(ctx, q, charge(&r))
	})
}

// validateGangPreview checks a preview's gang fields as CreateReservations
// checks a gang.
func validateGangPreview(nodes int, topology string, msg *apiv1.CreateReservationRequest) error {
	var vs envelope.Violations
	switch {
	case nodes < 0:
		vs.Add("gang_nodes", "must not be negative, got %d", nodes)
	case nodes > placer.MaxGangNodes:
		vs.Add("gang_nodes", "a gang spans at most %d nodes, got %d", placer.MaxGangNodes, nodes)
	}
	if topology != "" && nodes == 0 {
		vs.Add("gang_topology", "set only with gang_nodes")
	}
	if topology != "" && !slices.Contains(placer.Topologies, topology) {
		vs.Add("gang_topology", "one of %s, or empty for any nodes; got %q", strings.Join(placer.Topologies, ", "), topology)
	}
	if nodes > 0 && (msg.GetGpus() < 1 || msg.GetMigProfile() != "" || msg.GetSlots() != 0) {
		vs.Add("request.gpus", "a gang's members take whole GPUs: set gpus (per node), not mig_profile or slots")
	}
	return vs.Err()
}

// previewGang answers where a gang of nodes members like r would go now,
// or why it would not fit, and what all of it would do to quotas.
func (s *Service) previewGang(ctx context.Context, t *target, r *Reservation, nodes int, topology string) (*apiv1.PreviewReservationResponse, error) {
	g, err := placer.PlanGang(t.ix, r, nodes, topology)
	if err != nil {
		var re *placement.RequestError
		if errors.As(err, &re) {
			return nil, envelope.Invalid(envelope.Violation{Field: "request." + re.Field, Reason: re.Reason})
		}
		return nil, err
	}
	out := &apiv1.PreviewReservationResponse{Explanation: placer.ExplanationProto(g.Explanation),
		StartTime: timestamppb.New(r.StartsAt), EndTime: timestamppb.New(r.EndsAt), GangDomain: g.Domain}
	if g.Plans == nil {
		why := g.Why
		if b := placer.BindingUnsupported(t.pool.Name, placer.Pristine(t.ix.Static().Nodes), r); b != "" {
			why = strings.TrimSuffix(b+"; "+why, "; ")
		}
		out.Explanation.Summary = strings.TrimSuffix(why+"; "+out.Explanation.GetSummary(), "; ")
	}
	for i := range g.Plans {
		p := g.Plans[i]
		rec := *r
		if err := (&placer.Placers{}).RecordPlan(&rec, &p, g.Nodes[p.NodeID]); err != nil {
			return nil, err
		}
		out.GangPlacements = append(out.GangPlacements, Proto(rec, t.pool.Name).GetPlacement())
	}
	if len(out.GangPlacements) > 0 {
		out.Feasible = true
		out.Placement = out.GangPlacements[0]
	}
	c := charge(r)
	c.GPUs *= nodes
	c.VCPU, c.MemoryGiB = c.VCPU*nodes, c.MemoryGiB*nodes
	if err := s.env.Resolve(ctx, "quota", func(ctx context.Context, q store.Querier) (err error) {
		if out.Quota, err = quota.Effect(ctx, q, c); err != nil {
			return err
		}
		out.Budget, err = budget.Effect(ctx, q, c)
		return err
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// prefixed renames an INVALID_ARGUMENT's fields under a parent field.
func prefixed(err error, prefix string) error {
	var e *envelope.Error
	if !errors.As(err, &e) || len(e.Violations) == 0 {
		return err
	}
	out := *e
	out.Violations = make([]envelope.Violation, len(e.Violations))
	for i, v := range e.Violations {
		out.Violations[i] = envelope.Violation{Field: prefix + v.Field, Reason: v.Reason}
	}
	return &out
}

// migCouldHold reports whether r asks for a MIG profile that a GPU of the
// pool could offer after a repartition, in a pool with mig: auto.
func migCouldHold(t *target, nodes []placement.Node, r *Reservation) bool {
	if r.MIGProfile == "" || t.policy.GetMig() != pool.MIGAuto {
		return false
	}
	for i := range nodes {
		for _, g := range nodes[i].GPUs {
			if r.Model != "" && !placement.ModelMatches(r.Model, g.Model) {
				continue
			}
			for _, l := range migplan.Layouts(g.Model) {
				if slices.Contains(l, r.MIGProfile) {
					return true
				}
			}
		}
	}
	return false
}

// countRefusal records a MIG create refused for want of capacity. It is
// best effort: a count lost to a failed write only slows the repartitioner
// down, it never books or refuses anything; so a failure is logged, not
// returned to the caller, whose answer is the refusal.
func (s *Service) countRefusal(ctx context.Context, r *Reservation) {
	at := s.env.Clock().Now()
	err := s.env.DB().Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return MIGRefusalAdd(ctx, tx, r.PoolID, r.Model, r.MIGProfile, at)
	})
	if err != nil {
		slog.WarnContext(ctx, "count a MIG refusal", "pool", r.PoolID, "profile", r.MIGProfile, "err", err)
	}
}
