package fleet

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/better-compute/better-compute/internal/tracing"
)

// Span attributes of a command's spans.
const (
	AttrCommandID   = "bc.command.id"
	AttrCommandKind = "bc.command.kind"
	AttrNodeID      = "bc.node.id"
	AttrCommandSeq  = "bc.command.seq"
	// AttrCommandRepeat marks a send answered by the command already
	// stored under its idempotency key (which keeps its own traceparent).
	AttrCommandRepeat = "bc.command.repeat"
)

// startSend starts the span of enqueuing a command, a child of the caller's
// span and recorded with the caller's provider (nothing when it records
// nothing). Its traceparent is what the command row carries to the node.
func startSend(ctx context.Context, kind, nodeID string) (trace.Span, string) {
	ctx, span := tracing.FromContext(ctx).Start(ctx, "command.send", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String(AttrCommandKind, kind), attribute.String(AttrNodeID, nodeID)))
	return span, tracing.Traceparent(ctx)
}

// endSend ends a send span with what was stored.
func endSend(span trace.Span, c Command, inserted bool) {
	if span.IsRecording() {
		span.SetAttributes(attribute.String(AttrCommandID, c.ID), attribute.Int64(AttrCommandSeq, c.Seq), attribute.Bool(AttrCommandRepeat, !inserted))
	}
	span.End()
}
