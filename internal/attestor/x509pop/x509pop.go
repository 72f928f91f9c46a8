// Package x509pop is the x509 proof-of-possession attestor: the node
// presents a machine certificate (and its intermediates) that chains to a CA
// the operator registered, and signs the join's binding digest with the
// certificate's key. It proves the node holds a key an existing CA vouched
// for; it must never accept a chain it did not verify to one of the given
// roots, nor a signature over anything but the binding digest.
package x509pop

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/internal/attestor"
)

// Limits on what Verify parses.
const (
	MaxChain     = 8
	MaxCertBytes = 16 << 10
	MaxSigBytes  = 1024
)

// Sign signs the binding digest with the machine key: ECDSA (ASN.1),
// Ed25519 or RSA PKCS #1 v1.5 over SHA-256.
func Sign(key crypto.Signer, digest []byte) ([]byte, error) {
	switch key.Public().(type) {
	case ed25519.PublicKey:
		return key.Sign(rand.Reader, digest, crypto.Hash(0))
	case *ecdsa.PublicKey, *rsa.PublicKey:
		return key.Sign(rand.Reader, digest, crypto.SHA256)
	}
	return nil, fmt.Errorf("x509pop: key type %T is not supported", key.Public())
}

// Result is what a verified proof says.
type Result struct {
	Leaf *x509.Certificate
	// Root is the registered CA the chain ended at.
	Root *x509.Certificate
	// Subject names the machine: "x509:sha256:<leaf fingerprint>".
	Subject string
}

// Verify checks that chain (leaf first, DER) verifies at now to one of roots
// for client authentication (or any usage the CA allows) and that sig is
// the leaf key's signature over digest.
func Verify(chain [][]byte, sig, digest []byte, roots []*x509.Certificate, now time.Time) (Result, error) {
	return VerifyAs("x509", chain, sig, digest, roots, now)
}

// VerifyAs is Verify for an attestor that proves possession the same way
// (kubelet): its refusals name kind.
func VerifyAs(kind string, chain [][]byte, sig, digest []byte, roots []*x509.Certificate, now time.Time) (Result, error) {
	switch {
	case len(chain) == 0:
		return Result{}, fmt.Errorf("%w: %s: no certificate", attestor.ErrEvidence, kind)
	case len(chain) > MaxChain:
		return Result{}, fmt.Errorf("%w: %s: more than %d certificates", attestor.ErrEvidence, kind, MaxChain)
	case len(sig) == 0 || len(sig) > MaxSigBytes:
		return Result{}, fmt.Errorf("%w: %s: signature must be 1-%d bytes", attestor.ErrEvidence, kind, MaxSigBytes)
	case len(roots) == 0:
		return Result{}, fmt.Errorf("%w: %s: the tenant registered no %s CA", attestor.ErrEvidence, kind, kind)
	}
	certs := make([]*x509.Certificate, len(chain))
	for i, der := range chain {
		if len(der) > MaxCertBytes {
			return Result{}, fmt.Errorf("%w: %s: certificate %d is larger than %d bytes", attestor.ErrEvidence, kind, i, MaxCertBytes)
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return Result{}, fmt.Errorf("%w: %s: certificate %d: %w", attestor.ErrEvidence, kind, i, err)
		}
		certs[i] = c
	}
	rootPool, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range roots {
		rootPool.AddCert(r)
	}
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	chains, err := certs[0].Verify(x509.VerifyOptions{
		Roots: rootPool, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return Result{}, fmt.Errorf("%w: %s: the certificate does not chain to a registered CA: %w", attestor.ErrEvidence, kind, err)
	}
	if !verifySig(certs[0].PublicKey, digest, sig) {
		return Result{}, fmt.Errorf("%w: %s: the signature over the join challenge does not verify with the certificate's key", attestor.ErrEvidence, kind)
	}
	sum := sha256.Sum256(certs[0].Raw)
	c := chains[0]
	return Result{Leaf: certs[0], Root: c[len(c)-1], Subject: "x509:sha256:" + hex.EncodeToString(sum[:])}, nil
}

func verifySig(pub any, digest, sig []byte) bool {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		return ecdsa.VerifyASN1(k, digest, sig)
	case ed25519.PublicKey:
		return ed25519.Verify(k, digest, sig)
	case *rsa.PublicKey:
		return rsa.VerifyPKCS1v15(k, crypto.SHA256, digest, sig) == nil
	}
	return false
}

// Load reads the machine certificate chain and its key from PEM files, as
// crypto/tls does, for bcd's --attest-x509-cert and --attest-x509-key.
func Load(certFile, keyFile string) (chain [][]byte, key crypto.Signer, err error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("x509pop: load machine certificate: %w", err)
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, nil, errors.New("x509pop: the machine key cannot sign")
	}
	return pair.Certificate, key, nil
}
