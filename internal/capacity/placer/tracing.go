package placer

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/better-compute/better-compute/internal/tracing"
)

// Span attributes of the placer's spans.
const (
	AttrPoolID    = "bc.pool.id"
	AttrBatchSize = "bc.placer.batch_size"
	AttrPerItem   = "bc.placer.per_item"
)

// startBatchSpan starts the span of one placer transaction. A batch
// carries many callers' mutations, so it belongs to no one caller's trace:
// it is a root linked to each caller's span.
func (p *placer) startBatchSpan(ws []*work, perItem bool) trace.Span {
	if !tracing.On(p.e.Tracing) {
		// The placer is the hot path: off, no links to build.
		return noop.Span{}
	}
	links := make([]trace.Link, 0, len(ws))
	for _, w := range ws {
		if sc := trace.SpanContextFromContext(w.ctx); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	_, span := tracing.Tracer(p.e.Tracing).Start(context.Background(), "placer.batch", trace.WithNewRoot(), trace.WithLinks(links...),
		trace.WithAttributes(attribute.String(AttrPoolID, p.poolID), attribute.Int(AttrBatchSize, len(ws)), attribute.Bool(AttrPerItem, perItem)))
	return span
}

// startItemSpan starts the span of one caller's placement inside a batch:
// a child of the caller's span, so what the placement sends (a node's
// allocation.bind) joins the caller's trace, linked to the batch that
// committed it.
func (p *placer) startItemSpan(ctx context.Context, w *work, batch trace.Span, size int) (context.Context, trace.Span) {
	if !tracing.On(p.e.Tracing) {
		return ctx, noop.Span{}
	}
	parent := trace.ContextWithSpanContext(ctx, trace.SpanContextFromContext(w.ctx))
	return tracing.Tracer(p.e.Tracing).Start(parent, "placer.place", trace.WithLinks(trace.Link{SpanContext: batch.SpanContext()}),
		trace.WithAttributes(attribute.String(AttrPoolID, p.poolID), attribute.Int(AttrBatchSize, size)))
}

// endSpan ends span, marking it failed by err.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
