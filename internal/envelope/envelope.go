package envelope

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"connectrpc.com/connect"
	"github.com/riverqueue/river"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/store/dirversion"
)

// AuditEntry is one audit row, written in the mutation's transaction.
type AuditEntry struct {
	ID            string
	Time          time.Time
	TenantID      string
	PrincipalID   string
	PrincipalKind string
	Action        string
	ResourceType  string
	ResourceID    string
	Decision      string
	RequestID     string
	TraceID       string
	Result        string
	// Detail says what the mutation did beyond its resource (the command
	// line of reservations.exec); empty for most.
	Detail string
	// ClientAddr is the caller's address (ClientAddr: X-Forwarded-For only
	// through --trusted-proxies); empty for the control plane's own rows.
	ClientAddr string
}

// Decisions as recorded in the audit log.
const (
	DecisionAllow                = "allow"
	DecisionDeny                 = "deny"
	DecisionConfirmationRequired = "confirmation_required"
	DecisionError                = "error"
)

// Event is an outbox event, written in the mutation's transaction.
type Event struct {
	Type         string
	TenantID     string
	ResourceType string
	ResourceID   string
	Time         time.Time
	Data         map[string]any
}

// Recorder writes audit rows and outbox events inside a transaction. The
// audit and events modules implement it; the envelope only calls it.
type Recorder interface {
	// InsertAudits writes audit rows; a batch hands it many at once.
	InsertAudits(ctx context.Context, tx store.Tx, entries []AuditEntry) error
	InsertEvents(ctx context.Context, tx store.Tx, evs []Event) error
}

// JobInserter enqueues a background job in the caller's transaction.
type JobInserter interface {
	InsertTx(ctx context.Context, tx store.Tx, args river.JobArgs, opts *river.InsertOpts) error
}

// Metrics observes decisions; nil-safe.
type Metrics interface {
	Decision(action, decision string)
}

// Config wires an Envelope.
type Config struct {
	DB       *store.DB
	Authz    iam.Authorizer
	Recorder Recorder
	Jobs     JobInserter
	Clock    clock.Clock
	Logger   *slog.Logger
	Metrics  Metrics
	// ReadCacheTTL bounds how long a read decision is reused; at most 10 s.
	ReadCacheTTL time.Duration
	// WatchRecheck is how often a watch stream decides its reads again
	// (default 30 s), so a policy change reaches a stream that stays open.
	WatchRecheck time.Duration
	// ConfirmationTTL is how long a confirmation may be approved and used.
	ConfirmationTTL time.Duration
	// IdempotencyTTL is how long a create's result is kept for replay.
	IdempotencyTTL time.Duration
	// RefusalAuditLimit is how many refusals of one principal a
	// RefusalAuditWindow writes to the audit log (default 30 a minute); the
	// next writes one row marked AUDIT_RATE_LIMITED and the rest are
	// refused unrecorded (counted in bc_audit_refusals_unrecorded_total).
	RefusalAuditLimit  int
	RefusalAuditWindow time.Duration
	// Limits bound each principal's request rate and open streams.
	Limits Limits
	// Tracing records a span per API call; nil records none.
	Tracing trace.TracerProvider
	// TenantName names a tenant by id for refusal messages (the tenancy
	// module owns the table); nil leaves ids in them.
	TenantName func(ctx context.Context, id string) (string, error)
	// TenantActive reports whether a tenant's principals may mutate (the
	// tenancy module owns the state: tenancy.Active); nil lets every tenant.
	// The interceptor asks it on every mutation, the one place they all
	// pass, so no service can forget a suspension.
	TenantActive func(ctx context.Context, tenantID string) (bool, error)
	// TrustedProxies are the reverse proxies whose X-Forwarded-For names
	// the client recorded in audit rows; a request from anyone else is
	// recorded with its peer address.
	TrustedProxies []netip.Prefix
}

// Envelope runs the API pipeline.
type Envelope struct {
	cfg       Config
	readCache *decisionCache
	refusals  *refusalLimiter
	limiter   *principalLimiter
	directory *dirversion.Directory
}

// New returns an Envelope; it validates the config.
func New(cfg Config) (*Envelope, error) {
	if cfg.DB == nil || cfg.Authz == nil || cfg.Recorder == nil {
		return nil, errors.New("envelope: DB, Authz and Recorder are required")
	}
	if cfg.WatchRecheck < 0 {
		return nil, fmt.Errorf("envelope: watch recheck must not be negative, got %s", cfg.WatchRecheck)
	}
	cfg.Clock = cmp.Or[clock.Clock](cfg.Clock, cfg.DB.Clock())
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	cfg.ReadCacheTTL = min(cmp.Or(cfg.ReadCacheTTL, 10*time.Second), 10*time.Second)
	cfg.WatchRecheck = cmp.Or(cfg.WatchRecheck, 30*time.Second)
	cfg.ConfirmationTTL = cmp.Or(cfg.ConfirmationTTL, 15*time.Minute)
	cfg.IdempotencyTTL = cmp.Or(cfg.IdempotencyTTL, 24*time.Hour)
	cfg.RefusalAuditLimit = cmp.Or(cfg.RefusalAuditLimit, 30)
	cfg.RefusalAuditWindow = cmp.Or(cfg.RefusalAuditWindow, time.Minute)
	return &Envelope{
		cfg:       cfg,
		readCache: newDecisionCache(cfg.ReadCacheTTL, 10000),
		refusals:  newRefusalLimiter(cfg.RefusalAuditLimit, cfg.RefusalAuditWindow),
		limiter:   newPrincipalLimiter(cfg.Limits),
		directory: dirversion.New(cfg.DB),
	}, nil
}

// DB returns the store the envelope writes to.
func (e *Envelope) DB() *store.DB { return e.cfg.DB }

// Directory returns the cache of API keys, tenants, projects and pools
// that unary requests read at the directory version the interceptor read
// for them (see store/dirversion).
func (e *Envelope) Directory() *dirversion.Directory { return e.directory }

// Logger returns the envelope's logger.
func (e *Envelope) Logger() *slog.Logger { return e.cfg.Logger }

// Clock returns the envelope's clock.
func (e *Envelope) Clock() clock.Clock { return e.cfg.Clock }

// InvalidateReadDecisions drops cached read decisions, e.g. after a policy
// change, so a revoked permission stops working at once on this replica.
func (e *Envelope) InvalidateReadDecisions() { e.readCache.clear() }

// Tx is a mutation's transaction: the store transaction plus what the
// envelope records with it.
type Tx struct {
	store.Tx
	env        *Envelope
	caller     Caller
	events     []Event
	resourceID string
	tenantID   string
	detail     string
}

// Caller returns the authenticated caller.
func (t *Tx) Caller() Caller { return t.caller }

// Now returns the envelope clock's time.
func (t *Tx) Now() time.Time { return t.env.cfg.Clock.Now() }

// Emit queues an outbox event, written when Apply returns.
func (t *Tx) Emit(ev Event) {
	if ev.TenantID == "" {
		ev.TenantID = t.tenantID
	}
	t.events = append(t.events, ev)
}

// SetResource records the id (and tenant, for creates of tenants) of the
// resource the mutation created, for the audit row.
func (t *Tx) SetResource(id, tenantID string) {
	t.resourceID = id
	if tenantID != "" {
		t.tenantID = tenantID
	}
}

// SetAuditDetail records what the audit row says beyond the resource, such
// as a command line; the caller bounds and quotes it.
func (t *Tx) SetAuditDetail(detail string) { t.detail = detail }

// Enqueue inserts a job that commits or rolls back with this transaction.
func (t *Tx) Enqueue(ctx context.Context, args river.JobArgs, opts *river.InsertOpts) error {
	if t.env.cfg.Jobs == nil {
		return errors.New("envelope: no job runtime configured")
	}
	return t.env.cfg.Jobs.InsertTx(ctx, t.Tx, args, opts)
}

// UnknownResourceID is the id a Draft gives a resource that does not exist
// when it decides on the resource's tenant instead (so a stranger learns
// nothing); Apply then answers NOT_FOUND.
const UnknownResourceID = "unknown"

// Mutation describes one mutating call to Mutate.
type Mutation[Res any] struct {
	// Validate checks the request's fields; it returns Violations.Err().
	Validate func() error
	// Draft builds the resource the decision is about (request-as-resource),
	// reading what it needs. It runs before any write lock is taken.
	Draft func(ctx context.Context, q store.Querier) (iam.Resource, error)
	// Context, when set, adds request facts to the decision's context, such
	// as the new lifetime an extension asks for. It runs after Draft.
	Context func() map[string]any
	// Apply writes the mutation. It must re-check what Draft read: the world
	// may have moved between the decision and the transaction.
	Apply func(ctx context.Context, tx *Tx) (*Res, error)
	// Replayable, when set, returns what an idempotent replay may answer:
	// a response carrying a secret must strip it, because the stored
	// response sits in the database.
	Replayable func(res *Res) *Res
	// Submit, when set, commits the mutation in a batch with others (the
	// placer's group commit) instead of a transaction of its own: it must
	// call write once inside a transaction, flush the batch before that
	// transaction commits, and return write's error or the commit's. Apply
	// then runs in a transaction shared with other callers' mutations: an
	// error it returns must come before it writes anything, or the committer
	// must run it under a savepoint.
	Submit func(ctx context.Context, write func(ctx context.Context, b *Batch) error) error
	// AuditRefusals, when set, keeps an audit row (decision allow, result
	// the error's machine code) for a request that passed the decision but
	// that Apply refused with an API error — a BMC address outside the
	// site's networks, a busy machine — so refusals of risky requests stay
	// on record like denials do. Nothing else of the request is written. A
	// miss (NOT_FOUND) is no refusal and leaves no row, as for reads.
	AuditRefusals bool
}

// Mutate runs a mutation through the whole envelope and converts errors to
// Connect errors with machine codes.
func Mutate[Req, Res any](ctx context.Context, e *Envelope, req *connect.Request[Req], m Mutation[Res]) (*connect.Response[Res], error) {
	res, err := mutate(ctx, e, req, m)
	if err != nil {
		e.logError(ctx, err)
		return nil, ToConnect(err)
	}
	return connect.NewResponse(res), nil
}

func mutate[Req, Res any](ctx context.Context, e *Envelope, req *connect.Request[Req], m Mutation[Res]) (*Res, error) {
	info := InfoFrom(ctx)
	caller, ok := CallerFrom(ctx)
	if !ok || info.Method.Kind != KindMutation {
		// The interceptor sets both; reaching here without them is a wiring bug,
		// and the safe answer is to refuse.
		return nil, &Error{Code: CodeInternal, Message: "internal error", Err: fmt.Errorf("mutation %s without caller or catalog row", info.Procedure)}
	}
	if m.Validate != nil {
		if err := m.Validate(); err != nil {
			return nil, err
		}
	}
	msg, ok := any(req.Msg).(proto.Message)
	if !ok {
		return nil, &Error{Code: CodeInternal, Message: "internal error", Err: errors.New("request is not a proto message")}
	}
	reqHash, err := requestHash(info.Procedure, msg)
	if err != nil {
		return nil, err
	}

	idemKey := req.Header().Get(HeaderIdempotencyKey)
	if idemKey != "" {
		if err := checkIdempotencyKey(idemKey, info.Method); err != nil {
			return nil, err
		}
		if res, found, err := replay[Res](ctx, e, caller, idemKey, info.Procedure, reqHash); err != nil || found {
			return res, err
		}
	}

	confirmed := false
	confirmationID := req.Header().Get(HeaderConfirmationID)
	if confirmationID != "" {
		if err := e.checkConfirmation(ctx, caller, confirmationID, info.Method.Action, reqHash); err != nil {
			return nil, err
		}
		confirmed = true
	}

	var resource iam.Resource
	if err := e.cfg.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		resource, err = m.Draft(ctx, tx)
		return err
	}); err != nil {
		return nil, FromStore(err, "resource")
	}

	audit := AuditEntry{
		TenantID:      cmp.Or(resource.TenantID, caller.Principal.TenantID),
		PrincipalID:   caller.Principal.ID,
		PrincipalKind: string(caller.Principal.Kind),
		Action:        info.Method.Action,
		ResourceType:  resource.Type,
		ResourceID:    resource.ID,
		RequestID:     info.RequestID,
		TraceID:       info.TraceID,
		ClientAddr:    info.ClientAddr,
	}
	spanTenant(ctx, audit.TenantID)

	decisionCtx := map[string]any{"confirmed": confirmed}
	if m.Context != nil {
		for k, v := range m.Context() {
			if k != "confirmed" {
				decisionCtx[k] = v
			}
		}
	}
	// The one decision of this mutation.
	dec, err := e.cfg.Authz.Authorize(ctx, iam.Request{
		Principal: caller.Principal,
		Action:    info.Method.Action,
		Resource:  resource,
		Context:   decisionCtx,
	})
	switch {
	case err != nil:
		e.observe(ctx, info.Method.Action, DecisionError)
		audit.Decision, audit.Result = DecisionError, string(CodeAuthorizationFailed)
		e.recordRefusal(ctx, audit)
		return nil, &Error{Code: CodeAuthorizationFailed, Message: "authorization is unavailable; nothing was changed", Err: err}
	case dec.ConfirmationRequired && !confirmed && resource.ID == UnknownResourceID:
		// The caller may act in the tenant (only a confirmation stands in
		// its way), so saying NOT_FOUND leaks nothing; opening a
		// confirmation for nothing would ask a human to approve a request
		// that can only fail.
		e.observe(ctx, info.Method.Action, DecisionConfirmationRequired)
		return nil, Errorf(CodeNotFound, "%s not found", words(resource.Type))
	case dec.ConfirmationRequired && !confirmed:
		e.observe(ctx, info.Method.Action, DecisionConfirmationRequired)
		audit.Decision, audit.Result = DecisionConfirmationRequired, string(CodeConfirmationRequired)
		return nil, e.requireConfirmation(ctx, caller, audit, reqHash)
	case !dec.Allowed:
		e.observe(ctx, info.Method.Action, DecisionDeny)
		audit.Decision, audit.Result = DecisionDeny, string(CodePermissionDenied)
		e.recordRefusal(ctx, audit)
		return nil, e.refusal(ctx, caller, info.Method.Action, resource)
	}
	e.observe(ctx, info.Method.Action, DecisionAllow)

	var res *Res
	// write is the mutation's part of a transaction: Apply, then its audit
	// row, events and idempotency record — written at once, or staged in b
	// when the mutation commits in a batch.
	write := func(ctx context.Context, stx store.Tx, b *Batch) error {
		tx := &Tx{Tx: stx, env: e, caller: caller, resourceID: resource.ID, tenantID: audit.TenantID}
		if confirmed {
			if err := confirmationUse(ctx, stx, confirmationID); err != nil {
				return err
			}
		}
		var err error
		if res, err = m.Apply(ctx, tx); err != nil {
			return err
		}
		entry := audit
		entry.ID = NewID("aud", tx.Now())
		entry.Time = tx.Now()
		entry.TenantID, entry.ResourceID = tx.tenantID, tx.resourceID
		entry.Decision, entry.Result = DecisionAllow, "OK"
		entry.Detail = tx.detail
		for i := range tx.events {
			if tx.events[i].Time.IsZero() {
				tx.events[i].Time = tx.Now()
			}
		}
		var idem *idemRecord
		if idemKey != "" {
			stored := res
			if m.Replayable != nil {
				stored = m.Replayable(res)
			}
			body, err := proto.MarshalOptions{Deterministic: true}.Marshal(any(stored).(proto.Message))
			if err != nil {
				return err
			}
			idem = &idemRecord{principalID: caller.Principal.ID, key: idemKey, procedure: info.Procedure, reqHash: reqHash,
				body: body, expire: tx.Now().Add(e.cfg.IdempotencyTTL)}
		}
		if b != nil {
			b.audits = append(b.audits, entry)
			b.events = append(b.events, tx.events...)
			if idem != nil {
				b.idem = append(b.idem, *idem)
			}
			return nil
		}
		if err := e.cfg.Recorder.InsertAudits(ctx, stx, []AuditEntry{entry}); err != nil {
			return err
		}
		if len(tx.events) > 0 {
			if err := e.cfg.Recorder.InsertEvents(ctx, stx, tx.events); err != nil {
				return err
			}
		}
		if idem != nil {
			return idempotencyInsert(ctx, stx, []idemRecord{*idem})
		}
		return nil
	}
	if m.Submit != nil {
		err = m.Submit(ctx, func(ctx context.Context, b *Batch) error { return write(ctx, b.Tx, b) })
	} else {
		err = e.cfg.DB.Write(ctx, func(ctx context.Context, stx store.Tx) error { return write(ctx, stx, nil) })
	}
	if err != nil {
		var apiErr *Error
		if errors.As(err, &apiErr) && apiErr.Code == CodePermissionDenied {
			// The decision allowed it but the handler refused (e.g. a
			// non-human approving a confirmation): a refusal like any other,
			// so it stays on record.
			audit.Decision, audit.Result = DecisionDeny, string(CodePermissionDenied)
			e.recordRefusal(ctx, audit)
			return nil, err
		}
		if m.AuditRefusals && errors.As(err, &apiErr) && apiErr.Code != CodeInternal && apiErr.Code != CodeNotFound {
			audit.Decision, audit.Result = DecisionAllow, string(apiErr.Code)
			if len(apiErr.Message) <= 1024 {
				audit.Detail = apiErr.Message
			}
			e.recordRefusal(ctx, audit)
			return nil, err
		}
		if idemKey != "" && errors.Is(err, errIdempotencyRace) {
			// A concurrent request with the same key committed first: answer
			// with its result, as a replay would.
			if res, found, rerr := replay[Res](ctx, e, caller, idemKey, info.Procedure, reqHash); rerr != nil || found {
				return res, rerr
			}
		}
		return nil, FromStore(err, cmp.Or(resource.Type, "resource"))
	}
	return res, nil
}

// recordRefusal writes the audit row of a refused mutation in its own
// transaction: a refusal changes nothing else, but who tried what stays on
// record — up to RefusalAuditLimit rows per principal and window, so one
// caller cannot flood the audit log of the tenant it targets.
func (e *Envelope) recordRefusal(ctx context.Context, entry AuditEntry) {
	verdict, until := e.refusals.admit(entry.PrincipalID, e.cfg.Clock.Now())
	switch verdict {
	case refusalDrop:
		if m, ok := e.cfg.Metrics.(interface{ RefusalUnrecorded() }); ok {
			m.RefusalUnrecorded()
		}
		return
	case refusalRecordLast:
		entry.Result = ResultAuditLimited
		e.cfg.Logger.WarnContext(ctx, "a principal's refusals exceed the audit limit; further ones are refused without an audit row until the window ends",
			"principal", entry.PrincipalID, "action", entry.Action, "limit", e.cfg.RefusalAuditLimit, "until", until)
	}
	err := e.cfg.DB.Write(context.WithoutCancel(ctx), func(ctx context.Context, tx store.Tx) error {
		entry.ID = NewID("aud", e.cfg.Clock.Now())
		entry.Time = e.cfg.Clock.Now()
		return e.cfg.Recorder.InsertAudits(ctx, tx, []AuditEntry{entry})
	})
	if err != nil {
		e.cfg.Logger.ErrorContext(ctx, "audit of a refused mutation failed", "action", entry.Action, "err", err)
	}
}

func (e *Envelope) observe(ctx context.Context, action, decision string) {
	spanDecision(ctx, decision)
	if e.cfg.Metrics != nil {
		e.cfg.Metrics.Decision(action, decision)
	}
}

func (e *Envelope) logError(ctx context.Context, err error) {
	apiErr := AsError(err)
	info := InfoFrom(ctx)
	// A refusal of the caller's own making (a name taken, a field wrong, a
	// decision that denied) is the caller's business: the access log line
	// already records its code at INFO, so the message goes to DEBUG. A
	// fault of ours is an ERROR.
	level := slog.LevelDebug
	switch apiErr.Code {
	case CodeInternal, CodeAuthorizationFailed:
		level = slog.LevelError
	case CodeUnavailable:
		level = slog.LevelWarn
	}
	e.cfg.Logger.Log(ctx, level, "request refused", "procedure", info.Procedure, "request_id", info.RequestID,
		"trace_id", info.TraceID, "code", apiErr.Code, "message", apiErr.Message, "err", apiErr.Err)
}

// requestHash fingerprints a request so a replay (idempotency or
// confirmation) can prove it is the same request.
func requestHash(procedure string, msg proto.Message) (string, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return "", &Error{Code: CodeInternal, Message: "internal error", Err: err}
	}
	h := sha256.New()
	h.Write([]byte(procedure))
	h.Write([]byte{0})
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil)), nil
}
