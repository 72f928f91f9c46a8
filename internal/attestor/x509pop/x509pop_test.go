package x509pop_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
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

func newCA(t testing.TB, name string) ca {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(t, err)
	c, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return ca{c, key}
}

func (c ca) machine(t testing.TB) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "host-1"}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, key.Public(), c.key)
	require.NoError(t, err)
	return der, key
}

func TestVerify(t *testing.T) {
	t.Parallel()
	corp, other := newCA(t, "corp"), newCA(t, "other")
	leaf, key := corp.machine(t)
	digest := attestor.BindingDigest(attestor.X509, []byte("nonce-nonce-nonce-nonce"), make([]byte, 32))
	sig, err := x509pop.Sign(key, digest)
	require.NoError(t, err)
	now := time.Now()

	res, err := x509pop.Verify([][]byte{leaf}, sig, digest, []*x509.Certificate{other.cert, corp.cert}, now)
	require.NoError(t, err)
	require.Equal(t, "corp", res.Root.Subject.CommonName)
	require.Contains(t, res.Subject, "x509:sha256:")

	for name, tc := range map[string]struct {
		chain  [][]byte
		sig    []byte
		digest []byte
		roots  []*x509.Certificate
		want   string
	}{
		"another tenant's CA": {[][]byte{leaf}, sig, digest, []*x509.Certificate{other.cert}, "does not chain to a registered CA"},
		"no CA registered":    {[][]byte{leaf}, sig, digest, nil, "registered no x509 CA"},
		"another challenge":   {[][]byte{leaf}, sig, attestor.BindingDigest(attestor.X509, []byte("other"), make([]byte, 32)), []*x509.Certificate{corp.cert}, "does not verify"},
		"garbage certificate": {[][]byte{[]byte("junk")}, sig, digest, []*x509.Certificate{corp.cert}, "certificate 0"},
		"no signature":        {[][]byte{leaf}, nil, digest, []*x509.Certificate{corp.cert}, "signature must be"},
	} {
		_, err := x509pop.Verify(tc.chain, tc.sig, tc.digest, tc.roots, now)
		require.ErrorIs(t, err, attestor.ErrEvidence, name)
		require.ErrorContains(t, err, tc.want, name)
	}
}
