package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/store"
)

// FromPKI adapts the control plane's certificate authority to Authority.
func FromPKI(a *pki.Authority) Authority { return pkiAuthority{a} }

type pkiAuthority struct{ a *pki.Authority }

func (p pkiAuthority) TrustDomain() string    { return p.a.TrustDomain() }
func (p pkiAuthority) TrustBundlePEM() []byte { return p.a.TrustBundlePEM() }

func (p pkiAuthority) IssueServing(hosts []string) (tls.Certificate, error) {
	return p.a.IssueServing(hosts)
}

func (p pkiAuthority) GatewayTLSConfig(cert tls.Certificate) *tls.Config {
	return p.a.GatewayTLSConfig(cert)
}

func (p pkiAuthority) IssueNode(ctx context.Context, csrDER []byte, nodeID, role string, ttl time.Duration) ([][]byte, time.Time, error) {
	return p.a.IssueNode(ctx, csrDER, nodeID, pki.Role(role), ttl)
}

func (p pkiAuthority) VerifyNode(leaf *x509.Certificate) (NodeIdentity, error) {
	id, err := p.a.VerifyNode(leaf)
	if err != nil {
		return NodeIdentity{}, err
	}
	return NodeIdentity{NodeID: id.NodeID, Role: string(id.Role), Serial: id.Serial, NotAfter: id.NotAfter}, nil
}

func (p pkiAuthority) VerifyPeer(cs tls.ConnectionState) (NodeIdentity, error) {
	id, ok, err := p.a.PeerNode(cs)
	if err != nil {
		return NodeIdentity{}, err
	}
	if !ok {
		return NodeIdentity{}, fmt.Errorf("%w: no verified certificate", pki.ErrPeerRefused)
	}
	return NodeIdentity{NodeID: id.NodeID, Role: string(id.Role), Serial: id.Serial, NotAfter: id.NotAfter}, nil
}

// IsRevoked reports whether the certificate with this serial is revoked.
func (p pkiAuthority) IsRevoked(serial string) bool { return p.a.IsRevoked(serial) }

func (p pkiAuthority) UseNonce(ctx context.Context, tx store.Tx, nonce []byte, expire time.Time) error {
	err := p.a.UseNonce(ctx, tx, nonce, expire)
	if errors.Is(err, pki.ErrReplay) {
		return errors.Join(ErrReplay, err)
	}
	return err
}

func (p pkiAuthority) OpenJoinToken(token string) (JoinClaims, error) {
	c, err := p.a.OpenJoinToken(token)
	if errors.Is(err, pki.ErrTokenExpired) {
		return JoinClaims{}, errors.Join(ErrTokenExpired, err)
	}
	if err != nil {
		return JoinClaims{}, err
	}
	return JoinClaims{TokenID: c.TokenID, TenantID: c.TenantID, ProjectID: c.ProjectID, Pool: c.Pool, Labels: c.Labels, ExpiresAt: c.ExpiresAt}, nil
}

func (p pkiAuthority) ParseCSR(der []byte) (*x509.CertificateRequest, error) {
	return pki.ParseCSR(der)
}

// Refresh reloads the revocation set, so a certificate revoked through
// another replica is refused here too.
func (p pkiAuthority) Refresh(ctx context.Context) error { return p.a.Refresh(ctx) }

// CommandTrust is the part of an authority that signs commands: the bundle
// nodes pin and the worker chains the gateway sends with commands. An
// Authority without it sends commands unsigned.
type CommandTrust interface {
	CommandTrust() *agentv1.CommandTrust
	CommandSignerChain(ctx context.Context, q store.Querier, serial string) ([][]byte, error)
}

func (p pkiAuthority) CommandTrust() *agentv1.CommandTrust {
	roots, v, minV := p.a.CommandBundle()
	return &agentv1.CommandTrust{RootsPem: roots, Version: v, MinVersion: minV}
}

func (p pkiAuthority) CommandSignerChain(ctx context.Context, q store.Querier, serial string) ([][]byte, error) {
	return p.a.CommandSignerChain(ctx, q, serial)
}

// commandTrust is the gateway's CommandTrust, or nil.
func (g *Gateway) commandTrust() *agentv1.CommandTrust {
	if ct, ok := g.cfg.Authority.(CommandTrust); ok {
		return ct.CommandTrust()
	}
	return nil
}
