package pki_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/cmdsig"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/store"
)

func pemCount(b []byte) int {
	n := 0
	for {
		var blk *pem.Block
		if blk, b = pem.Decode(b); blk == nil {
			return n
		}
		n++
	}
}

// TestRotation walks a rotation through its three steps: a node that has
// not renewed holds step 2 back, a renewal releases it, the old generation
// leaves the bundle and the client pool, the serving certificate and the
// pin move, and the old command root retires once its worker key is
// replaced and its open commands end.
func TestRotation(t *testing.T) {
	t.Parallel()
	f := setup(t, pki.InitOptions{})
	ctx := t.Context()
	open := 0
	openCmds := func(context.Context, store.Tx, int64) (int, error) { return open, nil }

	oldCert := f.nodeCert(t, "nod_a", pki.RoleNode, 0)
	other := f.nodeCert(t, "nod_b", pki.RoleNode, 0)
	oldPin := f.a.Pin()
	oldServing, err := f.a.IssueServing([]string{"gw.test"})
	require.NoError(t, err)
	gwConf := f.a.GatewayTLSConfig(oldServing)
	signer := f.a.NewCommandSigner("replica-a")
	sign := func() cmdsig.Signature {
		var sig cmdsig.Signature
		require.NoError(t, f.db.Write(ctx, func(ctx context.Context, tx store.Tx) (err error) {
			sig, err = signer.SignCommand(ctx, tx, cmdsig.Fields{ID: "cmd", NodeID: "nod_a", Seq: 1, Kind: "k",
				ParamsDigest: cmdsig.Digest(nil), Deadline: f.clk.Now().Add(time.Hour)})
			return err
		}))
		return sig
	}
	require.Equal(t, int64(1), sign().TrustVersion)

	// Advancing with nothing begun is a no-op, not a rotation.
	st, err := f.a.AdvanceRotation(ctx, openCmds)
	require.NoError(t, err)
	require.False(t, st.InProgress())

	// Step 1: published beside the old.
	st, err = f.a.BeginRotation(ctx, "")
	require.NoError(t, err)
	require.Equal(t, int64(1), st.Serving)
	require.Equal(t, int64(2), st.Newest)
	require.Equal(t, int64(2), st.CommandPublished)
	_, err = f.a.BeginRotation(ctx, "")
	require.ErrorIs(t, err, pki.ErrRotationInProgress)
	require.Equal(t, 2, pemCount(f.a.TrustBundlePEM()), "both roots are in the bundle")
	roots, version, minVersion := f.a.CommandBundle()
	require.Equal(t, 2, pemCount(roots))
	require.Equal(t, []int64{2, 1}, []int64{version, minVersion})
	require.Equal(t, oldPin, f.a.Pin(), "the old generation still serves")
	require.Equal(t, int64(1), sign().TrustVersion, "replicas sign with the old root until nodes pinned the new")

	newCert := f.nodeCert(t, "nod_a", pki.RoleNode, 0) // nod_a renews
	require.NoError(t, newCert.Leaf.CheckSignatureFrom(f.a.CAForTest("node")), "renewals come from the new generation")
	for _, c := range []tls.Certificate{oldCert, newCert, other} {
		_, err := f.a.VerifyNode(c.Leaf)
		require.NoError(t, err, "both generations' node certificates are accepted while the rotation runs")
	}

	// Step 2 waits on nod_b, which has not renewed.
	st, err = f.a.AdvanceRotation(ctx, openCmds)
	require.ErrorIs(t, err, pki.ErrRotationWaiting)
	require.Len(t, st.Stragglers, 1)
	require.Equal(t, "nod_b", st.Stragglers[0].NodeID)
	require.Equal(t, int64(1), st.Serving)

	f.nodeCert(t, "nod_b", pki.RoleNode, 0)
	st, err = f.a.AdvanceRotation(ctx, openCmds)
	require.ErrorIs(t, err, pki.ErrRotationWaiting, "the old command root is still to retire")
	require.Equal(t, int64(2), st.Serving)
	require.Equal(t, int64(2), st.CommandActive)
	require.Len(t, st.OldSigners, 1, "replica-a's worker key of v1 is live and not replaced yet")
	require.NotEqual(t, oldPin, f.a.Pin(), "the pin is the new root's")
	require.Equal(t, 1, pemCount(f.a.TrustBundlePEM()), "the old root left the bundle")
	_, err = f.a.VerifyNode(oldCert.Leaf)
	require.Error(t, err, "a certificate of the retired generation is refused")
	_, err = f.a.VerifyNode(newCert.Leaf)
	require.NoError(t, err)

	// The gateway serves a certificate of the new generation, and an agent
	// that trusts only the new root completes a handshake with the new
	// node certificate; the old one is refused.
	newRoots := x509.NewCertPool()
	require.True(t, newRoots.AppendCertsFromPEM(f.a.TrustBundlePEM()))
	client := func(c tls.Certificate) *tls.Config {
		return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: newRoots, ServerName: "gw.test", Time: f.clk.Now,
			// Sent whatever CAs the server names, as the agent does.
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &c, nil }}
	}
	require.NoError(t, handshake(t, gwConf, client(newCert)))
	require.Error(t, handshake(t, gwConf, client(oldCert)))

	// Step 3: the worker key is replaced at the next signature; an open
	// command signed under v1 still holds the retirement back.
	require.Equal(t, int64(2), sign().TrustVersion)
	open = 1
	st, err = f.a.AdvanceRotation(ctx, openCmds)
	require.ErrorIs(t, err, pki.ErrRotationWaiting)
	require.Empty(t, st.OldSigners)
	require.Equal(t, 1, st.OpenOldCommands)
	open = 0
	st, err = f.a.AdvanceRotation(ctx, openCmds)
	require.NoError(t, err)
	require.False(t, st.InProgress())
	roots, version, minVersion = f.a.CommandBundle()
	require.Equal(t, 1, pemCount(roots))
	require.Equal(t, []int64{2, 2}, []int64{version, minVersion})

	// Another replica loading from the database sees the same, and a
	// second rotation can begin.
	b, err := pki.Load(ctx, f.db, f.sealer, f.clk)
	require.NoError(t, err)
	require.Equal(t, f.a.Pin(), b.Pin())
	require.Equal(t, int64(2), b.ServingGeneration())
	st, err = b.BeginRotation(ctx, "")
	require.NoError(t, err)
	require.Equal(t, int64(3), st.Newest)
}

// TestForgedGenerationRefused: a generation row written without the sealing
// secret (a database-only attacker's root) does not load.
func TestForgedGenerationRefused(t *testing.T) {
	t.Parallel()
	f := setup(t, pki.InitOptions{})
	ctx := t.Context()
	_, err := f.a.BeginRotation(ctx, "")
	require.NoError(t, err)
	attacker := setup(t, pki.InitOptions{})
	_, err = attacker.a.BeginRotation(ctx, "")
	require.NoError(t, err)
	// Copy the attacker's generation 2 over ours: certificates, keys
	// and seal, all sealed under another secret.
	require.NoError(t, pki.CopyGenerationForTest(ctx, attacker.db, f.db, 2))
	_, err = pki.Load(ctx, f.db, f.sealer, f.clk)
	require.ErrorContains(t, err, "generation 2")
	require.Error(t, f.a.Refresh(ctx), "a replica refuses it on refresh too")
}

// TestResealAfterRotation: a rotated-in generation's keys and seal move to
// a new sealing secret with the rest, and the authority loads under it.
func TestResealAfterRotation(t *testing.T) {
	t.Parallel()
	f := setup(t, pki.InitOptions{})
	ctx := t.Context()
	_, err := f.a.BeginRotation(ctx, "")
	require.NoError(t, err)
	next := newSealer(t)
	n, err := pki.Reseal(ctx, f.db, f.sealer, next)
	require.NoError(t, err)
	require.Equal(t, 4+3+3+5, n, "generation 1's four CA keys, command root v1's three values, v2's three, generation 2's four keys and its seal")
	b, err := pki.Load(ctx, f.db, next, f.clk)
	require.NoError(t, err)
	require.Equal(t, int64(2), b.IssuingGeneration())
	require.Equal(t, f.a.Pin(), b.Pin())
}
