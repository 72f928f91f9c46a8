package approval

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
)

func leafN(i int) Leaf {
	return Leaf{Kind: "disk.wipe", Subject: "nod_" + string(rune('a'+i)), ParamsDigest: sha256.Sum256([]byte{byte(i)})}
}

// TestRootIsRFC6962: the root matches the tree hash written out by hand
// for one, two and three leaves (RFC 6962 §2.1: the split is the largest
// power of two below n).
func TestRootIsRFC6962(t *testing.T) {
	t.Parallel()
	leafHash := func(l Leaf) []byte {
		h := sha256.Sum256(append([]byte{0}, l.Encode()...))
		return h[:]
	}
	node := func(a, b []byte) []byte {
		h := sha256.Sum256(append(append([]byte{1}, a...), b...))
		return h[:]
	}
	a, b, c := leafN(0), leafN(1), leafN(2)
	for _, tt := range []struct {
		leaves []Leaf
		want   []byte
	}{
		{[]Leaf{a}, leafHash(a)},
		{[]Leaf{a, b}, node(leafHash(a), leafHash(b))},
		{[]Leaf{a, b, c}, node(node(leafHash(a), leafHash(b)), leafHash(c))},
	} {
		got, err := Root(tt.leaves)
		require.NoError(t, err)
		require.Equal(t, tt.want, got[:])
	}
	_, err := Root(nil)
	require.Error(t, err)
}

// TestEncodingsAreUnambiguous: moving bytes between fields, or changing
// order, changes what is signed.
func TestEncodingsAreUnambiguous(t *testing.T) {
	t.Parallel()
	d := sha256.Sum256(nil)
	require.NotEqual(t, Leaf{Kind: "disk.wipe", Subject: "nod_ab", ParamsDigest: d}.Encode(),
		Leaf{Kind: "disk.wipenod_", Subject: "ab", ParamsDigest: d}.Encode())
	r1, _ := Root([]Leaf{leafN(0), leafN(1)})
	r2, _ := Root([]Leaf{leafN(1), leafN(0)})
	require.NotEqual(t, r1, r2)
	require.NotEqual(t, BatchMessage("td", "cbt_1", r1, 1), BatchMessage("td", "cbt_1", r1, 2))
	require.NotEqual(t, BatchMessage("a.td", "cbt_1", r1, 1), BatchMessage("a", ".tdcbt_1", r1, 1))
}

// TestParamsDigestIsCanonical: key order and number spelling do not
// change the digest; values do.
func TestParamsDigestIsCanonical(t *testing.T) {
	t.Parallel()
	a, ca, err := ParamsDigest(map[string]any{"b": 2.0, "a": "x"})
	require.NoError(t, err)
	require.Equal(t, `{"a":"x","b":2}`, string(ca))
	b, _, _ := ParamsDigest(map[string]any{"a": "x", "b": float64(2)})
	require.Equal(t, a, b)
	c, _, _ := ParamsDigest(map[string]any{"a": "x", "b": 3.0})
	require.NotEqual(t, a, c)
	e, ce, _ := ParamsDigest(nil)
	require.Equal(t, "{}", string(ce))
	require.Equal(t, sha256.Sum256([]byte("{}")), e)
}

func TestSetMessageSortsKeys(t *testing.T) {
	t.Parallel()
	s1, s2 := edSigner(t), edSigner(t)
	m1 := SetMessage("td", "tnt_1", 2, 1, []ssh.PublicKey{s1.PublicKey(), s2.PublicKey()})
	m2 := SetMessage("td", "tnt_1", 2, 1, []ssh.PublicKey{s2.PublicKey(), s1.PublicKey()})
	require.Equal(t, m1, m2)
	require.NotEqual(t, m1, SetMessage("td", "tnt_1", 2, 2, []ssh.PublicKey{s1.PublicKey(), s2.PublicKey()}))
}

func edSigner(t testing.TB) ssh.Signer {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	s, err := ssh.NewSignerFromKey(k)
	require.NoError(t, err)
	return s
}

func ecSigner(t testing.TB, c elliptic.Curve) ssh.Signer {
	t.Helper()
	k, err := ecdsa.GenerateKey(c, rand.Reader)
	require.NoError(t, err)
	s, err := ssh.NewSignerFromKey(k)
	require.NoError(t, err)
	return s
}

// TestSignVerify: each accepted key type signs and verifies; another
// message, another key, or a mangled signature does not verify.
func TestSignVerify(t *testing.T) {
	t.Parallel()
	msg := BatchMessage("td", "cbt_1", [32]byte{7}, 1)
	other := edSigner(t)
	for _, s := range []ssh.Signer{edSigner(t), ecSigner(t, elliptic.P256()), ecSigner(t, elliptic.P384()), ecSigner(t, elliptic.P521())} {
		sig, err := Sign(s, msg)
		require.NoError(t, err)
		require.NoError(t, Verify(s.PublicKey(), msg, sig), s.PublicKey().Type())
		require.ErrorIs(t, Verify(s.PublicKey(), append(msg, 0), sig), ErrBadSignature)
		require.ErrorIs(t, Verify(other.PublicKey(), msg, sig), ErrBadSignature)
		bad := append([]byte(nil), sig...)
		bad[len(bad)-1] ^= 1
		require.ErrorIs(t, Verify(s.PublicKey(), msg, bad), ErrBadSignature)
		require.ErrorIs(t, Verify(s.PublicKey(), msg, []byte("junk")), ErrBadSignature)
	}
}

// TestParseKey: authorized_keys lines and PEM public keys of the accepted
// types parse to the same key; RSA and garbage are refused.
func TestParseKey(t *testing.T) {
	t.Parallel()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKIXPublicKey(pub)
	require.NoError(t, err)
	fromPEM, err := ParseKey(string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})))
	require.NoError(t, err)
	sk, err := ssh.NewPublicKey(pub)
	require.NoError(t, err)
	fromLine, err := ParseKey(string(ssh.MarshalAuthorizedKey(sk)) + " comment")
	require.NoError(t, err)
	require.Equal(t, KeyID(fromLine), KeyID(fromPEM))
	_, err = ParseKey(AuthorizedKey(ecSigner(t, elliptic.P256()).PublicKey()))
	require.NoError(t, err)
	for _, bad := range []string{"", "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQDF", "not a key",
		string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1}}))} {
		_, err := ParseKey(bad)
		require.Error(t, err, bad)
	}
}

// FuzzParseKey: key text from a request never panics the parser, and what
// it accepts round-trips through its authorized_keys form.
func FuzzParseKey(f *testing.F) {
	f.Add(AuthorizedKey(edSigner(f).PublicKey()))
	f.Add(AuthorizedKey(ecSigner(f, elliptic.P256()).PublicKey()))
	f.Add("-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA\n-----END PUBLIC KEY-----\n")
	f.Add("ssh-rsa AAAA")
	f.Fuzz(func(t *testing.T, s string) {
		k, err := ParseKey(s)
		if err != nil {
			return
		}
		again, err := ParseKey(AuthorizedKey(k))
		if err != nil || KeyID(again) != KeyID(k) {
			t.Fatalf("accepted key %q does not round-trip: %v", s, err)
		}
	})
}

// FuzzVerify: signature bytes from a request never panic the verifier and
// never verify unless they are the signer's.
func FuzzVerify(f *testing.F) {
	s := edSigner(f)
	msg := BatchMessage("td", "cbt_1", [32]byte{1}, 1)
	good, err := Sign(s, msg)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte{})
	f.Add([]byte("\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, sig []byte) {
		if Verify(s.PublicKey(), msg, sig) == nil && string(sig) != string(good) {
			// Ed25519 signatures are deterministic; another encoding that
			// verifies would be a malleability bug.
			var a, b ssh.Signature
			if ssh.Unmarshal(sig, &a) != nil || ssh.Unmarshal(good, &b) != nil || string(a.Blob) != string(b.Blob) {
				t.Fatalf("a different signature verified: %x", sig)
			}
		}
	})
}
