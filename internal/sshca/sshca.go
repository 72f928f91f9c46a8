// Package sshca is the SSH side of exec into guests that run no agent: a
// certificate authority on golang.org/x/crypto/ssh that signs short user
// certificates (one principal, valid at most MaxUserTTL) and host
// certificates, and a client that logs in with a user certificate and pins
// the guest by its CA-signed host certificate.
//
// One CA serves every guest of a deployment, so a user certificate is only
// as narrow as its principal: callers sign for one guest's own principal
// (the instance id its sshd's AuthorizedPrincipalsFile lists), never for a
// name that every guest shares, such as the login account.
//
// It must never accept a guest by a bare host key (no trust on first use),
// and never sign a user certificate that outlives MaxUserTTL.
package sshca

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
)

// MaxUserTTL bounds user certificates: a leaked one is useless soon.
const MaxUserTTL = 15 * time.Minute

// clockSkew backdates ValidAfter so a guest whose clock is a little behind
// the signer's still accepts a fresh certificate.
const clockSkew = time.Minute

// CA signs SSH certificates with one key.
type CA struct {
	signer ssh.Signer
	now    func() time.Time
}

// New returns a CA with a fresh Ed25519 key. now is the clock (time.Now
// when nil).
func New(now func() time.Time) (*CA, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("sshca: generate key: %w", err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, fmt.Errorf("sshca: signer: %w", err)
	}
	return FromSigner(s, now), nil
}

// Load returns a CA from an OpenSSH private key (PEM), as New's
// MarshalPrivateKey writes.
func Load(pemBytes []byte, now func() time.Time) (*CA, error) {
	s, err := ssh.ParsePrivateKey(pemBytes)
	if err != nil {
		return nil, fmt.Errorf("sshca: parse CA key: %w", err)
	}
	return FromSigner(s, now), nil
}

// FromSigner wraps an existing signer.
func FromSigner(s ssh.Signer, now func() time.Time) *CA {
	if now == nil {
		now = time.Now
	}
	return &CA{signer: s, now: now}
}

// PublicKey is the CA's public key.
func (c *CA) PublicKey() ssh.PublicKey { return c.signer.PublicKey() }

// AuthorizedKey is the CA's public key in authorized_keys form, what sshd's
// TrustedUserCAKeys file and a known_hosts @cert-authority line hold.
func (c *CA) AuthorizedKey() string {
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(c.signer.PublicKey())))
}

// UserCert is a signed user certificate and the signer that uses it.
type UserCert struct {
	Cert   *ssh.Certificate
	Signer ssh.Signer
}

// SignUser signs pub for principal (what the guest's
// AuthorizedPrincipalsFile must list), valid from now for ttl (at most
// MaxUserTTL).
func (c *CA) SignUser(pub ssh.PublicKey, principal string, ttl time.Duration) (*ssh.Certificate, error) {
	if principal == "" {
		return nil, errors.New("sshca: user certificate: principal is required")
	}
	if ttl <= 0 || ttl > MaxUserTTL {
		return nil, fmt.Errorf("sshca: user certificate: ttl %s is outside (0, %s]", ttl, MaxUserTTL)
	}
	cert := &ssh.Certificate{
		Key:             pub,
		CertType:        ssh.UserCert,
		KeyId:           "user:" + principal,
		ValidPrincipals: []string{principal},
		Permissions: ssh.Permissions{Extensions: map[string]string{
			"permit-pty": "", "permit-port-forwarding": "",
		}},
	}
	return c.sign(cert, ttl)
}

// NewUser generates a key pair and signs it for principal: what an exec
// needs for one session.
func (c *CA) NewUser(principal string, ttl time.Duration) (*UserCert, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("sshca: generate user key: %w", err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, fmt.Errorf("sshca: user signer: %w", err)
	}
	cert, err := c.SignUser(s.PublicKey(), principal, ttl)
	if err != nil {
		return nil, err
	}
	cs, err := ssh.NewCertSigner(cert, s)
	if err != nil {
		return nil, fmt.Errorf("sshca: cert signer: %w", err)
	}
	return &UserCert{Cert: cert, Signer: cs}, nil
}

// SignHost signs a guest's host key for hostnames (names or addresses the
// client dials), valid from now for ttl.
func (c *CA) SignHost(pub ssh.PublicKey, hostnames []string, ttl time.Duration) (*ssh.Certificate, error) {
	if len(hostnames) == 0 {
		return nil, errors.New("sshca: host certificate: at least one hostname is required")
	}
	if ttl <= 0 {
		return nil, fmt.Errorf("sshca: host certificate: ttl %s must be positive", ttl)
	}
	cert := &ssh.Certificate{
		Key:             pub,
		CertType:        ssh.HostCert,
		KeyId:           "host:" + hostnames[0],
		ValidPrincipals: hostnames,
	}
	return c.sign(cert, ttl)
}

func (c *CA) sign(cert *ssh.Certificate, ttl time.Duration) (*ssh.Certificate, error) {
	now := c.now()
	var serial [8]byte
	if _, err := rand.Read(serial[:]); err != nil {
		return nil, fmt.Errorf("sshca: serial: %w", err)
	}
	cert.Serial = binary.BigEndian.Uint64(serial[:])
	cert.ValidAfter = uint64(now.Add(-clockSkew).Unix())
	cert.ValidBefore = uint64(now.Add(ttl).Unix())
	if err := cert.SignCert(rand.Reader, c.signer); err != nil {
		return nil, fmt.Errorf("sshca: sign: %w", err)
	}
	return cert, nil
}

// HostKey is a fresh guest host key: the private key in OpenSSH PEM form
// (for the guest's /etc/ssh) and its signer.
type HostKey struct {
	PrivatePEM []byte
	Signer     ssh.Signer
}

// NewHostKey generates an Ed25519 host key.
func NewHostKey() (*HostKey, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("sshca: generate host key: %w", err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		return nil, fmt.Errorf("sshca: marshal host key: %w", err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, fmt.Errorf("sshca: host signer: %w", err)
	}
	return &HostKey{PrivatePEM: pemEncode(block.Type, block.Bytes), Signer: s}, nil
}

// MarshalCert is a certificate in authorized_keys form (an sshd
// HostCertificate file, a -cert.pub file).
func MarshalCert(cert *ssh.Certificate) string {
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(cert)))
}

// Signer is the CA's signer, for a caller that stores the key or builds a
// second CA value on it (another clock).
func (c *CA) Signer() ssh.Signer { return c.signer }
