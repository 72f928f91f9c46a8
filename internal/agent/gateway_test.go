package agent_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bctest"
	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
)

// testCA mints certificates for the fake gateway and its nodes.
type testCA struct {
	key  *ecdsa.PrivateKey
	cert *x509.Certificate
}

var serial int64 = 1
var serialMu sync.Mutex

func nextSerial() *big.Int {
	serialMu.Lock()
	defer serialMu.Unlock()
	serial++
	return big.NewInt(serial)
}

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: nextSerial(), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return &testCA{key: key, cert: cert}
}

func (ca *testCA) pem() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw})
}

func (ca *testCA) issue(t testing.TB, pub any, tmpl *x509.Certificate) *x509.Certificate {
	tmpl.SerialNumber = nextSerial()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, pub, ca.key)
	if err != nil {
		t.Fatalf("issue: %v", err)
	}
	c, _ := x509.ParseCertificate(der)
	return c
}

func (ca *testCA) serverCert(t *testing.T) (tls.Certificate, *x509.Certificate) {
	return ca.serverCertFor(t, nil, []net.IP{net.ParseIP("127.0.0.1")})
}

// serverCertFor is a gateway certificate for exactly these names.
func (ca *testCA) serverCertFor(t *testing.T, dnsNames []string, ips []net.IP) (tls.Certificate, *x509.Certificate) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	leaf := ca.issue(t, &key.PublicKey, &x509.Certificate{
		Subject: pkix.Name{CommonName: "gateway"}, DNSNames: dnsNames, IPAddresses: ips,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	return tls.Certificate{Certificate: [][]byte{leaf.Raw, ca.cert.Raw}, PrivateKey: key, Leaf: leaf}, leaf
}

func pinOf(c *x509.Certificate) string {
	h := sha256.Sum256(c.RawSubjectPublicKeyInfo)
	return hex.EncodeToString(h[:])
}

// fakeGateway implements the server side of the agent contract just enough
// to drive bcd: Join (optionally pending first), Renew (verifying the
// signature), and Session with HelloAck, recording what the agent sends.
type fakeGateway struct {
	agentv1.UnimplementedAgentServiceServer
	t        *testing.T
	ca       *testCA
	addr     string
	token    string
	certLife time.Duration
	nodeID   string

	mu        sync.Mutex
	pending   int
	joinCSRs  [][]byte
	renewals  int
	drop      chan struct{}
	sessions  int
	hellos    chan *agentv1.Hello
	msgs      chan *agentv1.AgentMessage
	out       chan *agentv1.GatewayMessage
	heartbeat int32
	// silent is how many sessions get no HelloAck (a wedged gateway).
	silent int
	// ignoreGoodbye keeps a session open after the agent's Goodbye.
	ignoreGoodbye bool
	goodbyes      chan *agentv1.Goodbye
	// stop stops the server, closing its connections (a replica that died).
	stop func()
}

func newGateway(t *testing.T) *fakeGateway {
	t.Helper()
	ca := newCA(t, "test root")
	srvCert, _ := ca.serverCert(t)
	return newGatewayWith(t, ca, srvCert)
}

// newGatewayWith is a gateway of ca serving srvCert: several of one CA are
// the replicas of one control plane.
func newGatewayWith(t *testing.T, ca *testCA, srvCert tls.Certificate) *fakeGateway {
	t.Helper()
	g := &fakeGateway{
		t: t, ca: ca, certLife: time.Hour, nodeID: "node-" + t.Name(), heartbeat: 1,
		hellos: make(chan *agentv1.Hello, 16), msgs: make(chan *agentv1.AgentMessage, 4096),
		out: make(chan *agentv1.GatewayMessage, 64), goodbyes: make(chan *agentv1.Goodbye, 16),
	}
	g.token = "bcjt_" + pinOf(ca.cert) + ".eyJhbGciOiJkaXIifQ.x.y.z.w"
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	creds := credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{srvCert},
		ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: pool,
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g.addr = lis.Addr().String()
	s := grpc.NewServer(grpc.Creds(creds))
	agentv1.RegisterAgentServiceServer(s, g)
	go func() { _ = s.Serve(lis) }()
	g.stop = s.Stop
	t.Cleanup(s.Stop)
	return g
}

func peerCert(ctx context.Context) *x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return nil
	}
	return ti.State.PeerCertificates[0]
}

func (g *fakeGateway) issueNode(csrDER []byte) (*x509.Certificate, error) {
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, err
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, err
	}
	now := time.Now()
	return g.ca.issue(g.t, csr.PublicKey, &x509.Certificate{
		Subject:   pkix.Name{CommonName: g.nodeID, OrganizationalUnit: []string{"node"}},
		NotBefore: now.Add(-time.Second), NotAfter: now.Add(g.certLife),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}), nil
}

func (g *fakeGateway) Join(ctx context.Context, req *agentv1.JoinRequest) (*agentv1.JoinResponse, error) {
	if req.GetToken() != g.token {
		return nil, status.Error(codes.PermissionDenied, "bad token")
	}
	if req.GetIdentity().GetDmiProductUuid() == "" {
		return nil, status.Error(codes.InvalidArgument, "no identity")
	}
	g.mu.Lock()
	g.joinCSRs = append(g.joinCSRs, req.GetCsrDer())
	pending := g.pending > 0
	if pending {
		g.pending--
	}
	g.mu.Unlock()
	if pending {
		return &agentv1.JoinResponse{Status: agentv1.JoinStatus_JOIN_STATUS_PENDING_APPROVAL, JoinRequestId: "jr-1", Reason: "needs approval", RetryAfterSeconds: 1}, nil
	}
	c, err := g.issueNode(req.GetCsrDer())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return &agentv1.JoinResponse{
		Status: agentv1.JoinStatus_JOIN_STATUS_ADMITTED, NodeId: g.nodeID, CertificateChain: [][]byte{c.Raw},
		TrustBundlePem: g.ca.pem(), TrustDomain: "test.example", NotAfter: timestamppb.New(c.NotAfter),
	}, nil
}

func (g *fakeGateway) Renew(ctx context.Context, req *agentv1.RenewRequest) (*agentv1.RenewResponse, error) {
	cur := peerCert(ctx)
	if cur == nil {
		return nil, status.Error(codes.Unauthenticated, "no client certificate")
	}
	if len(req.GetNonce()) < 16 {
		return nil, status.Error(codes.InvalidArgument, "short nonce")
	}
	h := sha256.New()
	h.Write(req.GetNonce())
	h.Write([]byte(req.GetTime().AsTime().Format(time.RFC3339Nano)))
	h.Write(req.GetCsrDer())
	pub, ok := cur.PublicKey.(*ecdsa.PublicKey)
	if !ok || !ecdsa.VerifyASN1(pub, h.Sum(nil), req.GetSignature()) {
		return nil, status.Error(codes.PermissionDenied, "bad renew signature")
	}
	c, err := g.issueNode(req.GetCsrDer())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	g.mu.Lock()
	g.renewals++
	g.mu.Unlock()
	return &agentv1.RenewResponse{CertificateChain: [][]byte{c.Raw}, TrustBundlePem: g.ca.pem(), NotAfter: timestamppb.New(c.NotAfter)}, nil
}

func (g *fakeGateway) Session(stream agentv1.AgentService_SessionServer) error {
	if peerCert(stream.Context()) == nil {
		return status.Error(codes.Unauthenticated, "session needs a node certificate")
	}
	m, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := m.GetHello()
	if hello == nil {
		return status.Error(codes.FailedPrecondition, "hello first")
	}
	drop := make(chan struct{})
	g.mu.Lock()
	g.sessions++
	g.drop = drop
	silent := g.silent > 0
	if silent {
		g.silent--
	}
	ignoreGoodbye := g.ignoreGoodbye
	g.mu.Unlock()
	g.hellos <- hello
	if silent {
		<-stream.Context().Done()
		return nil
	}
	if err := stream.Send(&agentv1.GatewayMessage{Msg: &agentv1.GatewayMessage_HelloAck{HelloAck: &agentv1.HelloAck{
		NodeId: g.nodeID, HeartbeatSeconds: g.heartbeat, ServerTime: timestamppb.Now(),
	}}}); err != nil {
		return err
	}
	bye := make(chan struct{})
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			if gb := m.GetGoodbye(); gb != nil {
				g.goodbyes <- gb
				if !ignoreGoodbye {
					close(bye)
					return
				}
				continue
			}
			g.msgs <- m
		}
	}()
	for {
		select {
		case <-bye:
			return nil
		case <-stream.Context().Done():
			return nil
		case <-drop:
			return status.Error(codes.Unavailable, "dropped by test")
		case m := <-g.out:
			if err := stream.Send(m); err != nil {
				return err
			}
		}
	}
}

// dropSession ends the current session from the server side.
func (g *fakeGateway) dropSession() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.drop != nil {
		close(g.drop)
		g.drop = nil
	}
}

func (g *fakeGateway) send(m *agentv1.GatewayMessage) { g.out <- m }

func (g *fakeGateway) command(c *agentv1.Command) {
	g.send(&agentv1.GatewayMessage{Msg: &agentv1.GatewayMessage_Command{Command: c}})
}

// hello waits for the next Hello.
func (g *fakeGateway) hello(t *testing.T) *agentv1.Hello {
	t.Helper()
	return bctest.Receive(t, "a hello", g.hellos)
}

var errTimeout = errors.New("timeout")

// await returns the first message matching ok, discarding others.
func (g *fakeGateway) await(t *testing.T, what string, ok func(*agentv1.AgentMessage) bool) *agentv1.AgentMessage {
	t.Helper()
	deadline := bctest.Deadline(t)
	for {
		select {
		case m := <-g.msgs:
			if ok(m) {
				return m
			}
		case <-deadline:
			t.Fatalf("%s: %v", what, errTimeout)
			return nil
		}
	}
}

// finalUpdate waits for the final (non-RUNNING) update of seq, and reports
// whether a RUNNING update came first.
func (g *fakeGateway) finalUpdate(t *testing.T, seq uint64) (u *agentv1.CommandUpdate, ran bool) {
	t.Helper()
	for {
		m := g.await(t, "update", func(m *agentv1.AgentMessage) bool { return m.GetCommandUpdate().GetSeq() == seq })
		u := m.GetCommandUpdate()
		if u.GetState() == agentv1.CommandState_COMMAND_STATE_RUNNING {
			ran = true
			continue
		}
		return u, ran
	}
}
