// Package iam decides whether a principal may perform an action on a resource.
//
// It defines the Authorizer port that the API envelope calls exactly once per
// request, with the resource as it would be after the mutation (a draft for
// creates), and two adapters: Cedar, an embedded policy engine with a shipped
// schema and default policies, and AuthZEN, a client for a remote policy
// decision point that fails closed.
//
// This package must never touch the database: tenant policies arrive through
// the PolicySource port, and whatever loads them owns the storage and its
// caching. Keeping it pure makes a decision a function of its inputs, which is
// what lets the tests enumerate every action × role.
package iam

import (
	"context"
	"fmt"
)

// PrincipalKind says what sort of caller a principal is.
type PrincipalKind string

// Principal kinds. Nodes authenticate with certificates on fleet paths and
// have no API permissions, so the Cedar adapter denies them.
const (
	KindUser    PrincipalKind = "user"
	KindService PrincipalKind = "service"
	KindAgent   PrincipalKind = "agent"
	KindNode    PrincipalKind = "node"
)

// Role is the coarse permission level a principal holds in its tenant (or on
// the platform).
type Role string

// Roles the default policies know.
const (
	RolePlatformAdmin Role = "platform-admin"
	RoleAdmin         Role = "admin"
	RoleMember        Role = "member"
	// RoleOperator is a member who also runs the fleet's day: drains and
	// undrains nodes, quarantines and lifts GPUs, resets a pool's health
	// breaker. No credentials, no deletes a member cannot do.
	RoleOperator Role = "operator"
	RoleViewer   Role = "viewer"
	RoleAgent    Role = "agent"
)

// Principal is the authenticated caller.
type Principal struct {
	ID   string
	Kind PrincipalKind
	Name string
	// TenantID is "" for a platform-level principal.
	TenantID string
	Role     Role
}

// Resource is what the action is applied to: for a mutation, the draft of the
// resource as it would be afterwards; for a list, the container being listed.
type Resource struct {
	// Type is the Cedar entity type name without namespace: "Platform",
	// "Tenant", "Project", "ApiKey", "Policy", "Confirmation", "AuditLog",
	// "EventStream", "Node", "Command", "JoinToken", "JoinRequest".
	Type string
	// ID may be "" for a draft not yet created; the adapters then use DraftID.
	ID string
	// TenantID is "" for platform-level resources.
	TenantID string
	// ProjectID is "" when the resource is not in a project.
	ProjectID string
	// Attrs are the attributes policies need. Values may be string, bool,
	// int, int64, []string, or map[string]any of those.
	Attrs map[string]any
}

// DraftID names a resource that has no id yet, so policies can still be
// written against its type and parents.
const DraftID = "draft"

// PlatformID is the id of the single Platform entity at the root of every
// parent chain.
const PlatformID = "platform"

// ContextConfirmed is the context key the envelope sets to true when a human
// approved a confirmation for this request. It defaults to false.
const ContextConfirmed = "confirmed"

// Request is one authorization question.
type Request struct {
	Principal Principal
	// Action is one of Actions(), e.g. "projects.create".
	Action   string
	Resource Resource
	Context  map[string]any
}

// Decision is the answer. ConfirmationRequired implies !Allowed: the request
// would be allowed once a human confirms it.
type Decision struct {
	Allowed              bool
	ConfirmationRequired bool
	// Reasons are the ids of the policies that determined the decision, or
	// error text; for logs and audit, never shown to the caller verbatim.
	Reasons []string
}

// Authorizer answers authorization requests. Implementations fail closed: on
// error the Decision is a deny.
type Authorizer interface {
	Authorize(ctx context.Context, req Request) (Decision, error)
}

// TenantPolicy is one stored tenant policy document (one or more Cedar
// statements).
type TenantPolicy struct {
	ID   string
	Text string
}

// PolicySource supplies a tenant's stored policies. It is the only way
// policies reach this package.
type PolicySource interface {
	TenantPolicies(ctx context.Context, tenantID string) ([]TenantPolicy, error)
}

// ValidationError says why a policy document was rejected, in terms the API
// can return as a field violation.
type ValidationError struct {
	// Field is "text" or "text:line N".
	Field  string
	Reason string
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("invalid policy %s: %s", e.Field, e.Reason)
}
