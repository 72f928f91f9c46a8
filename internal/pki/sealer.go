package pki

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// SecretEnv names the environment variable that holds the sealing secret.
const SecretEnv = "BETTER_COMPUTE_SECRET"

// SecretFile is the file under the state directory where dev keeps a
// generated secret (mode 0600) when SecretEnv is unset.
const SecretFile = "secret"

const (
	keyIDLen = 8
	keyLen   = 32

	// sealVersion prefixes a value sealed under the derived sealing key.
	// Values sealed before it (under the raw secret) start with the raw
	// key's id instead; the key id after the prefix tells the two apart.
	sealVersion byte = 2
	// sealKeyInfo is the HKDF label of the sealing key, so the secret
	// itself never keys AES-GCM and each use of it has its own key.
	sealKeyInfo = "bc sealer v2"
)

// ErrSealed: a sealed value could not be opened (wrong key, wrong ref,
// tampered or truncated).
var ErrSealed = errors.New("pki: cannot open sealed value")

// Sealer encrypts secrets at rest with AES-256-GCM under a key derived from
// the deployment secret (HKDF-SHA256, label sealKeyInfo). The ref a value is
// sealed under is its additional data, so a sealed blob moved to another ref
// does not open.
//
// Values sealed by earlier releases, under the raw secret, still open (the
// legacy key is kept for Open only); Legacy reports them and a reseal
// (Reseal, or any module's reseal with this Sealer on both sides) moves
// them under the derived key.
type Sealer struct {
	key   [keyLen]byte // the deployment secret; only ever an HKDF input
	keyID [keyIDLen]byte
	aead  cipher.AEAD

	legacyKeyID [keyIDLen]byte
	legacyAEAD  cipher.AEAD
}

// NewSealer makes a Sealer from the value of BETTER_COMPUTE_SECRET: base64
// (standard or URL alphabet, padded or not) of exactly 32 bytes. The error
// never repeats the secret.
func NewSealer(secret string) (*Sealer, error) {
	secret = strings.TrimSpace(secret)
	if secret == "" {
		return nil, fmt.Errorf("%s is empty: it must be base64 of 32 random bytes (generate one with `openssl rand -base64 32`)", SecretEnv)
	}
	var raw []byte
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(secret); err == nil {
			raw = b
			break
		}
	}
	if raw == nil {
		return nil, fmt.Errorf("%s is not base64: it must be base64 of 32 random bytes", SecretEnv)
	}
	if len(raw) != keyLen {
		return nil, fmt.Errorf("%s decodes to %d bytes: it must be base64 of exactly %d bytes", SecretEnv, len(raw), keyLen)
	}
	s := &Sealer{}
	copy(s.key[:], raw)
	sealKey, err := s.deriveKey(sealKeyInfo)
	if err != nil {
		return nil, err
	}
	if s.aead, err = newGCM(sealKey); err != nil {
		return nil, err
	}
	sum := sha256.Sum256(sealKey)
	copy(s.keyID[:], sum[:keyIDLen])
	clear(sealKey)
	if s.legacyAEAD, err = newGCM(s.key[:]); err != nil {
		return nil, err
	}
	sum = sha256.Sum256(s.key[:])
	copy(s.legacyKeyID[:], sum[:keyIDLen])
	return s, nil
}

func newGCM(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// GenerateSecret returns a new random secret in the form NewSealer takes.
func GenerateSecret() (string, error) {
	var b [keyLen]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(b[:]), nil
}

// LoadSealer finds the secret the way every command does: the environment
// variable SecretEnv (read through lookupEnv; nil means os.LookupEnv), else
// <stateDir>/secret when that file exists and only its owner may read it.
func LoadSealer(lookupEnv func(string) (string, bool), stateDir string) (*Sealer, error) {
	if lookupEnv == nil {
		lookupEnv = os.LookupEnv
	}
	if v, ok := lookupEnv(SecretEnv); ok && v != "" {
		return NewSealer(v)
	}
	if stateDir != "" {
		path := filepath.Join(stateDir, SecretFile)
		fi, err := os.Stat(path)
		switch {
		case err == nil:
			if fi.Mode().Perm()&0o077 != 0 {
				return nil, fmt.Errorf("%s is readable by others (mode %v): chmod 600 it", path, fi.Mode().Perm())
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return nil, err
			}
			s, err := NewSealer(string(b))
			if err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			return s, nil
		case !errors.Is(err, os.ErrNotExist):
			return nil, err
		}
	}
	return nil, fmt.Errorf("no sealing secret: set %s (base64 of 32 random bytes) or create %s", SecretEnv, filepath.Join(stateDir, SecretFile))
}

// KeyID returns the first 8 bytes of the SHA-256 of the sealing key, as
// every sealed value carries it after its version byte.
func (s *Sealer) KeyID() []byte { return bytes.Clone(s.keyID[:]) }

// Seal encrypts plaintext for ref under the derived key. The output is the
// version byte, key id, nonce, ciphertext.
func (s *Sealer) Seal(ref string, plaintext []byte) ([]byte, error) {
	if ref == "" {
		return nil, errors.New("pki: seal: empty ref")
	}
	const head = 1 + keyIDLen
	ns := s.aead.NonceSize()
	out := make([]byte, head+ns, head+ns+len(plaintext)+s.aead.Overhead())
	out[0] = sealVersion
	copy(out[1:], s.keyID[:])
	if _, err := rand.Read(out[head:]); err != nil {
		return nil, err
	}
	return s.aead.Seal(out, out[head:], plaintext, []byte(ref)), nil
}

// Open decrypts a value Seal made for ref, or one an earlier release sealed
// under the raw secret. A value sealed under another key, another ref, or
// altered in any way is refused with ErrSealed.
func (s *Sealer) Open(ref string, sealed []byte) ([]byte, error) {
	aead, body := s.aead, []byte(nil)
	switch {
	case s.current(sealed):
		body = sealed[1+keyIDLen:]
	case s.Legacy(sealed):
		aead, body = s.legacyAEAD, sealed[keyIDLen:]
	case len(sealed) < keyIDLen+s.aead.NonceSize()+s.aead.Overhead():
		return nil, fmt.Errorf("%w %q: too short", ErrSealed, ref)
	default:
		return nil, fmt.Errorf("%w %q: sealed under another key (this secret's key id is %x)", ErrSealed, ref, s.keyID[:])
	}
	ns := aead.NonceSize()
	if len(body) < ns+aead.Overhead() {
		return nil, fmt.Errorf("%w %q: too short", ErrSealed, ref)
	}
	pt, err := aead.Open(nil, body[:ns], body[ns:], []byte(ref))
	if err != nil {
		return nil, fmt.Errorf("%w %q: authentication failed (tampered, or sealed for another ref)", ErrSealed, ref)
	}
	return pt, nil
}

// Legacy reports whether sealed carries the raw secret's key id: a value
// an earlier release sealed without the derived key, which a reseal should
// move. Whether it opens is Open's to say.
func (s *Sealer) Legacy(sealed []byte) bool {
	return len(sealed) >= keyIDLen && bytes.Equal(sealed[:keyIDLen], s.legacyKeyID[:]) && !s.current(sealed)
}

func (s *Sealer) current(sealed []byte) bool {
	return len(sealed) > keyIDLen && sealed[0] == sealVersion && bytes.Equal(sealed[1:1+keyIDLen], s.keyID[:])
}

// deriveKey derives a purpose-bound key from the secret, so that the join
// token key is never the sealing key itself.
func (s *Sealer) deriveKey(info string) ([]byte, error) {
	return hkdf.Key(sha256.New, s.key[:], nil, info, keyLen)
}
