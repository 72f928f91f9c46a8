package app

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	// The API's descriptors, for streamingProcedures.
	_ "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// apiPackage is the protobuf package of the public API.
const apiPackage = "bettercompute.api.v1"

// streamingProcedures lists the API's procedures that stream (the watches),
// read from the generated descriptors so a new watch is exempt from the
// body deadline without anyone remembering to list it.
var streamingProcedures = func() map[string]bool {
	out := map[string]bool{}
	protoregistry.GlobalFiles.RangeFilesByPackage(apiPackage, func(fd protoreflect.FileDescriptor) bool {
		for i := range fd.Services().Len() {
			svc := fd.Services().Get(i)
			for j := range svc.Methods().Len() {
				m := svc.Methods().Get(j)
				if m.IsStreamingClient() || m.IsStreamingServer() {
					out["/"+string(svc.FullName())+"/"+string(m.Name())] = true
				}
			}
		}
		return true
	})
	return out
}()

// bodyDeadline bounds how long a request body may take to arrive, so a
// client dribbling a byte at a time cannot hold a connection (and a
// goroutine) without ever authenticating: authentication runs only once the
// body is decoded. Streams are exempt — their connection carries the
// response for as long as the watch runs. The deadline is lifted once the
// body is read, because on HTTP/1.1 the server keeps reading the
// connection in the background while the handler runs, and an expired
// deadline there would cancel a slow handler's context.
func bodyDeadline(next http.Handler, timeout time.Duration) http.Handler {
	if timeout <= 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || streamingProcedures[r.URL.Path] {
			next.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		if err := rc.SetReadDeadline(time.Now().Add(timeout)); err != nil {
			// A writer without deadlines (a test recorder): serve as is.
			next.ServeHTTP(w, r)
			return
		}
		r.Body = &liftOnEOF{ReadCloser: r.Body, lift: func() { _ = rc.SetReadDeadline(time.Time{}) }}
		next.ServeHTTP(w, r)
	})
}

// liftOnEOF calls lift once, when the body has been read to its end.
type liftOnEOF struct {
	io.ReadCloser
	once sync.Once
	lift func()
}

func (b *liftOnEOF) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) {
		b.once.Do(b.lift)
	}
	return n, err
}

// connMetrics counts the API's connections.
type connMetrics struct {
	open    prometheus.Gauge
	refused prometheus.Counter
}

func newConnMetrics(reg prometheus.Registerer) *connMetrics {
	m := &connMetrics{
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "bc_api_connections_open", Help: "Open connections to the API listener.",
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "bc_api_connections_refused_total", Help: "Connections closed at accept because the API held --max-connections.",
		}),
	}
	reg.MustRegister(m.open, m.refused)
	return m
}

// limitListener closes connections accepted beyond max at once, rather than
// queueing them: a client learns at once that the server is full, and the
// slots held (each bounded by the header, body and idle deadlines) free up
// on their own.
type limitListener struct {
	net.Listener
	max     int64
	open    atomic.Int64
	metrics *connMetrics
	log     *slog.Logger
	// lastLog rate-limits the refusal log line (unix seconds).
	lastLog atomic.Int64
}

func newLimitListener(ln net.Listener, max int, metrics *connMetrics, log *slog.Logger) *limitListener {
	return &limitListener{Listener: ln, max: int64(max), metrics: metrics, log: log}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			_ = c.Close()
			l.metrics.refused.Inc()
			if now := time.Now().Unix(); l.lastLog.Swap(now) != now {
				l.log.Warn("refused an API connection: --max-connections are open", "max", l.max, "remote", c.RemoteAddr().String())
			}
			continue
		}
		l.metrics.open.Inc()
		return &limitedConn{Conn: c, release: func() {
			l.open.Add(-1)
			l.metrics.open.Dec()
		}}, nil
	}
}

// limitedConn gives its slot back once, on the first Close.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
