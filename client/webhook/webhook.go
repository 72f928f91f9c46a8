// Package webhook signs and verifies Better Compute webhook deliveries by the
// Standard Webhooks scheme (https://www.standardwebhooks.com): a receiver
// imports it and calls Verify on every request before trusting the body.
//
// A delivery carries three headers: webhook-id (the delivery's id, the same
// on every retry: deduplicate by it), webhook-timestamp (Unix seconds when
// it was signed) and webhook-signature, a space-separated list of
// "v1,<base64 HMAC-SHA256>" over "<id>.<timestamp>.<body>", one per secret
// that signs it (two while a rotated secret overlaps the new one).
//
// It must never accept a body whose signature it did not check, nor a
// timestamp outside the tolerance (a replay).
package webhook

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Header names of a signed delivery.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// SecretPrefix starts every endpoint secret.
const SecretPrefix = "whsec_"

// Tolerance is how far a delivery's timestamp may be from the receiver's
// clock before Verify refuses it as a replay.
const Tolerance = 5 * time.Minute

// Errors Verify returns (wrapped).
var (
	ErrMissingHeaders = errors.New("webhook: missing webhook-id, webhook-timestamp or webhook-signature")
	ErrBadSecret      = errors.New("webhook: secret must be whsec_ followed by base64")
	ErrTimestamp      = errors.New("webhook: timestamp outside the tolerance (replayed or clock skew)")
	ErrSignature      = errors.New("webhook: no signature matches")
)

// NewSecret returns a fresh secret: whsec_ and base64 of 32 random bytes.
func NewSecret() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return SecretPrefix + base64.StdEncoding.EncodeToString(b[:]), nil
}

// secretKey decodes a whsec_ secret into its HMAC key.
func secretKey(secret string) ([]byte, error) {
	raw, ok := strings.CutPrefix(secret, SecretPrefix)
	if !ok {
		return nil, ErrBadSecret
	}
	key, err := base64.StdEncoding.DecodeString(raw)
	if err != nil || len(key) == 0 {
		return nil, ErrBadSecret
	}
	return key, nil
}

// Signature returns "v1,<base64 HMAC-SHA256(key, id.timestamp.body)>".
func Signature(secret, id string, ts int64, body []byte) (string, error) {
	key, err := secretKey(secret)
	if err != nil {
		return "", err
	}
	return "v1," + base64.StdEncoding.EncodeToString(mac(key, id, ts, body)), nil
}

func mac(key []byte, id string, ts int64, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write([]byte(strconv.FormatInt(ts, 10)))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// Sign sets the three headers on h, with one signature per secret.
func Sign(h http.Header, secrets []string, id string, at time.Time, body []byte) error {
	ts := at.Unix()
	sigs := make([]string, 0, len(secrets))
	for _, s := range secrets {
		sig, err := Signature(s, id, ts, body)
		if err != nil {
			return err
		}
		sigs = append(sigs, sig)
	}
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
	h.Set(HeaderSignature, strings.Join(sigs, " "))
	return nil
}

// Verify checks a delivery against secret at the current time: the
// timestamp must be within Tolerance and one of the signatures must match.
func Verify(secret string, h http.Header, body []byte) error {
	return VerifyAt(secret, h, body, time.Now())
}

// VerifyAt is Verify at the given time.
func VerifyAt(secret string, h http.Header, body []byte, now time.Time) error {
	id, tsRaw, sigs := h.Get(HeaderID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	if id == "" || tsRaw == "" || sigs == "" {
		return ErrMissingHeaders
	}
	key, err := secretKey(secret)
	if err != nil {
		return err
	}
	ts, err := strconv.ParseInt(tsRaw, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: %q is not Unix seconds", ErrTimestamp, tsRaw)
	}
	if d := now.Sub(time.Unix(ts, 0)); d > Tolerance || d < -Tolerance {
		return fmt.Errorf("%w: %s off", ErrTimestamp, d.Round(time.Second))
	}
	want := mac(key, id, ts, body)
	for _, s := range strings.Fields(sigs) {
		v, b64, ok := strings.Cut(s, ",")
		if !ok || v != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(b64)
		if err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return ErrSignature
}
