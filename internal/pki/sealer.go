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
)

// ErrSealed: a sealed value could not be opened (wrong key, wrong ref,
// tampered or truncated).
var ErrSealed = errors.New("pki: cannot open sealed value")

// Sealer encrypts secrets at rest with AES-256-GCM. The ref a value is sealed
// under is its additional data, so a sealed blob moved to another ref does not
// open.
type Sealer struct {
	key   [keyLen]byte
	keyID [keyIDLen]byte
	aead  cipher.AEAD
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
	sum := sha256.Sum256(s.key[:])
	copy(s.keyID[:], sum[:keyIDLen])
	block, err := aes.NewCipher(s.key[:])
	if err != nil {
		return nil, err
	}
	if s.aead, err = cipher.NewGCM(block); err != nil {
		return nil, err
	}
	return s, nil
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

// KeyID returns the first 8 bytes of the SHA-256 of the key, as every sealed
// value carries it.
func (s *Sealer) KeyID() []byte { return bytes.Clone(s.keyID[:]) }

// Seal encrypts plaintext for ref. The output is key id, nonce, ciphertext.
func (s *Sealer) Seal(ref string, plaintext []byte) ([]byte, error) {
	if ref == "" {
		return nil, errors.New("pki: seal: empty ref")
	}
	ns := s.aead.NonceSize()
	out := make([]byte, keyIDLen+ns, keyIDLen+ns+len(plaintext)+s.aead.Overhead())
	copy(out, s.keyID[:])
	if _, err := rand.Read(out[keyIDLen:]); err != nil {
		return nil, err
	}
	return s.aead.Seal(out, out[keyIDLen:], plaintext, []byte(ref)), nil
}

// Open decrypts a value Seal made for ref. A value sealed under another key,
// another ref, or altered in any way is refused with ErrSealed.
func (s *Sealer) Open(ref string, sealed []byte) ([]byte, error) {
	ns := s.aead.NonceSize()
	if len(sealed) < keyIDLen+ns+s.aead.Overhead() {
		return nil, fmt.Errorf("%w %q: too short", ErrSealed, ref)
	}
	if !bytes.Equal(sealed[:keyIDLen], s.keyID[:]) {
		return nil, fmt.Errorf("%w %q: sealed under another key (key id %x, this secret's is %x)", ErrSealed, ref, sealed[:keyIDLen], s.keyID[:])
	}
	pt, err := s.aead.Open(nil, sealed[keyIDLen:keyIDLen+ns], sealed[keyIDLen+ns:], []byte(ref))
	if err != nil {
		return nil, fmt.Errorf("%w %q: authentication failed (tampered, or sealed for another ref)", ErrSealed, ref)
	}
	return pt, nil
}

// deriveKey derives a purpose-bound key from the secret, so that the join
// token key is never the sealing key itself.
func (s *Sealer) deriveKey(info string) ([]byte, error) {
	return hkdf.Key(sha256.New, s.key[:], nil, info, keyLen)
}
