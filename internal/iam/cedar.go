package iam

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"sync"

	"github.com/cedar-policy/cedar-go"
	publicast "github.com/cedar-policy/cedar-go/ast"
	"github.com/cedar-policy/cedar-go/types"
	"github.com/cedar-policy/cedar-go/x/exp/ast"
)

// Annotations the authorizer understands. Validate rejects any other, so a
// typo like @confim cannot silently turn a confirmation into a hard deny.
const (
	annotationID          = "id"
	annotationConfirm     = "confirm"
	annotationDescription = "description"
)

// Cedar is the embedded Authorizer: the shipped default policies plus the
// policies of the principal's tenant, evaluated by cedar-go.
type Cedar struct {
	src      PolicySource
	model    *model
	defaults cedar.PolicyMap

	mu sync.Mutex
	// tenants caches each tenant's parsed policies, keyed by tenant and
	// checked against a hash of the texts, so an edit is picked up on the
	// next request and only the latest version per tenant is kept.
	tenants map[string]tenantPolicies
}

type tenantPolicies struct {
	hash     [sha256.Size]byte
	policies cedar.PolicyMap
}

var _ Authorizer = (*Cedar)(nil)

// NewCedar parses the embedded schema and default policies. src supplies
// tenant policies and may be nil (defaults only).
func NewCedar(src PolicySource) (*Cedar, error) {
	m, err := loadModel()
	if err != nil {
		return nil, err
	}
	files, err := defaultPolicyFiles()
	if err != nil {
		return nil, fmt.Errorf("read default policies: %w", err)
	}
	defaults := cedar.PolicyMap{}
	for _, path := range slices.Sorted(maps.Keys(files)) {
		list, err := cedar.NewPolicyListFromBytes(path, files[path])
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", path, err)
		}
		for _, p := range list {
			// Default policies are named by @id so decision reasons read as
			// "tenant-admin", not "policy3".
			id, ok := p.Annotations()[annotationID]
			if !ok || id == "" {
				return nil, fmt.Errorf("%s:%d: default policy without @id", path, p.Position().Line)
			}
			if _, dup := defaults[cedar.PolicyID(id)]; dup {
				return nil, fmt.Errorf("%s: duplicate @id %q", path, id)
			}
			if err := checkReferences(m, p); err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			defaults[cedar.PolicyID(id)] = p
		}
	}
	return &Cedar{src: src, model: m, defaults: defaults, tenants: map[string]tenantPolicies{}}, nil
}

// Authorize evaluates req. It fails closed: every error comes with a deny.
func (c *Cedar) Authorize(ctx context.Context, req Request) (Decision, error) {
	action, ok := c.model.actions[req.Action]
	if !ok {
		return Decision{}, fmt.Errorf("iam: unknown action %q", req.Action)
	}
	if _, ok := principalTypes[req.Principal.Kind]; !ok {
		// A node certificate (or an unknown kind) reaching the API is
		// a plain deny, not a server fault.
		return Decision{Reasons: []string{fmt.Sprintf("principal kind %q has no api permissions", req.Principal.Kind)}}, nil
	}
	proj, err := c.model.project(req)
	if err != nil {
		return Decision{}, fmt.Errorf("iam: %w", err)
	}
	// Catches envelope bugs such as authorizing projects.create against the
	// tenant: an `in tenant` policy would happily allow it.
	if !c.model.appliesToResource(action, proj.resource.Type) {
		return Decision{}, fmt.Errorf("iam: action %q does not apply to resource type %q", req.Action, req.Resource.Type)
	}
	rctx, err := requestContext(req.Context, nil)
	if err != nil {
		return Decision{}, fmt.Errorf("iam: %w", err)
	}

	policies := policyChain{c.defaults}
	// A tenant's policies only govern its own principals acting on its own
	// resources, so they are loaded only when both sit in the same tenant.
	if t := req.Principal.TenantID; c.src != nil && t != "" && t == resourceTenant(req.Resource) {
		tp, err := c.tenantPolicies(ctx, t)
		if err != nil {
			return Decision{}, fmt.Errorf("iam: tenant %s policies: %w", t, err)
		}
		policies = append(policies, tp)
	}

	creq := cedar.Request{
		Principal: proj.principal,
		Action:    actionUID(req.Action),
		Resource:  proj.resource,
		Context:   rctx,
	}
	dec, diag := cedar.Authorize(policies, proj.entities, creq)
	if dec == cedar.Allow {
		return Decision{Allowed: true, Reasons: sortedIDs(diag.Reasons)}, nil
	}
	out := Decision{Reasons: sortedIDs(diag.Reasons)}
	for _, e := range diag.Errors {
		out.Reasons = append(out.Reasons, fmt.Sprintf("policy %s: %s", e.PolicyID, e.Message))
	}
	if c.confirmable(policies, proj, creq, req, diag.Reasons) {
		out.ConfirmationRequired = true
	}
	return out, nil
}

// confirmable reports whether a deny is only waiting for a human: every
// forbid that fired carries @confirm, and the same request with
// confirmed=true is allowed (so there is a permit to unlock, and confirming
// would not merely trade one deny for another).
func (c *Cedar) confirmable(policies policyChain, proj projection, creq cedar.Request, req Request, forbids []types.DiagnosticReason) bool {
	if len(forbids) == 0 {
		return false
	}
	if v, _ := creq.Context.Get(ContextConfirmed); v == types.True {
		return false
	}
	for _, r := range forbids {
		p := policies.get(r.PolicyID)
		if p == nil {
			return false
		}
		if _, ok := p.Annotations()[annotationConfirm]; !ok {
			return false
		}
	}
	yes := true
	rctx, err := requestContext(req.Context, &yes)
	if err != nil {
		return false
	}
	creq.Context = rctx
	dec, _ := cedar.Authorize(policies, proj.entities, creq)
	return dec == cedar.Allow
}

// tenantPolicies returns the tenant's parsed policies, reparsing only when
// the stored texts changed.
func (c *Cedar) tenantPolicies(ctx context.Context, tenantID string) (cedar.PolicyMap, error) {
	docs, err := c.src.TenantPolicies(ctx, tenantID)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	for _, d := range docs {
		// Lengths keep ("ab","c") and ("a","bc") apart.
		fmt.Fprintf(h, "%d:%s%d:%s", len(d.ID), d.ID, len(d.Text), d.Text)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])

	c.mu.Lock()
	cached, ok := c.tenants[tenantID]
	c.mu.Unlock()
	if ok && cached.hash == sum {
		return cached.policies, nil
	}
	pm, err := parseTenantPolicies(tenantID, docs)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.tenants[tenantID] = tenantPolicies{hash: sum, policies: pm}
	c.mu.Unlock()
	return pm, nil
}

// parseTenantPolicies parses a tenant's documents and confines each policy
// to the tenant: it gains `when { principal in T && resource in T }`, so even
// a careless `permit(principal, action, resource)` cannot reach beyond it.
// A document that no longer parses fails the request (closed), since
// skipping it could drop a forbid.
func parseTenantPolicies(tenantID string, docs []TenantPolicy) (cedar.PolicyMap, error) {
	tenant := ast.Value(tenantUID(tenantID))
	confine := ast.Principal().In(tenant).And(ast.Resource().In(tenant))
	pm := cedar.PolicyMap{}
	for _, d := range docs {
		name := "tenant/" + tenantID + "/" + d.ID
		list, err := cedar.NewPolicyListFromBytes(name, []byte(d.Text))
		if err != nil {
			return nil, fmt.Errorf("policy %s: %w", d.ID, err)
		}
		for i, p := range list {
			id := name
			if i > 0 {
				id = fmt.Sprintf("%s#%d", name, i)
			}
			orig := (*ast.Policy)(p.AST())
			confined := *orig
			confined.Conditions = append([]ast.ConditionType{{Condition: ast.ConditionWhen, Body: confine.AsIsNode()}}, orig.Conditions...)
			pm[cedar.PolicyID(id)] = cedar.NewPolicyFromAST((*publicast.Policy)(&confined))
		}
	}
	return pm, nil
}

// policyChain evaluates several policy maps as one set without copying them
// into a fresh PolicySet per request.
type policyChain []cedar.PolicyMap

func (pc policyChain) All() iter.Seq2[cedar.PolicyID, *cedar.Policy] {
	return func(yield func(cedar.PolicyID, *cedar.Policy) bool) {
		for _, m := range pc {
			for id, p := range m {
				if !yield(id, p) {
					return
				}
			}
		}
	}
}

func (pc policyChain) get(id cedar.PolicyID) *cedar.Policy {
	for _, m := range pc {
		if p, ok := m[id]; ok {
			return p
		}
	}
	return nil
}

var errNoPolicies = errors.New("no policy statements")
