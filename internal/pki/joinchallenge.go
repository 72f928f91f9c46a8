package pki

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// ErrChallenge: a join challenge that does not open, or one past its expiry.
var ErrChallenge = errors.New("pki: invalid join challenge")

const (
	challengeKeyInfo = "bc join challenge"
	maxChallengeLen  = 16 << 10
)

// JoinChallenge is the state of an attested join between JoinChallenge and
// Join. It travels sealed through the node (A256GCM under a key only the
// control plane holds), so any gateway replica can finish the join, nothing
// is written before it, and the node cannot read the TPM secret it must
// recover with its TPM nor change what the challenge binds.
type JoinChallenge struct {
	TokenID   string    `json:"jti"`
	CSRSHA256 string    `json:"csr"`
	Attestor  string    `json:"att"`
	Nonce     []byte    `json:"n"`
	ExpiresAt time.Time `json:"exp"`
	// For tpm: the secret the credential carries, the AK that must sign the
	// quote, and the EK and anchor that were checked.
	TPMSecret []byte `json:"sec,omitempty"`
	AKPublic  []byte `json:"ak,omitempty"`
	EKSubject string `json:"ek,omitempty"`
	AnchorID  string `json:"anc,omitempty"`
}

// SealJoinChallenge seals c.
func (a *Authority) SealJoinChallenge(c JoinChallenge) ([]byte, error) {
	if c.TokenID == "" || c.ExpiresAt.IsZero() || len(c.Nonce) == 0 {
		return nil, errors.New("pki: a join challenge needs a token id, a nonce and an expiry")
	}
	payload, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	enc, err := jose.NewEncrypter(jose.A256GCM, jose.Recipient{Algorithm: jose.DIRECT, Key: a.challengeKey},
		(&jose.EncrypterOptions{}).WithType("bc-join-challenge"))
	if err != nil {
		return nil, err
	}
	obj, err := enc.Encrypt(payload)
	if err != nil {
		return nil, err
	}
	s, err := obj.CompactSerialize()
	return []byte(s), err
}

// OpenJoinChallenge opens a challenge SealJoinChallenge made and refuses one
// past its expiry by the authority's clock.
func (a *Authority) OpenJoinChallenge(b []byte) (JoinChallenge, error) {
	if len(b) == 0 || len(b) > maxChallengeLen {
		return JoinChallenge{}, fmt.Errorf("%w: empty or longer than %d bytes", ErrChallenge, maxChallengeLen)
	}
	obj, err := jose.ParseEncryptedCompact(string(b), []jose.KeyAlgorithm{jose.DIRECT}, []jose.ContentEncryption{jose.A256GCM})
	if err != nil {
		return JoinChallenge{}, fmt.Errorf("%w: %w", ErrChallenge, err)
	}
	payload, err := obj.Decrypt(a.challengeKey)
	if err != nil {
		return JoinChallenge{}, fmt.Errorf("%w: does not decrypt", ErrChallenge)
	}
	var c JoinChallenge
	if err := json.Unmarshal(payload, &c); err != nil {
		return JoinChallenge{}, fmt.Errorf("%w: %w", ErrChallenge, err)
	}
	if !a.clk.Now().Before(c.ExpiresAt) {
		return JoinChallenge{}, fmt.Errorf("%w: expired at %s", ErrChallenge, c.ExpiresAt.Format(time.RFC3339))
	}
	return c, nil
}
