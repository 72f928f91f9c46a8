package gateway

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/tracing"
)

// Span attributes of a command's completion.
const (
	AttrCommandState       = "bc.command.state"
	AttrCommandFailureCode = "bc.command.failure_code"
)

// maxTraceparent bounds Command and CommandUpdate traceparents: a W3C one
// is 55 bytes; the rest of a longer one is no trace context of ours.
const maxTraceparent = 256

// traceCommandDone records a command's span from its enqueue to the node's
// final report: a child of the command's send span (the traceparent its
// row carries), linked to the agent's span that applied it. Spans cannot
// outlive a process, and the report may reach another replica than the one
// that sent the command, so the span is recorded whole when the report
// arrives, starting at the command's create time. A command sent without a
// trace (tracing off where it was sent) gets none.
func (g *Gateway) traceCommandDone(c fleet.Command, u *agentv1.CommandUpdate, state string) {
	parent := tracing.SpanContext(c.Traceparent)
	if !parent.IsValid() {
		return
	}
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), parent)
	var links []trace.Link
	if l, ok := tracing.Link(u.GetTraceparent()); ok {
		links = append(links, l)
	}
	now, start := time.Now(), c.CreateTime
	if start.IsZero() || start.After(now) {
		// A simulated clock ahead of the wall clock: the span's length
		// would be meaningless, its start is not.
		start = now
	}
	_, span := tracing.Tracer(g.cfg.Tracing).Start(ctx, "command.complete", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithTimestamp(start), trace.WithLinks(links...),
		trace.WithAttributes(attribute.String(fleet.AttrCommandID, c.ID), attribute.String(fleet.AttrCommandKind, c.Kind),
			attribute.String(fleet.AttrNodeID, c.NodeID), attribute.Int64(fleet.AttrCommandSeq, c.Seq),
			attribute.String(AttrCommandState, state)))
	if fc := u.GetFailureCode(); fc != "" {
		span.SetAttributes(attribute.String(AttrCommandFailureCode, fc))
	}
	if state == fleet.CommandFailed {
		span.SetStatus(codes.Error, u.GetFailureCode())
	}
	span.End(trace.WithTimestamp(now))
}
