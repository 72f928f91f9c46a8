package jobs_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/better-compute/better-compute/internal/jobs"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tracing"
	"github.com/better-compute/better-compute/internal/tracing/tracingtest"
)

// TestJobSpanLinksItsEnqueuer: a job enqueued inside a span is worked in a
// span of its own (exported over OTLP to a real collector), a new root
// linked to the enqueuing span, and the worker's context carries it.
func TestJobSpanLinksItsEnqueuer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	col := tracingtest.Start(t)
	tp, err := tracing.New(context.Background(), tracing.Config{Endpoint: col.Endpoint(), Insecure: true,
		BatchTimeout: 10 * time.Millisecond, Getenv: func(string) string { return "" }})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	inWorker := make(chan trace.SpanContext, 1)
	rt, err := jobs.New(b.db, b.workers(func(ctx context.Context, _ int) error {
		inWorker <- trace.SpanContextFromContext(ctx)
		return nil
	}), nil, jobs.Config{Worker: true, PollInterval: 50 * time.Millisecond, Tracing: tp})
	require.NoError(t, err)
	run(t, rt)

	ctx, enqueuer := tracing.Tracer(tp).Start(context.Background(), "enqueuer")
	require.NoError(t, b.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return rt.InsertTx(ctx, tx, pingArgs{N: 1}, nil)
	}))
	enqueuer.End()
	require.Equal(t, 1, waitDone(t, b))
	worked := <-inWorker
	require.True(t, worked.IsValid())
	require.NotEqual(t, enqueuer.SpanContext().TraceID(), worked.TraceID(), "a job's span is a root of its own")

	want := tracingtest.Link{TraceID: enqueuer.SpanContext().TraceID().String(), SpanID: enqueuer.SpanContext().SpanID().String()}
	spans := col.WaitFor(t, "the job's span", func(spans []tracingtest.Span) bool {
		_, ok := tracingtest.Find(spans, "", "job jobs_test_ping")
		return ok
	})
	job, _ := tracingtest.Find(spans, "", "job jobs_test_ping")
	require.Equal(t, worked.SpanID().String(), job.SpanID)
	require.Empty(t, job.ParentSpanID)
	require.Contains(t, job.Links, want, "linked to the span that enqueued it")
	require.Equal(t, "jobs_test_ping", job.Attrs["bc.job.kind"])
	require.Equal(t, "1", job.Attrs["bc.job.attempt"])
}

// TestNoTracingNoMetadata: without a tracer provider a job's metadata stays
// as River writes it, even when the enqueuer carries a trace.
func TestNoTracingNoMetadata(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rt, err := jobs.New(b.db, nil, nil, jobs.Config{})
	require.NoError(t, err)
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	require.NoError(t, b.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return rt.InsertTx(ctx, tx, pingArgs{N: 1}, nil)
	}))
	var n int
	require.NoError(t, b.db.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM river_job WHERE CAST(metadata AS TEXT) LIKE '%bc_traceparent%'`).Scan(&n)
	}))
	require.Zero(t, n)
}
