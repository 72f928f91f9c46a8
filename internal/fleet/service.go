package fleet

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/gpumodel"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// CertRevoker revokes every certificate of a node; *pki.Authority
// implements it. It runs its own transaction, so it is called after the
// deletion commits.
type CertRevoker interface {
	RevokeNode(ctx context.Context, nodeID, reason string) (int, error)
}

// JoinClaims are what a join token says about the node that presents it.
// They match pki.JoinClaims field for field, so the app converts one into
// the other.
type JoinClaims struct {
	TokenID   string            `json:"jti"`
	TenantID  string            `json:"tnt"`
	ProjectID string            `json:"prj"`
	Pool      string            `json:"pool,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	ExpiresAt time.Time         `json:"exp"`
}

// TokenSealer seals join claims into the token string an operator hands to
// a machine; the app adapts *pki.Authority to it.
type TokenSealer interface {
	SealJoinToken(JoinClaims) (string, error)
}

// CommandNotifier wakes the session that owns a node after a command for it
// was inserted or canceled. The gateway implements it (NOTIFY on
// PostgreSQL, an in-process wake registered with tx.AfterCommit on SQLite);
// it must only act once tx commits.
type CommandNotifier interface {
	NotifyCommand(tx store.Tx, nodeID string)
}

// SiteResolver resolves the site a site token binds (the machine
// lifecycle implements it): its id, or found false.
type SiteResolver interface {
	ResolveSite(ctx context.Context, q store.Querier, tenantID, ref string) (id string, found bool, err error)
}

// Deps are what the fleet API needs from the rest of the control plane.
type Deps struct {
	// Sites resolves site tokens' sites; without it a site cannot be bound.
	Sites SiteResolver
	// Revoker is required by NodeService.Delete.
	Revoker CertRevoker
	// Sealer is required by JoinTokenService.Create.
	Sealer TokenSealer
	// Notifier may be nil: commands then wait for the node's next poll.
	Notifier CommandNotifier
	// Signer signs every command this API inserts (nil: unsigned, which
	// a node that pinned command-signing roots refuses).
	Signer CommandSigner
	// States, when set, is told in the transaction of nodes that started
	// or stopped taking work (drain, undrain), so capacity's placers read
	// them again.
	States NodeStateHook
}

// NodeStateHook hears of nodes whose state changed whether they take work.
type NodeStateHook interface {
	NodesStateChanged(ctx context.Context, tx store.Tx, nodeIDs []string) error
}

func (d Deps) stateChanged(ctx context.Context, tx store.Tx, nodeID string) error {
	if d.States == nil {
		return nil
	}
	return d.States.NodesStateChanged(ctx, tx, []string{nodeID})
}

func (d Deps) notify(tx store.Tx, nodeID string) {
	if d.Notifier != nil {
		d.Notifier.NotifyCommand(tx, nodeID)
	}
}

// errNotWired is what a handler answers when the app did not give it a
// dependency it needs: a deployment bug, never the caller's fault.
func errNotWired(what string) error {
	return &envelope.Error{Code: envelope.CodeInternal, Message: "internal error", Err: errors.New("fleet: no " + what + " wired")}
}

// NodeResource projects a node into the authorization model.
func NodeResource(n Node) iam.Resource {
	return iam.Resource{Type: "Node", ID: n.ID, TenantID: n.TenantID, ProjectID: n.ProjectID,
		Attrs: map[string]any{"name": n.Name, "pool": n.Pool, "state": n.State}}
}

// nodeRef is a request's reference to a node, optionally confined to a
// tenant, as resolved before the decision.
type nodeRef struct {
	tenantRef, ref string
	tenant         tenancy.Tenant
	tenantFound    bool
	node           Node
	found          bool
}

// lookupNode resolves a node for a draft or a read. Misses are not errors
// yet: the decision comes first (on the named tenant, or on the platform
// when none was named or it does not exist), so a stranger learns nothing
// about another tenant's nodes.
func lookupNode(ctx context.Context, q store.Querier, tenantRef, ref string) (nodeRef, error) {
	r := nodeRef{tenantRef: tenantRef, ref: ref}
	if tenantRef != "" {
		var err error
		if r.tenant, r.tenantFound, err = tenancy.LookupTenant(ctx, q, tenantRef); err != nil || !r.tenantFound {
			return r, err
		}
	}
	n, err := NodeGet(ctx, q, r.tenant.ID, ref)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return r, nil
	case err != nil:
		return r, err
	}
	r.node, r.found = n, true
	return r, nil
}

// resource is what the decision is about: the node, or its container when
// it was not found.
func (r nodeRef) resource() iam.Resource {
	if r.found {
		return NodeResource(r.node)
	}
	return iam.Resource{Type: "Node", ID: "unknown", TenantID: r.tenant.ID}
}

// notFound says what was missing, after the decision allowed the call.
func (r nodeRef) notFound() error {
	if r.tenantRef != "" && !r.tenantFound {
		return envelope.NotFound("tenant", r.tenantRef)
	}
	if !r.found {
		return envelope.NotFound("node", r.ref)
	}
	return nil
}

// container resolves the tenant a list or a tenant-scoped call names; ""
// means the platform, which projects as the Platform (only platform admins
// pass).
func container(ctx context.Context, env *envelope.Envelope, ref string) (tenancy.Tenant, bool, iam.Resource, error) {
	if ref == "" {
		return tenancy.Tenant{}, true, tenancy.PlatformResource(), nil
	}
	var (
		t     tenancy.Tenant
		found bool
	)
	err := env.Resolve(ctx, "tenant", func(ctx context.Context, q store.Querier) (err error) {
		t, found, err = tenancy.LookupTenant(ctx, q, ref)
		return err
	})
	return t, found, tenancy.TenantResource(t), err
}

var (
	// Node names come from host names, so dots are allowed.
	nodeNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$`)
	labelKeyRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,125}[A-Za-z0-9])?$`)
)

// validateTenant checks an optional tenant reference.
func validateTenant(vs *envelope.Violations, ref string) {
	if ref != "" {
		vs.Ref("tenant", ref, "tnt")
	}
}

// validateNode checks a node reference: a nod_ id or a node name.
func validateNode(vs *envelope.Violations, field, ref string) {
	switch {
	case ref == "":
		vs.Add(field, "is required")
	case strings.Contains(ref, "_"):
		if !envelope.IsID(ref, NodeIDPrefix) {
			vs.Add(field, "is not a valid %s id", NodeIDPrefix)
		}
	case !nodeNameRE.MatchString(ref):
		vs.Add(field, "must be a node name (lower-case host name) or a %s_ id", NodeIDPrefix)
	}
}

// validateOneOf checks an optional filter value against its allowed values.
func validateOneOf(vs *envelope.Violations, field, value string, allowed ...string) {
	if value != "" && !slices.Contains(allowed, value) {
		vs.Add(field, "must be one of %s, got %q", strings.Join(allowed, ", "), truncate(value))
	}
}

const (
	maxLabels        = 64
	maxLabelValueLen = 255
)

// validateLabels checks label keys (like Kubernetes': alphanumerics with
// . _ / - inside, at most 127 bytes) and values (printable, at most 255).
func validateLabels(vs *envelope.Violations, field string, labels map[string]string) {
	if len(labels) > maxLabels {
		vs.Add(field, "must have at most %d labels, got %d", maxLabels, len(labels))
		return
	}
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		v := labels[k]
		if !labelKeyRE.MatchString(k) {
			vs.Add(field, "key %q must be alphanumeric with . _ / - inside, at most 127 bytes", truncate(k))
			continue
		}
		if len(v) > maxLabelValueLen || strings.IndexFunc(v, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
			vs.Add(field, "value of %q must be printable and at most %d bytes", k, maxLabelValueLen)
		}
	}
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// labelsJSON encodes labels for a JSON text column.
func labelsJSON(labels map[string]string) (string, error) {
	if len(labels) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(labels)
	return string(b), err
}

// labelsMap decodes a JSON text column written by labelsJSON; text that does
// not decode yields no labels.
func labelsMap(s string) map[string]string {
	var m map[string]string
	if json.Unmarshal([]byte(s), &m) != nil {
		return nil
	}
	return m
}

func stringsOf(s string) []string {
	var out []string
	if json.Unmarshal([]byte(s), &out) != nil {
		return nil
	}
	return out
}

// structOf decodes a JSON object column into a Struct; text that does not
// decode yields nil.
func structOf(s string) *structpb.Struct {
	if s == "" || s == "{}" {
		return nil
	}
	st := &structpb.Struct{}
	if protojson.Unmarshal([]byte(s), st) != nil {
		return nil
	}
	return st
}

func timestamp(t *time.Time) *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return timestamppb.New(*t)
}

// NodeProto converts a node for the API.
func NodeProto(n Node, conds []NodeCondition) *apiv1.Node {
	// The pool a node is in is capacity's membership; the join token's pool
	// (n.Pool) only until capacity has reconciled the node.
	poolName := n.Pool
	if n.MemberPool != nil {
		poolName = *n.MemberPool
	}
	out := &apiv1.Node{
		Id: n.ID, Name: n.Name, TenantId: n.TenantID, ProjectId: n.ProjectID, Pool: poolName, Labels: labelsMap(n.Labels),
		State: n.State, Liveness: n.Liveness, Mode: n.Mode, AgentVersion: n.AgentVersion,
		Capabilities: stringsOf(n.Capabilities), GpuCount: int32(n.GPUCount), GpuModel: n.GPUModel,
		LastHeartbeat: timestamp(n.LastHeartbeat), CreateTime: timestamppb.New(n.CreateTime),
		DerivedLabels: gpumodel.Labels(n.FirstGPU, n.GPUCount, n.FirstGPUMemMiB),
		Attestor:      n.Attestor, AttestedId: n.AttestedID, TrustAnchorId: n.TrustAnchorID,
	}
	// The labels the node reports (its Kubernetes Node's) are derived
	// from its inventory too; pool selectors see them, under the labels
	// an operator or join token set.
	for k, v := range labelsMap(n.ReportedLabels) {
		if _, set := out.Labels[k]; !set {
			if out.DerivedLabels == nil {
				out.DerivedLabels = map[string]string{}
			}
			out.DerivedLabels[k] = v
		}
	}
	for _, c := range conds {
		out.Conditions = append(out.Conditions, ConditionProto(c))
	}
	return out
}

// ConditionProto converts a node condition for the API.
func ConditionProto(c NodeCondition) *apiv1.NodeCondition {
	return &apiv1.NodeCondition{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message, UpdateTime: timestamppb.New(c.UpdateTime)}
}

// SealedParams are command params the API never returns: an instance's
// seed carries its user data (a sandbox's secret environment) and its SSH
// host key, meant for the guest alone.
var SealedParams = []string{"seed"}

// ParamsOpener gives the params a command of one kind is delivered with,
// from the params it is stored with: secrets another module sealed at rest
// (an instance's user data and host key) are opened for the agent alone,
// on its mTLS session. The gateway calls it per delivery; an error fails
// a pending command (UNENCODABLE) rather than send it without them.
type ParamsOpener func(c Command) (string, error)

// ParamsOpeners are the openers by command kind; kinds without one go out
// as stored.
type ParamsOpeners map[string]ParamsOpener

// Open returns the params c is delivered with.
func (o ParamsOpeners) Open(c Command) (string, error) {
	if open := o[c.Kind]; open != nil {
		return open(c)
	}
	return c.Params, nil
}

// paramsView is a command's params as the API shows them, SealedParams
// left out.
func paramsView(s string) *structpb.Struct {
	st := structOf(s)
	for _, k := range SealedParams {
		if st != nil && st.Fields[k] != nil {
			delete(st.Fields, k)
		}
	}
	return st
}

// CommandProto converts a command for the API.
func CommandProto(c Command) *apiv1.Command {
	return &apiv1.Command{
		Id: c.ID, TenantId: c.TenantID, NodeId: c.NodeID, Seq: c.Seq, Kind: c.Kind, Params: paramsView(c.Params),
		State: c.State, Progress: int32(c.Progress), Message: c.Message, Result: structOf(c.Result),
		FailureCode: c.FailureCode, CreatedBy: c.CreatedBy, Deadline: timestamppb.New(c.Deadline),
		CreateTime: timestamppb.New(c.CreateTime), UpdateTime: timestamppb.New(c.UpdateTime),
	}
}

// JoinTokenProto converts a join token's row for the API; it never carries
// the token.
func JoinTokenProto(t JoinToken, now time.Time) *apiv1.JoinToken {
	return &apiv1.JoinToken{
		Id: t.ID, TenantId: t.TenantID, ProjectId: t.ProjectID, Pool: t.Pool, Labels: labelsMap(t.Labels),
		CreatedBy: t.CreatedBy, State: t.State(now), CreateTime: timestamppb.New(t.CreateTime),
		ExpireTime: timestamppb.New(t.ExpireTime), RevokeTime: timestamp(t.RevokeTime), UsedTime: timestamp(t.UsedTime),
		NodeId: t.NodeID, Role: cmp.Or(t.Role, RoleNode), SiteId: t.SiteID, Attestor: t.Attestor,
	}
}

// JoinRequestProto converts a join request for the API.
func JoinRequestProto(r JoinRequest) *apiv1.JoinRequest {
	return &apiv1.JoinRequest{
		Id: r.ID, TenantId: r.TenantID, TokenId: r.TokenID, HardwareKey: r.HardwareKey, Identity: r.Identity,
		Reason: r.Reason, State: r.State, DecidedBy: r.DecidedBy, NodeId: r.NodeID,
		CreateTime: timestamppb.New(r.CreateTime), DecideTime: timestamp(r.DecideTime),
	}
}
