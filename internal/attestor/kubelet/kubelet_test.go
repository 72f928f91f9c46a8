package kubelet

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/attestor"
	"github.com/better-compute/better-compute/internal/attestor/x509pop"
)

type ca struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newCA(t *testing.T) ca {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubernetes"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(t, err)
	c, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return ca{c, key}
}

func (c ca) issue(t *testing.T, subject pkix.Name, usage x509.ExtKeyUsage) ([]byte, crypto.Signer) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(2), Subject: subject,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}, c.cert, key.Public(), c.key)
	require.NoError(t, err)
	return der, key
}

func TestVerify(t *testing.T) {
	t.Parallel()
	cluster, other := newCA(t), newCA(t)
	digest := attestor.BindingDigest(attestor.Kubelet, []byte("nonce"), []byte("csr"))
	node := pkix.Name{CommonName: "system:node:gpu-node-1", Organization: []string{"system:nodes"}}
	sign := func(key crypto.Signer) []byte {
		sig, err := x509pop.Sign(key, digest)
		require.NoError(t, err)
		return sig
	}

	der, key := cluster.issue(t, node, x509.ExtKeyUsageClientAuth)
	res, err := Verify([][]byte{der}, sign(key), digest, []*x509.Certificate{cluster.cert}, time.Now())
	require.NoError(t, err)
	require.Equal(t, "gpu-node-1", res.NodeName)
	require.Equal(t, "kubelet:gpu-node-1", res.Subject)
	require.Equal(t, cluster.cert, res.Root)

	for name, tc := range map[string]struct {
		subject pkix.Name
		issuer  ca
		usage   x509.ExtKeyUsage
		want    string
	}{
		"an administrator":     {pkix.Name{CommonName: "kubernetes-admin", Organization: []string{"system:masters"}}, cluster, x509.ExtKeyUsageClientAuth, "not a kubelet's"},
		"a node without group": {pkix.Name{CommonName: "system:node:gpu-node-1"}, cluster, x509.ExtKeyUsageClientAuth, "not system:nodes alone"},
		"a node with masters":  {pkix.Name{CommonName: "system:node:gpu-node-1", Organization: []string{"system:nodes", "system:masters"}}, cluster, x509.ExtKeyUsageClientAuth, "not system:nodes alone"},
		"an empty node name":   {pkix.Name{CommonName: "system:node:", Organization: []string{"system:nodes"}}, cluster, x509.ExtKeyUsageClientAuth, "not a Node name"},
		"another cluster":      {node, other, x509.ExtKeyUsageClientAuth, "does not chain to a registered CA"},
		"a serving cert":       {node, cluster, x509.ExtKeyUsageServerAuth, "does not chain to a registered CA"},
	} {
		der, key := tc.issuer.issue(t, tc.subject, tc.usage)
		_, err := Verify([][]byte{der}, sign(key), digest, []*x509.Certificate{cluster.cert}, time.Now())
		require.ErrorIs(t, err, attestor.ErrEvidence, name)
		require.ErrorContains(t, err, tc.want, name)
		require.ErrorContains(t, err, "kubelet:", name)
	}

	// A signature over another join's digest.
	der, key = cluster.issue(t, node, x509.ExtKeyUsageClientAuth)
	other2 := attestor.BindingDigest(attestor.X509, []byte("nonce"), []byte("csr"))
	sig, err := x509pop.Sign(key, other2)
	require.NoError(t, err)
	_, err = Verify([][]byte{der}, sig, digest, []*x509.Certificate{cluster.cert}, time.Now())
	require.ErrorContains(t, err, "does not verify")
}

// TestLoad reads the kubelet's one-file certificate and key.
func TestLoad(t *testing.T) {
	t.Parallel()
	cluster := newCA(t)
	der, key := cluster.issue(t, pkix.Name{CommonName: "system:node:n1", Organization: []string{"system:nodes"}}, x509.ExtKeyUsageClientAuth)
	keyDER, err := x509.MarshalECPrivateKey(key.(*ecdsa.PrivateKey))
	require.NoError(t, err)
	p := filepath.Join(t.TempDir(), "kubelet-client-current.pem")
	require.NoError(t, os.WriteFile(p, append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})...), 0o600))
	chain, signer, err := Load(p)
	require.NoError(t, err)
	require.Equal(t, [][]byte{der}, chain)
	require.True(t, key.Public().(*ecdsa.PublicKey).Equal(signer.Public()))
	_, _, err = Load(filepath.Join(t.TempDir(), "missing.pem"))
	require.ErrorContains(t, err, "missing.pem")
}
