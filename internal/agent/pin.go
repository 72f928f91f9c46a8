package agent

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
)

// TokenPrefix starts every join token: bcjt_<64 hex pin>.<jwe>.
const TokenPrefix = "bcjt_"

// DiscoveryTokenPrefix starts a machine's discovery token, which a
// commissioning ramdisk finds on its kernel command line:
// bcdt_<64 hex pin>.<secret>.
const DiscoveryTokenPrefix = "bcdt_"

// ErrBadToken is returned for a join token that is not bcjt_<pin>.<jwe>.
var ErrBadToken = errors.New("malformed join token")

// TokenPin extracts the gateway pin from a join token: the SHA-256 of the
// SubjectPublicKeyInfo of a certificate in the gateway's chain.
func TokenPin(token string) ([]byte, error) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(token), TokenPrefix)
	if !ok {
		rest, ok = strings.CutPrefix(strings.TrimSpace(token), DiscoveryTokenPrefix)
	}
	if !ok {
		return nil, fmt.Errorf("%w: want prefix %q", ErrBadToken, TokenPrefix)
	}
	pinHex, jwe, ok := strings.Cut(rest, ".")
	if !ok || jwe == "" {
		return nil, fmt.Errorf("%w: want <pin>.<jwe>", ErrBadToken)
	}
	if len(pinHex) != 2*sha256.Size {
		return nil, fmt.Errorf("%w: pin must be %d hex digits", ErrBadToken, 2*sha256.Size)
	}
	pin, err := hex.DecodeString(pinHex)
	if err != nil {
		return nil, fmt.Errorf("%w: pin: %w", ErrBadToken, err)
	}
	return pin, nil
}

// ErrPinMismatch is returned when no certificate of the gateway's chain
// carries the key the join token pins.
var ErrPinMismatch = errors.New("gateway certificate chain does not match the join token's pin")

// SPKIPin is SHA-256 over a certificate's RawSubjectPublicKeyInfo.
func SPKIPin(c *x509.Certificate) []byte {
	h := sha256.Sum256(c.RawSubjectPublicKeyInfo)
	return h[:]
}

// PinVerifier returns a tls.Config.VerifyPeerCertificate function for the
// join call, made with InsecureSkipVerify because the node has no trust
// bundle yet. It accepts the presented chain only if some certificate in it
// has the pinned key and the leaf verifies as a server certificate up to a
// pinned certificate (or is itself pinned). now gives the verification time.
func PinVerifier(pin []byte, now func() time.Time) func(rawCerts [][]byte, _ [][]*x509.Certificate) error {
	return func(rawCerts [][]byte, _ [][]*x509.Certificate) error {
		if len(rawCerts) == 0 {
			return errors.New("gateway presented no certificate")
		}
		certs := make([]*x509.Certificate, 0, len(rawCerts))
		for _, raw := range rawCerts {
			c, err := x509.ParseCertificate(raw)
			if err != nil {
				return fmt.Errorf("parse gateway certificate: %w", err)
			}
			certs = append(certs, c)
		}
		roots := x509.NewCertPool()
		intermediates := x509.NewCertPool()
		pinned := false
		for i, c := range certs {
			if bytes.Equal(SPKIPin(c), pin) {
				pinned = true
				roots.AddCert(c)
				if i == 0 {
					// The leaf itself is pinned: its key is the trust anchor.
					t := now()
					if t.Before(c.NotBefore) || t.After(c.NotAfter) {
						return fmt.Errorf("pinned gateway certificate not valid at %s", t.Format(time.RFC3339))
					}
					return nil
				}
			} else if i > 0 {
				intermediates.AddCert(c)
			}
		}
		if !pinned {
			return ErrPinMismatch
		}
		_, err := certs[0].Verify(x509.VerifyOptions{
			Roots:         roots,
			Intermediates: intermediates,
			CurrentTime:   now(),
			KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		})
		if err != nil {
			return fmt.Errorf("verify gateway chain against pin: %w", err)
		}
		return nil
	}
}
