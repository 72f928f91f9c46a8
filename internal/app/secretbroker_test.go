package app_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/gateway"
	"github.com/better-compute/better-compute/internal/nodesecret"
	"github.com/better-compute/better-compute/internal/store"
)

// brokerFixture is a control plane with two tenants, acme and globex, each
// with one real bcd joined and ready, and each tenant's admin client.
type brokerFixture struct {
	cp           *bctest.ControlPlane
	acme, globex *client.Client
	a, g         *bctest.FakeDaemon
}

func newBrokerFixture(t *testing.T) *brokerFixture {
	t.Helper()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	f := &brokerFixture{cp: cp}
	join := func(tenant string) (*client.Client, *bctest.FakeDaemon) {
		_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: tenant}))
		require.NoError(t, err)
		_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: tenant, Name: "gpu"}))
		require.NoError(t, err)
		key, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: tenant, Role: "admin"}))
		require.NoError(t, err)
		tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: tenant, Project: "gpu"}))
		require.NoError(t, err)
		d, err := bctest.NewFakeDaemon(bctest.FakeDaemonConfig{Gateway: cp.GatewayAddr, StateDir: t.TempDir(), Clock: cp.Clock})
		require.NoError(t, err)
		require.NoError(t, d.Join(ctx, tok.Msg.GetToken()))
		d.Start()
		t.Cleanup(func() { _ = d.Stop() })
		bctest.WaitFor(t, tenant+"'s node connected", d.Connected)
		return cp.Client(key.Msg.GetSecret()), d
	}
	f.acme, f.a = join("acme")
	f.globex, f.g = join("globex")
	return f
}

func (f *brokerFixture) put(t *testing.T, c *client.Client, name, value string, nodeReadable bool) *apiv1.Secret {
	t.Helper()
	res, err := c.Secrets.Put(context.Background(), connect.NewRequest(&apiv1.PutSecretRequest{Name: name, Value: []byte(value),
		NodeReadable: &nodeReadable}))
	require.NoError(t, err)
	return res.Msg.GetSecret()
}

func (f *brokerFixture) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, query, args...).Scan(&n)
	}))
	return n
}

// rawNode speaks FetchSecret as a node's own process would, from the
// node's state directory, so a test can sign with another key or send one
// request twice.
type rawNode struct {
	client     agentv1.AgentServiceClient
	key        *ecdsa.PrivateKey
	nodeID, td string
}

func newRawNode(t *testing.T, f *brokerFixture, d *bctest.FakeDaemon) *rawNode {
	t.Helper()
	dir := d.StateDir()
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "node.crt"), filepath.Join(dir, "node.key"))
	require.NoError(t, err)
	bundle, err := os.ReadFile(filepath.Join(dir, "trust.pem"))
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(bundle))
	host, _, err := net.SplitHostPort(f.cp.GatewayAddr)
	require.NoError(t, err)
	conn, err := grpc.NewClient("passthrough:///"+f.cp.GatewayAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: host, Certificates: []tls.Certificate{cert}, Time: f.cp.Clock.Now,
	})))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	key, ok := cert.PrivateKey.(*ecdsa.PrivateKey)
	require.True(t, ok)
	return &rawNode{client: agentv1.NewAgentServiceClient(conn), key: key, nodeID: d.NodeID(), td: f.cp.App.PKI.TrustDomain()}
}

// request is a fresh request for ref, signed by signer, its answer sealed
// to a new key it returns.
func (n *rawNode) request(t *testing.T, now time.Time, ref string, signer *ecdsa.PrivateKey) (*agentv1.FetchSecretRequest, func(*agentv1.FetchSecretResponse) ([]byte, error)) {
	t.Helper()
	sk, err := nodesecret.NewKey()
	require.NoError(t, err)
	nonce := make([]byte, 24)
	_, _ = rand.Read(nonce)
	req := &agentv1.FetchSecretRequest{Ref: ref, Nonce: nonce, Time: timestamppb.New(now), RecipientPublicKey: sk.PublicKey().Bytes()}
	require.NoError(t, nodesecret.Sign(signer, n.td, n.nodeID, req))
	return req, func(resp *agentv1.FetchSecretResponse) ([]byte, error) {
		return nodesecret.Open(sk, nodesecret.Binding{TrustDomain: n.td, NodeID: n.nodeID, Ref: ref, Version: resp.GetVersion(), Nonce: nonce},
			resp.GetEncapsulatedKey(), resp.GetCiphertext())
	}
}

// refusedWith checks a refusal's gRPC code and machine reason.
func refusedWith(t *testing.T, err error, code codes.Code, reason string) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, code, status.Code(err), "err: %v", err)
	require.Equal(t, reason, gateway.FetchReason(err), "err: %v", err)
}

// TestSecretBrokerDelivers: a real bcd fetches its tenant's node-readable
// secret (Agent.FetchSecret, and the `bcd secret get` path beside the
// running agent), the latest version; each fetch is one allow audit row
// naming the node, the secret and its version; the value is in no row.
func TestSecretBrokerDelivers(t *testing.T) {
	t.Parallel()
	f := newBrokerFixture(t)
	ctx := context.Background()
	const v1, v2 = "first-db-password-value", "second-db-password-value"
	s := f.put(t, f.acme, "db-password", v1, true)
	f.put(t, f.acme, "db-password", v2, true)

	got, err := f.a.FetchSecret(ctx, "secret://db-password")
	require.NoError(t, err)
	require.Equal(t, v2, string(got))

	got, err = agent.FetchSecretWithState(ctx, agent.StateFetchConfig{Server: f.cp.GatewayAddr, StateDir: f.a.StateDir(), Clock: f.cp.Clock},
		"secret://db-password")
	require.NoError(t, err)
	require.Equal(t, v2, string(got))

	require.Equal(t, 2, f.count(t, `SELECT COUNT(*) FROM audit_log WHERE action = 'secrets.fetch' AND decision = 'allow'
		AND principal_id = $1 AND principal_kind = 'node' AND resource_id = $2 AND detail LIKE $3`,
		f.a.NodeID(), s.GetId(), "%secret://db-password version 2%"))
	for _, v := range []string{v1, v2} {
		require.Zero(t, f.count(t, `SELECT COUNT(*) FROM audit_log WHERE detail LIKE $1`, "%"+v+"%"))
		require.Zero(t, f.count(t, `SELECT COUNT(*) FROM events WHERE CAST(data AS TEXT) LIKE $1`, "%"+v+"%"))
	}

	// An answer captured on its way to node A opens only with the key
	// A's request named, and only under A's binding.
	n := newRawNode(t, f, f.a)
	req, open := n.request(t, f.cp.Clock.Now(), "secret://db-password", n.key)
	resp, err := n.client.FetchSecret(ctx, req)
	require.NoError(t, err)
	got, err = open(resp)
	require.NoError(t, err)
	require.Equal(t, v2, string(got))
	other, err := nodesecret.NewKey()
	require.NoError(t, err)
	_, err = nodesecret.Open(other, nodesecret.Binding{TrustDomain: n.td, NodeID: n.nodeID, Ref: "secret://db-password",
		Version: resp.GetVersion(), Nonce: req.GetNonce()}, resp.GetEncapsulatedKey(), resp.GetCiphertext())
	require.ErrorIs(t, err, nodesecret.ErrOpen)
}

// TestSecretBrokerNoOracle: an unknown ref, a secret not marked
// node-readable, another tenant's secret, a platform secret's name and an
// invalid name are all the same NOT_FOUND, and each is one deny audit row
// and nothing else.
func TestSecretBrokerNoOracle(t *testing.T) {
	t.Parallel()
	f := newBrokerFixture(t)
	ctx := context.Background()
	f.put(t, f.acme, "acme-only", "acme's value", true)
	f.put(t, f.acme, "not-for-nodes", "kept off nodes", false)
	_, err := f.cp.Admin().Secrets.Put(ctx, connect.NewRequest(&apiv1.PutSecretRequest{Name: "platform-token", Value: []byte("platform")}))
	require.NoError(t, err)

	// The nodes write events of their own meanwhile (state, inventory):
	// count what a fetch could write.
	const fetchEvents = `SELECT COUNT(*) FROM events WHERE resource_type = 'Secret' OR type LIKE 'secret%'`
	events := f.count(t, fetchEvents)
	secrets := f.count(t, `SELECT COUNT(*) FROM secrets`)
	cases := []struct {
		d    *bctest.FakeDaemon
		name string
	}{
		{f.a, "missing"},
		{f.a, "not-for-nodes"},
		{f.g, "acme-only"}, // globex's node asks for acme's name
		{f.a, "platform-token"},
		{f.a, "Not_A_Name"},
	}
	for _, c := range cases {
		ref := "secret://" + c.name
		_, err := c.d.FetchSecret(ctx, ref)
		refusedWith(t, err, codes.NotFound, gateway.FetchReasonNotFound)
		require.Contains(t, status.Convert(errorsCause(err)).Message(), "NOT_FOUND: secret "+ref+" not found", "one message for every cause")
	}
	require.Equal(t, len(cases), f.count(t, `SELECT COUNT(*) FROM audit_log WHERE action = 'secrets.fetch' AND decision = 'deny' AND result = 'NotFound'`))
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM audit_log WHERE action = 'secrets.fetch' AND principal_id = $1 AND detail LIKE $2`,
		f.g.NodeID(), "%secret://acme-only%NOT_FOUND%"))
	require.Equal(t, events, f.count(t, fetchEvents), "a refusal writes no event")
	require.Equal(t, secrets, f.count(t, `SELECT COUNT(*) FROM secrets`))
	require.Zero(t, f.count(t, `SELECT COUNT(*) FROM audit_log WHERE detail LIKE '%acme''s value%' OR detail LIKE '%kept off nodes%'`))

	// Granting it later lets the same node read it.
	f.put(t, f.acme, "not-for-nodes", "now for nodes", true)
	got, err := f.a.FetchSecret(ctx, "secret://not-for-nodes")
	require.NoError(t, err)
	require.Equal(t, "now for nodes", string(got))
}

// errorsCause unwraps to the gRPC status error a FetchSecret error wraps.
func errorsCause(err error) error {
	type unwrapper interface{ Unwrap() error }
	for err != nil {
		if _, ok := status.FromError(err); ok {
			return err
		}
		u, ok := err.(unwrapper)
		if !ok {
			return err
		}
		err = u.Unwrap()
	}
	return err
}

// TestSecretBrokerRefusesForgedAndReplayed: a request signed by another
// key than the presented certificate's, a replayed request, one whose time
// is stale and one naming no valid recipient key are refused with their
// reasons; each is a deny audit row, and none answers a value.
func TestSecretBrokerRefusesForgedAndReplayed(t *testing.T) {
	t.Parallel()
	f := newBrokerFixture(t)
	ctx := context.Background()
	f.put(t, f.acme, "db", "the-value", true)
	n := newRawNode(t, f, f.a)
	now := f.cp.Clock.Now()

	other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	req, _ := n.request(t, now, "secret://db", other)
	_, err = n.client.FetchSecret(ctx, req)
	refusedWith(t, err, codes.PermissionDenied, gateway.FetchReasonSignature)

	// Signed for another node (globex's id) with A's own key.
	forged, _ := n.request(t, now, "secret://db", n.key)
	forged.Signature = nil
	require.NoError(t, nodesecret.Sign(n.key, n.td, f.g.NodeID(), forged))
	_, err = n.client.FetchSecret(ctx, forged)
	refusedWith(t, err, codes.PermissionDenied, gateway.FetchReasonSignature)

	req, open := n.request(t, now, "secret://db", n.key)
	resp, err := n.client.FetchSecret(ctx, req)
	require.NoError(t, err)
	got, err := open(resp)
	require.NoError(t, err)
	require.Equal(t, "the-value", string(got))
	_, err = n.client.FetchSecret(ctx, req)
	refusedWith(t, err, codes.PermissionDenied, gateway.FetchReasonReplay)

	// A refused request's nonce is used too: after a grant it does not
	// replay into an answer.
	f.put(t, f.acme, "later", "granted-later", false)
	req, _ = n.request(t, now, "secret://later", n.key)
	_, err = n.client.FetchSecret(ctx, req)
	refusedWith(t, err, codes.NotFound, gateway.FetchReasonNotFound)
	f.put(t, f.acme, "later", "granted-later", true)
	_, err = n.client.FetchSecret(ctx, req)
	refusedWith(t, err, codes.PermissionDenied, gateway.FetchReasonReplay)

	stale, _ := n.request(t, now.Add(-time.Hour), "secret://db", n.key)
	_, err = n.client.FetchSecret(ctx, stale)
	refusedWith(t, err, codes.InvalidArgument, gateway.FetchReasonStaleTime)

	bad, _ := n.request(t, now, "secret://db", n.key)
	bad.RecipientPublicKey = []byte("short")
	bad.Signature = nil
	require.NoError(t, nodesecret.Sign(n.key, n.td, n.nodeID, bad))
	_, err = n.client.FetchSecret(ctx, bad)
	refusedWith(t, err, codes.InvalidArgument, gateway.FetchReasonInvalid)

	require.Equal(t, 2, f.count(t, `SELECT COUNT(*) FROM audit_log WHERE action = 'secrets.fetch' AND decision = 'deny' AND detail LIKE '%BAD_SIGNATURE%'`))
	require.Equal(t, 2, f.count(t, `SELECT COUNT(*) FROM audit_log WHERE action = 'secrets.fetch' AND decision = 'deny' AND detail LIKE '%REPLAYED_NONCE%'`))
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM audit_log WHERE action = 'secrets.fetch' AND decision = 'deny' AND detail LIKE '%STALE_TIME%'`))
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM audit_log WHERE action = 'secrets.fetch' AND decision = 'allow'`))
	require.Zero(t, f.count(t, `SELECT COUNT(*) FROM audit_log WHERE detail LIKE '%the-value%' OR detail LIKE '%granted-later%'`))
}
