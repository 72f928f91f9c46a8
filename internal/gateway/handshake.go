package gateway

import (
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/credentials"

	"github.com/better-compute/better-compute/internal/clock"
)

// Reasons a handshake is refused, as the counter's label.
const (
	// HandshakeRefused: the TLS handshake failed on its merits (a client
	// certificate from a CA the gateway does not trust, a revoked or
	// expired one, not TLS 1.3, not TLS at all).
	HandshakeRefused = "refused"
	// HandshakeTimeout: the client did not finish within HandshakeTimeout.
	HandshakeTimeout = "timeout"
	// HandshakeClosed: the client hung up mid-handshake (a port probe).
	HandshakeClosed = "closed"
)

// metrics are the gateway's own counters. They live per Gateway (not in
// the global registry) so that many control planes fit in one test process.
type metrics struct {
	handshakesRefused *prometheus.CounterVec
	*fleetMetrics
}

func newMetrics(g *Gateway) *metrics {
	return &metrics{
		fleetMetrics: newFleetMetrics(g),
		handshakesRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bc_gateway_handshakes_refused_total",
			Help: "Connections to the agent gateway whose TLS handshake failed, by reason (refused, timeout, closed).",
		}, []string{"reason"}),
	}
}

func (m *metrics) register(r prometheus.Registerer) error {
	for _, c := range append(m.collectors(), m.handshakesRefused) {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// watchedCreds wraps the gateway's TLS credentials so that a failed
// handshake is counted and logged: grpc drops such a connection quietly,
// and a forged client certificate would otherwise leave no trace.
type watchedCreds struct {
	credentials.TransportCredentials
	g *Gateway
}

func (c *watchedCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		c.g.handshakeRefused(raw.RemoteAddr(), err)
	}
	return conn, info, err
}

func (c *watchedCreds) Clone() credentials.TransportCredentials {
	return &watchedCreds{TransportCredentials: c.TransportCredentials.Clone(), g: c.g}
}

// handshakeRefused counts a failed handshake and logs it, at most once per
// RefusalLogInterval, saying how many were not logged since the last line.
// A client that hangs up mid-handshake is counted but logged at debug only:
// probes and health checks do it all day.
func (g *Gateway) handshakeRefused(addr net.Addr, err error) {
	reason := classifyHandshake(err)
	g.metrics.handshakesRefused.WithLabelValues(reason).Inc()
	peer := ""
	if addr != nil {
		peer = addr.String()
	}
	if reason == HandshakeClosed {
		g.log.Debug("agent handshake abandoned by the client", "peer", peer, "err", err)
		return
	}
	if ok, suppressed := g.refusals.allow(); ok {
		g.log.Warn("agent handshake refused", "peer", peer, "reason", reason, "err", err, "suppressed_since_last", suppressed)
	}
}

func classifyHandshake(err error) string {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return HandshakeTimeout
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, net.ErrClosed):
		return HandshakeClosed
	}
	return HandshakeRefused
}

// sampler lets one event through per interval and counts the others, so a
// log line can say how many it stands for.
type sampler struct {
	clock clock.Clock
	every time.Duration

	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func newSampler(c clock.Clock, every time.Duration) *sampler {
	return &sampler{clock: c, every: every}
}

// allow reports whether this event may be logged, and how many were held
// back since the last one that was.
func (s *sampler) allow() (ok bool, suppressed int) {
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.last.IsZero() && now.Sub(s.last) < s.every {
		s.suppressed++
		return false, 0
	}
	s.last, suppressed, s.suppressed = now, s.suppressed, 0
	return true, suppressed
}
