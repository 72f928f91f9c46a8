// Package cmdsig is the command-signing format shared by the control plane,
// which signs every command row as it inserts it, and bcd, which verifies
// the signature against the command-signing roots it pinned at join before
// it applies anything. It depends on nothing but the standard library, so
// both sides compute the same bytes.
//
// A database-only attacker can write a command row but cannot sign it: the
// worker keys live in the replicas' memory and their certificates chain to
// a root whose key is sealed (or offline), not stored in the clear.
package cmdsig

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"
)

// Context separates command signatures from every other use of a key.
const Context = "better-compute command v1"

// SignerPathPrefix is the path of a worker certificate's SPIFFE URI:
// spiffe://<trust domain>/command-signer/<replica>. bcd accepts only a leaf
// that carries one in its own trust domain.
const SignerPathPrefix = "/command-signer/"

// Failure codes bcd records on a command it refuses.
const (
	FailUnsigned     = "UNSIGNED"
	FailBadSignature = "BAD_SIGNATURE"
	FailStaleTrust   = "STALE_TRUST_VERSION"
)

// Errors of Verify; each maps to a failure code (Code).
var (
	ErrUnsigned     = errors.New("the command carries no signature")
	ErrBadSignature = errors.New("the command's signature does not verify")
	ErrStaleTrust   = errors.New("the command was signed under a retired trust version")
)

// Code is the failure code for an error of Verify.
func Code(err error) string {
	switch {
	case errors.Is(err, ErrUnsigned):
		return FailUnsigned
	case errors.Is(err, ErrStaleTrust):
		return FailStaleTrust
	default:
		return FailBadSignature
	}
}

// Fields are what a signature covers: everything that decides what a node
// does and when, and which node does it.
type Fields struct {
	TrustDomain    string
	TrustVersion   int64
	ID             string
	NodeID         string
	Seq            uint64
	Kind           string
	ParamsDigest   [32]byte // Digest of the params as stored (JSON text)
	IdempotencyKey string
	Deadline       time.Time // signed to the second
}

// Digest is the SHA-256 of a command's params as stored.
func Digest(params []byte) [32]byte { return sha256.Sum256(params) }

// Bytes is the canonical encoding of f: the context, then each field
// length-prefixed (strings) or fixed-width big-endian (numbers), so no two
// distinct Fields share an encoding.
func Bytes(f Fields) []byte {
	b := make([]byte, 0, 256)
	str := func(s string) {
		b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	str(Context)
	str(f.TrustDomain)
	b = binary.BigEndian.AppendUint64(b, uint64(f.TrustVersion))
	str(f.ID)
	str(f.NodeID)
	b = binary.BigEndian.AppendUint64(b, f.Seq)
	str(f.Kind)
	b = append(b, f.ParamsDigest[:]...)
	str(f.IdempotencyKey)
	b = binary.BigEndian.AppendUint64(b, uint64(f.Deadline.Unix()))
	return b
}

// Signature is what a command row carries besides its fields.
type Signature struct {
	TrustVersion int64
	// Signer is the worker certificate's serial (lowercase hex); the
	// gateway sends its chain with the command.
	Signer string
	Sig    []byte // ASN.1 ECDSA P-256 over SHA-256(Bytes)
}

// Sign signs f with a worker key.
func Sign(key *ecdsa.PrivateKey, f Fields) ([]byte, error) {
	sum := sha256.Sum256(Bytes(f))
	return ecdsa.SignASN1(rand.Reader, key, sum[:])
}

// Bundle is what bcd pins: the command-signing roots and the lowest trust
// version it still accepts.
type Bundle struct {
	Roots       *x509.CertPool
	MinVersion  int64
	TrustDomain string
}

// Verify checks that chain (the worker certificate, then its CA; DER)
// leads to a pinned root at now, that the leaf is a command signer of the
// bundle's trust domain, that the version is not retired, and that sig
// signs f. f.TrustDomain is taken from the bundle.
func Verify(b Bundle, chain [][]byte, sig []byte, f Fields, now time.Time) error {
	return (&Verifier{}).Verify(b, chain, sig, f, now)
}

// Verifier is Verify with the chains it verified remembered, so a node
// checks a worker's chain once and each command's signature after that
// (docs/benchmarks.md). The zero value is ready; it is safe for concurrent
// use. Remembered chains are tied to the Bundle they were verified under.
type Verifier struct {
	mu     sync.Mutex
	bundle *x509.CertPool
	chains map[[32]byte]verifiedChain
}

type verifiedChain struct {
	pub                 *ecdsa.PublicKey
	notBefore, notAfter time.Time // of the whole chain
}

// maxRemembered bounds the cache: a replica makes a worker key a day.
const maxRemembered = 64

// Verify is the package's Verify.
func (v *Verifier) Verify(b Bundle, chain [][]byte, sig []byte, f Fields, now time.Time) error {
	if len(sig) == 0 || len(chain) == 0 {
		return ErrUnsigned
	}
	if f.TrustVersion < b.MinVersion {
		return fmt.Errorf("%w: version %d, the node accepts %d and later", ErrStaleTrust, f.TrustVersion, b.MinVersion)
	}
	pub, err := v.chainKey(b, chain, now)
	if err != nil {
		return err
	}
	f.TrustDomain = b.TrustDomain
	sum := sha256.Sum256(Bytes(f))
	if !ecdsa.VerifyASN1(pub, sum[:], sig) {
		return ErrBadSignature
	}
	return nil
}

func (v *Verifier) chainKey(b Bundle, chain [][]byte, now time.Time) (*ecdsa.PublicKey, error) {
	h := sha256.New()
	h.Write([]byte(b.TrustDomain))
	for _, der := range chain {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(der)))
		h.Write(n[:])
		h.Write(der)
	}
	var key [32]byte
	h.Sum(key[:0])
	v.mu.Lock()
	if v.bundle != b.Roots {
		v.bundle, v.chains = b.Roots, nil
	}
	c, ok := v.chains[key]
	v.mu.Unlock()
	if ok && !now.Before(c.notBefore) && !now.After(c.notAfter) {
		return c.pub, nil
	}
	c, err := verifyChain(b, chain, now)
	if err != nil {
		return nil, err
	}
	v.mu.Lock()
	if v.chains == nil || len(v.chains) >= maxRemembered {
		v.chains = map[[32]byte]verifiedChain{}
	}
	v.chains[key] = c
	v.mu.Unlock()
	return c.pub, nil
}

func verifyChain(b Bundle, chain [][]byte, now time.Time) (verifiedChain, error) {
	leaf, err := x509.ParseCertificate(chain[0])
	if err != nil {
		return verifiedChain{}, fmt.Errorf("%w: the signer's certificate: %w", ErrBadSignature, err)
	}
	inter := x509.NewCertPool()
	c := verifiedChain{notBefore: leaf.NotBefore, notAfter: leaf.NotAfter}
	for _, der := range chain[1:] {
		ic, err := x509.ParseCertificate(der)
		if err != nil {
			return verifiedChain{}, fmt.Errorf("%w: the chain: %w", ErrBadSignature, err)
		}
		inter.AddCert(ic)
	}
	paths, err := leaf.Verify(x509.VerifyOptions{Roots: b.Roots, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	if err != nil {
		return verifiedChain{}, fmt.Errorf("%w: the signer does not chain to a pinned root: %w", ErrBadSignature, err)
	}
	for _, p := range paths[0] {
		if p.NotBefore.After(c.notBefore) {
			c.notBefore = p.NotBefore
		}
		if p.NotAfter.Before(c.notAfter) {
			c.notAfter = p.NotAfter
		}
	}
	if !isSigner(leaf, b.TrustDomain) {
		return verifiedChain{}, fmt.Errorf("%w: the certificate %s is not a command signer of %s", ErrBadSignature, leaf.SerialNumber.Text(16), b.TrustDomain)
	}
	pub, ok := leaf.PublicKey.(*ecdsa.PublicKey)
	if !ok {
		return verifiedChain{}, fmt.Errorf("%w: the signer's key is %T, not ECDSA", ErrBadSignature, leaf.PublicKey)
	}
	c.pub = pub
	return c, nil
}

func isSigner(c *x509.Certificate, td string) bool {
	for _, u := range c.URIs {
		if u.Scheme == "spiffe" && u.Host == td && strings.HasPrefix(u.Path, SignerPathPrefix) {
			return true
		}
	}
	return false
}

// SignerURI is the SPIFFE URI of a worker certificate.
func SignerURI(td, replica string) *url.URL {
	return &url.URL{Scheme: "spiffe", Host: td, Path: SignerPathPrefix + replica}
}
