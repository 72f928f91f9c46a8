package pki

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// Join token errors; OpenJoinToken wraps exactly one of them.
var (
	// ErrTokenMalformed: not a join token, or one that does not decrypt.
	ErrTokenMalformed = errors.New("pki: malformed join token")
	// ErrTokenExpired: a valid token past its expiry.
	ErrTokenExpired = errors.New("pki: join token expired")
	// ErrTokenForeign: a token of another authority (another pin).
	ErrTokenForeign = errors.New("pki: join token of another authority")
)

const (
	joinKeyInfo     = "bc join token"
	joinTokenPrefix = "bcjt_"
	// pinHeader binds the pin into the JWE's protected header, so the clear
	// prefix cannot be swapped.
	pinHeader = jose.HeaderKey("bc_pin")
	// maxJoinTokenLen bounds what OpenJoinToken parses.
	maxJoinTokenLen = 8 << 10
	pinLen          = 64
)

// JoinClaims are what a join token says about the node that presents it.
type JoinClaims struct {
	TokenID   string            `json:"jti"`
	TenantID  string            `json:"tnt"`
	ProjectID string            `json:"prj"`
	Pool      string            `json:"pool,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	ExpiresAt time.Time         `json:"exp"`
}

// SealJoinToken seals claims as a JWE (dir, A256GCM, key derived from the
// sealing secret) and returns "bcjt_" + Pin() + "." + the compact JWE, so
// that an agent reads the pin without any secret.
func (a *Authority) SealJoinToken(c JoinClaims) (string, error) {
	if c.TokenID == "" {
		return "", errors.New("pki: a join token needs a token id")
	}
	if c.ExpiresAt.IsZero() {
		return "", errors.New("pki: a join token needs an expiry")
	}
	c.ExpiresAt = c.ExpiresAt.UTC()
	pin := a.Pin()
	payload, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	enc, err := jose.NewEncrypter(jose.A256GCM, jose.Recipient{Algorithm: jose.DIRECT, Key: a.joinKey},
		(&jose.EncrypterOptions{}).WithType("bc-join").WithHeader(pinHeader, pin))
	if err != nil {
		return "", err
	}
	obj, err := enc.Encrypt(payload)
	if err != nil {
		return "", err
	}
	compact, err := obj.CompactSerialize()
	if err != nil {
		return "", err
	}
	return joinTokenPrefix + pin + "." + compact, nil
}

// OpenJoinToken opens a token SealJoinToken made. It refuses a token of
// another pin (ErrTokenForeign), one that does not parse or decrypt
// (ErrTokenMalformed), and one expired by the authority's clock
// (ErrTokenExpired).
func (a *Authority) OpenJoinToken(token string) (JoinClaims, error) {
	if len(token) > maxJoinTokenLen {
		return JoinClaims{}, fmt.Errorf("%w: longer than %d bytes", ErrTokenMalformed, maxJoinTokenLen)
	}
	pin, compact, err := splitToken(token)
	if err != nil {
		return JoinClaims{}, err
	}
	if pin != a.Pin() {
		return JoinClaims{}, fmt.Errorf("%w: pin %s is not this authority's", ErrTokenForeign, pin)
	}
	obj, err := jose.ParseEncryptedCompact(compact, []jose.KeyAlgorithm{jose.DIRECT}, []jose.ContentEncryption{jose.A256GCM})
	if err != nil {
		return JoinClaims{}, fmt.Errorf("%w: %w", ErrTokenMalformed, err)
	}
	payload, err := obj.Decrypt(a.joinKey)
	if err != nil {
		// A token sealed under another secret lands here too.
		return JoinClaims{}, fmt.Errorf("%w: does not decrypt", ErrTokenMalformed)
	}
	if got, _ := obj.Header.ExtraHeaders[pinHeader].(string); got != pin {
		return JoinClaims{}, fmt.Errorf("%w: sealed for pin %q", ErrTokenForeign, got)
	}
	var c JoinClaims
	if err := json.Unmarshal(payload, &c); err != nil {
		return JoinClaims{}, fmt.Errorf("%w: claims: %w", ErrTokenMalformed, err)
	}
	if c.TokenID == "" || c.ExpiresAt.IsZero() {
		return JoinClaims{}, fmt.Errorf("%w: claims lack a token id or expiry", ErrTokenMalformed)
	}
	if !a.clk.Now().Before(c.ExpiresAt) {
		return JoinClaims{}, fmt.Errorf("%w at %s", ErrTokenExpired, c.ExpiresAt.Format(time.RFC3339))
	}
	return c, nil
}

// TokenPin returns the pin a join token carries in clear (64 lowercase hex),
// for the agent's first dial.
func TokenPin(token string) (string, error) {
	pin, _, err := splitToken(token)
	return pin, err
}

func splitToken(token string) (pin, compact string, err error) {
	token = strings.TrimSpace(token)
	rest, ok := strings.CutPrefix(token, joinTokenPrefix)
	if !ok {
		return "", "", fmt.Errorf("%w: missing the %q prefix", ErrTokenMalformed, joinTokenPrefix)
	}
	pin, compact, ok = strings.Cut(rest, ".")
	if !ok || compact == "" {
		return "", "", fmt.Errorf("%w: missing the JWE after the pin", ErrTokenMalformed)
	}
	if len(pin) != pinLen || strings.ToLower(pin) != pin {
		return "", "", fmt.Errorf("%w: the pin must be %d lowercase hex characters", ErrTokenMalformed, pinLen)
	}
	if _, err := hex.DecodeString(pin); err != nil {
		return "", "", fmt.Errorf("%w: the pin must be %d lowercase hex characters", ErrTokenMalformed, pinLen)
	}
	return pin, compact, nil
}
