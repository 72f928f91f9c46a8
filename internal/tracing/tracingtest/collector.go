// Package tracingtest is an in-process OTLP collector for tests: a real
// gRPC server implementing the OTLP TraceService, so a test exercises the
// exporter, its protobuf encoding and the wire, not an in-memory shortcut.
//
// It must never be used outside tests.
package tracingtest

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/grpc"
)

// Span is one received span, its ids in lower-case hex.
type Span struct {
	Service      string
	Name         string
	TraceID      string
	SpanID       string
	ParentSpanID string
	Kind         string
	Attrs        map[string]string
	Links        []Link
	Start, End   time.Time
	StatusError  bool
}

// Link is a received span link.
type Link struct{ TraceID, SpanID string }

func (s Span) String() string {
	return fmt.Sprintf("%s/%s trace=%s span=%s parent=%s attrs=%v links=%v", s.Service, s.Name, s.TraceID, s.SpanID, s.ParentSpanID, s.Attrs, s.Links)
}

// Collector receives OTLP/gRPC trace exports on a loopback port.
type Collector struct {
	coltracepb.UnimplementedTraceServiceServer
	srv  *grpc.Server
	addr string

	mu      sync.Mutex
	spans   []Span
	changed chan struct{} // closed and replaced on every export
}

// Start listens on 127.0.0.1 and serves until the test ends.
func Start(t testing.TB) *Collector {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("tracingtest: listen: %v", err)
	}
	c := &Collector{srv: grpc.NewServer(), addr: ln.Addr().String(), changed: make(chan struct{})}
	coltracepb.RegisterTraceServiceServer(c.srv, c)
	go func() { _ = c.srv.Serve(ln) }()
	t.Cleanup(c.srv.Stop)
	return c
}

// Endpoint is the collector's host:port (plaintext gRPC).
func (c *Collector) Endpoint() string { return c.addr }

// Export implements the OTLP TraceService.
func (c *Collector) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	var got []Span
	for _, rs := range req.GetResourceSpans() {
		service := attrs(rs.GetResource().GetAttributes())["service.name"]
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{
					Service: service, Name: s.GetName(),
					TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentSpanID: hex.EncodeToString(s.GetParentSpanId()),
					Kind:         strings.TrimPrefix(s.GetKind().String(), "SPAN_KIND_"),
					Attrs:        attrs(s.GetAttributes()),
					Start:        time.Unix(0, int64(s.GetStartTimeUnixNano())),
					End:          time.Unix(0, int64(s.GetEndTimeUnixNano())),
					StatusError:  s.GetStatus().GetCode().String() == "STATUS_CODE_ERROR",
				}
				for _, l := range s.GetLinks() {
					sp.Links = append(sp.Links, Link{TraceID: hex.EncodeToString(l.GetTraceId()), SpanID: hex.EncodeToString(l.GetSpanId())})
				}
				got = append(got, sp)
			}
		}
	}
	c.mu.Lock()
	c.spans = append(c.spans, got...)
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func attrs(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		v := kv.GetValue()
		switch x := v.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = x.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = fmt.Sprint(x.IntValue)
		case *commonpb.AnyValue_BoolValue:
			m[kv.GetKey()] = fmt.Sprint(x.BoolValue)
		case *commonpb.AnyValue_DoubleValue:
			m[kv.GetKey()] = fmt.Sprint(x.DoubleValue)
		default:
			m[kv.GetKey()] = v.String()
		}
	}
	return m
}

// Spans returns every span received so far.
func (c *Collector) Spans() []Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Span(nil), c.spans...)
}

// WaitFor waits until cond holds over the spans received, re-checking on
// every export (not on a timer), until the test binary's deadline.
func (c *Collector) WaitFor(t testing.TB, what string, cond func([]Span) bool) []Span {
	t.Helper()
	var deadline <-chan time.Time
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if dl, ok := d.Deadline(); ok {
			timer := time.NewTimer(time.Until(dl.Add(-5 * time.Second)))
			defer timer.Stop()
			deadline = timer.C
		}
	}
	for {
		c.mu.Lock()
		spans, changed := append([]Span(nil), c.spans...), c.changed
		c.mu.Unlock()
		if cond(spans) {
			return spans
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("tracingtest: gave up waiting for %s at the test deadline; received %d spans:\n%s", what, len(spans), dump(spans))
			return nil
		}
	}
}

func dump(spans []Span) string {
	var b strings.Builder
	for _, s := range spans {
		b.WriteString(s.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// Find returns the first span named name (and, when service is not empty,
// from that service).
func Find(spans []Span, service, name string) (Span, bool) {
	for _, s := range spans {
		if s.Name == name && (service == "" || s.Service == service) {
			return s, true
		}
	}
	return Span{}, false
}
