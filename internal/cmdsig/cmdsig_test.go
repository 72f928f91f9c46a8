package cmdsig_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/cmdsig"
)

type issuer struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newCA(t testing.TB, parent *issuer, cn string, now time.Time) *issuer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(now.UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(365 * 24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	p, pk := tmpl, key
	if parent != nil {
		p, pk = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p, key.Public(), pk)
	require.NoError(t, err)
	c, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return &issuer{cert: c, key: key}
}

func newLeaf(t testing.TB, ca *issuer, uri *url.URL, now time.Time, life time.Duration) *issuer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(now.UnixNano() + 1), Subject: pkix.Name{CommonName: "w"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(life), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}
	if uri != nil {
		tmpl.URIs = []*url.URL{uri}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	require.NoError(t, err)
	c, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return &issuer{cert: c, key: key}
}

// TestVerify: a signature verifies only for the exact fields it was made
// over, from a worker certificate of the pinned trust domain that chains
// to a pinned root, under a version the node still accepts.
func TestVerify(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	root := newCA(t, nil, "root", now)
	ca := newCA(t, root, "ca", now)
	worker := newLeaf(t, ca, cmdsig.SignerURI("fleet.example", "replica-a"), now, 24*time.Hour)
	roots := x509.NewCertPool()
	roots.AddCert(root.cert)
	bundle := cmdsig.Bundle{Roots: roots, MinVersion: 1, TrustDomain: "fleet.example"}
	f := cmdsig.Fields{TrustDomain: "fleet.example", TrustVersion: 1, ID: "cmd_1", NodeID: "nod_1", Seq: 7, Kind: "disk.wipe",
		ParamsDigest: cmdsig.Digest([]byte(`{"disk":"vda"}`)), IdempotencyKey: "k1", Deadline: now.Add(time.Hour)}
	sig, err := cmdsig.Sign(worker.key, f)
	require.NoError(t, err)
	chain := [][]byte{worker.cert.Raw, ca.cert.Raw}
	require.NoError(t, cmdsig.Verify(bundle, chain, sig, f, now))

	changed := map[string]func(f *cmdsig.Fields){
		"id":       func(f *cmdsig.Fields) { f.ID = "cmd_2" },
		"node":     func(f *cmdsig.Fields) { f.NodeID = "nod_2" },
		"seq":      func(f *cmdsig.Fields) { f.Seq = 8 },
		"kind":     func(f *cmdsig.Fields) { f.Kind = "power.off" },
		"params":   func(f *cmdsig.Fields) { f.ParamsDigest = cmdsig.Digest([]byte(`{"disk":"vdb"}`)) },
		"key":      func(f *cmdsig.Fields) { f.IdempotencyKey = "k2" },
		"deadline": func(f *cmdsig.Fields) { f.Deadline = f.Deadline.Add(time.Hour) },
		"version":  func(f *cmdsig.Fields) { f.TrustVersion = 2 },
	}
	for name, change := range changed {
		g := f
		change(&g)
		err := cmdsig.Verify(bundle, chain, sig, g, now)
		require.ErrorIs(t, err, cmdsig.ErrBadSignature, name)
		require.Equal(t, cmdsig.FailBadSignature, cmdsig.Code(err), name)
	}

	// A Verifier remembers the chain, never past its validity, and never
	// for a changed field.
	var v cmdsig.Verifier
	require.NoError(t, v.Verify(bundle, chain, sig, f, now))
	require.NoError(t, v.Verify(bundle, chain, sig, f, now.Add(time.Hour)))
	require.ErrorIs(t, v.Verify(bundle, chain, sig, f, now.Add(25*time.Hour)), cmdsig.ErrBadSignature, "remembered past its expiry")
	g := f
	g.Seq++
	require.ErrorIs(t, v.Verify(bundle, chain, sig, g, now), cmdsig.ErrBadSignature)
	other := bundle
	other.TrustDomain = "other.example"
	require.ErrorIs(t, v.Verify(other, chain, sig, f, now), cmdsig.ErrBadSignature, "remembered under another trust domain")

	require.ErrorIs(t, cmdsig.Verify(bundle, nil, nil, f, now), cmdsig.ErrUnsigned)
	require.Equal(t, cmdsig.FailUnsigned, cmdsig.Code(cmdsig.Verify(bundle, chain, nil, f, now)))

	stale := bundle
	stale.MinVersion = 2
	err = cmdsig.Verify(stale, chain, sig, f, now)
	require.ErrorIs(t, err, cmdsig.ErrStaleTrust)
	require.Equal(t, cmdsig.FailStaleTrust, cmdsig.Code(err))

	require.ErrorIs(t, cmdsig.Verify(other, chain, sig, f, now), cmdsig.ErrBadSignature, "another trust domain's signer")

	require.ErrorIs(t, cmdsig.Verify(bundle, chain, sig, f, now.Add(25*time.Hour)), cmdsig.ErrBadSignature, "an expired worker certificate")
	require.ErrorIs(t, cmdsig.Verify(bundle, chain[:1], sig, f, now), cmdsig.ErrBadSignature, "no path to the root without the CA")

	// A certificate under the same root that is not a command signer (a
	// node's, say) cannot sign commands.
	node := newLeaf(t, ca, &url.URL{Scheme: "spiffe", Host: "fleet.example", Path: "/node/nod_1"}, now, time.Hour)
	nsig, err := cmdsig.Sign(node.key, f)
	require.NoError(t, err)
	require.ErrorIs(t, cmdsig.Verify(bundle, [][]byte{node.cert.Raw, ca.cert.Raw}, nsig, f, now), cmdsig.ErrBadSignature)

	// A signer under a root the node never pinned.
	rogue := newCA(t, nil, "rogue", now)
	rw := newLeaf(t, rogue, cmdsig.SignerURI("fleet.example", "x"), now, time.Hour)
	rsig, err := cmdsig.Sign(rw.key, f)
	require.NoError(t, err)
	require.ErrorIs(t, cmdsig.Verify(bundle, [][]byte{rw.cert.Raw}, rsig, f, now), cmdsig.ErrBadSignature)
}

// TestBytesAreUnambiguous: moving bytes between adjacent fields changes
// the encoding.
func TestBytesAreUnambiguous(t *testing.T) {
	t.Parallel()
	a := cmdsig.Bytes(cmdsig.Fields{ID: "ab", NodeID: "c"})
	b := cmdsig.Bytes(cmdsig.Fields{ID: "a", NodeID: "bc"})
	require.NotEqual(t, a, b)
}

func BenchmarkSign(b *testing.B) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(b, err)
	f := cmdsig.Fields{TrustDomain: "fleet.example", TrustVersion: 1, ID: "cmd_1", NodeID: "nod_1", Seq: 7, Kind: "allocation.bind",
		ParamsDigest: cmdsig.Digest(make([]byte, 512)), IdempotencyKey: "k1", Deadline: time.Now()}
	for b.Loop() {
		if _, err := cmdsig.Sign(key, f); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerify(b *testing.B) {
	now := time.Now()
	root := newCA(b, nil, "root", now)
	ca := newCA(b, root, "ca", now)
	worker := newLeaf(b, ca, cmdsig.SignerURI("fleet.example", "replica-a"), now, 24*time.Hour)
	roots := x509.NewCertPool()
	roots.AddCert(root.cert)
	bundle := cmdsig.Bundle{Roots: roots, MinVersion: 1, TrustDomain: "fleet.example"}
	f := cmdsig.Fields{TrustDomain: "fleet.example", TrustVersion: 1, ID: "cmd_1", NodeID: "nod_1", Seq: 7, Kind: "allocation.bind",
		ParamsDigest: cmdsig.Digest(make([]byte, 512)), IdempotencyKey: "k1", Deadline: now}
	sig, err := cmdsig.Sign(worker.key, f)
	require.NoError(b, err)
	chain := [][]byte{worker.cert.Raw, ca.cert.Raw}
	b.Run("chain", func(b *testing.B) {
		for b.Loop() {
			if err := cmdsig.Verify(bundle, chain, sig, f, now); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("remembered", func(b *testing.B) {
		var v cmdsig.Verifier
		for b.Loop() {
			if err := v.Verify(bundle, chain, sig, f, now); err != nil {
				b.Fatal(err)
			}
		}
	})
}
