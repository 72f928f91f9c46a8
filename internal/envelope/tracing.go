package envelope

import (
	"context"
	"net/http"
	"strings"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/better-compute/better-compute/internal/tracing"
)

// Span attributes the envelope sets on an API call's span.
const (
	AttrRequestID         = "bc.request_id"
	AttrPrincipalKind     = "bc.principal.kind"
	AttrPrincipalTenantID = "bc.principal.tenant_id"
	AttrTenantID          = "bc.tenant.id"
	AttrDecision          = "bc.decision"
	AttrCode              = "bc.code"
)

// startSpan starts the API call's server span, a child of the caller's
// traceparent when it sent one. With tracing off it starts nothing.
func (i *Interceptor) startSpan(ctx context.Context, procedure string, h http.Header) context.Context {
	if !tracing.On(i.env.cfg.Tracing) {
		// Off: no span, and nothing downstream (commands, jobs) inherits a
		// trace context; the logs still get the caller's trace id.
		return ctx
	}
	ctx = tracing.WithTraceparent(ctx, h.Get(HeaderTraceparent))
	service, method, _ := strings.Cut(strings.TrimPrefix(procedure, "/"), "/")
	ctx, _ = tracing.Tracer(i.env.cfg.Tracing).Start(ctx, procedure, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("rpc.system", "connect_rpc"),
			attribute.String("rpc.service", service), attribute.String("rpc.method", method)))
	return ctx
}

// endSpan records who called, the outcome and its machine code, and ends
// the span. Only a fault of ours marks it an error: a refusal is the
// caller's business, as in the logs.
func endSpan(ctx context.Context, code string, err error) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{attribute.String(AttrCode, code), attribute.String(AttrRequestID, InfoFrom(ctx).RequestID)}
	if c, ok := CallerFrom(ctx); ok {
		attrs = append(attrs, attribute.String(AttrPrincipalKind, string(c.Principal.Kind)),
			attribute.String(AttrPrincipalTenantID, c.Principal.TenantID))
	}
	span.SetAttributes(attrs...)
	if err != nil {
		switch connect.CodeOf(ToConnect(err)) {
		case connect.CodeInternal, connect.CodeUnknown, connect.CodeUnavailable, connect.CodeDataLoss, connect.CodeDeadlineExceeded:
			span.SetStatus(codes.Error, code)
		}
	}
	span.End()
}

// spanDecision records the call's authorization decision on its span.
func spanDecision(ctx context.Context, decision string) {
	trace.SpanFromContext(ctx).SetAttributes(attribute.String(AttrDecision, decision))
}

// spanTenant records the tenant a mutation acts in on its span.
func spanTenant(ctx context.Context, tenantID string) {
	if tenantID != "" {
		trace.SpanFromContext(ctx).SetAttributes(attribute.String(AttrTenantID, tenantID))
	}
}
