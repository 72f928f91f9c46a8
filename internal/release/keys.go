package release

import (
	"encoding/pem"
	"errors"
	"fmt"

	"github.com/better-compute/better-compute/internal/imagesig"
)

// PEM labels of release keys. The key bytes are the usual PKCS#8 and PKIX
// encodings (the algorithms and checks of internal/imagesig), under labels
// of their own: the command-signing root's key (command-root-<n>.key) and
// image signer keys are "PRIVATE KEY" and "PUBLIC KEY" blocks, and a file
// of either is refused here, so one key cannot serve both purposes by
// accident.
const (
	PrivateKeyPEMType = "BETTER COMPUTE RELEASE PRIVATE KEY"
	PublicKeyPEMType  = "BETTER COMPUTE RELEASE PUBLIC KEY"
)

// KeyIDPrefix heads every release key id: "release:" and the lower-case
// hex sha256 of the key's PKIX encoding.
const KeyIDPrefix = "release:"

// Algorithms of release keys.
const (
	AlgEd25519   = imagesig.AlgEd25519
	AlgECDSAP256 = imagesig.AlgECDSAP256
)

// PublicKey is a release public key.
type PublicKey struct {
	// ID is KeyIDPrefix and the key's fingerprint.
	ID  string
	key imagesig.PublicKey
}

// Algorithm is AlgEd25519 or AlgECDSAP256.
func (k PublicKey) Algorithm() string { return k.key.Algorithm }

// PEM is the key as a PublicKeyPEMType block.
func (k PublicKey) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: PublicKeyPEMType, Bytes: k.key.DER})
}

func publicKey(k imagesig.PublicKey) PublicKey {
	return PublicKey{ID: KeyIDPrefix + k.Fingerprint, key: k}
}

// ParsePublicKeyPEM parses one PublicKeyPEMType block. A "PUBLIC KEY" or
// "CERTIFICATE" block (an image signer's key, the command-signing root's
// certificate) is refused as ErrWrongPurpose.
func ParsePublicKeyPEM(text []byte) (PublicKey, error) {
	block, rest := pem.Decode(text)
	if block == nil {
		return PublicKey{}, refuse("pubkey", ErrMalformed, "is not PEM: want a %q block", PublicKeyPEMType)
	}
	if block.Type != PublicKeyPEMType {
		return PublicKey{}, refuse("pubkey", ErrWrongPurpose, "is a PEM %q block: want %q (release keygen makes one; the command-signing root and image signer keys are not release keys)", block.Type, PublicKeyPEMType)
	}
	if len(trimSpace(rest)) > 0 {
		return PublicKey{}, refuse("pubkey", ErrMalformed, "holds more than one PEM block")
	}
	k, err := imagesig.ParsePublicKeyDER(block.Bytes)
	if err != nil {
		return PublicKey{}, refuse("pubkey", ErrMalformed, "%v", err)
	}
	return publicKey(k), nil
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == '\n' || b[0] == '\r' || b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	return b
}

// Key is a release private key.
type Key struct {
	Public PublicKey
	signer imagesig.Signer
}

// ParsePrivateKeyPEM parses a PrivateKeyPEMType block (PKCS#8, Ed25519 or
// ECDSA P-256). A "PRIVATE KEY" or "EC PRIVATE KEY" block, the form of the
// command-signing root's offline key and of image signer keys, is refused
// as ErrWrongPurpose.
func ParsePrivateKeyPEM(text []byte) (Key, error) {
	block, _ := pem.Decode(text)
	if block == nil {
		return Key{}, refuse("key", ErrMalformed, "is not PEM: want a %q block", PrivateKeyPEMType)
	}
	if block.Type != PrivateKeyPEMType {
		return Key{}, refuse("key", ErrWrongPurpose, "is a PEM %q block: want %q (release keygen makes one; the command-signing root and image signer keys must not sign releases)", block.Type, PrivateKeyPEMType)
	}
	// imagesig holds the algorithms; it reads the standard label.
	std := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: block.Bytes})
	s, err := imagesig.ParsePrivateKeyPEM(std)
	clear(std)
	clear(block.Bytes)
	if err != nil {
		return Key{}, refuse("key", ErrMalformed, "%v", err)
	}
	return Key{Public: publicKey(s.Public), signer: s}, nil
}

// GenerateKey makes a release key of alg and returns it with its
// PrivateKeyPEMType encoding.
func GenerateKey(alg string) (Key, []byte, error) {
	s, text, err := imagesig.GenerateKey(alg)
	if err != nil {
		return Key{}, nil, refuse("algorithm", ErrInvalid, "%v", err)
	}
	block, _ := pem.Decode(text)
	if block == nil {
		return Key{}, nil, errors.New("release: the generated key did not encode")
	}
	clear(text)
	priv := pem.EncodeToMemory(&pem.Block{Type: PrivateKeyPEMType, Bytes: block.Bytes})
	clear(block.Bytes)
	return Key{Public: publicKey(s.Public), signer: s}, priv, nil
}

// sign signs payload as PublicKey.verify expects.
func (k Key) sign(payload []byte) ([]byte, error) {
	sig, err := k.signer.Sign(payload)
	if err != nil {
		return nil, fmt.Errorf("release: sign: %w", err)
	}
	return sig, nil
}

func (k PublicKey) verify(payload, sig []byte) bool { return k.key.Verify(payload, sig) == nil }
