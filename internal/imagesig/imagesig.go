// Package imagesig is the pure cryptography of image signing: the signed
// payload, key parsing and fingerprints, signing, and the check the ramdisk
// runs on downloaded bytes before it writes them to a disk.
//
// It imports only the standard library, so the ramdisk and the site agent
// can use it without the control plane. It must never read a database or
// decide who may deploy what: that is internal/images.
package imagesig

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"regexp"
)

// Algorithms of signer keys.
const (
	AlgEd25519   = "ed25519"
	AlgECDSAP256 = "ecdsa-p256"
)

// PayloadVersion heads every signed payload; a new payload format gets a new
// version, so a signature can never be read under another format.
const PayloadVersion = "better-compute-image-v1"

var digestRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// ValidDigest reports whether s is a lower-case hex sha256.
func ValidDigest(s string) bool { return digestRE.MatchString(s) }

// Payload is the exact byte string a signer signs for an image:
//
//	better-compute-image-v1\n<name>\n<kind>\n<sha256 hex>\n
//
// The name and kind are bound so that a signed kernel cannot pass as a
// ramdisk, nor one tenant's "debian-12" as another image of the same bytes
// under a name the signer never saw.
func Payload(name, kind, sha256Hex string) []byte {
	return []byte(PayloadVersion + "\n" + name + "\n" + kind + "\n" + sha256Hex + "\n")
}

// PublicKey is a parsed signer key.
type PublicKey struct {
	Algorithm string
	// Fingerprint is the lower-case hex sha256 of the PKIX DER encoding.
	Fingerprint string
	// DER is the PKIX encoding.
	DER []byte
	key crypto.PublicKey
}

// PEM returns the key as PEM "PUBLIC KEY".
func (k PublicKey) PEM() string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: k.DER}))
}

// ParsePublicKeyPEM parses one PEM "PUBLIC KEY" block (PKIX) holding an
// Ed25519 or ECDSA P-256 key; anything else is refused.
func ParsePublicKeyPEM(text []byte) (PublicKey, error) {
	block, rest := pem.Decode(text)
	if block == nil {
		return PublicKey{}, errors.New("is not PEM: want a \"PUBLIC KEY\" block")
	}
	if block.Type != "PUBLIC KEY" {
		return PublicKey{}, fmt.Errorf("is a PEM %q block: want \"PUBLIC KEY\" (a private key must never be sent)", block.Type)
	}
	if len(pemTrim(rest)) > 0 {
		return PublicKey{}, errors.New("holds more than one PEM block")
	}
	return ParsePublicKeyDER(block.Bytes)
}

func pemTrim(b []byte) []byte {
	for len(b) > 0 && (b[0] == '\n' || b[0] == '\r' || b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	return b
}

// ParsePublicKeyDER parses a PKIX public key.
func ParsePublicKeyDER(der []byte) (PublicKey, error) {
	k, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return PublicKey{}, fmt.Errorf("is not a PKIX public key: %w", err)
	}
	out := PublicKey{DER: der, key: k}
	switch k := k.(type) {
	case ed25519.PublicKey:
		out.Algorithm = AlgEd25519
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return PublicKey{}, fmt.Errorf("is an ECDSA key on %s: only P-256 is accepted", k.Curve.Params().Name)
		}
		out.Algorithm = AlgECDSAP256
	default:
		return PublicKey{}, fmt.Errorf("is a %T: only Ed25519 and ECDSA P-256 are accepted", k)
	}
	sum := sha256.Sum256(der)
	out.Fingerprint = hex.EncodeToString(sum[:])
	return out, nil
}

// Verify checks sig over payload. Ed25519 signs the payload itself; ECDSA
// P-256 signs its sha256, ASN.1 DER encoded.
func (k PublicKey) Verify(payload, sig []byte) error {
	ok := false
	switch pub := k.key.(type) {
	case ed25519.PublicKey:
		ok = ed25519.Verify(pub, payload, sig)
	case *ecdsa.PublicKey:
		sum := sha256.Sum256(payload)
		ok = ecdsa.VerifyASN1(pub, sum[:], sig)
	}
	if !ok {
		return ErrBadSignature
	}
	return nil
}

// ErrBadSignature is a signature that does not verify under its key.
var ErrBadSignature = errors.New("signature does not verify")

// Signer is a private signing key.
type Signer struct {
	Public PublicKey
	key    crypto.Signer
}

// ParsePrivateKeyPEM parses a PEM "PRIVATE KEY" (PKCS#8) block, as
// `openssl genpkey -algorithm ed25519` or GenerateKey writes it, or an
// "EC PRIVATE KEY" (SEC 1) on P-256.
func ParsePrivateKeyPEM(text []byte) (Signer, error) {
	block, _ := pem.Decode(text)
	if block == nil {
		return Signer{}, errors.New("is not PEM: want a \"PRIVATE KEY\" block")
	}
	var (
		k   any
		err error
	)
	switch block.Type {
	case "PRIVATE KEY":
		k, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(block.Bytes)
	default:
		return Signer{}, fmt.Errorf("is a PEM %q block: want \"PRIVATE KEY\"", block.Type)
	}
	if err != nil {
		return Signer{}, fmt.Errorf("is not a private key: %w", err)
	}
	cs, ok := k.(crypto.Signer)
	if !ok {
		return Signer{}, fmt.Errorf("is a %T: it cannot sign", k)
	}
	der, err := x509.MarshalPKIXPublicKey(cs.Public())
	if err != nil {
		return Signer{}, err
	}
	pub, err := ParsePublicKeyDER(der)
	if err != nil {
		return Signer{}, err
	}
	return Signer{Public: pub, key: cs}, nil
}

// GenerateKey makes a new key of the algorithm and returns it with its PEM
// "PRIVATE KEY" (PKCS#8) encoding.
func GenerateKey(alg string) (Signer, []byte, error) {
	var (
		k   crypto.Signer
		err error
	)
	switch alg {
	case AlgEd25519:
		_, k, err = ed25519.GenerateKey(rand.Reader)
	case AlgECDSAP256:
		k, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	default:
		return Signer{}, nil, fmt.Errorf("unknown algorithm %q: want %s or %s", alg, AlgEd25519, AlgECDSAP256)
	}
	if err != nil {
		return Signer{}, nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return Signer{}, nil, err
	}
	text := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	s, err := ParsePrivateKeyPEM(text)
	return s, text, err
}

// Sign signs payload as Verify expects.
func (s Signer) Sign(payload []byte) ([]byte, error) {
	if _, ok := s.key.(ed25519.PrivateKey); ok {
		return s.key.Sign(rand.Reader, payload, crypto.Hash(0))
	}
	sum := sha256.Sum256(payload)
	return s.key.Sign(rand.Reader, sum[:], crypto.SHA256)
}

// Descriptor is what the ramdisk is told about the image it downloads.
type Descriptor struct {
	Name   string
	Kind   string
	SHA256 string
	Size   int64
	// Signatures are (fingerprint, signature) pairs the catalog holds.
	Signatures []Signature
}

// Signature is one signature of a Descriptor.
type Signature struct {
	KeyFingerprint string
	Signature      []byte
}

// ErrDigestMismatch is content whose size or sha256 is not the descriptor's.
var ErrDigestMismatch = errors.New("image content does not match its digest")

// ErrUntrusted is an image no trusted key signed.
var ErrUntrusted = errors.New("no trusted key signed the image")

// VerifySignatures reports whether some signature of d verifies under one of
// trusted (the keys the verifier was configured with, never keys the
// descriptor brought).
func VerifySignatures(d Descriptor, trusted []PublicKey) error {
	payload := Payload(d.Name, d.Kind, d.SHA256)
	for _, sig := range d.Signatures {
		for _, k := range trusted {
			if k.Fingerprint == sig.KeyFingerprint && k.Verify(payload, sig.Signature) == nil {
				return nil
			}
		}
	}
	return ErrUntrusted
}

// CopyVerified copies r to w while hashing, then checks the size, the
// digest and a trusted signature. The caller writes w to a place it can
// discard (a staging file, or a disk it will wipe on error): when
// CopyVerified fails, what reached w must not be used. It reads at most
// d.Size+1 bytes, so a source longer than promised fails without being
// read to its end.
func CopyVerified(w io.Writer, r io.Reader, d Descriptor, trusted []PublicKey) (int64, error) {
	if err := VerifySignatures(d, trusted); err != nil {
		return 0, err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(w, h), io.LimitReader(r, d.Size+1))
	if err != nil {
		return n, err
	}
	if n != d.Size || hex.EncodeToString(h.Sum(nil)) != d.SHA256 {
		return n, fmt.Errorf("%w: got %d bytes, want %d with sha256 %s", ErrDigestMismatch, n, d.Size, d.SHA256)
	}
	return n, nil
}
