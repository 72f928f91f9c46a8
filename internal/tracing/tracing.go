// Package tracing sets up OpenTelemetry traces for the control plane and
// bcd: an OTLP/gRPC exporter when an endpoint is configured, a no-op
// provider otherwise, and the W3C traceparent helpers that carry one trace
// across what a context cannot: command rows, job metadata and the agent
// protocol.
//
// It must never make tracing a requirement: with no endpoint every span is
// the API's no-op, and a collector that is down never fails or slows a
// request (spans are exported in batches, off the request path).
package tracing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// InstrumentationName names the tracer every span of this project comes
// from.
const InstrumentationName = "github.com/better-compute/better-compute"

// The standard OTLP variables that turn tracing on without a flag.
const (
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvSDKDisabled    = "OTEL_SDK_DISABLED"
)

// Config configures a Provider.
type Config struct {
	// Endpoint is the OTLP/gRPC collector: host:port (TLS unless Insecure)
	// or a URL (http:// is plaintext, https:// TLS). Empty falls back to
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT,
	// which the exporter reads with the rest of the OTEL_EXPORTER_OTLP_*
	// variables; with none of them set tracing is off.
	Endpoint string
	// Insecure sends to a host:port Endpoint without TLS (a collector on
	// loopback or in the same pod).
	Insecure bool
	// ServiceName is the resource's service.name (better-compute or bcd).
	ServiceName    string
	ServiceVersion string
	// Attributes are added to the resource, e.g. the replica or node id.
	Attributes []attribute.KeyValue
	// BatchTimeout is the longest a finished span waits to be exported
	// (default 5s); tests shorten it.
	BatchTimeout time.Duration
	// Getenv reads the environment (default os.Getenv); tests replace it.
	Getenv func(string) string
}

// Enabled reports whether cfg turns tracing on: an endpoint configured, in
// the config or the standard environment, and the SDK not disabled.
func (c Config) Enabled() bool {
	getenv := c.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	if strings.EqualFold(strings.TrimSpace(getenv(EnvSDKDisabled)), "true") {
		return false
	}
	return c.Endpoint != "" || getenv(EnvTracesEndpoint) != "" || getenv(EnvEndpoint) != ""
}

// Provider is the process's tracer provider: the SDK's when tracing is on,
// the no-op one when off.
type Provider struct {
	trace.TracerProvider
	sdk *sdktrace.TracerProvider
}

// Off returns a Provider that records nothing.
func Off() *Provider { return &Provider{TracerProvider: noop.NewTracerProvider()} }

// New returns the provider cfg asks for. Off costs nothing: the no-op
// provider allocates no spans and exports nothing.
func New(ctx context.Context, cfg Config) (*Provider, error) {
	if !cfg.Enabled() {
		return Off(), nil
	}
	var opts []otlptracegrpc.Option
	switch {
	case strings.Contains(cfg.Endpoint, "://"):
		opts = append(opts, otlptracegrpc.WithEndpointURL(cfg.Endpoint))
	case cfg.Endpoint != "":
		opts = append(opts, otlptracegrpc.WithEndpoint(cfg.Endpoint))
		if cfg.Insecure {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
	}
	// New does not dial: a collector that is not up yet is retried on
	// export, and the process starts regardless.
	exp, err := otlptracegrpc.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: otlp exporter: %w", err)
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", cmp.Or(cfg.ServiceName, "better-compute"))}
	if cfg.ServiceVersion != "" {
		attrs = append(attrs, attribute.String("service.version", cfg.ServiceVersion))
	}
	attrs = append(attrs, cfg.Attributes...)
	// Not merged with resource.Default(): its schema URL may differ from
	// ours, and its attributes (SDK name and version) are not worth an
	// error at start.
	res := resource.NewSchemaless(attrs...)
	sdk := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(cmp.Or(cfg.BatchTimeout, 5*time.Second))),
		sdktrace.WithResource(res),
		// A caller's traceparent decides whether its request is sampled;
		// a request without one is.
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())),
	)
	return &Provider{TracerProvider: sdk, sdk: sdk}, nil
}

// Enabled reports whether spans are recorded and exported.
func (p *Provider) Enabled() bool { return p != nil && p.sdk != nil }

// IfEnabled returns p when it records spans and nil when it does not, for
// a component that skips its tracing work entirely on nil.
func (p *Provider) IfEnabled() trace.TracerProvider {
	if !p.Enabled() {
		return nil
	}
	return p
}

// ForceFlush exports the spans that have ended and not yet been sent.
func (p *Provider) ForceFlush(ctx context.Context) error {
	if !p.Enabled() {
		return nil
	}
	return p.sdk.ForceFlush(ctx)
}

// Shutdown flushes and stops the exporter; safe to call twice.
func (p *Provider) Shutdown(ctx context.Context) error {
	if !p.Enabled() {
		return nil
	}
	err := p.sdk.Shutdown(ctx)
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("tracing: spans not exported before shutdown: %w", err)
	}
	return err
}

// On reports whether tp records spans: a hot path skips its tracing work
// (parsing headers, building links) when it does not.
func On(tp trace.TracerProvider) bool {
	if tp == nil {
		return false
	}
	if p, ok := tp.(*Provider); ok {
		return p.Enabled()
	}
	_, noopTP := tp.(noop.TracerProvider)
	return !noopTP
}

// Tracer returns the project's tracer from tp, or the no-op tracer when tp
// is nil (a component built without tracing).
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return noop.NewTracerProvider().Tracer(InstrumentationName)
	}
	return tp.Tracer(InstrumentationName)
}

// FromContext returns the tracer of the span in ctx: a component with no
// provider of its own (the fleet's command store) records its spans with
// its caller's, and records nothing when the caller does not.
func FromContext(ctx context.Context) trace.Tracer {
	return trace.SpanFromContext(ctx).TracerProvider().Tracer(InstrumentationName)
}

var w3c = propagation.TraceContext{}

// Traceparent returns the W3C traceparent of the span in ctx, or "" when
// ctx has none (tracing off and no caller's traceparent).
func Traceparent(ctx context.Context) string {
	c := propagation.MapCarrier{}
	w3c.Inject(ctx, c)
	return c.Get("traceparent")
}

// TraceparentOf returns the W3C traceparent of sc, or "" when it is not
// valid.
func TraceparentOf(sc trace.SpanContext) string {
	return Traceparent(trace.ContextWithSpanContext(context.Background(), sc))
}

// SpanContext parses a W3C traceparent; a missing or malformed one gives
// the zero (invalid) span context.
func SpanContext(traceparent string) trace.SpanContext {
	if traceparent == "" {
		return trace.SpanContext{}
	}
	ctx := w3c.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceparent})
	return trace.SpanContextFromContext(ctx)
}

// WithTraceparent returns ctx whose parent span is the remote one that
// traceparent names; ctx unchanged when it names none.
func WithTraceparent(ctx context.Context, traceparent string) context.Context {
	sc := SpanContext(traceparent)
	if !sc.IsValid() {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}

// Link returns a link to the span traceparent names, and false when it
// names none.
func Link(traceparent string, attrs ...attribute.KeyValue) (trace.Link, bool) {
	sc := SpanContext(traceparent)
	return trace.Link{SpanContext: sc, Attributes: attrs}, sc.IsValid()
}
