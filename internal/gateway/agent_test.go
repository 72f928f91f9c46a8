package gateway_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"sort"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/better-compute/better-compute/bctest"
	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/nodesig"
	"github.com/better-compute/better-compute/internal/store"
)

// fixture is a control plane with a tenant and a project to join into.
type fixture struct {
	cp *bctest.ControlPlane
}

func setup(t *testing.T, opts ...bctest.ControlPlaneOption) fixture {
	t.Helper()
	cp := bctest.NewControlPlane(t, opts...)
	ctx := context.Background()
	admin := cp.Admin()
	_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "gpu"}))
	require.NoError(t, err)
	return fixture{cp: cp}
}

// token mints a join token through the API.
func (f fixture) token(t *testing.T, labels map[string]string) (id, token string) {
	t.Helper()
	res, err := f.cp.Admin().JoinTokens.Create(context.Background(), connect.NewRequest(&apiv1.CreateJoinTokenRequest{
		Tenant: "acme", Project: "gpu", Pool: "a100", Labels: labels,
	}))
	require.NoError(t, err)
	return res.Msg.GetJoinToken().GetId(), res.Msg.GetToken()
}

// agent is a minimal node agent: its key, its CSR, and after a join its
// certificate.
type agent struct {
	t        *testing.T
	f        fixture
	key      *ecdsa.PrivateKey
	csr      []byte
	identity *agentv1.HardwareIdentity
	nodeID   string
	cert     *tls.Certificate
	// addr overrides the gateway dialled (another replica's).
	addr string
}

func newAgent(t *testing.T, f fixture, host string) *agent {
	t.Helper()
	a := &agent{t: t, f: f}
	a.newKey()
	serial := host + "-" + hex.EncodeToString(randBytes(4))
	a.identity = &agentv1.HardwareIdentity{
		DmiProductUuid: "4c4c4544-" + hex.EncodeToString(randBytes(4)) + "-0000-0000-000000000001", DmiProductSerial: serial,
		DmiBoardSerial: "B" + serial, DmiProductName: "DGX H100", Hostname: host + ".example.com",
		GpuUuids: []string{"GPU-" + hex.EncodeToString(randBytes(8)), "GPU-" + hex.EncodeToString(randBytes(8))},
	}
	return a
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

func (a *agent) newKey() {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(a.t, err)
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "node"}}, key)
	require.NoError(a.t, err)
	a.key, a.csr = key, csr
}

// dial connects to the gateway, with the agent's certificate when it has
// one (cert overrides it).
func (a *agent) dial(cert *tls.Certificate) agentv1.AgentServiceClient {
	a.t.Helper()
	pool := x509.NewCertPool()
	require.True(a.t, pool.AppendCertsFromPEM(a.f.cp.PKI.TrustBundlePEM()))
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool, ServerName: "127.0.0.1"}
	if cert == nil {
		cert = a.cert
	}
	if cert != nil {
		// Present the certificate even when its issuer is not one the
		// gateway names, so a foreign one reaches the handshake.
		c := *cert
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &c, nil }
	}
	addr := a.f.cp.GatewayAddr
	if a.addr != "" {
		addr = a.addr
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	require.NoError(a.t, err)
	a.t.Cleanup(func() { _ = conn.Close() })
	return agentv1.NewAgentServiceClient(conn)
}

func (a *agent) joinRequest(token string) *agentv1.JoinRequest {
	return &agentv1.JoinRequest{Token: token, CsrDer: a.csr, Identity: a.identity, AgentVersion: "0.1.0", Mode: agentv1.AgentMode_AGENT_MODE_NODE}
}

func (a *agent) tryJoin(token string) (*agentv1.JoinResponse, error) {
	return a.dial(nil).Join(context.Background(), a.joinRequest(token))
}

// join joins and keeps the certificate.
func (a *agent) join(token string) *agentv1.JoinResponse {
	a.t.Helper()
	res, err := a.tryJoin(token)
	require.NoError(a.t, err)
	require.Equal(a.t, agentv1.JoinStatus_JOIN_STATUS_ADMITTED, res.GetStatus())
	a.nodeID = res.GetNodeId()
	a.cert = &tls.Certificate{Certificate: res.GetCertificateChain(), PrivateKey: a.key}
	return res
}

// stream is an open session.
type stream struct {
	t      *testing.T
	s      grpc.BidiStreamingClient[agentv1.AgentMessage, agentv1.GatewayMessage]
	cancel context.CancelFunc
	recv   chan *agentv1.GatewayMessage
	errc   chan error
	// sign signs final updates and allocation reports as bcd does once it
	// pinned command-signing roots (these sessions say trust_version 1).
	sign func(proto.Message) error
}

func (a *agent) open(cert *tls.Certificate) *stream {
	a.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := a.dial(cert).Session(ctx)
	require.NoError(a.t, err)
	st := &stream{t: a.t, s: s, cancel: cancel, recv: make(chan *agentv1.GatewayMessage, 64), errc: make(chan error, 1)}
	if cert == nil {
		cert = a.cert
	}
	if cert != nil {
		key, td, node := cert.PrivateKey.(crypto.Signer), a.f.cp.PKI.TrustDomain(), a.nodeID
		st.sign = func(m proto.Message) error { return nodesig.Sign(key, td, node, m) }
	}
	go func() {
		for {
			m, err := s.Recv()
			if err != nil {
				st.errc <- err
				return
			}
			st.recv <- m
		}
	}()
	a.t.Cleanup(cancel)
	return st
}

// session opens a stream and says hello; it returns the stream after the
// HelloAck.
func (a *agent) session(lastApplied uint64, digest string) *stream {
	a.t.Helper()
	st := a.open(nil)
	st.send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Hello{Hello: &agentv1.Hello{
		AgentVersion: "0.1.0", Mode: agentv1.AgentMode_AGENT_MODE_NODE, Capabilities: []string{"cgroups.v2"},
		TrustVersion: 1, LastAppliedSeq: lastApplied, InventoryDigest: digest,
	}}})
	ack := st.next().GetHelloAck()
	require.NotNil(a.t, ack)
	require.Equal(a.t, a.nodeID, ack.GetNodeId())
	return st
}

func (st *stream) send(m *agentv1.AgentMessage) {
	st.t.Helper()
	var inner proto.Message
	switch x := m.GetMsg().(type) {
	case *agentv1.AgentMessage_CommandUpdate:
		inner = x.CommandUpdate
	case *agentv1.AgentMessage_AllocationBound:
		inner = x.AllocationBound
	case *agentv1.AgentMessage_AllocationReleased:
		inner = x.AllocationReleased
	}
	if inner != nil && st.sign != nil && nodesig.Signed(inner) {
		require.NoError(st.t, st.sign(inner))
	}
	st.sendUnsigned(m)
}

// sendUnsigned sends m as it is.
func (st *stream) sendUnsigned(m *agentv1.AgentMessage) {
	st.t.Helper()
	require.NoError(st.t, st.s.Send(m))
}

func (st *stream) next() *agentv1.GatewayMessage {
	st.t.Helper()
	select {
	case m := <-st.recv:
		return m
	case err := <-st.errc:
		st.t.Fatalf("stream ended: %v", err)
	case <-bctest.Deadline(st.t):
		st.t.Fatal("no message from the gateway")
	}
	return nil
}

// nextCommand skips other messages until a command arrives.
func (st *stream) nextCommand() *agentv1.Command {
	st.t.Helper()
	for {
		if c := st.next().GetCommand(); c != nil {
			return c
		}
	}
}

// closed waits for the gateway to end the stream and returns its status.
func (st *stream) closed() *status.Status {
	st.t.Helper()
	for {
		select {
		case <-st.recv:
		case err := <-st.errc:
			return status.Convert(err)
		case <-bctest.Deadline(st.t):
			st.t.Fatal("the gateway did not end the stream")
			return nil
		}
	}
}

func heartbeat() *agentv1.AgentMessage {
	return &agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Heartbeat{Heartbeat: &agentv1.Heartbeat{}}}
}

func update(c *agentv1.Command, state agentv1.CommandState, progress int32) *agentv1.AgentMessage {
	return &agentv1.AgentMessage{Msg: &agentv1.AgentMessage_CommandUpdate{CommandUpdate: &agentv1.CommandUpdate{
		CommandId: c.GetId(), Seq: c.GetSeq(), State: state, Progress: progress,
	}}}
}

// section builds an inventory section of a snapshot.
func section(name string, msg proto.Message) *agentv1.InventorySection {
	data, err := proto.Marshal(msg)
	if err != nil {
		panic(err)
	}
	sum := sha256.Sum256(data)
	return &agentv1.InventorySection{Name: name, Data: data, Sha256: hex.EncodeToString(sum[:])}
}

// snapshot completes sections with their snapshot digest and count.
func snapshot(secs ...*agentv1.InventorySection) (string, []*agentv1.AgentMessage) {
	names := make([]string, 0, len(secs))
	byName := map[string]string{}
	for _, s := range secs {
		names = append(names, s.GetName())
		byName[s.GetName()] = s.GetSha256()
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		h.Write([]byte(n + ":" + byName[n] + "\n"))
	}
	digest := hex.EncodeToString(h.Sum(nil))
	var out []*agentv1.AgentMessage
	for _, s := range secs {
		s.SnapshotDigest, s.SectionCount = digest, int32(len(secs))
		out = append(out, &agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Inventory{Inventory: s}})
	}
	return digest, out
}

// query reads one row through the store.
func query(t *testing.T, db *store.DB, q string, args []any, dest ...any) {
	t.Helper()
	require.NoError(t, db.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, q, args...).Scan(dest...)
	}))
}

func nodeState(t *testing.T, f fixture, nodeID string) (state, liveness string) {
	t.Helper()
	query(t, f.cp.App.DB, `SELECT state, liveness FROM nodes WHERE id = $1`, []any{nodeID}, &state, &liveness)
	return state, liveness
}

func count(t *testing.T, f fixture, q string, args ...any) int {
	t.Helper()
	var n int
	query(t, f.cp.App.DB, q, args, &n)
	return n
}

func eventually(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	bctest.WaitFor(t, msg, cond)
}

func requireCode(t *testing.T, err error, code codes.Code, contains string) {
	t.Helper()
	require.Error(t, err)
	st := status.Convert(err)
	require.Equal(t, code.String(), st.Code().String(), "status %v", st)
	if contains != "" {
		require.Contains(t, st.Message(), contains)
	}
}
