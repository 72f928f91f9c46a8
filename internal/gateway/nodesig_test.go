package gateway_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/nodesig"
	"github.com/better-compute/better-compute/internal/store"
)

// TestNodeSignedReports: a node that pinned command-signing roots
// (Hello.trust_version 1) must sign a command's final update with its own
// certificate's key. An unsigned update, or one signed by another key,
// ends the session and changes nothing; a signed one is applied, and the
// exact bytes it signed are kept with the certificate, so the record
// verifies later against the node CA alone.
func TestNodeSignedReports(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	_, tok := f.token(t, nil)
	a := newAgent(t, f, "gpu-sig")
	a.join(tok)
	run, err := f.cp.Admin().Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{Tenant: "acme", Node: a.nodeID, Kind: "inventory.refresh"}))
	require.NoError(t, err)
	id := run.Msg.GetCommand().GetId()
	state := func() string {
		var s string
		query(t, f.cp.App.DB, `SELECT state FROM commands WHERE id = $1`, []any{id}, &s)
		return s
	}

	st := a.session(0, "")
	c := st.nextCommand()
	st.sendUnsigned(update(c, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, 100))
	require.Equal(t, codes.PermissionDenied, st.closed().Code(), "an unsigned final update")
	require.NotEqual(t, fleet.CommandSucceeded, state())

	st = a.session(0, "")
	c = st.nextCommand()
	other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	forged := update(c, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, 100)
	require.NoError(t, nodesig.Sign(other, f.cp.PKI.TrustDomain(), a.nodeID, forged.GetCommandUpdate()))
	st.sendUnsigned(forged)
	require.Equal(t, codes.PermissionDenied, st.closed().Code(), "a final update signed by another key")
	require.NotEqual(t, fleet.CommandSucceeded, state())

	st = a.session(0, "")
	c = st.nextCommand()
	done := update(c, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, 100)
	done.GetCommandUpdate().Message = "refreshed \x1b[31m" // defused when stored; the signature covers what was sent
	st.send(done)
	eventually(t, func() bool { return state() == fleet.CommandSucceeded }, "the signed update applied")

	var reports []fleet.NodeReport
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		reports, err = fleet.NodeReportsFor(ctx, tx, id)
		return err
	}))
	require.Len(t, reports, 1)
	r := reports[0]
	require.Equal(t, a.nodeID, r.NodeID)
	require.Equal(t, "command.succeeded", r.Kind)
	cert, err := x509.ParseCertificate(r.CertDER)
	require.NoError(t, err)
	_, err = cert.Verify(x509.VerifyOptions{Roots: f.cp.PKI.NodeCAPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
		CurrentTime: f.cp.Clock.Now()})
	require.NoError(t, err, "the kept certificate chains to the node CA")
	sum := sha256.Sum256(r.Signed)
	require.True(t, ecdsa.VerifyASN1(cert.PublicKey.(*ecdsa.PublicKey), sum[:], r.Signature), "the kept bytes verify offline")
	require.Contains(t, string(r.Signed), "refreshed \x1b[31m", "the bytes are the node's, as sent")
}
