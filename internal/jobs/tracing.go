package jobs

import (
	"context"
	"encoding/json"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/better-compute/better-compute/internal/tracing"
)

// MetadataTraceparent is the job metadata key holding the traceparent of
// the span that enqueued the job.
const MetadataTraceparent = "bc_traceparent"

// Span attributes of a job's span.
const (
	AttrJobKind    = "bc.job.kind"
	AttrJobID      = "bc.job.id"
	AttrJobAttempt = "bc.job.attempt"
	AttrJobQueue   = "bc.job.queue"
)

// traceMiddleware carries trace context through River: an insert records
// the enqueuing span's traceparent in the job's metadata, and a worked job
// runs in a span of its own linked to it. A link, not a parent: a job may
// run long after the request that enqueued it has answered, retry, or
// coalesce several enqueues into one (unique jobs).
type traceMiddleware struct {
	river.MiddlewareDefaults
	tracer trace.Tracer
}

var (
	_ rivertype.JobInsertMiddleware = (*traceMiddleware)(nil)
	_ rivertype.WorkerMiddleware    = (*traceMiddleware)(nil)
)

func (m *traceMiddleware) InsertMany(ctx context.Context, params []*rivertype.JobInsertParams, doInner func(context.Context) ([]*rivertype.JobInsertResult, error)) ([]*rivertype.JobInsertResult, error) {
	if tp := tracing.Traceparent(ctx); tp != "" {
		for _, p := range params {
			p.Metadata = withMetadata(p.Metadata, MetadataTraceparent, tp)
		}
	}
	return doInner(ctx)
}

func (m *traceMiddleware) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	opts := []trace.SpanStartOption{trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String(AttrJobKind, job.Kind), attribute.Int64(AttrJobID, job.ID),
			attribute.Int(AttrJobAttempt, job.Attempt), attribute.String(AttrJobQueue, job.Queue))}
	if l, ok := tracing.Link(metadataString(job.Metadata, MetadataTraceparent)); ok {
		opts = append(opts, trace.WithLinks(l))
	}
	ctx, span := m.tracer.Start(ctx, "job "+job.Kind, opts...)
	defer span.End()
	err := doInner(ctx)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}

// withMetadata returns metadata (a JSON object, or empty) with key set.
func withMetadata(metadata []byte, key, value string) []byte {
	m := map[string]json.RawMessage{}
	if len(metadata) > 0 && json.Unmarshal(metadata, &m) != nil {
		// Not an object: leave what the caller wrote alone.
		return metadata
	}
	v, _ := json.Marshal(value)
	m[key] = v
	out, err := json.Marshal(m)
	if err != nil {
		return metadata
	}
	return out
}

// metadataString returns the string under key in a job's metadata, or "".
func metadataString(metadata []byte, key string) string {
	var m map[string]any
	if json.Unmarshal(metadata, &m) != nil {
		return ""
	}
	s, _ := m[key].(string)
	return s
}
