package envelope

import (
	"context"
	"net/http"

	"github.com/better-compute/better-compute/internal/iam"
)

// Caller is an authenticated principal and how it proved who it is.
type Caller struct {
	Principal iam.Principal
	// AuthenticatedBy is "api-key" or "oidc".
	AuthenticatedBy string
	// CredentialID is the API key id, when a key was used.
	CredentialID string
}

// Human reports whether the caller is a person (kind user), the only kind
// that may approve confirmations.
func (c Caller) Human() bool { return c.Principal.Kind == iam.KindUser }

// Authenticator turns request headers into a Caller. It returns an *Error
// with CodeUnauthenticated when the credentials are missing or refused.
type Authenticator interface {
	Authenticate(ctx context.Context, h http.Header) (Caller, error)
}

// RequestInfo describes the request being served, for logs and audit.
type RequestInfo struct {
	RequestID string
	TraceID   string
	// ClientAddr is the caller's address as the audit log records it.
	ClientAddr string
	Procedure  string
	Method     Method
}

type callerKey struct{}
type infoKey struct{}

// WithCaller returns ctx carrying the caller.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFrom returns the caller the interceptor authenticated.
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

func withInfo(ctx context.Context, info RequestInfo) context.Context {
	return context.WithValue(ctx, infoKey{}, info)
}

// InfoFrom returns the request's info.
func InfoFrom(ctx context.Context) RequestInfo {
	info, _ := ctx.Value(infoKey{}).(RequestInfo)
	return info
}

// Header names the envelope reads.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderConfirmationID = "Bc-Confirmation-Id"
	HeaderRequestID      = "X-Request-Id"
	HeaderTraceparent    = "Traceparent"
)
