package gateway_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"

	"github.com/better-compute/better-compute/bctest"
	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/gateway"
)

// logRecorder keeps the records with one message, for asserting on log
// lines.
type logRecorder struct {
	msg string
	mu  sync.Mutex
	got []map[string]any
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *logRecorder) WithGroup(string) slog.Handler            { return r }
func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	if rec.Message != r.msg {
		return nil
	}
	attrs := map[string]any{}
	rec.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.Any(); return true })
	r.mu.Lock()
	r.got = append(r.got, attrs)
	r.mu.Unlock()
	return nil
}

func (r *logRecorder) lines() []map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]map[string]any(nil), r.got...)
}

// refusedHandshakes reads bc_gateway_handshakes_refused_total{reason} from
// the registry /metrics serves.
func refusedHandshakes(t *testing.T, reg prometheus.Gatherer, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "bc_gateway_handshakes_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// forgedNode is a node certificate in the right shape for nodeID, signed by
// a CA of its own that the gateway does not trust.
func forgedNode(t *testing.T, trustDomain, nodeID string) tls.Certificate {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "Better Compute Node CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	u, _ := url.Parse("spiffe://" + trustDomain + "/node/" + nodeID)
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: nodeID, OrganizationalUnit: []string{"bc-role:node"}},
		URIs: []*url.URL{u}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca, &key.PublicKey, caKey)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der, caDER}, PrivateKey: key}
}

// TestForgedCertificateRefusedLoggedCounted: a client certificate from a CA
// the gateway does not trust is refused in the handshake, counted in
// bc_gateway_handshakes_refused_total and logged — at most one line per
// interval, the next saying how many it held back.
func TestForgedCertificateRefusedLoggedCounted(t *testing.T) {
	t.Parallel()
	logs := &logRecorder{msg: "agent handshake refused"}
	f := setup(t, func(c *app.Config) { c.Logger = slog.New(logs) })
	_, tok := f.token(t, nil)
	a := newAgent(t, f, "victim")
	a.join(tok)
	forged := forgedNode(t, f.cp.PKI.TrustDomain(), a.nodeID)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(f.cp.PKI.TrustBundlePEM()))

	attempt := func(n float64) {
		t.Helper()
		conn, err := tls.Dial("tcp", f.cp.GatewayAddr, &tls.Config{
			MinVersion: tls.VersionTLS13, RootCAs: pool, ServerName: "127.0.0.1",
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &forged, nil },
		})
		if err == nil {
			// TLS 1.3: the client finishes first; the refusal comes as an
			// alert on the first read.
			_, err = conn.Read(make([]byte, 1))
			_ = conn.Close()
		}
		require.ErrorContains(t, err, "tls: unknown certificate authority", "refused in the handshake")
		eventually(t, func() bool { return refusedHandshakes(t, f.cp.App.Registry, gateway.HandshakeRefused) == n }, "refusal counted")
	}
	attempt(1)
	lines := logs.lines()
	require.Len(t, lines, 1, "a refused handshake is logged")
	require.Equal(t, gateway.HandshakeRefused, lines[0]["reason"])
	require.NotEmpty(t, lines[0]["peer"])
	require.Contains(t, lines[0]["err"].(error).Error(), "certificate")

	attempt(2)
	require.Len(t, logs.lines(), 1, "a second refusal within the interval is counted, not logged")
	f.cp.Clock.Advance(10 * time.Second)
	attempt(3)
	lines = logs.lines()
	require.Len(t, lines, 2)
	require.EqualValues(t, 1, lines[1]["suppressed_since_last"], "the next line says how many it stands for")

	// The gateway still serves the real node.
	a.session(0, "")
}

// TestUnauthenticatedConnectionsClosed: a TCP connection that never starts
// TLS, and a TLS connection that never speaks HTTP/2, are closed by the
// gateway after HandshakeTimeout (the first counted as a timeout).
func TestUnauthenticatedConnectionsClosed(t *testing.T) {
	t.Parallel()
	f := setup(t, func(c *app.Config) { c.GatewayHandshakeTimeout = 300 * time.Millisecond })

	t.Run("raw TCP", func(t *testing.T) {
		conn, err := net.Dial("tcp", f.cp.GatewayAddr)
		require.NoError(t, err)
		defer conn.Close()
		requireClosedByServer(t, conn)
		eventually(t, func() bool { return refusedHandshakes(t, f.cp.App.Registry, gateway.HandshakeTimeout) >= 1 }, "timeout counted")
	})
	t.Run("TLS without HTTP/2", func(t *testing.T) {
		pool := x509.NewCertPool()
		require.True(t, pool.AppendCertsFromPEM(f.cp.PKI.TrustBundlePEM()))
		conn, err := tls.Dial("tcp", f.cp.GatewayAddr, &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool, ServerName: "127.0.0.1"})
		if err != nil {
			// On a machine slow enough to miss the deadline inside the
			// handshake, the server closed it there: the same outcome.
			t.Logf("closed during the handshake: %v", err)
			return
		}
		defer conn.Close()
		requireClosedByServer(t, conn)
	})
}

// requireClosedByServer reads until the server closes conn. The read
// deadline is only a guard against a hung test; reaching it fails.
func requireClosedByServer(t *testing.T, conn net.Conn) {
	t.Helper()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(time.Minute)))
	_, err := io.Copy(io.Discard, conn)
	require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "the gateway kept the connection open: %v", err)
}

// TestIdleConnectionClosed: a connection with no stream for
// IdleConnTimeout is closed (GOAWAY), while an agent's session connection,
// which always holds its stream, stays.
func TestIdleConnectionClosed(t *testing.T) {
	t.Parallel()
	f := setup(t, func(c *app.Config) { c.GatewayIdleConnTimeout = 300 * time.Millisecond })
	_, tok := f.token(t, nil)
	a := newAgent(t, f, "idle-1")
	a.join(tok)
	st := a.session(0, "")

	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(f.cp.PKI.TrustBundlePEM()))
	conn, err := grpc.NewClient(f.cp.GatewayAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS13, RootCAs: pool, ServerName: "127.0.0.1",
	})))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a guard, not a wait
	defer cancel()
	conn.Connect()
	for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
		require.True(t, conn.WaitForStateChange(ctx, s), "never connected")
	}
	require.True(t, conn.WaitForStateChange(ctx, connectivity.Ready), "the idle connection was not closed")
	require.NotEqual(t, connectivity.Ready, conn.GetState())

	// The session, older than the idle connection, is still served.
	run, err := f.cp.Admin().Commands.Run(context.Background(), connect.NewRequest(&apiv1.RunCommandRequest{Tenant: "acme", Node: a.nodeID, Kind: "inventory.refresh"}))
	require.NoError(t, err)
	require.Equal(t, run.Msg.GetCommand().GetId(), st.nextCommand().GetId())
}

func goodbye() *agentv1.AgentMessage {
	return &agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Goodbye{Goodbye: &agentv1.Goodbye{Reason: "shutdown"}}}
}

// longLiveness makes the heartbeat timeouts far longer than any test: a
// node that turns unreachable did so for another reason.
func longLiveness(c *app.Config) {
	c.UnreachableAfter, c.LostAfter = time.Hour, 2*time.Hour
}

// TestGoodbye: a session closed with Goodbye turns the node unreachable at
// once (not after UnreachableAfter) and ends with OK; heartbeats flushed
// after it do not revive the node; a dropped session changes nothing; the
// next session makes the node ready again.
func TestGoodbye(t *testing.T) {
	t.Parallel()
	f := setup(t, longLiveness)
	ctx := context.Background()
	_, tok := f.token(t, nil)
	a := newAgent(t, f, "bye-1")
	a.join(tok)

	// A drop is not a goodbye.
	st := a.session(0, "")
	st.cancel()
	eventually(t, func() bool {
		var owner string
		query(t, f.cp.App.DB, `SELECT session_owner FROM nodes WHERE id = $1`, []any{a.nodeID}, &owner)
		return owner == ""
	}, "dropped session released")
	_, live := nodeState(t, f, a.nodeID)
	require.Equal(t, "ready", live)

	st = a.session(0, "")
	st.send(heartbeat()) // waits in the batch
	st.send(goodbye())
	require.NoError(t, st.s.CloseSend())
	for done := false; !done; {
		select {
		case <-st.recv:
		case err := <-st.errc:
			require.ErrorIs(t, err, io.EOF, "the gateway ends a session that said goodbye with OK")
			done = true
		case <-bctest.Deadline(t):
			t.Fatal("the gateway did not end the session")
		}
	}
	eventually(t, func() bool {
		return count(t, f, `SELECT count(*) FROM events WHERE type = 'node.unreachable' AND resource_id = $1`, a.nodeID) == 1
	}, "node.unreachable event")
	_, live = nodeState(t, f, a.nodeID)
	require.Equal(t, "unreachable", live)
	var data string
	query(t, f.cp.App.DB, `SELECT data FROM events WHERE type = 'node.unreachable' AND resource_id = $1`, []any{a.nodeID}, &data)
	require.JSONEq(t, `{"reason":"goodbye","agent_reason":"shutdown"}`, data)
	require.NoError(t, f.cp.App.Gateway.FlushHeartbeats(ctx))
	_, live = nodeState(t, f, a.nodeID)
	require.Equal(t, "unreachable", live, "a heartbeat from before the goodbye does not revive the node")

	a.session(0, "")
	_, live = nodeState(t, f, a.nodeID)
	require.Equal(t, "ready", live)
}

// TestAgentStopMarksUnreachable: the real agent, stopped as bcd is on
// SIGTERM, leaves its node unreachable at once.
func TestAgentStopMarksUnreachable(t *testing.T) {
	t.Parallel()
	f := setup(t, longLiveness)
	_, tok := f.token(t, nil)
	d, err := bctest.NewFakeDaemon(bctest.FakeDaemonConfig{Gateway: f.cp.GatewayAddr, StateDir: filepath.Join(t.TempDir(), "node")})
	require.NoError(t, err)
	require.NoError(t, d.Join(context.Background(), tok))
	d.Start()
	t.Cleanup(func() { _ = d.Stop() })
	eventually(t, d.Connected, "session up")
	_, live := nodeState(t, f, d.NodeID())
	require.Equal(t, "ready", live)

	require.NoError(t, d.Stop())
	eventually(t, func() bool {
		_, live := nodeState(t, f, d.NodeID())
		return live == "unreachable"
	}, "unreachable at once, with an hour of liveness timeout left")
}
