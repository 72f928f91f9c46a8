package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"github.com/better-compute/better-compute/internal/pki"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

// Authority is what the gateway needs of the PKI (internal/pki): the
// consumer-side port, so the gateway can be tested and built on its own.
// FromPKI adapts *pki.Authority to it.
type Authority interface {
	TrustDomain() string
	// TrustBundlePEM is what a node must trust for the gateway and renewals.
	TrustBundlePEM() []byte
	// IssueServing issues the gateway's serving certificate for hosts.
	IssueServing(hosts []string) (tls.Certificate, error)
	// GatewayTLSConfig is the server TLS config: TLS 1.3, a client
	// certificate verified when given, trust domain, role and revocation
	// checked during the handshake.
	GatewayTLSConfig(cert tls.Certificate) *tls.Config
	// IssueNode signs a node certificate for csrDER; a non-empty attestor
	// is recorded in it (what admitted the node).
	IssueNode(ctx context.Context, csrDER []byte, nodeID, role, attestor string, ttl time.Duration) (chain [][]byte, notAfter time.Time, err error)
	// SealJoinChallenge and OpenJoinChallenge carry an attested join's
	// state through the node, sealed.
	SealJoinChallenge(c pki.JoinChallenge) ([]byte, error)
	OpenJoinChallenge(b []byte) (pki.JoinChallenge, error)
	// VerifyNode checks a presented leaf (chain, trust domain, role,
	// revocation) and says whom it names.
	VerifyNode(leaf *x509.Certificate) (NodeIdentity, error)
	// VerifyPeer is VerifyNode for the leaf of a connection crypto/tls
	// verified with GatewayTLSConfig, which may skip what the handshake
	// already checked.
	VerifyPeer(cs tls.ConnectionState) (NodeIdentity, error)
	// UseNonce records a renew nonce in tx until expire; a nonce seen
	// before fails with an error matching ErrReplay.
	UseNonce(ctx context.Context, tx store.Tx, nonce []byte, expire time.Time) error
	// OpenJoinToken opens a sealed join token.
	OpenJoinToken(token string) (JoinClaims, error)
	// ParseCSR parses a PKCS#10 request and checks its signature.
	ParseCSR(der []byte) (*x509.CertificateRequest, error)
}

// NodeIdentity is what a verified node certificate says.
type NodeIdentity struct {
	NodeID   string
	Role     string
	Serial   string
	NotAfter time.Time
}

// JoinClaims is what an opened join token says.
type JoinClaims struct {
	TokenID   string
	TenantID  string
	ProjectID string
	Pool      string
	Labels    map[string]string
	ExpiresAt time.Time
}

// Errors an Authority returns.
var (
	// ErrReplay: UseNonce saw the nonce before.
	ErrReplay = errors.New("nonce already used")
	// ErrTokenExpired: OpenJoinToken opened a token past its expiry.
	ErrTokenExpired = errors.New("join token expired")
)

// Roles of node certificates, by agent mode.
const (
	RoleNode    = "node"
	RoleSite    = "site"
	RoleRamdisk = "ramdisk"
)

// revocations is an Authority that answers whether one certificate serial
// is revoked without checking the certificate again (FromPKI's does).
type revocations interface {
	IsRevoked(serial string) bool
}
