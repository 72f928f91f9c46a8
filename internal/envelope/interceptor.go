package envelope

import (
	"context"
	"errors"
	"net/http"
	"regexp"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
)

var (
	requestIDRE   = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)
	traceparentRE = regexp.MustCompile(`^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$`)
)

// Interceptor is the first stage of the envelope for every procedure:
// request and trace ids, the catalog lookup (an uncatalogued procedure is
// refused), authentication, strict decoding, metrics and the access log.
type Interceptor struct {
	env     *Envelope
	authn   Authenticator
	metrics *PromMetrics
}

// NewInterceptor returns the envelope's Connect interceptor.
func NewInterceptor(env *Envelope, authn Authenticator, metrics *PromMetrics) *Interceptor {
	return &Interceptor{env: env, authn: authn, metrics: metrics}
}

// begin starts a call. A unary call reads the directory version here, once,
// for every cached lookup of the request (authentication first: see
// store/dirversion); a stream outlives any version it would read, so its
// lookups read the database.
func (i *Interceptor) begin(ctx context.Context, procedure, peer string, h http.Header, unary bool) (context.Context, error) {
	info := RequestInfo{Procedure: procedure, RequestID: h.Get(HeaderRequestID), ClientAddr: ClientAddr(peer, h, i.env.cfg.TrustedProxies)}
	if !requestIDRE.MatchString(info.RequestID) {
		info.RequestID = NewID("req", i.env.cfg.Clock.Now())
	}
	if m := traceparentRE.FindStringSubmatch(h.Get(HeaderTraceparent)); m != nil {
		info.TraceID = m[1]
	}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		// The call's span (tracing on): the logs and the audit row name
		// the trace it is exported in.
		info.TraceID = sc.TraceID().String()
	}
	m, ok := Lookup(procedure)
	if !ok {
		ctx = withInfo(ctx, info)
		return ctx, Errorf(CodeInternal, "procedure %s has no catalog row", procedure)
	}
	info.Method = m
	ctx = withInfo(ctx, info)
	// Refused on every method that does not honour it, reads and streams
	// included: a caller who sends one expects a retry to be safe, and a
	// silently ignored key would let it believe so.
	if key := h.Get(HeaderIdempotencyKey); key != "" {
		if err := checkIdempotencyKey(key, m); err != nil {
			return ctx, err
		}
	}
	// A call with no credentials reads no version: it has no key to look
	// up, and a stranger's requests should cost the database nothing (its
	// few lookups, if any, read the database as a stream's do).
	if unary && h.Get("Authorization") != "" {
		var err error
		if ctx, err = i.env.directory.Begin(ctx); err != nil {
			return ctx, FromStore(err, "directory version")
		}
	}
	caller, err := i.authn.Authenticate(ctx, h)
	if err != nil {
		return ctx, err
	}
	ctx = WithCaller(ctx, caller)
	if m.Kind == KindMutation && caller.Principal.TenantID != "" && i.env.cfg.TenantActive != nil {
		// A suspended tenant's principals still read; they change nothing.
		// Its running work is the hosts' and keeps running.
		active, err := i.env.cfg.TenantActive(ctx, caller.Principal.TenantID)
		if err != nil {
			return ctx, FromStore(err, "tenant")
		}
		if !active {
			return ctx, Errorf(CodeTenantSuspended, "tenant %s is suspended: its keys may read, but every mutation is refused until a platform administrator resumes it", caller.Principal.TenantID)
		}
	}
	// After authentication, so the bucket is the principal's and a stranger
	// cannot spend another's.
	return ctx, i.env.limiter.allow(caller.Principal.ID, i.env.cfg.Clock.Now())
}

func (i *Interceptor) finish(ctx context.Context, procedure string, start time.Time, err error) {
	code := "OK"
	if err != nil {
		code = string(AsError(err).Code)
		// Handlers return Connect errors already; their detail keeps the
		// machine code that the Connect code alone would blur.
		if d := DetailOf(err); d != nil {
			code = d.GetCode()
		}
	}
	if i.metrics != nil {
		i.metrics.Request(procedure, code, time.Since(start))
	}
	info := InfoFrom(ctx)
	attrs := []any{"procedure", procedure, "code", code, "request_id", info.RequestID, "duration_ms", float64(time.Since(start).Microseconds()) / 1000}
	if info.TraceID != "" {
		attrs = append(attrs, "trace_id", info.TraceID)
	}
	if c, ok := CallerFrom(ctx); ok {
		attrs = append(attrs, "principal", c.Principal.ID)
	}
	i.env.cfg.Logger.InfoContext(ctx, "request", attrs...)
	endSpan(ctx, code, err)
}

// WrapUnary implements connect.Interceptor.
func (i *Interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		start := time.Now()
		ctx = i.startSpan(ctx, req.Spec().Procedure, req.Header())
		ctx, err := i.begin(ctx, req.Spec().Procedure, req.Peer().Addr, req.Header(), true)
		if err == nil {
			err = strictFields(req.Any())
		}
		ctx = WithRequestedTenant(ctx, req.Any())
		var res connect.AnyResponse
		if err == nil {
			res, err = next(ctx, req)
		}
		i.finish(ctx, req.Spec().Procedure, start, err)
		if err != nil {
			cerr := ToConnect(err)
			cerr.Meta().Set(HeaderRequestID, InfoFrom(ctx).RequestID)
			return nil, cerr
		}
		res.Header().Set(HeaderRequestID, InfoFrom(ctx).RequestID)
		return res, nil
	}
}

// WrapStreamingClient implements connect.Interceptor.
func (i *Interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler implements connect.Interceptor.
func (i *Interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		start := time.Now()
		ctx = i.startSpan(ctx, conn.Spec().Procedure, conn.RequestHeader())
		ctx, err := i.begin(ctx, conn.Spec().Procedure, conn.Peer().Addr, conn.RequestHeader(), false)
		var done func()
		if err == nil {
			caller, _ := CallerFrom(ctx)
			done, err = i.env.limiter.openStream(caller.Principal.ID)
		}
		if err == nil {
			conn.ResponseHeader().Set(HeaderRequestID, InfoFrom(ctx).RequestID)
			err = next(ctx, &strictConn{StreamingHandlerConn: conn})
			done()
		}
		if errors.Is(err, context.Canceled) {
			err = nil
		}
		i.finish(ctx, conn.Spec().Procedure, start, err)
		if err != nil {
			cerr := ToConnect(err)
			cerr.Meta().Set(HeaderRequestID, InfoFrom(ctx).RequestID)
			return cerr
		}
		return nil
	}
}

type strictConn struct {
	connect.StreamingHandlerConn
}

func (c *strictConn) Receive(msg any) error {
	if err := c.StreamingHandlerConn.Receive(msg); err != nil {
		return err
	}
	return strictFields(msg)
}

// strictFields refuses fields this server does not know. The JSON codec
// already refuses them; binary protobuf keeps them as unknown bytes, which
// would otherwise be silently ignored.
func strictFields(msg any) error {
	m, ok := msg.(proto.Message)
	if !ok {
		return nil
	}
	if len(m.ProtoReflect().GetUnknown()) > 0 {
		return Invalid(Violation{Field: "body", Reason: "has fields this server does not know"})
	}
	return CheckText(m) // control and bidi characters in any string field
}
