package gateway_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/gateway"
	"github.com/better-compute/better-compute/internal/store"
)

func TestJoinRefusals(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	admin := f.cp.Admin()

	t.Run("another CSR with a used token", func(t *testing.T) {
		_, tok := f.token(t, nil)
		a := newAgent(t, f, "n1")
		a.join(tok)
		a.newKey()
		_, err := a.tryJoin(tok)
		requireCode(t, err, codes.PermissionDenied, "token already used")
	})
	t.Run("a token another authority sealed", func(t *testing.T) {
		other := setup(t)
		_, foreign := other.token(t, nil)
		_, err := newAgent(t, f, "n2").tryJoin(foreign)
		requireCode(t, err, codes.Unauthenticated, "invalid join token")
	})
	t.Run("garbage token", func(t *testing.T) {
		_, err := newAgent(t, f, "n3").tryJoin("bcjt_nope")
		requireCode(t, err, codes.Unauthenticated, "invalid join token")
	})
	t.Run("revoked token", func(t *testing.T) {
		id, tok := f.token(t, nil)
		_, err := admin.JoinTokens.Revoke(ctx, connect.NewRequest(&apiv1.RevokeJoinTokenRequest{Tenant: "acme", Id: id}))
		require.NoError(t, err)
		_, err = newAgent(t, f, "n4").tryJoin(tok)
		requireCode(t, err, codes.PermissionDenied, "revoked")
	})
	t.Run("bad CSR", func(t *testing.T) {
		_, tok := f.token(t, nil)
		a := newAgent(t, f, "n5")
		a.csr = []byte("not a csr")
		_, err := a.tryJoin(tok)
		requireCode(t, err, codes.InvalidArgument, "csr_der")
	})
	t.Run("duplicate identity", func(t *testing.T) {
		_, tok1 := f.token(t, nil)
		_, tok2 := f.token(t, nil)
		a := newAgent(t, f, "n6")
		a.join(tok1)
		b := newAgent(t, f, "n6b")
		b.identity = proto.Clone(a.identity).(*agentv1.HardwareIdentity)
		// Same machine: GPU order does not matter.
		b.identity.GpuUuids[0], b.identity.GpuUuids[1] = b.identity.GpuUuids[1], b.identity.GpuUuids[0]
		_, err := b.tryJoin(tok2)
		requireCode(t, err, codes.AlreadyExists, gateway.CodeDuplicateIdentity)
		require.Contains(t, err.Error(), a.nodeID, "within the token's tenant the holder is named")
	})
	t.Run("duplicate identity in another tenant", func(t *testing.T) {
		_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "rival"}))
		require.NoError(t, err)
		_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "rival", Name: "gpu"}))
		require.NoError(t, err)
		tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "rival", Project: "gpu"}))
		require.NoError(t, err)
		_, tok1 := f.token(t, nil)
		a := newAgent(t, f, "n6c")
		a.join(tok1)
		b := newAgent(t, f, "n6d")
		b.identity = proto.Clone(a.identity).(*agentv1.HardwareIdentity)
		_, err = b.tryJoin(tok.Msg.GetToken())
		requireCode(t, err, codes.AlreadyExists, gateway.CodeDuplicateIdentity)
		require.NotContains(t, err.Error(), a.nodeID, "another tenant's token learns no node id")
		require.NotContains(t, err.Error(), "nod_")
		require.Equal(t, 1, count(t, f, `SELECT count(*) FROM nodes WHERE hardware_key = (SELECT hardware_key FROM nodes WHERE id = $1)`, a.nodeID),
			"nothing joined")
	})
	t.Run("unique names", func(t *testing.T) {
		_, tok1 := f.token(t, nil)
		_, tok2 := f.token(t, nil)
		a, b := newAgent(t, f, "twin"), newAgent(t, f, "twin")
		a.join(tok1)
		b.join(tok2)
		var an, bn string
		query(t, f.cp.App.DB, `SELECT name FROM nodes WHERE id = $1`, []any{a.nodeID}, &an)
		query(t, f.cp.App.DB, `SELECT name FROM nodes WHERE id = $1`, []any{b.nodeID}, &bn)
		require.Equal(t, []string{"twin", "twin-2"}, []string{an, bn})
	})
	t.Run("expired token", func(t *testing.T) {
		g := setup(t)
		_, tok := g.token(t, nil)
		g.cp.Clock.Advance(2 * time.Hour)
		_, err := newAgent(t, g, "n7").tryJoin(tok)
		requireCode(t, err, codes.PermissionDenied, "expired")
	})
}

// TestPlaceholderJoin: a placeholder DMI identity waits for an operator;
// an approval admits exactly one join.
func TestPlaceholderJoin(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	_, tok := f.token(t, nil)
	a := newAgent(t, f, "whitebox")
	a.identity.DmiProductSerial = "To Be Filled By O.E.M."
	a.identity.DmiProductUuid = "03000200-0400-0500-0006-000700080009"

	res, err := a.tryJoin(tok)
	require.NoError(t, err)
	require.Equal(t, agentv1.JoinStatus_JOIN_STATUS_PENDING_APPROVAL, res.GetStatus())
	require.Contains(t, res.GetReason(), "placeholder DMI")
	require.Positive(t, res.GetRetryAfterSeconds())
	reqID := res.GetJoinRequestId()
	require.True(t, strings.HasPrefix(reqID, "jrq_"), reqID)

	// Asking again changes nothing.
	res, err = a.tryJoin(tok)
	require.NoError(t, err)
	require.Equal(t, reqID, res.GetJoinRequestId())
	require.Equal(t, 0, count(t, f, `SELECT count(*) FROM nodes`))

	_, err = f.cp.Admin().JoinRequests.Approve(ctx, connect.NewRequest(&apiv1.ApproveJoinRequestRequest{Tenant: "acme", Id: reqID}))
	require.NoError(t, err)
	a.join(tok)
	var state, nodeID string
	query(t, f.cp.App.DB, `SELECT state, node_id FROM join_requests WHERE id = $1`, []any{reqID}, &state, &nodeID)
	require.Equal(t, "admitted", state)
	require.Equal(t, a.nodeID, nodeID)
	// A retry still gets the same node.
	require.Equal(t, a.nodeID, a.join(tok).GetNodeId())
}

func selfSignedNode(t *testing.T, nodeID string) *tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	u, _ := url.Parse("spiffe://better-compute.local/node/" + nodeID)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(42), Subject: pkix.Name{CommonName: nodeID, OrganizationalUnit: []string{"bc-role:node"}},
		URIs: []*url.URL{u}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func hello() *agentv1.AgentMessage {
	return &agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Hello{Hello: &agentv1.Hello{AgentVersion: "0.1.0"}}}
}

// TestCertificateRefusals: no certificate, a foreign CA, an expired or a
// revoked certificate never get a session.
func TestCertificateRefusals(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	_, tok := f.token(t, nil)
	a := newAgent(t, f, "c1")
	a.join(tok)

	t.Run("no certificate", func(t *testing.T) {
		s, err := a.dial(&tls.Certificate{}).Session(ctx)
		require.NoError(t, err)
		_ = s.Send(hello())
		_, err = s.Recv()
		requireCode(t, err, codes.Unauthenticated, "node certificate is required")
	})
	t.Run("foreign CA", func(t *testing.T) {
		s, err := a.dial(selfSignedNode(t, a.nodeID)).Session(ctx)
		if err == nil {
			_ = s.Send(hello())
			_, err = s.Recv()
		}
		requireCode(t, err, codes.Unavailable, "")
	})
	t.Run("revoked, also mid-session", func(t *testing.T) {
		b := newAgent(t, f, "c2")
		_, tok := f.token(t, nil)
		b.join(tok)
		st := b.session(0, "")
		_, err := f.cp.PKI.RevokeNode(ctx, b.nodeID, "test")
		require.NoError(t, err)
		// The next wake finds the certificate revoked and ends the session.
		require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			f.cp.App.Gateway.NotifyCommand(tx, b.nodeID)
			return nil
		}))
		require.Equal(t, codes.Unauthenticated, st.closed().Code())
		s, err := b.dial(nil).Session(ctx)
		if err == nil {
			_ = s.Send(hello())
			_, err = s.Recv()
		}
		requireCode(t, err, codes.Unavailable, "")
	})
	t.Run("expired", func(t *testing.T) {
		g := setup(t)
		_, tok := g.token(t, nil)
		c := newAgent(t, g, "c3")
		c.join(tok)
		g.cp.Clock.Advance(25 * time.Hour)
		s, err := c.dial(nil).Session(ctx)
		if err == nil {
			_ = s.Send(hello())
			_, err = s.Recv()
		}
		requireCode(t, err, codes.Unavailable, "")
	})
}

// rawCodec sends bytes as they are, to put garbage on the wire.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error)      { return v.([]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error { *(v.(*[]byte)) = data; return nil }
func (rawCodec) Name() string                       { return "proto" }

// TestSessionRefusals: every bad message ends the session with a clear
// status and writes nothing.
func TestSessionRefusals(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	admin := f.cp.Admin()
	joined := func(t *testing.T, host string) *agent {
		_, tok := f.token(t, nil)
		a := newAgent(t, f, host)
		a.join(tok)
		return a
	}

	t.Run("first message not hello", func(t *testing.T) {
		st := joined(t, "s1").open(nil)
		st.send(heartbeat())
		s := st.closed()
		require.Equal(t, codes.InvalidArgument, s.Code())
		require.Contains(t, s.Message(), "must be hello")
	})
	t.Run("hello twice", func(t *testing.T) {
		st := joined(t, "s2").session(0, "")
		st.send(hello())
		require.Equal(t, codes.InvalidArgument, st.closed().Code())
	})
	t.Run("another node's command", func(t *testing.T) {
		a, b := joined(t, "s3a"), joined(t, "s3b")
		sa, sb := a.session(0, ""), b.session(0, "")
		_, err := admin.Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{Tenant: "acme", Node: b.nodeID, Kind: "inventory.refresh"}))
		require.NoError(t, err)
		cb := sb.nextCommand()
		sa.send(update(cb, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, 100))
		s := sa.closed()
		require.Equal(t, codes.PermissionDenied, s.Code())
		require.Contains(t, s.Message(), "not a command of node "+a.nodeID)
		var state string
		query(t, f.cp.App.DB, `SELECT state FROM commands WHERE id = $1`, []any{cb.GetId()}, &state)
		// Delivered (or, a moment before the gateway marks it, pending):
		// never moved forward by another node's update.
		require.Contains(t, []string{"pending", "delivered"}, state, "nothing written")
	})
	t.Run("wrong seq", func(t *testing.T) {
		a := joined(t, "s4")
		st := a.session(0, "")
		_, err := admin.Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{Tenant: "acme", Node: a.nodeID, Kind: "inventory.refresh"}))
		require.NoError(t, err)
		c := st.nextCommand()
		bad := update(c, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, 100)
		bad.GetCommandUpdate().Seq = c.GetSeq() + 7
		st.send(bad)
		s := st.closed()
		require.Equal(t, codes.InvalidArgument, s.Code())
		require.Contains(t, s.Message(), "seq")
		var state string
		query(t, f.cp.App.DB, `SELECT state FROM commands WHERE id = $1`, []any{c.GetId()}, &state)
		require.Contains(t, []string{"pending", "delivered"}, state, "nothing written")
	})
	t.Run("unknown allocation", func(t *testing.T) {
		st := joined(t, "s5").session(0, "")
		st.send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_AllocationBound{AllocationBound: &agentv1.AllocationBound{AllocationId: "alc_x"}}})
		require.Equal(t, codes.PermissionDenied, st.closed().Code())
		require.Equal(t, 0, count(t, f, `SELECT count(*) FROM events WHERE type LIKE 'allocation.%'`))
	})
	t.Run("oversize frame", func(t *testing.T) {
		st := joined(t, "s6").session(0, "")
		big := &agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Inventory{Inventory: &agentv1.InventorySection{
			Name: "gpus", Data: make([]byte, gateway.MaxFrameBytes+1),
		}}}
		_ = st.s.Send(big)
		require.Equal(t, codes.ResourceExhausted, st.closed().Code())
	})
	t.Run("garbage protobuf", func(t *testing.T) {
		a := joined(t, "s7")
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(f.cp.PKI.TrustBundlePEM())
		conn, err := grpc.NewClient(f.cp.GatewayAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			MinVersion: tls.VersionTLS13, RootCAs: pool, ServerName: "127.0.0.1", Certificates: []tls.Certificate{*a.cert},
		})))
		require.NoError(t, err)
		defer conn.Close()
		s, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true},
			agentv1.AgentService_Session_FullMethodName, grpc.ForceCodec(rawCodec{}))
		require.NoError(t, err)
		h, _ := proto.Marshal(hello())
		require.NoError(t, s.SendMsg(h))
		require.NoError(t, s.SendMsg([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f}))
		for {
			var out []byte
			if err := s.RecvMsg(&out); err != nil {
				requireCode(t, err, codes.InvalidArgument, "malformed")
				break
			}
		}
	})
	t.Run("inventory sha256 mismatch", func(t *testing.T) {
		a := joined(t, "s8")
		st := a.session(0, "")
		_, msgs := snapshot(section("memory", &agentv1.MemoryInventory{TotalMib: 1024}))
		msgs[0].GetInventory().Data = append(msgs[0].GetInventory().Data, 0)
		st.send(msgs[0])
		s := st.closed()
		require.Equal(t, codes.InvalidArgument, s.Code())
		require.Contains(t, s.Message(), "sha256")
		require.Equal(t, 0, count(t, f, `SELECT count(*) FROM inventory_sections WHERE node_id = $1`, a.nodeID))
	})
	t.Run("unknown inventory section", func(t *testing.T) {
		st := joined(t, "s9").session(0, "")
		_, msgs := snapshot(section("bios", &agentv1.MemoryInventory{}))
		st.send(msgs[0])
		require.Equal(t, codes.InvalidArgument, st.closed().Code())
	})
	t.Run("inventory section over 1 MiB", func(t *testing.T) {
		st := joined(t, "s10").session(0, "")
		_, msgs := snapshot(section("system", &agentv1.SystemInventory{Kernel: strings.Repeat("x", gateway.MaxSectionBytes)}))
		st.send(msgs[0])
		require.Equal(t, codes.ResourceExhausted, st.closed().Code())
	})
	t.Run("retired node", func(t *testing.T) {
		a := joined(t, "s11")
		require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE nodes SET state = 'retired' WHERE id = $1`, a.nodeID)
			return err
		}))
		st := a.open(nil)
		// The gateway may refuse the stream before it reads the hello; the
		// send then meets the closed stream (io.EOF) and the refusal is in
		// the stream's status.
		if err := st.s.Send(hello()); err != nil {
			require.ErrorIs(t, err, io.EOF)
		}
		require.Equal(t, codes.PermissionDenied, st.closed().Code())
	})
}

// TestRenew: a renew signed by the current key gets a new certificate for
// the same node; a replay, a foreign signature or a stale time does not.
func TestRenew(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	_, tok := f.token(t, nil)
	a := newAgent(t, f, "r1")
	a.join(tok)
	oldKey := a.key
	a.newKey()
	newKey, newCSR := a.key, a.csr
	nonce := randBytes(32)
	now := f.cp.Clock.Now()
	sig, err := ecdsa.SignASN1(rand.Reader, oldKey, gateway.RenewDigest(nonce, now, newCSR))
	require.NoError(t, err)
	req := &agentv1.RenewRequest{CsrDer: newCSR, Nonce: nonce, Time: timestamppb.New(now), Signature: sig}

	res, err := a.dial(nil).Renew(ctx, req)
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(res.GetCertificateChain()[0])
	require.NoError(t, err)
	require.Equal(t, "spiffe://"+f.cp.PKI.TrustDomain()+"/node/"+a.nodeID, leaf.URIs[0].String())

	_, err = a.dial(nil).Renew(ctx, req)
	requireCode(t, err, codes.PermissionDenied, "nonce")

	forged := proto.Clone(req).(*agentv1.RenewRequest)
	forged.Nonce = randBytes(32)
	forged.Signature, _ = ecdsa.SignASN1(rand.Reader, newKey, gateway.RenewDigest(forged.Nonce, now, newCSR))
	_, err = a.dial(nil).Renew(ctx, forged)
	requireCode(t, err, codes.PermissionDenied, "signature")

	stale := proto.Clone(req).(*agentv1.RenewRequest)
	stale.Nonce = randBytes(32)
	stale.Time = timestamppb.New(now.Add(-10 * time.Minute))
	stale.Signature, _ = ecdsa.SignASN1(rand.Reader, oldKey, gateway.RenewDigest(stale.Nonce, stale.Time.AsTime(), newCSR))
	_, err = a.dial(nil).Renew(ctx, stale)
	requireCode(t, err, codes.InvalidArgument, "time")

	short := proto.Clone(req).(*agentv1.RenewRequest)
	short.Nonce = randBytes(8)
	_, err = a.dial(nil).Renew(ctx, short)
	requireCode(t, err, codes.InvalidArgument, "nonce")

	_, err = a.dial(&tls.Certificate{}).Renew(ctx, req)
	requireCode(t, err, codes.Unauthenticated, "")

	// The new certificate opens a session.
	a.cert = &tls.Certificate{Certificate: res.GetCertificateChain(), PrivateKey: newKey}
	a.session(0, "")
}
