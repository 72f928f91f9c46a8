package health

import (
	"context"
	"errors"
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
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/gpuhealth"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// Service serves the HealthService API on the envelope: reads for the
// node's (or pool's) tenant, and the operator's quarantine, lift and
// breaker reset as mutations with one decision, one transaction and an
// audit row each.
type Service struct {
	env *envelope.Envelope
	m   *Module
}

// NewService returns the health handlers over the module.
func NewService(env *envelope.Envelope, m *Module) *Service {
	return &Service{env: env, m: m}
}

var _ apiv1connect.HealthServiceHandler = (*Service)(nil)

// maxReason bounds an operator's reason (quarantine, lift, reset).
const maxReason = 200

// nodeHealthRemediations is how many of a node's latest remediations
// GetNodeHealth shows.
const nodeHealthRemediations = 20

var (
	findingStates = []string{FindingOpen, FindingResolved}
	remStates     = []string{RemPending, RemDraining, RemRunning, RemSucceeded, RemFailed, RemEscalated, RemCanceled}
	severities    = []string{gpuhealth.SeverityCritical, gpuhealth.SeverityError, gpuhealth.SeverityWarning, gpuhealth.SeverityInfo}
	// GPU UUIDs are NVML's (GPU-…, MIG-…): letters, digits and dashes.
	gpuUUIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)
	// Node names come from host names (fleet's rule).
	nodeNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$`)
)

func validateTenant(vs *envelope.Violations, ref string) {
	if ref != "" {
		vs.Ref("tenant", ref, "tnt")
	}
}

func validateNode(vs *envelope.Violations, field, ref string, required bool) {
	switch {
	case ref == "":
		if required {
			vs.Add(field, "is required")
		}
	case strings.Contains(ref, "_"):
		if !envelope.IsID(ref, fleet.NodeIDPrefix) {
			vs.Add(field, "is not a valid %s id", fleet.NodeIDPrefix)
		}
	case !nodeNameRE.MatchString(ref):
		vs.Add(field, "must be a node name (lower-case host name) or a %s_ id", fleet.NodeIDPrefix)
	}
}

// validatePool checks a pool reference; a name needs a tenant.
func validatePool(vs *envelope.Violations, tenant, ref string, required bool) {
	switch {
	case ref == "":
		if required {
			vs.Add("pool", "is required")
		}
	case strings.HasPrefix(ref, pool.IDPrefix+"_"):
		vs.Ref("pool", ref, pool.IDPrefix)
	case tenant == "":
		vs.Add("pool", "a pool name needs tenant; without one, give the %s_ id", pool.IDPrefix)
	default:
		vs.Ref("pool", ref, pool.IDPrefix)
	}
}

func validateGPU(vs *envelope.Violations, ref string) {
	switch {
	case ref == "":
		vs.Add("gpu", "is required: the GPU's UUID (GPU-…)")
	case !gpuUUIDRE.MatchString(ref):
		vs.Add("gpu", "must be a GPU UUID (letters, digits, dashes; at most 128 bytes)")
	}
}

func validateReason(vs *envelope.Violations, reason string) {
	if strings.TrimSpace(reason) == "" {
		vs.Add("reason", "is required: say why, for the audit log")
		return
	}
	vs.MaxLen("reason", reason, maxReason)
}

func validateOneOf(vs *envelope.Violations, field, value string, allowed ...string) {
	if value != "" && !slices.Contains(allowed, value) {
		vs.Add(field, "must be one of %s", strings.Join(allowed, ", "))
	}
}

// tenantRef is a request's tenant, as resolved before the decision.
type tenantRef struct {
	ref    string
	tenant tenancy.Tenant
	found  bool
}

func lookupTenant(ctx context.Context, q store.Querier, ref string) (tenantRef, error) {
	r := tenantRef{ref: ref}
	if ref == "" {
		return r, nil
	}
	var err error
	r.tenant, r.found, err = tenancy.LookupTenant(ctx, q, ref)
	return r, err
}

// missing says the named tenant does not exist, after the decision.
func (r tenantRef) missing() error {
	if r.ref != "" && !r.found {
		return envelope.NotFound("tenant", r.ref)
	}
	return nil
}

// container is what a tenant-wide read is decided on: the tenant, or the
// platform when none was named (only platform admins pass).
func (r tenantRef) container() iam.Resource {
	if r.ref == "" {
		return tenancy.PlatformResource()
	}
	return tenancy.TenantResource(r.tenant)
}

// nodeRef is a request's node, as resolved before the decision. A miss is
// not an error yet: the decision comes first (on the tenant's unknown
// node), so a stranger learns nothing of another tenant's nodes.
type nodeRef struct {
	tenantRef
	nodeRef string
	node    fleet.Node
	found   bool
}

func lookupNode(ctx context.Context, q store.Querier, tenant, ref string) (nodeRef, error) {
	tr, err := lookupTenant(ctx, q, tenant)
	r := nodeRef{tenantRef: tr, nodeRef: ref}
	if err != nil || (tenant != "" && !tr.found) {
		return r, err
	}
	n, err := fleet.NodeGet(ctx, q, tr.tenant.ID, ref)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return r, nil
	case err != nil:
		return r, err
	}
	r.node, r.found = n, true
	return r, nil
}

func (r nodeRef) resource() iam.Resource {
	if r.found {
		return fleet.NodeResource(r.node)
	}
	return iam.Resource{Type: "Node", ID: "unknown", TenantID: r.tenant.ID}
}

func (r nodeRef) notFound() error {
	if err := r.missing(); err != nil {
		return err
	}
	if !r.found {
		return envelope.NotFound("node", r.nodeRef)
	}
	return nil
}

// gpuRef is a request's GPU: found only when a node of the named tenant
// (any node, without one) reports it, so another tenant's GPU reads as a
// GPU that does not exist.
type gpuRef struct {
	nodeRef
	gpu GPURef
}

func lookupGPU(ctx context.Context, q store.Querier, tenant, uuid string) (gpuRef, error) {
	tr, err := lookupTenant(ctx, q, tenant)
	r := gpuRef{nodeRef: nodeRef{tenantRef: tr}, gpu: GPURef{UUID: uuid}}
	if err != nil || (tenant != "" && !tr.found) {
		return r, err
	}
	g, err := GPUByUUID(ctx, q, uuid)
	if errors.Is(err, store.ErrNotFound) {
		// A lost GPU leaves the gpus table but keeps its quarantine row.
		h, herr := GPUGet(ctx, q, uuid)
		if herr != nil {
			if errors.Is(herr, store.ErrNotFound) {
				return r, nil
			}
			return r, herr
		}
		g, err = GPURef{UUID: uuid, NodeID: h.NodeID, Index: -1}, nil
	}
	if err != nil {
		return r, err
	}
	n, err := fleet.NodeGet(ctx, q, tr.tenant.ID, g.NodeID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return r, nil
	case err != nil:
		return r, err
	}
	r.gpu, r.node, r.found = g, n, true
	return r, nil
}

func (r gpuRef) notFound() error {
	if err := r.missing(); err != nil {
		return err
	}
	if !r.found {
		return envelope.NotFound("gpu", r.gpu.UUID)
	}
	return nil
}

// poolRef is a request's pool, as resolved before the decision.
type poolRef struct {
	tenantRef
	poolRef string
	pool    pool.Pool
	found   bool
}

func lookupPool(ctx context.Context, q store.Querier, tenant, ref string) (poolRef, error) {
	tr, err := lookupTenant(ctx, q, tenant)
	r := poolRef{tenantRef: tr, poolRef: ref}
	if err != nil || (tenant != "" && !tr.found) {
		return r, err
	}
	p, err := pool.Get(ctx, q, tr.tenant.ID, ref)
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
		return pool.Resource(r.pool)
	}
	return iam.Resource{Type: "Pool", ID: "unknown", TenantID: r.tenant.ID}
}

func (r poolRef) notFound() error {
	if err := r.missing(); err != nil {
		return err
	}
	if !r.found {
		return envelope.NotFound("pool", r.poolRef)
	}
	return nil
}

// by names the caller in what the module records (created_by, resolved_by).
func by(tx *envelope.Tx) string {
	p := tx.Caller().Principal
	return string(p.Kind) + ":" + p.ID
}

// GetNodeHealth reads a node's GPUs, open findings and remediations.
func (s *Service) GetNodeHealth(ctx context.Context, req *connect.Request[apiv1.GetNodeHealthRequest]) (*connect.Response[apiv1.GetNodeHealthResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	validateTenant(&vs, msg.GetTenant())
	validateNode(&vs, "node", msg.GetNode(), true)
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var (
		r  nodeRef
		nh *apiv1.NodeHealth
	)
	if err := s.env.Resolve(ctx, "node", func(ctx context.Context, q store.Querier) (err error) {
		if r, err = lookupNode(ctx, q, msg.GetTenant(), msg.GetNode()); err != nil || !r.found {
			return err
		}
		nh, err = s.nodeHealth(ctx, q, r.node)
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, r.resource()); err != nil {
		return nil, err
	}
	if err := r.notFound(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	return connect.NewResponse(&apiv1.GetNodeHealthResponse{Health: nh}), nil
}

// nodeHealth reads what GetNodeHealth shows of n.
func (s *Service) nodeHealth(ctx context.Context, q store.Querier, n fleet.Node) (*apiv1.NodeHealth, error) {
	now := s.m.Now()
	poolID, _, err := poolOfNode(ctx, q, n.ID)
	if err != nil {
		return nil, err
	}
	gpus, err := NodeGPUs(ctx, q, n.ID)
	if err != nil {
		return nil, err
	}
	out, err := GPUsOfNodes(ctx, q, []string{n.ID})
	if err != nil {
		return nil, err
	}
	held, err := GPUReservations(ctx, q, n.ID, now)
	if err != nil {
		return nil, err
	}
	findings, err := FindingList(ctx, q, FindingsQuery{NodeID: n.ID, State: FindingOpen})
	if err != nil {
		return nil, err
	}
	rems, err := RemediationList(ctx, q, RemediationsQuery{NodeID: n.ID})
	if err != nil {
		return nil, err
	}
	conds, err := fleet.NodeConditionList(ctx, q, n.ID)
	if err != nil {
		return nil, err
	}
	nh := &apiv1.NodeHealth{NodeId: n.ID, Node: n.Name, TenantId: n.TenantID, PoolId: poolID,
		GpusTotal: int32(len(gpus)), GpusOut: int32(len(out))}
	seen := map[string]bool{}
	for _, g := range gpus {
		seen[g.UUID] = true
		nh.Gpus = append(nh.Gpus, gpuHealthProto(g, out, held))
	}
	// A GPU that fell off the bus is gone from the inventory but still out.
	for _, uuid := range sortedKeys(out) {
		if !seen[uuid] {
			nh.Gpus = append(nh.Gpus, gpuHealthProto(GPURef{UUID: uuid, NodeID: n.ID, Index: -1}, out, held))
		}
	}
	for _, f := range findings {
		nh.Findings = append(nh.Findings, FindingProto(f, n.Name))
	}
	active := false
	if len(rems) > nodeHealthRemediations {
		rems = rems[len(rems)-nodeHealthRemediations:]
	}
	for _, m := range rems {
		active = active || slices.Contains(activeRemStates, m.State)
		nh.Remediations = append(nh.Remediations, RemediationProto(m, n.Name))
	}
	maintenance := false
	for _, c := range conds[n.ID] {
		if c.Type == ConditionMaintenance && c.Status == "true" {
			maintenance = true
		}
	}
	switch {
	case maintenance:
		nh.Status = "maintenance"
	case active:
		nh.Status = "unhealthy"
	case len(out) > 0:
		nh.Status = "degraded"
	default:
		nh.Status = "ok"
	}
	return nh, nil
}

func sortedKeys(m map[string]GPU) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func gpuHealthProto(g GPURef, out map[string]GPU, held map[string]int) *apiv1.GpuHealth {
	p := &apiv1.GpuHealth{Uuid: g.UUID, Index: int32(g.Index), Model: g.Model, State: "ok", Reservations: int32(held[g.UUID])}
	if h, ok := out[g.UUID]; ok {
		p.State, p.Reason = h.State, h.Reason
	}
	return p
}

// ListFindings lists findings of a tenant (every tenant's, for platform
// admins), with what the listed scope's open findings take out.
func (s *Service) ListFindings(ctx context.Context, req *connect.Request[apiv1.ListFindingsRequest]) (*connect.Response[apiv1.ListFindingsResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	validateTenant(&vs, msg.GetTenant())
	validateNode(&vs, "node", msg.GetNode(), false)
	validatePool(&vs, msg.GetTenant(), msg.GetPool(), false)
	validateOneOf(&vs, "state", msg.GetState(), findingStates...)
	validateOneOf(&vs, "min_severity", msg.GetMinSeverity(), severities...)
	vs.PageSize("page_size", msg.GetPageSize())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	filter := strings.Join([]string{msg.GetTenant(), msg.GetNode(), msg.GetPool(), msg.GetState(), msg.GetMinSeverity()}, "/")
	after, err := envelope.DecodePageToken("page_token", msg.GetPageToken(), filter)
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	limit := envelope.PageSize(msg.GetPageSize())
	var (
		sc       scope
		findings []Finding
		names    map[string]string
		resp     = &apiv1.ListFindingsResponse{}
	)
	if err := s.env.Resolve(ctx, "findings", func(ctx context.Context, q store.Querier) (err error) {
		if sc, err = resolveScope(ctx, q, msg.GetTenant(), msg.GetNode(), msg.GetPool()); err != nil || sc.miss() != nil {
			return err
		}
		p := FindingsQuery{TenantID: sc.tenant.tenant.ID, NodeID: sc.nodeID, PoolID: sc.poolID, State: msg.GetState(), After: after, Limit: limit + 1}
		if ms := msg.GetMinSeverity(); ms != "" {
			for _, sev := range severities {
				if gpuhealth.SeverityRank(sev) >= gpuhealth.SeverityRank(ms) {
					p.Severities = append(p.Severities, sev)
				}
			}
		}
		if findings, err = FindingList(ctx, q, p); err != nil {
			return err
		}
		out, unhealthy, err := ScopeCounts(ctx, q, ScopeQuery{TenantID: sc.tenant.tenant.ID, NodeID: sc.nodeID, PoolID: sc.poolID})
		if err != nil {
			return err
		}
		resp.GpusOut, resp.NodesUnhealthy = int32(out), int32(unhealthy)
		names, err = nodeNames(ctx, q, findings, func(f Finding) string { return f.NodeID })
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, sc.tenant.container()); err != nil {
		return nil, err
	}
	if err := sc.miss(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if len(findings) > limit {
		resp.NextPageToken = envelope.EncodePageToken(findings[limit-1].ID, filter)
		findings = findings[:limit]
	}
	for _, f := range findings {
		resp.Findings = append(resp.Findings, FindingProto(f, names[f.NodeID]))
	}
	return connect.NewResponse(resp), nil
}

// ListRemediations lists remediations of a tenant (every tenant's, for
// platform admins).
func (s *Service) ListRemediations(ctx context.Context, req *connect.Request[apiv1.ListRemediationsRequest]) (*connect.Response[apiv1.ListRemediationsResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	validateTenant(&vs, msg.GetTenant())
	validateNode(&vs, "node", msg.GetNode(), false)
	validatePool(&vs, msg.GetTenant(), msg.GetPool(), false)
	validateOneOf(&vs, "state", msg.GetState(), remStates...)
	vs.PageSize("page_size", msg.GetPageSize())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	filter := strings.Join([]string{msg.GetTenant(), msg.GetNode(), msg.GetPool(), msg.GetState()}, "/")
	after, err := envelope.DecodePageToken("page_token", msg.GetPageToken(), filter)
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	limit := envelope.PageSize(msg.GetPageSize())
	var (
		sc    scope
		rems  []Remediation
		names map[string]string
	)
	if err := s.env.Resolve(ctx, "remediations", func(ctx context.Context, q store.Querier) (err error) {
		if sc, err = resolveScope(ctx, q, msg.GetTenant(), msg.GetNode(), msg.GetPool()); err != nil || sc.miss() != nil {
			return err
		}
		p := RemediationsQuery{TenantID: sc.tenant.tenant.ID, NodeID: sc.nodeID, PoolID: sc.poolID, After: after, Limit: limit + 1}
		if st := msg.GetState(); st != "" {
			p.States = []string{st}
		}
		if rems, err = RemediationList(ctx, q, p); err != nil {
			return err
		}
		names, err = nodeNames(ctx, q, rems, func(r Remediation) string { return r.NodeID })
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, sc.tenant.container()); err != nil {
		return nil, err
	}
	if err := sc.miss(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	resp := &apiv1.ListRemediationsResponse{}
	if len(rems) > limit {
		resp.NextPageToken = envelope.EncodePageToken(rems[limit-1].ID, filter)
		rems = rems[:limit]
	}
	for _, r := range rems {
		resp.Remediations = append(resp.Remediations, RemediationProto(r, names[r.NodeID]))
	}
	return connect.NewResponse(resp), nil
}

// scope is a list's tenant with its optional node and pool filters,
// resolved before the decision (made on the tenant); a node or pool that
// is not the tenant's is a miss, as one that does not exist.
type scope struct {
	tenant           tenantRef
	nodeRef, poolRef string
	nodeID, poolID   string
}

func resolveScope(ctx context.Context, q store.Querier, tenant, node, poolName string) (scope, error) {
	tr, err := lookupTenant(ctx, q, tenant)
	sc := scope{tenant: tr, nodeRef: node, poolRef: poolName}
	if err != nil || (tenant != "" && !tr.found) {
		return sc, err
	}
	if node != "" {
		n, err := fleet.NodeGet(ctx, q, tr.tenant.ID, node)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return sc, err
		}
		sc.nodeID = n.ID
	}
	if poolName != "" {
		p, err := pool.Get(ctx, q, tr.tenant.ID, poolName)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return sc, err
		}
		sc.poolID = p.ID
	}
	return sc, nil
}

// miss says what the list named that is not there.
func (sc scope) miss() error {
	if err := sc.tenant.missing(); err != nil {
		return err
	}
	if sc.nodeRef != "" && sc.nodeID == "" {
		return envelope.NotFound("node", sc.nodeRef)
	}
	if sc.poolRef != "" && sc.poolID == "" {
		return envelope.NotFound("pool", sc.poolRef)
	}
	return nil
}

// nodeNames reads the names of the nodes rows name, by id.
func nodeNames[T any](ctx context.Context, q store.Querier, rows []T, nodeID func(T) string) (map[string]string, error) {
	names := map[string]string{}
	for _, r := range rows {
		id := nodeID(r)
		if _, ok := names[id]; ok {
			continue
		}
		n, err := fleet.NodeGet(ctx, q, "", id)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
		names[id] = n.Name
	}
	return names, nil
}

// GetPoolHealth reads a pool's health: capacity out, budget, breaker.
func (s *Service) GetPoolHealth(ctx context.Context, req *connect.Request[apiv1.GetPoolHealthRequest]) (*connect.Response[apiv1.GetPoolHealthResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	validateTenant(&vs, msg.GetTenant())
	validatePool(&vs, msg.GetTenant(), msg.GetPool(), true)
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var (
		r  poolRef
		st PoolStatus
	)
	if err := s.env.Resolve(ctx, "pool", func(ctx context.Context, q store.Querier) (err error) {
		if r, err = lookupPool(ctx, q, msg.GetTenant(), msg.GetPool()); err != nil || !r.found {
			return err
		}
		st, err = PoolStatusOf(ctx, q, r.pool.ID, s.m.Now())
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, r.resource()); err != nil {
		return nil, err
	}
	if err := r.notFound(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	return connect.NewResponse(&apiv1.GetPoolHealthResponse{Health: PoolHealthProto(st)}), nil
}

// QuarantineGpu takes one GPU out of placement (or marks it for RMA).
func (s *Service) QuarantineGpu(ctx context.Context, req *connect.Request[apiv1.QuarantineGpuRequest]) (*connect.Response[apiv1.QuarantineGpuResponse], error) {
	msg := req.Msg
	var r gpuRef
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.QuarantineGpuResponse]{
		Validate: func() error {
			var vs envelope.Violations
			validateTenant(&vs, msg.GetTenant())
			validateGPU(&vs, msg.GetGpu())
			validateReason(&vs, msg.GetReason())
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (res iam.Resource, err error) {
			r, err = lookupGPU(ctx, q, msg.GetTenant(), msg.GetGpu())
			return r.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.QuarantineGpuResponse, error) {
			if err := r.notFound(); err != nil {
				return nil, err
			}
			n, err := fleet.NodeGet(ctx, tx, "", r.node.ID)
			if err != nil {
				return nil, err
			}
			want := GPUQuarantined
			if msg.GetRma() {
				want = GPURMA
			}
			cur, err := GPUGet(ctx, tx, r.gpu.UUID)
			switch {
			case errors.Is(err, store.ErrNotFound):
			case err != nil:
				return nil, err
			case cur.State == GPURMA || cur.State == want:
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "GPU %s of node %s is already %s (%s): lift it first to change why",
					r.gpu.UUID, n.Name, describeState(cur.State), cur.Reason)
			}
			f, err := s.m.QuarantineGPU(ctx, tx.Tx, n, r.gpu, msg.GetReason(), msg.GetRma(), by(tx))
			if err != nil {
				return nil, err
			}
			tx.SetAuditDetail(msg.GetReason())
			return &apiv1.QuarantineGpuResponse{
				Gpu:     &apiv1.GpuHealth{Uuid: r.gpu.UUID, Index: int32(r.gpu.Index), Model: r.gpu.Model, State: want, Reason: msg.GetReason()},
				Finding: FindingProto(f, n.Name),
			}, nil
		},
	})
}

func describeState(state string) string {
	if state == GPURMA {
		return "marked for RMA"
	}
	return state
}

// LiftGpu puts a quarantined GPU back in placement and resolves its open
// findings.
func (s *Service) LiftGpu(ctx context.Context, req *connect.Request[apiv1.LiftGpuRequest]) (*connect.Response[apiv1.LiftGpuResponse], error) {
	msg := req.Msg
	var r gpuRef
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.LiftGpuResponse]{
		Validate: func() error {
			var vs envelope.Violations
			validateTenant(&vs, msg.GetTenant())
			validateGPU(&vs, msg.GetGpu())
			validateReason(&vs, msg.GetReason())
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (res iam.Resource, err error) {
			r, err = lookupGPU(ctx, q, msg.GetTenant(), msg.GetGpu())
			return r.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.LiftGpuResponse, error) {
			if err := r.notFound(); err != nil {
				return nil, err
			}
			n, err := fleet.NodeGet(ctx, tx, "", r.node.ID)
			if err != nil {
				return nil, err
			}
			if _, err := GPUGet(ctx, tx, r.gpu.UUID); errors.Is(err, store.ErrNotFound) {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "GPU %s of node %s is not quarantined: there is nothing to lift", r.gpu.UUID, n.Name)
			} else if err != nil {
				return nil, err
			}
			resolved, err := s.m.LiftGPU(ctx, tx.Tx, n, r.gpu, msg.GetReason(), by(tx))
			if err != nil {
				return nil, err
			}
			tx.SetAuditDetail(msg.GetReason())
			return &apiv1.LiftGpuResponse{
				Gpu:              &apiv1.GpuHealth{Uuid: r.gpu.UUID, Index: int32(r.gpu.Index), Model: r.gpu.Model, State: "ok"},
				ResolvedFindings: int32(resolved),
			}, nil
		},
	})
}

// ResetBreaker closes a pool's breaker: remediation resumes.
func (s *Service) ResetBreaker(ctx context.Context, req *connect.Request[apiv1.ResetBreakerRequest]) (*connect.Response[apiv1.ResetBreakerResponse], error) {
	msg := req.Msg
	var r poolRef
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.ResetBreakerResponse]{
		Validate: func() error {
			var vs envelope.Violations
			validateTenant(&vs, msg.GetTenant())
			validatePool(&vs, msg.GetTenant(), msg.GetPool(), true)
			validateReason(&vs, msg.GetReason())
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (res iam.Resource, err error) {
			r, err = lookupPool(ctx, q, msg.GetTenant(), msg.GetPool())
			return r.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.ResetBreakerResponse, error) {
			if err := r.notFound(); err != nil {
				return nil, err
			}
			if _, err := s.m.ResetBreaker(ctx, tx.Tx, r.pool.ID, r.pool.TenantID, by(tx), msg.GetReason()); err != nil {
				return nil, err
			}
			st, err := PoolStatusOf(ctx, tx, r.pool.ID, tx.Now())
			if err != nil {
				return nil, err
			}
			tx.SetAuditDetail(msg.GetReason())
			return &apiv1.ResetBreakerResponse{Health: PoolHealthProto(st)}, nil
		},
	})
}

func ts(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func tsp(t *time.Time) *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return ts(*t)
}

// FindingProto is a finding as the API shows it.
func FindingProto(f Finding, nodeName string) *apiv1.HealthFinding {
	return &apiv1.HealthFinding{Id: f.ID, NodeId: f.NodeID, Node: nodeName, TenantId: f.TenantID, PoolId: f.PoolID,
		GpuUuid: f.GPUUUID, GpuIndex: int32(f.GPUIndex), Kind: f.Kind, Code: f.Code, Severity: f.Severity, Message: f.Message,
		Pid: f.PID, ProcessName: f.ProcessName, Action: f.Action, State: f.State, Count: f.Count,
		OccurTime: ts(f.OccurTime), CreateTime: ts(f.CreateTime), UpdateTime: ts(f.UpdateTime), ResolveTime: tsp(f.ResolveTime),
		RemediationId: f.RemediationID}
}

// RemediationProto is a remediation as the API shows it.
func RemediationProto(r Remediation, nodeName string) *apiv1.Remediation {
	return &apiv1.Remediation{Id: r.ID, NodeId: r.NodeID, Node: nodeName, TenantId: r.TenantID, PoolId: r.PoolID,
		GpuUuid: r.GPUUUID, Action: r.Action, State: r.State, Reason: r.Reason, FindingId: r.FindingID, WorkflowId: r.WorkflowID,
		Error: r.Error, CreateTime: ts(r.CreateTime), StartTime: tsp(r.StartTime), EndTime: tsp(r.EndTime)}
}

// PoolHealthProto is a pool's health as the API shows it.
func PoolHealthProto(st PoolStatus) *apiv1.PoolHealth {
	b := st.Breaker
	return &apiv1.PoolHealth{PoolId: st.PoolID, Pool: st.Name, TenantId: st.TenantID, Nodes: int32(st.Nodes),
		NodesUnhealthy: int32(st.Unhealthy), GpusTotal: int32(st.GPUsTotal), GpusOut: int32(st.GPUsOut),
		Budget: int32(st.Budget), BudgetUsed: int32(st.BudgetUsed), Breaker: b.State, BreakerReason: b.Reason,
		BreakerTripTime: tsp(b.TripTime), RemediationsPending: int32(st.Pending)}
}
