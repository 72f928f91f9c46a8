package pki

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

// Role is what a node certificate lets its holder be; it is carried in the
// Subject OU as "bc-role:<role>".
type Role string

// The roles.
const (
	RoleNode    Role = "node"
	RoleSite    Role = "site"
	RoleRamdisk Role = "ramdisk"
	RoleGateway Role = "gateway"
)

// Valid reports whether r is a known role.
func (r Role) Valid() bool {
	switch r {
	case RoleNode, RoleSite, RoleRamdisk, RoleGateway:
		return true
	}
	return false
}

const rolePrefix = "bc-role:"

// attestorPrefix marks the Subject OU that records what admitted a node
// (bc-attestor:tpm, x509, cloud or join_token). An OU, as the role is,
// rather than a second URI SAN: an X.509-SVID carries exactly one URI SAN.
const attestorPrefix = "bc-attestor:"

// AttestorOf returns what admitted the node a certificate names, from its
// Subject OU; "" for a certificate issued before attestors were recorded.
func AttestorOf(c *x509.Certificate) string {
	for _, ou := range c.Subject.OrganizationalUnit {
		if k, ok := strings.CutPrefix(ou, attestorPrefix); ok {
			return k
		}
	}
	return ""
}

// Certificate lifetimes.
const (
	// MaxNodeTTL bounds every node certificate.
	MaxNodeTTL = 24 * time.Hour
	// MaxRamdiskTTL bounds a ramdisk's certificate: it lives for one boot.
	MaxRamdiskTTL = 2 * time.Hour
	// ServingTTL is the gateway serving certificate's lifetime.
	ServingTTL = 90 * 24 * time.Hour
)

// MaxCSRSize caps what ParseCSR reads.
const MaxCSRSize = 16 << 10

// ErrBadCSR: a CSR is malformed, badly signed or has a refused key.
var ErrBadCSR = errors.New("pki: bad certificate request")

// ParseCSR parses a DER certificate request, checks its self-signature and
// its key: ECDSA P-256 or P-384, Ed25519, or RSA of at least 2048 bits.
func ParseCSR(der []byte) (*x509.CertificateRequest, error) {
	if len(der) == 0 {
		return nil, fmt.Errorf("%w: empty", ErrBadCSR)
	}
	if len(der) > MaxCSRSize {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrBadCSR, len(der), MaxCSRSize)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadCSR, err)
	}
	if err := checkPublicKey(csr.PublicKey); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadCSR, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("%w: signature: %w", ErrBadCSR, err)
	}
	return csr, nil
}

func checkPublicKey(pub crypto.PublicKey) error {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() {
			return fmt.Errorf("ECDSA curve %s is not accepted (use P-256 or P-384)", k.Curve.Params().Name)
		}
	case ed25519.PublicKey:
		if len(k) != ed25519.PublicKeySize {
			return errors.New("malformed Ed25519 key")
		}
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return fmt.Errorf("RSA key of %d bits is too short (at least 2048)", k.N.BitLen())
		}
	default:
		return fmt.Errorf("key type %T is not accepted", pub)
	}
	return nil
}

// ValidNodeID reports whether id can name a node in a certificate: 1 to 128
// characters of letters, digits, '.', '_' and '-', starting with a letter or
// digit, so it is safe in a URI path and a CN alike.
func ValidNodeID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i, r := range id {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case i > 0 && (r == '.' || r == '_' || r == '-'):
		default:
			return false
		}
	}
	return true
}

// SPIFFEID returns the SPIFFE ID of a node in this trust domain.
func (a *Authority) SPIFFEID(nodeID string) *url.URL {
	return &url.URL{Scheme: "spiffe", Host: a.trustDomain, Path: "/node/" + nodeID}
}

// IssueNode issues a client certificate for nodeID in role from a CSR. It
// checks the CSR's signature and key and ignores its subject: the identity
// is the caller's to decide. The certificate has CN=nodeID, the URI SAN
// spiffe://<trust-domain>/node/<nodeID>, the OU bc-role:<role>, client-auth
// usage, and lives from one minute ago to now+min(ttl, 24h) (2h for a
// ramdisk; a ttl <= 0 means the maximum). The serial is recorded for
// revocation. chain is the leaf and the node CA, DER.
func (a *Authority) IssueNode(ctx context.Context, csrDER []byte, nodeID string, role Role, ttl time.Duration) (chain [][]byte, notAfter time.Time, err error) {
	return a.IssueNodeAttested(ctx, csrDER, nodeID, role, "", ttl)
}

// IssueNodeAttested is IssueNode for a node an attestor admitted: a
// non-empty attestor is recorded in the Subject OU bc-attestor:<attestor>
// next to the role's.
func (a *Authority) IssueNodeAttested(ctx context.Context, csrDER []byte, nodeID string, role Role, attestor string, ttl time.Duration) (chain [][]byte, notAfter time.Time, err error) {
	if !ValidNodeID(nodeID) {
		return nil, time.Time{}, fmt.Errorf("pki: invalid node id %q", nodeID)
	}
	if !role.Valid() {
		return nil, time.Time{}, fmt.Errorf("pki: invalid role %q", role)
	}
	if attestor != "" && !ValidNodeID(attestor) {
		return nil, time.Time{}, fmt.Errorf("pki: invalid attestor %q", attestor)
	}
	csr, err := ParseCSR(csrDER)
	if err != nil {
		return nil, time.Time{}, err
	}
	limit := MaxNodeTTL
	if role == RoleRamdisk {
		limit = MaxRamdiskTTL
	}
	if ttl <= 0 || ttl > limit {
		ttl = limit
	}
	g := a.issuing()
	nodeCA := g.cas[caNode]
	now := a.clk.Now()
	notAfter = minTime(now.Add(ttl), nodeCA.cert.NotAfter).UTC().Truncate(time.Second)
	if !notAfter.After(now) {
		return nil, time.Time{}, errors.New("pki: the node CA has expired")
	}
	ous := []string{rolePrefix + string(role)}
	if attestor != "" {
		ous = append(ous, attestorPrefix+attestor)
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: nodeID, OrganizationalUnit: ous},
		URIs:        []*url.URL{a.SPIFFEID(nodeID)},
		NotBefore:   now.Add(-backdate),
		NotAfter:    notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	leaf, err := sign(tmpl, nodeCA.cert, csr.PublicKey, nodeCA.key)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("pki: issue node certificate: %w", err)
	}
	err = a.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return certInsert(ctx, tx, certRow{Serial: serialString(leaf.SerialNumber), NodeID: nodeID, Role: role, NotAfter: leaf.NotAfter, IssueTime: now, Generation: g.gen})
	})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("pki: record node certificate: %w", err)
	}
	return [][]byte{leaf.Raw, nodeCA.cert.Raw}, leaf.NotAfter, nil
}

// IssueServing issues the gateway's serving certificate for a fresh P-256
// key: server-auth usage, DNS and IP SANs from hosts, OU bc-role:gateway, 90
// days. The chain is the leaf, the serving CA and the root, so an agent can
// match the root against its pin.
func (a *Authority) IssueServing(hosts []string) (tls.Certificate, error) {
	if len(hosts) == 0 {
		return tls.Certificate{}, errors.New("pki: a serving certificate needs at least one host")
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: hosts[0], OrganizationalUnit: []string{rolePrefix + string(RoleGateway)}},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			continue
		}
		if h == "" || strings.ContainsAny(h, " /:@") {
			return tls.Certificate{}, fmt.Errorf("pki: invalid host %q: want a DNS name or an IP address", h)
		}
		tmpl.DNSNames = append(tmpl.DNSNames, strings.ToLower(h))
	}
	g := a.serving()
	servingCA, root := g.cas[caServing], g.cas[caRoot]
	now := a.clk.Now()
	tmpl.NotBefore = now.Add(-backdate)
	tmpl.NotAfter = minTime(now.Add(ServingTTL), servingCA.cert.NotAfter)
	key, err := newKey()
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := sign(tmpl, servingCA.cert, key.Public(), servingCA.key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: issue serving certificate: %w", err)
	}
	return tls.Certificate{
		Certificate: [][]byte{leaf.Raw, servingCA.cert.Raw, root.cert.Raw},
		PrivateKey:  key,
		Leaf:        leaf,
	}, nil
}
