// Package attestor names the ways a machine proves what it is when it
// joins, besides the join token every join carries: a TPM 2.0 (tpm), a
// machine certificate from an operator's CA (x509) and a cloud provider's
// signed instance-identity document (cloud) and a Kubernetes kubelet's
// client certificate from a registered cluster CA (kubelet). Each has a subpackage with the
// node's side (gathering evidence) and the control plane's (verifying it);
// this package holds what they share: the kinds and the digest that binds
// evidence to one join.
//
// It must never decide admission by itself: a verifier says what the
// evidence proves, against trust anchors the caller chose (the join token's
// tenant's only); the gateway decides.
package attestor

import (
	"crypto/sha256"
	"errors"
	"slices"
)

// Kinds of attestation. JoinToken is recorded on a node that proved only
// its join token.
const (
	JoinToken = "join_token"
	TPM       = "tpm"
	X509      = "x509"
	Cloud     = "cloud"
	Kubelet   = "kubelet"
)

// Kinds are the attestors a join token or a trust anchor can name.
var Kinds = []string{TPM, X509, Cloud, Kubelet}

// Valid reports whether kind is one of Kinds.
func Valid(kind string) bool { return slices.Contains(Kinds, kind) }

// NonceSize is the size of a join challenge's nonce.
const NonceSize = 32

// ErrEvidence is wrapped by every refusal of evidence.
var ErrEvidence = errors.New("attestation refused")

// BindingDigest is what x509 proof of possession signs and what a TPM
// quote's nonce and a cloud document's nonce carry: SHA-256 over a
// domain-separating label, the attestor kind, the server's nonce and the
// SHA-256 of the join's CSR. Binding the CSR means evidence gathered for
// one join cannot admit another key, and the nonce means it cannot be
// replayed past the challenge's life.
func BindingDigest(kind string, nonce, csrSHA256 []byte) []byte {
	h := sha256.New()
	h.Write([]byte("bc-join-attestation-v1\x00"))
	h.Write([]byte(kind))
	h.Write([]byte{0})
	h.Write(nonce)
	h.Write(csrSHA256)
	return h.Sum(nil)
}
