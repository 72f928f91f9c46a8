package pool

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/gpuhealth"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/provideraccounts"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// Service serves the PoolService API.
type Service struct {
	env     *envelope.Envelope
	changed ChangeHook
	live    LiveReservations
}

// LiveReservations counts a pool's live reservations (pending, placed,
// binding, active or releasing) in the caller's transaction and names one
// of them. Reservations are the reservation module's rows: it supplies the
// count, so that this package does not read them.
type LiveReservations func(ctx context.Context, tx store.Tx, poolID string) (n int, oneID string, err error)

// ChangeHook runs in the transaction of every create, update and archive,
// so that membership follows the pool's selector at once. poolID is the
// pool created or updated, "" for an archive; an error (a create or update
// that would put nodes into conflict) rolls the change back.
type ChangeHook func(ctx context.Context, tx store.Tx, tenantID, poolID string) error

// NewService returns the pool handlers; changed may be nil, and so may
// live (an archive with if_idle is then refused: nothing can count).
func NewService(env *envelope.Envelope, changed ChangeHook, live LiveReservations) *Service {
	return &Service{env: env, changed: changed, live: live}
}

func (s *Service) notify(ctx context.Context, tx store.Tx, tenantID, poolID string) error {
	if s.changed == nil {
		return nil
	}
	return s.changed(ctx, tx, tenantID, poolID)
}

var _ apiv1connect.PoolServiceHandler = (*Service)(nil)

// Resource projects a pool into the authorization model.
func Resource(p Pool) iam.Resource {
	return iam.Resource{Type: "Pool", ID: p.ID, TenantID: p.TenantID, Attrs: map[string]any{"name": p.Name, "state": p.State}}
}

// Policy bounds.
const (
	GPUSharingExclusive = "exclusive"
	GPUSharingMIG       = "mig"
	GPUSharingTimeslice = "timeslice"
	GPUSharingMPS       = "mps"

	OnNodeLostRelease = "release"
	OnNodeLostReplace = "replace"

	// DefaultMaxPending is how many reservations may wait in a pool whose
	// policy leaves max_pending at 0.
	DefaultMaxPending = 1000

	MaxSlotsPerGPU     = 48
	MaxDurationSeconds = 30 * 24 * 3600

	// DefaultStartHorizonSeconds is how far ahead a reservation may start
	// in a pool whose policy leaves start_horizon_seconds at 0: a start in
	// year 9999 books nothing useful and holds atoms out of every view.
	DefaultStartHorizonSeconds = 90 * 24 * 3600
	// MaxStartHorizonSeconds bounds start_horizon_seconds.
	MaxStartHorizonSeconds = 366 * 24 * 3600
)

// StartHorizon is how far ahead of now a pool lets a reservation start.
func StartHorizon(p *apiv1.PoolPolicy) time.Duration {
	n := p.GetStartHorizonSeconds()
	if n <= 0 {
		n = DefaultStartHorizonSeconds
	}
	return time.Duration(min(n, MaxStartHorizonSeconds)) * time.Second
}

// validatePolicy checks a policy, naming each offending field policy.*.
func validatePolicy(vs *envelope.Violations, p *apiv1.PoolPolicy) {
	if p == nil {
		return
	}
	nonNeg := func(field string, n int64) {
		if n < 0 {
			vs.Add(field, "must not be negative, got %d", n)
		}
	}
	if g := p.GetPerGpu(); g != nil {
		nonNeg("policy.per_gpu.vcpu", int64(g.GetVcpu()))
		nonNeg("policy.per_gpu.memory_gib", int64(g.GetMemoryGib()))
		nonNeg("policy.per_gpu.hugepages_1gi", int64(g.GetHugepages_1Gi()))
	}
	nonNeg("policy.host_reserve.vcpu", int64(p.GetHostReserve().GetVcpu()))
	nonNeg("policy.host_reserve.memory_gib", int64(p.GetHostReserve().GetMemoryGib()))
	slots := p.GetSlotsPerGpu()
	switch p.GetGpuSharing() {
	case "", GPUSharingExclusive, GPUSharingMIG:
		if slots != 0 {
			vs.Add("policy.slots_per_gpu", "must be 0 unless gpu_sharing is timeslice or mps, got %d", slots)
		}
	case GPUSharingTimeslice, GPUSharingMPS:
		if slots < 1 || slots > MaxSlotsPerGPU {
			vs.Add("policy.slots_per_gpu", "must be between 1 and %d for %s, got %d", MaxSlotsPerGPU, p.GetGpuSharing(), slots)
		}
	default:
		vs.Add("policy.gpu_sharing", "must be one of exclusive, mig, timeslice, mps, got %q", truncate(p.GetGpuSharing()))
	}
	if p.GetMaxPending() < -1 {
		vs.Add("policy.max_pending", "must be -1 (none wait), 0 (the default) or positive, got %d", p.GetMaxPending())
	}
	switch p.GetOnNodeLost() {
	case "", OnNodeLostRelease, OnNodeLostReplace:
	default:
		vs.Add("policy.on_node_lost", "must be release or replace, got %q", truncate(p.GetOnNodeLost()))
	}
	switch p.GetRequiredAttestor() {
	case "", "tpm", "x509", "cloud", "kubelet":
	default:
		vs.Add("policy.required_attestor", "must be tpm, x509, cloud or kubelet, got %q", truncate(p.GetRequiredAttestor()))
	}
	if h := p.GetStartHorizonSeconds(); h < 0 || h > MaxStartHorizonSeconds {
		vs.Add("policy.start_horizon_seconds", "must be between 0 (the default, 90 days) and %d (366 days), got %d", MaxStartHorizonSeconds, h)
	}
	switch p.GetMig() {
	case "", MIGManual:
	case MIGAuto:
		if p.GetGpuSharing() != GPUSharingMIG {
			vs.Add("policy.mig", "auto needs gpu_sharing mig, got gpu_sharing %q", truncate(p.GetGpuSharing()))
		}
	default:
		vs.Add("policy.mig", "must be auto or manual, got %q", truncate(p.GetMig()))
	}
	validateHealthPolicy(vs, p.GetHealth())
	validateProviderPolicy(vs, p.GetProvider())
	if v := p.GetMemoryOvercommit(); v != "" {
		if _, err := ParseMemoryOvercommit(v); err != nil {
			vs.Add("policy.memory_overcommit", "%v", err)
		} else if p.GetProvider() != nil {
			vs.Add("policy.memory_overcommit", "a provider pool's servers are not guests of its nodes: leave it empty")
		}
	}
	validatePrices(p.GetPrices(), func(field, reason string) { vs.Add(field, "%s", reason) })
	minD, maxD := p.GetMinDurationSeconds(), p.GetMaxDurationSeconds()
	nonNeg("policy.min_duration_seconds", minD)
	switch {
	case maxD < 0 || maxD > MaxDurationSeconds:
		vs.Add("policy.max_duration_seconds", "must be between 0 and %d (30 days), got %d", MaxDurationSeconds, maxD)
	case maxD > 0 && minD > maxD:
		vs.Add("policy.min_duration_seconds", "must be at most max_duration_seconds (%d), got %d", maxD, minD)
	case maxD == 0 && minD > MaxDurationSeconds:
		vs.Add("policy.min_duration_seconds", "must be at most %d (30 days), got %d", MaxDurationSeconds, minD)
	}
}

// validateProviderPolicy checks policy.provider's shape; the account is
// looked up in the pool's tenant when the pool is written (checkProvider).
func validateProviderPolicy(vs *envelope.Violations, p *apiv1.ProviderPolicy) {
	if p == nil {
		return
	}
	if p.GetAccount() == "" {
		vs.Add("policy.provider.account", "is required: a provider account of the pool's tenant (better-compute provider-accounts list)")
	} else {
		vs.Name("policy.provider.account", p.GetAccount())
	}
	for _, f := range []struct{ name, v string }{{"server_type", p.GetServerType()}, {"image", p.GetImage()}, {"location", p.GetLocation()}} {
		switch {
		case f.v == "" && f.name != "location":
			vs.Add("policy.provider."+f.name, "is required")
		case len(f.v) > 128:
			vs.Add("policy.provider."+f.name, "at most 128 bytes, got %d", len(f.v))
		case strings.ContainsAny(f.v, " \t\r\n\"'"):
			vs.Add("policy.provider."+f.name, "must not contain spaces or quotes, got %q", truncate(f.v))
		}
	}
}

// checkProvider resolves a provider policy's account in the pool's tenant:
// a pool cannot name another tenant's account, and a missing one is
// refused now rather than at the first instance.
func checkProvider(ctx context.Context, q store.Querier, tenantID string, p *apiv1.PoolPolicy) error {
	pp := p.GetProvider()
	if pp == nil {
		return nil
	}
	a, err := provideraccounts.Get(ctx, q, tenantID, pp.GetAccount(), "")
	if errors.Is(err, store.ErrNotFound) {
		return envelope.Invalid(envelope.Violation{Field: "policy.provider.account",
			Reason: fmt.Sprintf("the pool's tenant has no provider account %q", truncate(pp.GetAccount()))})
	}
	if err != nil {
		return err
	}
	pp.Account = a.ID
	return nil
}

// Memory overcommit bounds (policy.memory_overcommit) in percent: past 2
// a host's guests would need half their memory ballooned away to fit.
const (
	MinMemoryOvercommitPct = 100
	MaxMemoryOvercommitPct = 200
)

// ParseMemoryOvercommit reads policy.memory_overcommit ("1.25") as a
// percent (125); empty is 100 (no overcommit).
func ParseMemoryOvercommit(v string) (int, error) {
	if v == "" {
		return MinMemoryOvercommitPct, nil
	}
	whole, frac, _ := strings.Cut(v, ".")
	if whole == "" || len(frac) > 2 || strings.Trim(whole+frac, "0123456789") != "" || len(whole) > 3 {
		return 0, fmt.Errorf("must be a decimal ratio with at most 2 decimals (\"1.5\"), got %q", truncate(v))
	}
	w, _ := strconv.Atoi(whole)
	f, _ := strconv.Atoi((frac + "00")[:2])
	pct := w*100 + f
	if pct < MinMemoryOvercommitPct || pct > MaxMemoryOvercommitPct {
		return 0, fmt.Errorf("must be between 1 (no overcommit) and 2, got %q", truncate(v))
	}
	return pct, nil
}

// MemoryOvercommit is a pool's memory overcommit in percent (100: none).
func MemoryOvercommit(p Pool) int {
	pol := &apiv1.PoolPolicy{}
	if protojson.Unmarshal([]byte(p.Policy), pol) != nil {
		return MinMemoryOvercommitPct
	}
	pct, err := ParseMemoryOvercommit(pol.GetMemoryOvercommit())
	if err != nil {
		return MinMemoryOvercommitPct
	}
	return pct
}

// Provider returns a pool's provider policy: nil for a pool of nodes.
func Provider(p Pool) *apiv1.ProviderPolicy {
	pol := &apiv1.PoolPolicy{}
	if protojson.Unmarshal([]byte(p.Policy), pol) != nil {
		return nil
	}
	return pol.GetProvider()
}

// MIG layout modes (policy.mig).
const (
	MIGManual = "manual"
	MIGAuto   = "auto"
)

// Health policy bounds.
const (
	// MaxXIDActions bounds policy.health.xid_actions.
	MaxXIDActions = 256
	// MaxBreakerWindowSeconds is a day: a longer window counts a fleet's
	// ordinary failures as one event.
	MaxBreakerWindowSeconds = 86400
)

// validateHealthPolicy checks policy.health.
func validateHealthPolicy(vs *envelope.Violations, h *apiv1.HealthPolicy) {
	if h == nil {
		return
	}
	if len(h.GetXidActions()) > MaxXIDActions {
		vs.Add("policy.health.xid_actions", "at most %d codes, got %d", MaxXIDActions, len(h.GetXidActions()))
	}
	for _, code := range gpuhealth.SortedXIDs(h.GetXidActions()) {
		a := h.GetXidActions()[code]
		if code < 1 || code > 1<<16 {
			vs.Add(fmt.Sprintf("policy.health.xid_actions[%d]", code), "an XID is between 1 and 65536")
			continue
		}
		if !gpuhealth.ValidAction(a) {
			vs.Add(fmt.Sprintf("policy.health.xid_actions[%d]", code), "must be record, quarantine, rma, reset or reboot, got %q", truncate(a))
		}
	}
	if b := h.GetDisruptionBudgetPercent(); b < 0 || b > 100 {
		vs.Add("policy.health.disruption_budget_percent", "must be between 0 (the default, 5) and 100, got %d", b)
	}
	if b := h.GetBreakerPercent(); b < 0 || b > 100 {
		vs.Add("policy.health.breaker_percent", "must be between 0 (the default, 10) and 100, got %d", b)
	}
	if w := h.GetBreakerWindowSeconds(); w < 0 || w > MaxBreakerWindowSeconds {
		vs.Add("policy.health.breaker_window_seconds", "must be between 0 (the default, 600) and %d, got %d", MaxBreakerWindowSeconds, w)
	}
}

// RequiredAttestor returns the attestor the tenant's pool named ref
// requires of joining machines: "" when it requires none or there is no
// such pool (a token may name a pool before it exists).
func RequiredAttestor(ctx context.Context, q store.Querier, tenantID, ref string) (string, error) {
	p, err := Get(ctx, q, tenantID, ref)
	if errors.Is(err, store.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	pol := &apiv1.PoolPolicy{}
	if err := protojson.Unmarshal([]byte(p.Policy), pol); err != nil {
		return "", fmt.Errorf("pool %s: policy: %w", p.ID, err)
	}
	return pol.GetRequiredAttestor(), nil
}

// normalPolicy fills the defaults of a valid policy.
func normalPolicy(p *apiv1.PoolPolicy) *apiv1.PoolPolicy {
	out := &apiv1.PoolPolicy{}
	if p != nil {
		out = cloneOf(p)
	}
	if out.GpuSharing == "" {
		out.GpuSharing = GPUSharingExclusive
	}
	if out.OnNodeLost == "" {
		out.OnNodeLost = OnNodeLostRelease
	}
	if out.HostReserve == nil {
		out.HostReserve = &apiv1.HostReserve{}
	}
	if out.StartHorizonSeconds == 0 {
		out.StartHorizonSeconds = DefaultStartHorizonSeconds
	}
	return out
}

var jsonOpts = protojson.MarshalOptions{UseProtoNames: true}

func policyJSON(p *apiv1.PoolPolicy) (string, error) {
	b, err := jsonOpts.Marshal(normalPolicy(p))
	return string(b), err
}

func selectorJSON(reqs []*apiv1.SelectorRequirement) (string, error) {
	b, err := jsonOpts.Marshal(&apiv1.PoolSelector{Requirements: reqs})
	return string(b), err
}

// Proto converts a pool for the API. Text that does not decode yields an
// empty selector or a default policy.
func Proto(p Pool) *apiv1.Pool {
	sel := &apiv1.PoolSelector{}
	if protojson.Unmarshal([]byte(p.Selector), sel) != nil {
		sel = &apiv1.PoolSelector{}
	}
	pol := &apiv1.PoolPolicy{}
	if protojson.Unmarshal([]byte(p.Policy), pol) != nil {
		pol = &apiv1.PoolPolicy{}
	}
	out := &apiv1.Pool{
		Id: p.ID, TenantId: p.TenantID, Name: p.Name, Selector: sel.GetRequirements(), Policy: normalPolicy(pol),
		State: p.State, CreatedBy: p.CreatedBy, CreateTime: timestamppb.New(p.CreateTime), UpdateTime: timestamppb.New(p.UpdateTime),
		Offer: &apiv1.PoolOffer{Scope: cmp.Or(p.Offer, OfferPrivate), Tenants: p.OfferedTo}, Owner: p.Owner,
	}
	if p.ArchiveTime != nil {
		out.ArchiveTime = timestamppb.New(*p.ArchiveTime)
	}
	return out
}

// poolRef is a request's reference to a pool in a tenant, as resolved
// before the decision.
type poolRef struct {
	tenantRef, ref string
	tenant         tenancy.Tenant
	tenantFound    bool
	pool           Pool
	found          bool
	// amb: the name is offered by several owners (a consumer's read).
	amb *Ambiguous
}

// lookup resolves a pool for a draft or a read. Misses are not errors yet:
// the decision comes first (on the tenant, or on the platform when the
// tenant does not exist), so a stranger learns nothing about other tenants.
func lookup(ctx context.Context, q store.Querier, tenantRef, ref string) (poolRef, error) {
	r := poolRef{tenantRef: tenantRef, ref: ref}
	var err error
	if r.tenant, r.tenantFound, err = tenancy.LookupTenant(ctx, q, tenantRef); err != nil || !r.tenantFound {
		return r, err
	}
	p, err := Get(ctx, q, r.tenant.ID, ref)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return r, nil
	case err != nil:
		return r, err
	}
	r.pool, r.found = p, true
	return r, nil
}

func (r poolRef) resource() iam.Resource {
	if r.found {
		return Resource(r.pool)
	}
	return iam.Resource{Type: "Pool", ID: "unknown", TenantID: r.tenant.ID}
}

func (r poolRef) notFound() error {
	if !r.tenantFound {
		return envelope.NotFound("tenant", r.tenantRef)
	}
	if r.amb != nil {
		return r.amb.Err()
	}
	if !r.found {
		return envelope.NotFound("pool", r.ref)
	}
	return nil
}

func validateRef(vs *envelope.Violations, tenant, pool string) {
	vs.Ref("tenant", tenant, "tnt")
	vs.Ref("pool", pool, IDPrefix)
}

// Create creates a pool.
func (s *Service) Create(ctx context.Context, req *connect.Request[apiv1.CreatePoolRequest]) (*connect.Response[apiv1.CreatePoolResponse], error) {
	msg := req.Msg
	var tenant tenancy.Tenant
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.CreatePoolResponse]{
		Validate: func() error {
			var vs envelope.Violations
			vs.Ref("tenant", msg.GetTenant(), "tnt")
			vs.Name("name", msg.GetName())
			validateSelector(&vs, msg.GetSelector())
			validatePolicy(&vs, msg.GetPolicy())
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			t, found, err := tenancy.LookupTenant(ctx, q, msg.GetTenant())
			if err != nil || !found {
				return iam.Resource{Type: "Pool", ID: iam.DraftID}, err
			}
			tenant = t
			return iam.Resource{Type: "Pool", ID: iam.DraftID, TenantID: t.ID, Attrs: map[string]any{"name": msg.GetName()}}, nil
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.CreatePoolResponse, error) {
			if tenant.ID == "" {
				return nil, envelope.NotFound("tenant", msg.GetTenant())
			}
			sel, err := selectorJSON(msg.GetSelector())
			if err != nil {
				return nil, err
			}
			if err := checkProvider(ctx, tx, tenant.ID, msg.GetPolicy()); err != nil {
				return nil, err
			}
			pol, err := policyJSON(msg.GetPolicy())
			if err != nil {
				return nil, err
			}
			now := tx.Now()
			p := Pool{
				ID: envelope.NewID(IDPrefix, now), TenantID: tenant.ID, Name: msg.GetName(), Selector: sel, Policy: pol,
				State: StateActive, CreatedBy: tx.Caller().Principal.ID, CreateTime: now, UpdateTime: now,
			}
			if err := Insert(ctx, tx, &p); err != nil {
				if errors.Is(err, store.ErrUnique) {
					return nil, envelope.Errorf(envelope.CodeAlreadyExists, "pool %q already exists in tenant %s", p.Name, tenant.Name)
				}
				return nil, err
			}
			tx.SetResource(p.ID, "")
			if err := s.notify(ctx, tx, p.TenantID, p.ID); err != nil {
				return nil, err
			}
			tx.Emit(envelope.Event{Type: "pool.created", TenantID: p.TenantID, ResourceType: "Pool", ResourceID: p.ID,
				Data: map[string]any{"name": p.Name}})
			return &apiv1.CreatePoolResponse{Pool: Proto(p)}, nil
		},
	})
}

// Update replaces an active pool's selector, policy or both.
func (s *Service) Update(ctx context.Context, req *connect.Request[apiv1.UpdatePoolRequest]) (*connect.Response[apiv1.UpdatePoolResponse], error) {
	msg := req.Msg
	var r poolRef
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.UpdatePoolResponse]{
		Validate: func() error {
			var vs envelope.Violations
			validateRef(&vs, msg.GetTenant(), msg.GetPool())
			if msg.GetSelector() == nil && msg.GetPolicy() == nil {
				vs.Add("selector", "or policy must be set: there is nothing to update")
			}
			validateSelector(&vs, msg.GetSelector().GetRequirements())
			validatePolicy(&vs, msg.GetPolicy())
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			r, err = lookup(ctx, q, msg.GetTenant(), msg.GetPool())
			return r.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.UpdatePoolResponse, error) {
			if err := r.notFound(); err != nil {
				return nil, err
			}
			cur, err := Get(ctx, tx, r.pool.TenantID, r.pool.ID)
			if err != nil {
				return nil, err
			}
			if cur.State != StateActive {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "pool %s is %s: it cannot be updated", cur.Name, cur.State)
			}
			sel, pol := cur.Selector, cur.Policy
			if msg.GetSelector() != nil {
				if sel, err = selectorJSON(msg.GetSelector().GetRequirements()); err != nil {
					return nil, err
				}
			}
			if msg.GetPolicy() != nil {
				if err := checkProvider(ctx, tx, cur.TenantID, msg.GetPolicy()); err != nil {
					return nil, err
				}
				if pol, err = policyJSON(msg.GetPolicy()); err != nil {
					return nil, err
				}
			}
			ok, err := Update(ctx, tx, cur.TenantID, cur.ID, sel, pol)
			if err != nil {
				return nil, err
			}
			if !ok {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "pool %s is no longer active", cur.Name)
			}
			if cur, err = Get(ctx, tx, cur.TenantID, cur.ID); err != nil {
				return nil, err
			}
			if err := s.notify(ctx, tx, cur.TenantID, cur.ID); err != nil {
				return nil, err
			}
			tx.Emit(envelope.Event{Type: "pool.updated", TenantID: cur.TenantID, ResourceType: "Pool", ResourceID: cur.ID,
				Data: map[string]any{"name": cur.Name, "selector": msg.GetSelector() != nil, "policy": msg.GetPolicy() != nil}})
			return &apiv1.UpdatePoolResponse{Pool: Proto(cur)}, nil
		},
	})
}

// Archive archives a pool. Archiving an archived pool succeeds and changes
// nothing.
func (s *Service) Archive(ctx context.Context, req *connect.Request[apiv1.ArchivePoolRequest]) (*connect.Response[apiv1.ArchivePoolResponse], error) {
	msg := req.Msg
	var r poolRef
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.ArchivePoolResponse]{
		Validate: func() error {
			var vs envelope.Violations
			validateRef(&vs, msg.GetTenant(), msg.GetPool())
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			r, err = lookup(ctx, q, msg.GetTenant(), msg.GetPool())
			return r.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.ArchivePoolResponse, error) {
			if err := r.notFound(); err != nil {
				return nil, err
			}
			if msg.GetIfIdle() {
				if err := s.refuseBusy(ctx, tx, r.pool.ID); err != nil {
					return nil, err
				}
			}
			ok, err := Archive(ctx, tx, r.pool.TenantID, r.pool.ID)
			if err != nil {
				return nil, err
			}
			cur, err := Get(ctx, tx, r.pool.TenantID, r.pool.ID)
			if err != nil {
				return nil, err
			}
			if ok {
				if err := s.notify(ctx, tx, cur.TenantID, ""); err != nil {
					return nil, err
				}
				tx.Emit(envelope.Event{Type: "pool.archived", TenantID: cur.TenantID, ResourceType: "Pool", ResourceID: cur.ID,
					Data: map[string]any{"name": cur.Name}})
			}
			return &apiv1.ArchivePoolResponse{Pool: Proto(cur)}, nil
		},
	})
}

// refuseBusy refuses the archive of an active pool that has live
// reservations. It first locks the pool's row: every reservation batch of
// the pool locks it too and re-reads the pool's state under the lock
// (placer.Batch.LockPool), so a batch that commits before the lock is
// counted here and one that waits for it finds the pool archived.
func (s *Service) refuseBusy(ctx context.Context, tx store.Tx, poolID string) error {
	cur, err := GetForUpdate(ctx, tx, poolID)
	if err != nil {
		return envelope.FromStore(err, "pool")
	}
	if cur.State != StateActive {
		return nil // archiving an archived pool changes nothing
	}
	if s.live == nil {
		return envelope.Errorf(envelope.CodeFailedPrecondition, "this server cannot count pool %s's reservations: archive it without if_idle", cur.Name)
	}
	n, one, err := s.live(ctx, tx, poolID)
	if err != nil {
		return err
	}
	if n > 0 {
		noun := "reservations"
		if n == 1 {
			noun = "reservation"
		}
		return envelope.Errorf(envelope.CodeFailedPrecondition, "pool %s has %d live %s (%s is one); release them before archiving it",
			cur.Name, n, noun, one)
	}
	return nil
}

// Get reads a pool: one the tenant owns, or one offered to it (read on the
// consumer's side: the decision is on the consumer tenant, whose view of
// the catalogue it is).
func (s *Service) Get(ctx context.Context, req *connect.Request[apiv1.GetPoolRequest]) (*connect.Response[apiv1.GetPoolResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	vs.Ref("tenant", msg.GetTenant(), "tnt")
	ValidateVisibleRef(&vs, "pool", msg.GetPool())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	r := poolRef{tenantRef: msg.GetTenant(), ref: msg.GetPool()}
	if err := s.env.Resolve(ctx, "pool", func(ctx context.Context, q store.Querier) (err error) {
		if r.tenant, r.tenantFound, err = tenancy.LookupTenant(ctx, q, r.tenantRef); err != nil || !r.tenantFound {
			return err
		}
		if r.pool, r.found, r.amb, err = ResolveVisible(ctx, q, r.tenant.ID, r.ref); err != nil || !r.found {
			return err
		}
		ps := []Pool{r.pool}
		err = withOffers(ctx, q, ps)
		r.pool = ps[0]
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	res := r.resource()
	if r.found && r.pool.TenantID != r.tenant.ID {
		res = tenancy.TenantResource(r.tenant)
	}
	if err := s.env.AuthorizeRead(ctx, res); err != nil {
		return nil, err
	}
	if err := r.notFound(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	return connect.NewResponse(&apiv1.GetPoolResponse{Pool: Proto(r.pool)}), nil
}

// List lists pools: a tenant's, or every tenant's for platform admins.
func (s *Service) List(ctx context.Context, req *connect.Request[apiv1.ListPoolsRequest]) (*connect.Response[apiv1.ListPoolsResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	if msg.GetTenant() != "" {
		vs.Ref("tenant", msg.GetTenant(), "tnt")
	}
	vs.PageSize("page_size", msg.GetPageSize())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	filter := msg.GetTenant()
	if msg.GetIncludeArchived() {
		filter += "/archived"
	}
	after, err := envelope.DecodePageToken("page_token", msg.GetPageToken(), filter)
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var (
		t     tenancy.Tenant
		found = true
		res   = tenancy.PlatformResource()
	)
	if msg.GetTenant() != "" {
		if err := s.env.Resolve(ctx, "tenant", func(ctx context.Context, q store.Querier) (err error) {
			t, found, err = tenancy.LookupTenant(ctx, q, msg.GetTenant())
			return err
		}); err != nil {
			return nil, s.env.Fail(ctx, err)
		}
		res = tenancy.TenantResource(t)
	}
	if err := s.env.AuthorizeRead(ctx, res); err != nil {
		return nil, err
	}
	if !found {
		return nil, s.env.Fail(ctx, envelope.NotFound("tenant", msg.GetTenant()))
	}
	limit := envelope.PageSize(msg.GetPageSize())
	var pools []Pool
	if err := s.env.Resolve(ctx, "pools", func(ctx context.Context, q store.Querier) (err error) {
		// A tenant's listing shows the pools offered to it beside its own.
		pools, err = List(ctx, q, &ListParams{TenantID: t.ID, Offered: true, IncludeArchived: msg.GetIncludeArchived(), After: after, Limit: limit + 1})
		if err != nil {
			return err
		}
		return withOffers(ctx, q, pools)
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.ListPoolsResponse{}
	for i, p := range pools {
		if i == limit {
			out.NextPageToken = envelope.EncodePageToken(pools[i-1].ID, filter)
			break
		}
		out.Pools = append(out.Pools, Proto(p))
	}
	return connect.NewResponse(out), nil
}

func cloneOf(p *apiv1.PoolPolicy) *apiv1.PoolPolicy { return proto.CloneOf(p) }
