package envelope

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/store"
)

// Code is a stable machine code. Clients branch on it; it never changes
// meaning once shipped.
type Code string

// The machine codes this API answers with.
const (
	CodeInvalidArgument        Code = "INVALID_ARGUMENT"
	CodeNotFound               Code = "NOT_FOUND"
	CodeAlreadyExists          Code = "ALREADY_EXISTS"
	CodePermissionDenied       Code = "PERMISSION_DENIED"
	CodeUnauthenticated        Code = "UNAUTHENTICATED"
	CodeConfirmationRequired   Code = "CONFIRMATION_REQUIRED"
	CodeIdempotencyKeyReused   Code = "IDEMPOTENCY_KEY_REUSED"
	CodeFailedPrecondition     Code = "FAILED_PRECONDITION"
	CodeConflict               Code = "CONFLICT"
	CodeUnavailable            Code = "UNAVAILABLE"
	CodeInternal               Code = "INTERNAL"
	CodeAuthorizationFailed    Code = "AUTHORIZATION_UNAVAILABLE"
	CodeConfirmationNotUsable  Code = "CONFIRMATION_NOT_USABLE"
	CodeResourceExhaustedLimit Code = "RESOURCE_EXHAUSTED"
	// CodeQuotaExceeded: a quota of the tenant or project would be exceeded;
	// the detail carries the quota effect.
	CodeQuotaExceeded Code = "QUOTA_EXCEEDED"
	// CodeSpendLimitReached: the tenant's hard budget for the period would be
	// passed; the message names the amounts.
	CodeSpendLimitReached Code = "SPEND_LIMIT_REACHED"
	// CodeNoCapacity: no node can hold the request; the detail carries the
	// explanation by node class.
	CodeNoCapacity Code = "NO_CAPACITY"
	// CodeRateLimited: the principal made more requests than its rate
	// allows; retry after the error's retry delay.
	CodeRateLimited Code = "RATE_LIMITED"
	// CodeTooManyStreams: the principal holds as many watch streams as it
	// may; close one, or retry after the error's retry delay.
	CodeTooManyStreams Code = "TOO_MANY_STREAMS"
	// CodeDigestMismatch: uploaded bytes disagree with the sha256 or size
	// the request declared; nothing was kept.
	CodeDigestMismatch Code = "DIGEST_MISMATCH"
	// CodeUnknownSigner: the signing key is on neither the owner's nor the
	// platform's signer allowlist.
	CodeUnknownSigner Code = "UNKNOWN_SIGNER"
	// CodeImageUntrusted: no trusted key signed the image for this use
	// (deploy, promote; a ramdisk needs the platform's signature).
	CodeImageUntrusted Code = "IMAGE_UNTRUSTED"
	// CodeImageInUse: something (a deployed machine) uses the image; the
	// detail names it in the message.
	CodeImageInUse Code = "IMAGE_IN_USE"
	// CodeReleaseUntrusted: a release manifest is not signed by one of the
	// control plane's release public keys, or its signature does not verify.
	CodeReleaseUntrusted Code = "RELEASE_UNTRUSTED"
	// CodeExecNotIsolated: the process would run on a node that does not
	// confine it (no exec.isolated) in a pool shared beyond its owner.
	CodeExecNotIsolated Code = "EXEC_NOT_ISOLATED"
	// CodeQuorumRequired: the command kind is destructive and runs only in
	// a command batch a quorum of the tenant's approvers signed.
	CodeQuorumRequired Code = "QUORUM_REQUIRED"
	// CodeTenantSuspended: the caller's tenant is suspended; it may read,
	// but every mutation is refused.
	CodeTenantSuspended Code = "TENANT_SUSPENDED"
)

var connectCodes = map[Code]connect.Code{
	CodeInvalidArgument:        connect.CodeInvalidArgument,
	CodeNotFound:               connect.CodeNotFound,
	CodeAlreadyExists:          connect.CodeAlreadyExists,
	CodePermissionDenied:       connect.CodePermissionDenied,
	CodeUnauthenticated:        connect.CodeUnauthenticated,
	CodeConfirmationRequired:   connect.CodeFailedPrecondition,
	CodeIdempotencyKeyReused:   connect.CodeFailedPrecondition,
	CodeFailedPrecondition:     connect.CodeFailedPrecondition,
	CodeConflict:               connect.CodeAborted,
	CodeUnavailable:            connect.CodeUnavailable,
	CodeInternal:               connect.CodeInternal,
	CodeAuthorizationFailed:    connect.CodeUnavailable,
	CodeConfirmationNotUsable:  connect.CodeFailedPrecondition,
	CodeQuorumRequired:         connect.CodeFailedPrecondition,
	CodeTenantSuspended:        connect.CodeFailedPrecondition,
	CodeResourceExhaustedLimit: connect.CodeResourceExhausted,
	CodeQuotaExceeded:          connect.CodeResourceExhausted,
	CodeSpendLimitReached:      connect.CodeResourceExhausted,
	CodeNoCapacity:             connect.CodeResourceExhausted,
	CodeRateLimited:            connect.CodeResourceExhausted,
	CodeTooManyStreams:         connect.CodeResourceExhausted,
	CodeDigestMismatch:         connect.CodeInvalidArgument,
	CodeUnknownSigner:          connect.CodeFailedPrecondition,
	CodeImageUntrusted:         connect.CodeFailedPrecondition,
	CodeImageInUse:             connect.CodeFailedPrecondition,
	CodeReleaseUntrusted:       connect.CodeFailedPrecondition,
	CodeExecNotIsolated:        connect.CodeFailedPrecondition,
}

// canonicalCodes maps a bare Connect code (from Connect itself, not the
// envelope) back to one machine code; several machine codes share a Connect
// code, and a map iteration must not pick among them by chance.
var canonicalCodes = map[connect.Code]Code{
	connect.CodeInvalidArgument:    CodeInvalidArgument,
	connect.CodeNotFound:           CodeNotFound,
	connect.CodeAlreadyExists:      CodeAlreadyExists,
	connect.CodePermissionDenied:   CodePermissionDenied,
	connect.CodeUnauthenticated:    CodeUnauthenticated,
	connect.CodeFailedPrecondition: CodeFailedPrecondition,
	connect.CodeAborted:            CodeConflict,
	connect.CodeUnavailable:        CodeUnavailable,
	connect.CodeInternal:           CodeInternal,
	connect.CodeResourceExhausted:  CodeResourceExhaustedLimit,
}

// Violation names a refused request field and why.
type Violation struct {
	Field  string `json:"field"`
	Reason string `json:"reason"`
}

// Error is an API error: a machine code, a user-facing message and, where
// they apply, field violations or a confirmation id. Internal detail goes in
// Err, which is logged and never sent.
type Error struct {
	Code           Code
	Message        string
	Violations     []Violation
	ConfirmationID string
	// Explanation (NO_CAPACITY) and Quota (QUOTA_EXCEEDED) ride in the
	// detail so clients can render them.
	Explanation *apiv1.Explanation
	Quota       *apiv1.QuotaEffect
	// RetryAfter, when set, is sent as a google.rpc.RetryInfo detail and a
	// Retry-After header (whole seconds).
	RetryAfter time.Duration
	// Status, when set, replaces the Connect code the machine code maps
	// to: a NO_CAPACITY that waiting cannot cure is FAILED_PRECONDITION
	// (400), not the retryable RESOURCE_EXHAUSTED (429).
	Status connect.Code
	Err    error
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Message, e.Err)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an API error with a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Invalid returns an INVALID_ARGUMENT error for the given violations.
func Invalid(vs ...Violation) *Error {
	msg := "invalid request"
	if len(vs) > 0 {
		msg = fmt.Sprintf("invalid %s: %s", vs[0].Field, vs[0].Reason)
		if len(vs) > 1 {
			msg += fmt.Sprintf(" (and %d more)", len(vs)-1)
		}
	}
	return &Error{Code: CodeInvalidArgument, Message: msg, Violations: vs}
}

// NotFound returns a NOT_FOUND error for a resource kind and key.
func NotFound(kind, key string) *Error {
	return Errorf(CodeNotFound, "%s %q not found", kind, key)
}

// storeRetryAfter is the retry hint sent with a store timeout.
const storeRetryAfter = time.Second

// FromStore turns a store error into an API error, keeping the store's
// detail for the log only.
func FromStore(err error, what string) error {
	var apiErr *Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &apiErr):
		return apiErr
	case errors.Is(err, store.ErrNotFound):
		return &Error{Code: CodeNotFound, Message: what + " not found", Err: err}
	case errors.Is(err, store.ErrUnique):
		return &Error{Code: CodeAlreadyExists, Message: what + " already exists", Err: err}
	case errors.Is(err, store.ErrConstraint):
		return &Error{Code: CodeFailedPrecondition, Message: what + " violates a constraint", Err: err}
	case errors.Is(err, store.ErrSerialization):
		return &Error{Code: CodeConflict, Message: "concurrent update, retry", Err: err}
	case errors.Is(err, store.ErrLockTimeout):
		// Nothing was changed and the holder will finish: retryable, after
		// a pause rather than at once into the same queue.
		return &Error{Code: CodeUnavailable, Message: "the database is busy (waited too long for a lock), retry", RetryAfter: storeRetryAfter, Err: err}
	case errors.Is(err, store.ErrStatementTimeout):
		return &Error{Code: CodeUnavailable, Message: "the database is busy (a statement took too long), retry", RetryAfter: storeRetryAfter, Err: err}
	default:
		return &Error{Code: CodeInternal, Message: "internal error", Err: err}
	}
}

// ToConnect converts any error into a Connect error carrying an ErrorDetail.
func ToConnect(err error) *connect.Error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	apiErr := AsError(err)
	status := connectCodes[apiErr.Code]
	if apiErr.Status != 0 {
		status = apiErr.Status
	}
	cerr := connect.NewError(status, errors.New(apiErr.Message))
	detail := &apiv1.ErrorDetail{
		Code:           string(apiErr.Code),
		Message:        apiErr.Message,
		ConfirmationId: apiErr.ConfirmationID,
		Explanation:    apiErr.Explanation,
		Quota:          apiErr.Quota,
	}
	for _, v := range apiErr.Violations {
		detail.Violations = append(detail.Violations, &apiv1.FieldViolation{Field: v.Field, Reason: v.Reason})
	}
	if d, derr := connect.NewErrorDetail(detail); derr == nil {
		cerr.AddDetail(d)
	}
	if apiErr.RetryAfter > 0 {
		if d, derr := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(apiErr.RetryAfter)}); derr == nil {
			cerr.AddDetail(d)
		}
		cerr.Meta().Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(apiErr.RetryAfter.Seconds())))))
	}
	return cerr
}

// RetryDelayOf returns the retry delay a Connect error's google.rpc.RetryInfo
// detail carries, or 0.
func RetryDelayOf(err error) time.Duration {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return 0
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if ri, ok := v.(*errdetails.RetryInfo); ok {
				return ri.GetRetryDelay().AsDuration()
			}
		}
	}
	return 0
}

// AsError returns err as an *Error, classifying anything else as INTERNAL or
// by its store kind.
func AsError(err error) *Error {
	var apiErr *Error
	if errors.As(err, &apiErr) {
		return apiErr
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return &Error{Code: codeFromConnect(ce.Code()), Message: ce.Message(), Err: err}
	}
	if errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrUnique) ||
		errors.Is(err, store.ErrConstraint) || errors.Is(err, store.ErrSerialization) ||
		errors.Is(err, store.ErrLockTimeout) || errors.Is(err, store.ErrStatementTimeout) {
		return AsError(FromStore(err, "resource"))
	}
	return &Error{Code: CodeInternal, Message: "internal error", Err: err}
}

func codeFromConnect(c connect.Code) Code {
	if k, ok := canonicalCodes[c]; ok {
		return k
	}
	return CodeInternal
}

// DetailOf extracts the ErrorDetail from a Connect error returned to a client.
func DetailOf(err error) *apiv1.ErrorDetail {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil
	}
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if derr != nil {
			continue
		}
		if ed, ok := v.(*apiv1.ErrorDetail); ok {
			return ed
		}
	}
	return nil
}
