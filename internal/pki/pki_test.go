package pki_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/store"
)

type fixture struct {
	db     *store.DB
	clk    *bctest.SimClock
	sealer *pki.Sealer
	a      *pki.Authority
}

func newSealer(t testing.TB) *pki.Sealer {
	t.Helper()
	secret, err := pki.GenerateSecret()
	require.NoError(t, err)
	s, err := pki.NewSealer(secret)
	require.NoError(t, err)
	return s
}

// newDB opens a migrated database of its own on the test backend.
func newDB(t testing.TB, clk *bctest.SimClock) *store.DB {
	t.Helper()
	if clk == nil {
		clk = bctest.NewSimClock(time.Time{})
	}
	db := bctest.NewDB(t, clk)
	require.NoError(t, db.Migrate(context.Background(), pki.Migrations()))
	return db
}

func setup(t testing.TB, opts pki.InitOptions) fixture {
	t.Helper()
	clk := bctest.NewSimClock(time.Time{})
	db := newDB(t, clk)
	s := newSealer(t)
	a, err := pki.Init(context.Background(), db, s, opts)
	require.NoError(t, err)
	return fixture{db: db, clk: clk, sealer: s, a: a}
}

func newCSR(t testing.TB, key crypto.Signer, cn string) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn}}, key)
	require.NoError(t, err)
	return der
}

func p256(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	return k
}

// nodeCert issues a node certificate and returns it as a TLS client
// certificate.
func (f fixture) nodeCert(t testing.TB, nodeID string, role pki.Role, ttl time.Duration) tls.Certificate {
	t.Helper()
	key := p256(t)
	chain, _, err := f.a.IssueNode(t.Context(), newCSR(t, key, "ignored"), nodeID, role, ttl)
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(chain[0])
	require.NoError(t, err)
	return tls.Certificate{Certificate: chain, PrivateKey: key, Leaf: leaf}
}

func TestSealer(t *testing.T) {
	t.Parallel()
	s, other := newSealer(t), newSealer(t)
	secret := []byte("the node CA key")
	sealed, err := s.Seal("pki/ca/node/key", secret)
	require.NoError(t, err)
	require.NotContains(t, string(sealed), string(secret))
	require.Equal(t, s.KeyID(), sealed[1:9], "version byte, then the derived key's id")
	got, err := s.Open("pki/ca/node/key", sealed)
	require.NoError(t, err)
	require.Equal(t, secret, got)

	again, err := s.Seal("pki/ca/node/key", secret)
	require.NoError(t, err)
	require.NotEqual(t, sealed, again, "every seal uses a fresh nonce")

	flip := func(i int) []byte {
		b := bytes.Clone(sealed)
		b[i] ^= 1
		return b
	}
	tests := []struct {
		name   string
		s      *pki.Sealer
		ref    string
		sealed []byte
	}{
		{"wrong ref", s, "pki/ca/serving/key", sealed},
		{"wrong key", other, "pki/ca/node/key", sealed},
		{"tampered key id", s, "pki/ca/node/key", flip(0)},
		{"tampered nonce", s, "pki/ca/node/key", flip(10)},
		{"tampered ciphertext", s, "pki/ca/node/key", flip(len(sealed) - 20)},
		{"tampered tag", s, "pki/ca/node/key", flip(len(sealed) - 1)},
		{"truncated", s, "pki/ca/node/key", sealed[:20]},
		{"empty", s, "pki/ca/node/key", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := tt.s.Open(tt.ref, tt.sealed)
			require.ErrorIs(t, err, pki.ErrSealed)
		})
	}
}

// TestSealerDerivedKey: values are sealed under a key derived from the
// secret, never the raw secret; values an earlier release sealed under the
// raw secret still open, and nothing but the raw-key path opens them.
func TestSealerDerivedKey(t *testing.T) {
	t.Parallel()
	s := newSealer(t)
	const ref = "secret/sec_1"
	sealed, err := s.Seal(ref, []byte("v"))
	require.NoError(t, err)
	require.False(t, s.Legacy(sealed))
	_, err = s.OpenLegacyForTest(ref, sealed)
	require.Error(t, err, "the raw secret must not open a new value")

	old := s.SealLegacyForTest(ref, []byte("old"))
	require.True(t, s.Legacy(old))
	got, err := s.Open(ref, old)
	require.NoError(t, err)
	require.Equal(t, []byte("old"), got)
	_, err = s.Open("secret/sec_2", old)
	require.ErrorIs(t, err, pki.ErrSealed, "a legacy value stays bound to its ref")
	_, err = newSealer(t).Open(ref, old)
	require.ErrorIs(t, err, pki.ErrSealed)
}

// TestUpgradeReseal: CA keys sealed under the raw secret by an earlier
// release load after the upgrade, and LoadOrInit reseals them under the
// derived key, so the raw secret no longer opens them.
func TestUpgradeReseal(t *testing.T) {
	t.Parallel()
	f := setup(t, pki.InitOptions{})
	ctx := t.Context()
	keys, err := pki.CAKeysSealedForTest(ctx, f.db)
	require.NoError(t, err)
	require.NotEmpty(t, keys)
	for kind, sealed := range keys {
		der, err := f.sealer.Open(pki.KeyRefForTest(kind), sealed)
		require.NoError(t, err)
		require.NoError(t, pki.SetCAKeySealedForTest(ctx, f.db, kind, f.sealer.SealLegacyForTest(pki.KeyRefForTest(kind), der)))
	}

	a, created, err := pki.LoadOrInit(ctx, f.db, f.sealer, f.clk, pki.InitOptions{})
	require.NoError(t, err, "CA keys sealed under the raw secret still open")
	require.False(t, created)
	require.Equal(t, f.a.Pin(), a.Pin())

	after, err := pki.CAKeysSealedForTest(ctx, f.db)
	require.NoError(t, err)
	require.Len(t, after, len(keys))
	for kind, sealed := range after {
		require.False(t, f.sealer.Legacy(sealed), kind)
		_, err := f.sealer.OpenLegacyForTest(pki.KeyRefForTest(kind), sealed)
		require.Error(t, err, "%s: the raw secret no longer opens the resealed key", kind)
		_, err = f.sealer.Open(pki.KeyRefForTest(kind), sealed)
		require.NoError(t, err, kind)
	}
	n, err := pki.ResealLegacy(ctx, f.db, f.sealer)
	require.NoError(t, err)
	require.Zero(t, n, "nothing left to move")
	_, err = pki.Load(ctx, f.db, f.sealer, f.clk)
	require.NoError(t, err)
}

func TestNewSealer(t *testing.T) {
	t.Parallel()
	raw := bytes.Repeat([]byte{0xfb}, 32) // encodes with '+' '/' or '-' '_'
	tests := []struct {
		name, secret string
		ok           bool
	}{
		{"std padded", base64.StdEncoding.EncodeToString(raw), true},
		{"std raw", base64.RawStdEncoding.EncodeToString(raw), true},
		{"url padded", base64.URLEncoding.EncodeToString(raw), true},
		{"url raw", base64.RawURLEncoding.EncodeToString(raw), true},
		{"trailing newline", base64.StdEncoding.EncodeToString(raw) + "\n", true},
		{"31 bytes", base64.StdEncoding.EncodeToString(raw[:31]), false},
		{"33 bytes", base64.StdEncoding.EncodeToString(append(raw, 1)), false},
		{"not base64", "this is not base64 at all!!", false},
		{"empty", "", false},
	}
	var keyIDs [][]byte
	for _, tt := range tests {
		s, err := pki.NewSealer(tt.secret)
		if !tt.ok {
			require.Error(t, err, tt.name)
			require.Contains(t, err.Error(), pki.SecretEnv, tt.name)
			if tt.secret != "" {
				require.NotContains(t, err.Error(), strings.TrimSpace(tt.secret), "an error must not repeat the secret")
			}
			continue
		}
		require.NoError(t, err, tt.name)
		keyIDs = append(keyIDs, s.KeyID())
	}
	for _, id := range keyIDs {
		require.Equal(t, keyIDs[0], id, "every encoding of one key is the same key")
	}
}

func TestLoadSealer(t *testing.T) {
	t.Parallel()
	secret, err := pki.GenerateSecret()
	require.NoError(t, err)
	want, err := pki.NewSealer(secret)
	require.NoError(t, err)
	noEnv := func(string) (string, bool) { return "", false }
	env := func(k string) (string, bool) { return secret, k == pki.SecretEnv }

	dir := t.TempDir()
	_, err = pki.LoadSealer(noEnv, dir)
	require.ErrorContains(t, err, pki.SecretEnv)

	s, err := pki.LoadSealer(env, dir)
	require.NoError(t, err)
	require.Equal(t, want.KeyID(), s.KeyID())

	path := filepath.Join(dir, pki.SecretFile)
	require.NoError(t, os.WriteFile(path, []byte(secret+"\n"), 0o600))
	s, err = pki.LoadSealer(noEnv, dir)
	require.NoError(t, err)
	require.Equal(t, want.KeyID(), s.KeyID())

	require.NoError(t, os.Chmod(path, 0o644))
	_, err = pki.LoadSealer(noEnv, dir)
	require.ErrorContains(t, err, "chmod 600")
}

func TestInitAndLoad(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clk := bctest.NewSimClock(time.Time{})
	db := newDB(t, clk)
	s := newSealer(t)

	_, err := pki.Load(ctx, db, s, clk)
	require.ErrorIs(t, err, pki.ErrNotInitialized)
	_, err = pki.Inspect(ctx, db)
	require.ErrorIs(t, err, pki.ErrNotInitialized)

	a, err := pki.Init(ctx, db, s, pki.InitOptions{TrustDomain: "fleet.example.com"})
	require.NoError(t, err)
	require.Equal(t, "fleet.example.com", a.TrustDomain())
	require.Len(t, a.Pin(), 64)
	require.False(t, a.RootOffline())

	_, err = pki.Init(ctx, db, s, pki.InitOptions{})
	require.ErrorIs(t, err, pki.ErrAlreadyInitialized)

	b, err := pki.Load(ctx, db, s, clk)
	require.NoError(t, err)
	require.Equal(t, a.Pin(), b.Pin())
	require.Equal(t, a.TrustDomain(), b.TrustDomain())
	require.Equal(t, a.TrustBundlePEM(), b.TrustBundlePEM())

	// The root is what the pin says, and self-signed for ten years.
	block, _ := pem.Decode(b.TrustBundlePEM())
	require.NotNil(t, block)
	root, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	sum := sha256.Sum256(root.RawSubjectPublicKeyInfo)
	require.Equal(t, hex.EncodeToString(sum[:]), b.Pin())
	require.True(t, root.IsCA)
	require.Equal(t, clk.Now().AddDate(10, 0, 0).Year(), root.NotAfter.AddDate(0, 0, 3).Year())

	// The loaded keys issue certificates the first authority's pool accepts.
	f := fixture{db: db, clk: clk, sealer: s, a: b}
	cert := f.nodeCert(t, "n1", pki.RoleNode, time.Hour)
	_, err = cert.Leaf.Verify(x509.VerifyOptions{Roots: a.NodeCAPool(), CurrentTime: clk.Now(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	require.NoError(t, err)

	sum2, err := pki.Inspect(ctx, db)
	require.NoError(t, err)
	require.Equal(t, a.Pin(), sum2.Pin)
	require.Len(t, sum2.CAs, 4)
	for i, kind := range []string{"root", "node", "serving", "internal"} {
		ca := sum2.CAs[i]
		require.Equal(t, kind, ca.Kind)
		require.False(t, ca.Offline)
		require.Contains(t, ca.Subject, "better-compute "+kind)
		if kind != "root" {
			require.WithinDuration(t, clk.Now().Add(2*365*24*time.Hour), ca.NotAfter, time.Second)
		}
	}

	// Another secret does not open the keys.
	_, err = pki.Load(ctx, db, newSealer(t), clk)
	require.ErrorIs(t, err, pki.ErrSealed)
}

func TestLoadOrInit(t *testing.T) {
	t.Parallel()
	clk := bctest.NewSimClock(time.Time{})
	db := newDB(t, clk)
	s := newSealer(t)
	a, created, err := pki.LoadOrInit(t.Context(), db, s, clk, pki.InitOptions{})
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, pki.DefaultTrustDomain, a.TrustDomain())
	b, created, err := pki.LoadOrInit(t.Context(), db, s, clk, pki.InitOptions{TrustDomain: "ignored.example"})
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, a.Pin(), b.Pin())
	require.Equal(t, pki.DefaultTrustDomain, b.TrustDomain())
}

func TestInitTrustDomain(t *testing.T) {
	t.Parallel()
	tests := []struct {
		td string
		ok bool
	}{
		{"better-compute.local", true},
		{"a", true},
		{"prod-1.example.com", true},
		{"Upper.example", false},
		{"under_score.example", false},
		{"-lead.example", false},
		{"trail-.example", false},
		{"double..dot", false},
		{"with/slash", false},
		{"spiffe://x", false},
		{strings.Repeat("a", 64) + ".example", false},
	}
	for _, tt := range tests {
		t.Run(tt.td, func(t *testing.T) {
			t.Parallel()
			db := newDB(t, nil)
			_, err := pki.Init(t.Context(), db, newSealer(t), pki.InitOptions{TrustDomain: tt.td})
			if tt.ok {
				require.NoError(t, err)
			} else {
				require.ErrorContains(t, err, "invalid trust domain")
			}
		})
	}
}

func TestOfflineRoot(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "root")
	f := setup(t, pki.InitOptions{OfflineRoot: true, RootOut: out})
	require.True(t, f.a.RootOffline())

	fi, err := os.Stat(filepath.Join(out, "root.key"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	keyPEM, err := os.ReadFile(filepath.Join(out, "root.key"))
	require.NoError(t, err)
	block, _ := pem.Decode(keyPEM)
	require.NotNil(t, block)
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	require.NoError(t, err)
	crtPEM, err := os.ReadFile(filepath.Join(out, "root.crt"))
	require.NoError(t, err)
	require.Equal(t, f.a.TrustBundlePEM(), crtPEM)
	block, _ = pem.Decode(crtPEM)
	root, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	require.True(t, key.(*ecdsa.PrivateKey).PublicKey.Equal(root.PublicKey))

	sum, err := pki.Inspect(t.Context(), f.db)
	require.NoError(t, err)
	require.True(t, sum.CAs[0].Offline, "the root key is not in the database")
	for _, ca := range sum.CAs[1:] {
		require.False(t, ca.Offline)
	}

	// The intermediates still work after a Load without the root key.
	b, err := pki.Load(t.Context(), f.db, f.sealer, f.clk)
	require.NoError(t, err)
	require.True(t, b.RootOffline())
	_ = fixture{db: f.db, clk: f.clk, sealer: f.sealer, a: b}.nodeCert(t, "n1", pki.RoleNode, 0)

	// Rotation reseals only the three intermediates, and of the offline
	// command-signing root's generation its CA key and seal.
	n, err := pki.Reseal(t.Context(), f.db, f.sealer, newSealer(t))
	require.NoError(t, err)
	require.Equal(t, 3+2, n)
	_, err = os.Stat(filepath.Join(out, "command-root-1.key"))
	require.NoError(t, err, "the offline command-signing root's key is written beside the root's")

	// Init never replaces root files, even for a new database.
	_, err = pki.Init(t.Context(), newDB(t, nil), f.sealer, pki.InitOptions{OfflineRoot: true, RootOut: out})
	require.ErrorIs(t, err, os.ErrExist)
	_, err = pki.Init(t.Context(), newDB(t, nil), f.sealer, pki.InitOptions{OfflineRoot: true})
	require.Error(t, err)
}

func TestIssueNode(t *testing.T) {
	t.Parallel()
	f := setup(t, pki.InitOptions{TrustDomain: "td.example"})
	now := f.clk.Now()
	tests := []struct {
		name string
		role pki.Role
		ttl  time.Duration
		want time.Duration
	}{
		{"default ttl", pki.RoleNode, 0, 24 * time.Hour},
		{"short ttl", pki.RoleNode, time.Hour, time.Hour},
		{"capped at 24h", pki.RoleSite, 72 * time.Hour, 24 * time.Hour},
		{"gateway", pki.RoleGateway, 12 * time.Hour, 12 * time.Hour},
		{"ramdisk capped at 2h", pki.RoleRamdisk, 24 * time.Hour, 2 * time.Hour},
		{"ramdisk default", pki.RoleRamdisk, 0, 2 * time.Hour},
		{"ramdisk short", pki.RoleRamdisk, 30 * time.Minute, 30 * time.Minute},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			nodeID := "node-" + string(rune('a'+i))
			key := p256(t)
			chain, notAfter, err := f.a.IssueNode(t.Context(), newCSR(t, key, "evil-admin"), nodeID, tt.role, tt.ttl)
			require.NoError(t, err)
			require.Len(t, chain, 2)
			leaf, err := x509.ParseCertificate(chain[0])
			require.NoError(t, err)
			require.Equal(t, f.a.CAForTest("node").Raw, chain[1])
			require.Equal(t, nodeID, leaf.Subject.CommonName, "the CSR's subject is ignored")
			require.Equal(t, []string{"bc-role:" + string(tt.role)}, leaf.Subject.OrganizationalUnit)
			require.Len(t, leaf.URIs, 1)
			require.Equal(t, "spiffe://td.example/node/"+nodeID, leaf.URIs[0].String())
			require.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, leaf.ExtKeyUsage)
			require.False(t, leaf.IsCA)
			require.True(t, key.PublicKey.Equal(leaf.PublicKey))
			require.Equal(t, now.Add(-time.Minute), leaf.NotBefore)
			require.Equal(t, now.Add(tt.want), leaf.NotAfter)
			require.Equal(t, leaf.NotAfter, notAfter)
			require.LessOrEqual(t, leaf.NotAfter.Sub(now), 24*time.Hour)

			id, err := f.a.VerifyNode(leaf)
			require.NoError(t, err)
			require.Equal(t, pki.NodeIdentity{NodeID: nodeID, Role: tt.role, Serial: leaf.SerialNumber.Text(16), NotAfter: leaf.NotAfter}, id)
		})
	}
}

func TestIssueNodeRefuses(t *testing.T) {
	t.Parallel()
	f := setup(t, pki.InitOptions{})
	good := newCSR(t, p256(t), "x")
	tampered := bytes.Clone(good)
	tampered[len(tampered)-5] ^= 0xff
	p224, err := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	require.NoError(t, err)
	rsa1024, err := rsa.GenerateKey(rand.Reader, 1024)
	require.NoError(t, err)
	tests := []struct {
		name, nodeID string
		role         pki.Role
		csr          []byte
		want         string
	}{
		{"empty node id", "", pki.RoleNode, good, "invalid node id"},
		{"slash in node id", "a/b", pki.RoleNode, good, "invalid node id"},
		{"unknown role", "n1", "admin", good, "invalid role"},
		{"garbage csr", "n1", pki.RoleNode, []byte("not a csr"), "bad certificate request"},
		{"bad signature", "n1", pki.RoleNode, tampered, "bad certificate request"},
		{"P-224 key", "n1", pki.RoleNode, newCSR(t, p224, "x"), "P-224"},
		{"short RSA key", "n1", pki.RoleNode, newCSR(t, rsa1024, "x"), "too short"},
		{"oversized", "n1", pki.RoleNode, make([]byte, pki.MaxCSRSize+1), "more than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := f.a.IssueNode(t.Context(), tt.csr, tt.nodeID, tt.role, time.Hour)
			require.ErrorContains(t, err, tt.want)
		})
	}
}

func TestParseCSRKeys(t *testing.T) {
	t.Parallel()
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	require.NoError(t, err)
	_, ed, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	rsa2048, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	for name, key := range map[string]crypto.Signer{"P-256": p256(t), "P-384": p384, "Ed25519": ed, "RSA-2048": rsa2048} {
		csr, err := pki.ParseCSR(newCSR(t, key, "x"))
		require.NoError(t, err, name)
		require.NotNil(t, csr.PublicKey, name)
	}
}

// handshake runs one TLS handshake over loopback and returns the server's
// verdict (or the client's error when the server accepted).
func handshake(t *testing.T, server, client *tls.Config) error {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", server)
	require.NoError(t, err)
	defer ln.Close()
	errc := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			errc <- err
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		err = c.(*tls.Conn).Handshake()
		if err == nil {
			_, err = c.Write([]byte("ok"))
		}
		errc <- err
	}()
	c, cerr := tls.Dial("tcp", ln.Addr().String(), client)
	if cerr == nil {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_, cerr = io.ReadFull(c, make([]byte, 2))
		_ = c.Close()
	}
	if serr := <-errc; serr != nil {
		return serr
	}
	return cerr
}

func TestGatewayHandshake(t *testing.T) {
	t.Parallel()
	f := setup(t, pki.InitOptions{})
	other := setup(t, pki.InitOptions{})
	serving, err := f.a.IssueServing([]string{"gateway.test", "127.0.0.1"})
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(f.a.TrustBundlePEM()))
	clientCfg := func(certs ...tls.Certificate) *tls.Config {
		return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: "gateway.test", Certificates: certs, Time: f.clk.Now}
	}

	// The expired, revoked and forged certificates of the table.
	revoked := f.nodeCert(t, "revoked", pki.RoleNode, time.Hour)
	require.NoError(t, f.a.Revoke(t.Context(), revoked.Leaf.SerialNumber.Text(16), "compromised"))
	forge := func(kind string, uris []string, ous []string, eku x509.ExtKeyUsage) tls.Certificate {
		key := p256(t)
		tmpl := &x509.Certificate{
			Subject:     pkix.Name{CommonName: "forged", OrganizationalUnit: ous},
			NotBefore:   f.clk.Now().Add(-time.Minute),
			NotAfter:    f.clk.Now().Add(time.Hour),
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{eku},
		}
		for _, u := range uris {
			pu, err := url.Parse(u)
			require.NoError(t, err)
			tmpl.URIs = append(tmpl.URIs, pu)
		}
		leaf, err := f.a.SignForTest(kind, tmpl, key.Public())
		require.NoError(t, err)
		return tls.Certificate{Certificate: [][]byte{leaf.Raw, f.a.CAForTest(kind).Raw}, PrivateKey: key, Leaf: leaf}
	}
	td := f.a.TrustDomain()

	tests := []struct {
		name   string
		client *tls.Config
		prep   func()
		ok     bool
	}{
		{"node certificate", clientCfg(f.nodeCert(t, "n1", pki.RoleNode, time.Hour)), nil, true},
		{"node certificate, leaf alone", clientCfg(leafAlone(f.nodeCert(t, "n1", pki.RoleNode, time.Hour))), nil, true},
		{"no certificate (join)", clientCfg(), nil, true},
		{"other CA", clientCfg(other.nodeCert(t, "n1", pki.RoleNode, time.Hour)), nil, false},
		{"revoked", clientCfg(revoked), nil, false},
		{"other trust domain", clientCfg(forge("node", []string{"spiffe://evil.example/node/n1"}, []string{"bc-role:node"}, x509.ExtKeyUsageClientAuth)), nil, false},
		{"two SPIFFE IDs", clientCfg(forge("node", []string{"spiffe://" + td + "/node/n1", "spiffe://" + td + "/node/n2"}, []string{"bc-role:node"}, x509.ExtKeyUsageClientAuth)), nil, false},
		{"not a node path", clientCfg(forge("node", []string{"spiffe://" + td + "/admin/n1"}, []string{"bc-role:node"}, x509.ExtKeyUsageClientAuth)), nil, false},
		{"no role", clientCfg(forge("node", []string{"spiffe://" + td + "/node/n1"}, nil, x509.ExtKeyUsageClientAuth)), nil, false},
		{"unknown role", clientCfg(forge("node", []string{"spiffe://" + td + "/node/n1"}, []string{"bc-role:root"}, x509.ExtKeyUsageClientAuth)), nil, false},
		{"issued by the serving CA", clientCfg(forge("serving", []string{"spiffe://" + td + "/node/n1"}, []string{"bc-role:node"}, x509.ExtKeyUsageClientAuth)), nil, false},
		{"server-auth only", clientCfg(forge("node", []string{"spiffe://" + td + "/node/n1"}, []string{"bc-role:node"}, x509.ExtKeyUsageServerAuth)), nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := handshake(t, f.a.GatewayTLSConfig(serving), tt.client)
			if tt.ok {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
			}
		})
	}
}

// leafAlone is c presenting its leaf without the CA, as bcd does.
func leafAlone(c tls.Certificate) tls.Certificate {
	c.Certificate = c.Certificate[:1]
	return c
}

func TestGatewayHandshakeExpired(t *testing.T) {
	t.Parallel()
	f := setup(t, pki.InitOptions{})
	serving, err := f.a.IssueServing([]string{"gateway.test"})
	require.NoError(t, err)
	cert := f.nodeCert(t, "n1", pki.RoleRamdisk, 0)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(f.a.TrustBundlePEM())
	client := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: "gateway.test", Certificates: []tls.Certificate{cert}, Time: f.clk.Now}
	require.NoError(t, handshake(t, f.a.GatewayTLSConfig(serving), client))
	f.clk.Advance(2*time.Hour + time.Second)
	err = handshake(t, f.a.GatewayTLSConfig(serving), client)
	require.Error(t, err)
	require.Contains(t, err.Error(), "expired")

	// TLS 1.2 is refused outright.
	f2 := setup(t, pki.InitOptions{})
	serving2, err := f2.a.IssueServing([]string{"gateway.test"})
	require.NoError(t, err)
	roots2 := x509.NewCertPool()
	roots2.AppendCertsFromPEM(f2.a.TrustBundlePEM())
	old := &tls.Config{MaxVersion: tls.VersionTLS12, RootCAs: roots2, ServerName: "gateway.test", Time: f2.clk.Now}
	require.Error(t, handshake(t, f2.a.GatewayTLSConfig(serving2), old))
}

func TestRevocation(t *testing.T) {
	t.Parallel()
	f := setup(t, pki.InitOptions{})
	ctx := t.Context()
	replica, err := pki.Load(ctx, f.db, f.sealer, f.clk)
	require.NoError(t, err)

	c1 := f.nodeCert(t, "n1", pki.RoleNode, time.Hour)
	c2 := f.nodeCert(t, "n1", pki.RoleNode, 24*time.Hour)
	c3 := f.nodeCert(t, "n1", pki.RoleNode, 10*time.Minute) // expires before the node is revoked
	other := f.nodeCert(t, "n2", pki.RoleNode, time.Hour)
	serial := func(c tls.Certificate) string { return c.Leaf.SerialNumber.Text(16) }

	require.ErrorIs(t, f.a.Revoke(ctx, "abcdef", "typo"), pki.ErrUnknownCertificate)
	require.NoError(t, f.a.Revoke(ctx, serial(c1), "lost"))
	require.NoError(t, f.a.Revoke(ctx, serial(c1), "lost again"), "revoking twice is not an error")
	require.True(t, f.a.IsRevoked(serial(c1)))
	require.False(t, replica.IsRevoked(serial(c1)), "another replica learns on Refresh")
	_, err = f.a.VerifyNode(c1.Leaf)
	require.ErrorIs(t, err, pki.ErrRevoked)

	f.clk.Advance(30 * time.Minute)
	n, err := f.a.RevokeNode(ctx, "n1", "decommissioned")
	require.NoError(t, err)
	require.Equal(t, 1, n, "only c2: c1 is already revoked and c3 has expired")
	require.True(t, f.a.IsRevoked(serial(c2)))
	require.False(t, f.a.IsRevoked(serial(c3)))
	require.False(t, f.a.IsRevoked(serial(other)))

	require.NoError(t, replica.Refresh(ctx))
	require.True(t, replica.IsRevoked(serial(c1)))
	require.True(t, replica.IsRevoked(serial(c2)))
	require.False(t, replica.IsRevoked(serial(other)))
	_, err = replica.VerifyNode(other.Leaf)
	require.NoError(t, err)
}

func TestJoinToken(t *testing.T) {
	t.Parallel()
	f := setup(t, pki.InitOptions{})
	other := setup(t, pki.InitOptions{})
	claims := pki.JoinClaims{
		TokenID: "jt_1", TenantID: "tnt_1", ProjectID: "prj_1", Pool: "gpu",
		Labels: map[string]string{"rack": "r1"}, ExpiresAt: f.clk.Now().Add(time.Hour),
	}
	token, err := f.a.SealJoinToken(claims)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(token, "bcjt_"+f.a.Pin()+"."))
	pin, err := pki.TokenPin(token)
	require.NoError(t, err)
	require.Equal(t, f.a.Pin(), pin)

	got, err := f.a.OpenJoinToken(token)
	require.NoError(t, err)
	require.Equal(t, claims, got)

	foreign, err := other.a.SealJoinToken(claims)
	require.NoError(t, err)
	// A foreign token relabelled with this authority's pin does not decrypt.
	relabelled := "bcjt_" + f.a.Pin() + foreign[len("bcjt_")+64:]

	tampered := []byte(token)
	tampered[len(tampered)-30] ^= 0x01
	tests := []struct {
		name, token string
		want        error
	}{
		{"foreign pin", foreign, pki.ErrTokenForeign},
		{"relabelled", relabelled, pki.ErrTokenMalformed},
		{"tampered", string(tampered), pki.ErrTokenMalformed},
		{"no prefix", strings.TrimPrefix(token, "bcjt_"), pki.ErrTokenMalformed},
		{"no JWE", "bcjt_" + f.a.Pin() + ".", pki.ErrTokenMalformed},
		{"short pin", "bcjt_abc.xyz", pki.ErrTokenMalformed},
		{"garbage JWE", "bcjt_" + f.a.Pin() + ".a.b.c.d.e", pki.ErrTokenMalformed},
		{"empty", "", pki.ErrTokenMalformed},
	}
	for _, tt := range tests {
		_, err := f.a.OpenJoinToken(tt.token)
		require.ErrorIs(t, err, tt.want, tt.name)
		for _, e := range []error{pki.ErrTokenMalformed, pki.ErrTokenExpired, pki.ErrTokenForeign} {
			if !errors.Is(tt.want, e) {
				require.NotErrorIs(t, err, e, tt.name)
			}
		}
	}

	f.clk.Advance(time.Hour)
	_, err = f.a.OpenJoinToken(token)
	require.ErrorIs(t, err, pki.ErrTokenExpired)

	// A rotated secret invalidates outstanding tokens.
	fresh, err := f.a.SealJoinToken(pki.JoinClaims{TokenID: "jt_2", ExpiresAt: f.clk.Now().Add(time.Hour)})
	require.NoError(t, err)
	next := newSealer(t)
	_, err = pki.Reseal(t.Context(), f.db, f.sealer, next)
	require.NoError(t, err)
	rotated, err := pki.Load(t.Context(), f.db, next, f.clk)
	require.NoError(t, err)
	_, err = rotated.OpenJoinToken(fresh)
	require.ErrorIs(t, err, pki.ErrTokenMalformed)

	_, err = f.a.SealJoinToken(pki.JoinClaims{ExpiresAt: f.clk.Now()})
	require.Error(t, err)
}

func TestServingChainAndPin(t *testing.T) {
	t.Parallel()
	f := setup(t, pki.InitOptions{})
	other := setup(t, pki.InitOptions{})
	// VerifyPinnedChain judges validity by the agent's real clock.
	f.clk.Set(time.Now())
	other.clk.Set(time.Now())
	cert, err := f.a.IssueServing([]string{"gateway.test", "10.0.0.1", "::1"})
	require.NoError(t, err)
	require.Len(t, cert.Certificate, 3)
	leaf := cert.Leaf
	require.Equal(t, []string{"gateway.test"}, leaf.DNSNames)
	require.Len(t, leaf.IPAddresses, 2)
	require.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, leaf.ExtKeyUsage)
	require.Equal(t, []string{"bc-role:gateway"}, leaf.Subject.OrganizationalUnit)
	require.Equal(t, f.clk.Now().Add(90*24*time.Hour).Truncate(time.Second), leaf.NotAfter)

	token, err := f.a.SealJoinToken(pki.JoinClaims{TokenID: "t", ExpiresAt: f.clk.Now().Add(time.Hour)})
	require.NoError(t, err)
	pin, err := pki.TokenPin(token)
	require.NoError(t, err)
	require.NoError(t, pki.VerifyPinnedChain(cert.Certificate, pin))

	otherCert, err := other.a.IssueServing([]string{"gateway.test"})
	require.NoError(t, err)
	tests := []struct {
		name  string
		chain [][]byte
		pin   string
	}{
		{"other pin", cert.Certificate, other.a.Pin()},
		{"chain without the root", cert.Certificate[:2], pin},
		{"other authority's chain", otherCert.Certificate, pin},
		{"other leaf with this root", [][]byte{otherCert.Certificate[0], otherCert.Certificate[1], cert.Certificate[2]}, pin},
		{"nothing", nil, pin},
		{"garbage", [][]byte{[]byte("x")}, pin},
	}
	for _, tt := range tests {
		require.Error(t, pki.VerifyPinnedChain(tt.chain, tt.pin), tt.name)
	}
	require.ErrorIs(t, pki.VerifyPinnedChain(cert.Certificate, other.a.Pin()), pki.ErrPinMismatch)

	_, err = f.a.IssueServing(nil)
	require.Error(t, err)
	_, err = f.a.IssueServing([]string{"bad host/x"})
	require.Error(t, err)
}

func TestUseNonce(t *testing.T) {
	t.Parallel()
	f := setup(t, pki.InitOptions{})
	ctx := t.Context()
	nonce := bytes.Repeat([]byte{7}, 32)
	use := func(n []byte, expire time.Time) error {
		return f.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			return f.a.UseNonce(ctx, tx, n, expire)
		})
	}
	expire := f.clk.Now().Add(5 * time.Minute)
	require.NoError(t, use(nonce, expire))
	require.ErrorIs(t, use(nonce, expire), pki.ErrReplay)
	require.NoError(t, use(bytes.Repeat([]byte{8}, 32), expire))
	require.Error(t, use([]byte("short"), expire))
	require.Error(t, use(bytes.Repeat([]byte{9}, 32), f.clk.Now()), "an expired nonce guards nothing")

	// Once expired, a nonce is pruned; the renew it guarded is stale anyway.
	f.clk.Advance(6 * time.Minute)
	require.NoError(t, use(nonce, f.clk.Now().Add(5*time.Minute)))
}

func TestReseal(t *testing.T) {
	t.Parallel()
	f := setup(t, pki.InitOptions{})
	ctx := t.Context()
	next := newSealer(t)
	n, err := pki.Reseal(ctx, f.db, f.sealer, next)
	require.NoError(t, err)
	require.Equal(t, 4+3, n, "four CA keys; the command-signing root's key, its CA's key and its seal")

	_, err = pki.Load(ctx, f.db, f.sealer, f.clk)
	require.ErrorIs(t, err, pki.ErrSealed)
	b, err := pki.Load(ctx, f.db, next, f.clk)
	require.NoError(t, err)
	require.Equal(t, f.a.Pin(), b.Pin())

	// A wrong "from" secret changes nothing.
	_, err = pki.Reseal(ctx, f.db, f.sealer, newSealer(t))
	require.ErrorIs(t, err, pki.ErrSealed)
	_, err = pki.Load(ctx, f.db, next, f.clk)
	require.NoError(t, err)
}

// A session ticket from before a revocation must not resume past it.
func TestGatewayRevocationSurvivesResumption(t *testing.T) {
	t.Parallel()
	f := setup(t, pki.InitOptions{})
	serving, err := f.a.IssueServing([]string{"gateway.test"})
	require.NoError(t, err)
	server := f.a.GatewayTLSConfig(serving) // one config: one ticket key
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(f.a.TrustBundlePEM())
	cert := f.nodeCert(t, "n1", pki.RoleNode, time.Hour)
	client := &tls.Config{
		MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: "gateway.test", Time: f.clk.Now,
		Certificates: []tls.Certificate{cert}, ClientSessionCache: tls.NewLRUClientSessionCache(4),
	}
	require.NoError(t, handshake(t, server, client))
	require.NoError(t, handshake(t, server, client), "a second handshake (resumed) is accepted")
	require.NoError(t, f.a.Revoke(t.Context(), cert.Leaf.SerialNumber.Text(16), "stolen"))
	require.Error(t, handshake(t, server, client))
}
