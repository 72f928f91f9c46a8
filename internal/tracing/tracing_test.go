package tracing_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/better-compute/better-compute/internal/tracing"
	"github.com/better-compute/better-compute/internal/tracing/tracingtest"
)

func env(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

func TestEnabled(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  tracing.Config
		want bool
	}{
		{"nothing configured", tracing.Config{Getenv: env(nil)}, false},
		{"flag", tracing.Config{Endpoint: "127.0.0.1:4317", Getenv: env(nil)}, true},
		{"standard variable", tracing.Config{Getenv: env(map[string]string{tracing.EnvEndpoint: "http://c:4317"})}, true},
		{"traces variable", tracing.Config{Getenv: env(map[string]string{tracing.EnvTracesEndpoint: "http://c:4317"})}, true},
		{"sdk disabled wins", tracing.Config{Endpoint: "127.0.0.1:4317", Getenv: env(map[string]string{tracing.EnvSDKDisabled: "TRUE"})}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, tc.cfg.Enabled())
		})
	}
}

// TestOffRecordsNothing: the off provider's spans record nothing and give
// no traceparent, unless the caller's trace context passes through.
func TestOffRecordsNothing(t *testing.T) {
	t.Parallel()
	p, err := tracing.New(context.Background(), tracing.Config{Getenv: env(nil)})
	require.NoError(t, err)
	require.False(t, p.Enabled())
	require.Nil(t, p.IfEnabled())
	ctx, span := tracing.Tracer(p).Start(context.Background(), "x")
	require.False(t, span.IsRecording())
	require.Empty(t, tracing.Traceparent(ctx))
	span.End()

	const caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	ctx, span = tracing.Tracer(p).Start(tracing.WithTraceparent(context.Background(), caller), "x")
	require.False(t, span.IsRecording())
	require.Equal(t, caller, tracing.Traceparent(ctx), "the caller's context passes through untouched")
	require.NoError(t, p.Shutdown(context.Background()))
}

func TestTraceparentRoundTrip(t *testing.T) {
	t.Parallel()
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	sc := tracing.SpanContext(tp)
	require.True(t, sc.IsValid())
	require.True(t, sc.IsRemote())
	require.Equal(t, "0af7651916cd43dd8448eb211c80319c", sc.TraceID().String())
	require.Equal(t, tp, tracing.TraceparentOf(sc))
	for _, bad := range []string{"", "garbage", "00-00000000000000000000000000000000-b7ad6b7169203331-01"} {
		require.False(t, tracing.SpanContext(bad).IsValid(), bad)
		_, ok := tracing.Link(bad)
		require.False(t, ok)
		require.Equal(t, context.Background(), tracing.WithTraceparent(context.Background(), bad))
	}
}

// TestExportsOverOTLP: an enabled provider exports to a real OTLP/gRPC
// collector, with its service name, parentage and FromContext's tracer.
func TestExportsOverOTLP(t *testing.T) {
	t.Parallel()
	col := tracingtest.Start(t)
	p, err := tracing.New(context.Background(), tracing.Config{Endpoint: col.Endpoint(), Insecure: true,
		ServiceName: "svc", BatchTimeout: 10 * time.Millisecond, Getenv: env(nil)})
	require.NoError(t, err)
	require.True(t, p.Enabled())
	ctx, parent := tracing.Tracer(p).Start(context.Background(), "parent")
	_, child := tracing.FromContext(ctx).Start(ctx, "child", trace.WithAttributes())
	child.End()
	parent.End()
	require.NoError(t, p.Shutdown(context.Background()))
	spans := col.WaitFor(t, "both spans", func(s []tracingtest.Span) bool { return len(s) == 2 })
	c, ok := tracingtest.Find(spans, "svc", "child")
	require.True(t, ok)
	pa, ok := tracingtest.Find(spans, "svc", "parent")
	require.True(t, ok)
	require.Equal(t, pa.SpanID, c.ParentSpanID)
	require.Equal(t, pa.TraceID, c.TraceID)
	require.NoError(t, p.Shutdown(context.Background()), "twice is fine")
}

func TestOn(t *testing.T) {
	t.Parallel()
	p, err := tracing.New(context.Background(), tracing.Config{Endpoint: "127.0.0.1:1", Insecure: true, Getenv: env(nil)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	require.True(t, tracing.On(p))
	require.False(t, tracing.On(tracing.Off()))
	require.False(t, tracing.On(nil))
	require.False(t, tracing.On(noop.NewTracerProvider()))
}
