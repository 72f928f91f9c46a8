package agent

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/tracing"
)

// startCommandSpan starts the span of applying c, a child of the span that
// sent it (Command.traceparent). With tracing off in bcd the command's own
// trace context passes through unchanged, so the control plane still
// learns which trace the update belongs to.
func (a *Agent) startCommandSpan(ctx context.Context, c *agentv1.Command) (context.Context, trace.Span) {
	ctx = tracing.WithTraceparent(ctx, c.GetTraceparent())
	return tracing.Tracer(a.cfg.Tracing).Start(ctx, "bcd.command", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("bc.command.id", c.GetId()), attribute.String("bc.command.kind", c.GetKind()),
			attribute.Int64("bc.command.seq", int64(min(c.GetSeq(), 1<<63-1))), attribute.String("bc.node.id", a.NodeID())))
}

// endCommandSpan records the final state on the span, ends it, and puts its
// traceparent on the update that reports it.
func endCommandSpan(ctx context.Context, span trace.Span, final *agentv1.CommandUpdate) {
	final.Traceparent = tracing.Traceparent(ctx)
	if span.IsRecording() {
		span.SetAttributes(attribute.String("bc.command.state", final.GetState().String()))
		if final.GetFailureCode() != "" {
			span.SetAttributes(attribute.String("bc.command.failure_code", final.GetFailureCode()))
		}
		if final.GetState() == agentv1.CommandState_COMMAND_STATE_FAILED {
			span.SetStatus(codes.Error, final.GetFailureCode())
		}
	}
	span.End()
}
