package pki_test

import (
	"context"
	"crypto/x509"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/pki"
)

// TestReplicaCertificate: a replica certificate verifies against the
// internal CA for both client and server auth and carries the replica's
// SPIFFE ID; node and gateway certificates do not verify there.
func TestReplicaCertificate(t *testing.T) {
	t.Parallel()
	f := setup(t, pki.InitOptions{})
	c, err := f.a.IssueReplica("rep-1")
	require.NoError(t, err)
	require.Equal(t, "spiffe://"+f.a.TrustDomain()+"/replica/rep-1", c.Leaf.URIs[0].String())
	inter := x509.NewCertPool()
	for _, der := range c.Certificate[1:] {
		ic, err := x509.ParseCertificate(der)
		require.NoError(t, err)
		inter.AddCert(ic)
	}
	now := f.clk.Now()
	for _, use := range []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth} {
		_, err := c.Leaf.Verify(x509.VerifyOptions{Roots: f.a.InternalCAPool(), Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{use}})
		require.NoError(t, err)
	}

	chain, _, err := f.a.IssueNode(context.Background(), newCSR(t, p256(t), "n"), "node-1", pki.RoleNode, 0)
	require.NoError(t, err)
	node, err := x509.ParseCertificate(chain[0])
	require.NoError(t, err)
	_, err = node.Verify(x509.VerifyOptions{Roots: f.a.InternalCAPool(), CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	require.Error(t, err, "a node certificate is no replica's")
	gw, err := f.a.IssueServing([]string{"gw.example"})
	require.NoError(t, err)
	_, err = gw.Leaf.Verify(x509.VerifyOptions{Roots: f.a.InternalCAPool(), CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	require.Error(t, err, "a gateway certificate is no replica's")

	_, err = f.a.IssueReplica("bad name")
	require.ErrorContains(t, err, "invalid replica id")
}
