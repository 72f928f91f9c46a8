// Package nodesecret is the crypto of the node-initiated secret broker
// (AgentService.FetchSecret): the bytes a node signs to ask for a secret,
// and the sealing of the answer to the one-use key the request names. Both
// bcd and the gateway use it, so the two sides cannot disagree on a byte.
// It never sees a database or a log: it must not keep or print a value.
package nodesecret

import (
	"crypto"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/hpke"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
)

// Context separates a fetch request's signature from every other use of
// a node's key (nodesig's reports, renewals).
const Context = "better-compute secret fetch v1"

// sealInfo is the HPKE info string: keys derived for a broker answer are
// good for nothing else.
const sealInfo = "better-compute secret answer v1"

// Nonce bounds, as for renewals.
const (
	MinNonceBytes = 16
	MaxNonceBytes = 64
)

// ErrBadSignature: the request's signature is missing or does not verify.
var ErrBadSignature = errors.New("the fetch request's signature does not verify")

// The suite: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, AES-256-GCM.
var (
	kem  = hpke.DHKEM(ecdh.X25519())
	kdf  = hpke.HKDFSHA256()
	aead = hpke.AES256GCM()
)

// appendField appends s with a 4-byte big-endian length, so no two
// different field lists make the same bytes.
func appendField(b, s []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

// RequestBytes is what a node signs for req: the context, the trust
// domain, the node id, the ref, the nonce, the time (RFC 3339 nano, UTC)
// and the recipient key. The signature itself is left out.
func RequestBytes(trustDomain, nodeID string, req *agentv1.FetchSecretRequest) []byte {
	var t string
	if req.GetTime() != nil {
		t = req.GetTime().AsTime().UTC().Format(time.RFC3339Nano)
	}
	b := make([]byte, 0, 256)
	for _, f := range [][]byte{[]byte(Context), []byte(trustDomain), []byte(nodeID), []byte(req.GetRef()), req.GetNonce(),
		[]byte(t), req.GetRecipientPublicKey()} {
		b = appendField(b, f)
	}
	return b
}

// Sign sets req's signature by key (the node's current certificate key).
func Sign(key crypto.Signer, trustDomain, nodeID string, req *agentv1.FetchSecretRequest) error {
	sum := sha256.Sum256(RequestBytes(trustDomain, nodeID, req))
	sig, err := key.Sign(rand.Reader, sum[:], crypto.SHA256)
	if err != nil {
		return fmt.Errorf("nodesecret: sign: %w", err)
	}
	req.Signature = sig
	return nil
}

// Verify checks req's signature by pub (the presented certificate's key).
func Verify(pub crypto.PublicKey, trustDomain, nodeID string, req *agentv1.FetchSecretRequest) error {
	k, ok := pub.(*ecdsa.PublicKey)
	if !ok {
		return fmt.Errorf("%w: the node's key is %T", ErrBadSignature, pub)
	}
	if len(req.GetSignature()) == 0 {
		return fmt.Errorf("%w: unsigned", ErrBadSignature)
	}
	sum := sha256.Sum256(RequestBytes(trustDomain, nodeID, req))
	if !ecdsa.VerifyASN1(k, sum[:], req.GetSignature()) {
		return ErrBadSignature
	}
	return nil
}

// Binding is what an answer is bound to: its associated data. An answer
// opened under any other node, ref, version or request nonce fails.
type Binding struct {
	TrustDomain string
	NodeID      string
	Ref         string
	Version     int64
	Nonce       []byte
}

func (b Binding) aad() []byte {
	out := make([]byte, 0, 128)
	for _, f := range [][]byte{[]byte(sealInfo), []byte(b.TrustDomain), []byte(b.NodeID), []byte(b.Ref), b.Nonce} {
		out = appendField(out, f)
	}
	return binary.BigEndian.AppendUint64(out, uint64(b.Version))
}

// NewKey makes the one-use X25519 key a request names; its private half
// opens only that request's answer.
func NewKey() (*ecdh.PrivateKey, error) {
	return ecdh.X25519().GenerateKey(rand.Reader)
}

// CheckRecipient reports whether b is an X25519 public key an answer can
// be sealed to.
func CheckRecipient(b []byte) error {
	if _, err := kem.NewPublicKey(b); err != nil {
		return fmt.Errorf("not an X25519 public key: %w", err)
	}
	return nil
}

// Seal seals plaintext to the X25519 public key recipient under a fresh
// server ephemeral key (HPKE base mode), bound to b.
func Seal(recipient []byte, b Binding, plaintext []byte) (enc, ciphertext []byte, err error) {
	pk, err := kem.NewPublicKey(recipient)
	if err != nil {
		return nil, nil, fmt.Errorf("nodesecret: recipient key: %w", err)
	}
	enc, s, err := hpke.NewSender(pk, kdf, aead, []byte(sealInfo))
	if err != nil {
		return nil, nil, fmt.Errorf("nodesecret: seal: %w", err)
	}
	ct, err := s.Seal(b.aad(), plaintext)
	if err != nil {
		return nil, nil, fmt.Errorf("nodesecret: seal: %w", err)
	}
	return enc, ct, nil
}

// ErrOpen: the answer does not open with this key under this binding.
var ErrOpen = errors.New("nodesecret: the answer does not open with this key and binding")

// Open opens an answer sealed to key's public half under b.
func Open(key *ecdh.PrivateKey, b Binding, enc, ciphertext []byte) ([]byte, error) {
	sk, err := hpke.NewDHKEMPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("nodesecret: key: %w", err)
	}
	r, err := hpke.NewRecipient(enc, sk, kdf, aead, []byte(sealInfo))
	if err != nil {
		return nil, ErrOpen
	}
	out, err := r.Open(b.aad(), ciphertext)
	if err != nil {
		return nil, ErrOpen
	}
	return out, nil
}
