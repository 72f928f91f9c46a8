package pki

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

// Errors of peer verification and revocation.
var (
	// ErrPeerRefused: a peer certificate is not a valid node identity of
	// this authority.
	ErrPeerRefused = errors.New("pki: peer certificate refused")
	// ErrRevoked: the certificate's serial is revoked.
	ErrRevoked = errors.New("pki: certificate revoked")
	// ErrUnknownCertificate: no certificate with that serial was issued.
	ErrUnknownCertificate = errors.New("pki: unknown certificate")
	// ErrReplay: a renew nonce was used before.
	ErrReplay = errors.New("pki: nonce already used")
	// ErrPinMismatch: no certificate of a presented chain matches the pin.
	ErrPinMismatch = errors.New("pki: no certificate in the chain matches the pin")
)

// NodeIdentity is who a verified node certificate speaks for.
type NodeIdentity struct {
	NodeID   string
	Role     Role
	Serial   string
	NotAfter time.Time
}

// VerifyNode checks a client leaf that crypto/tls already verified against
// NodeCAPool: it must be issued by the node CA, carry exactly one URI SAN,
// spiffe://<this trust domain>/node/<id>, exactly one OU bc-role:<role>,
// client-auth usage, and a serial that is not revoked.
func (a *Authority) VerifyNode(leaf *x509.Certificate) (NodeIdentity, error) {
	return a.verifyNode(leaf, false)
}

// verifyNode is VerifyNode; signedByNodeCA says the caller already checked
// the leaf's signature against the node CA.
func (a *Authority) verifyNode(leaf *x509.Certificate, signedByNodeCA bool) (NodeIdentity, error) {
	refuse := func(format string, args ...any) (NodeIdentity, error) {
		return NodeIdentity{}, fmt.Errorf("%w: "+format, append([]any{ErrPeerRefused}, args...)...)
	}
	if leaf == nil {
		return refuse("no certificate")
	}
	// The pool holds the root too, so a chain through another intermediate
	// of this root would pass crypto/tls; only the node CA issues nodes.
	if !signedByNodeCA {
		signed := false
		for _, c := range a.liveCAs(caNode) {
			if signed = leaf.CheckSignatureFrom(c) == nil; signed {
				break
			}
		}
		if !signed {
			return refuse("not issued by the node CA")
		}
	}
	if len(leaf.URIs) != 1 {
		return refuse("want exactly one URI SAN, got %d", len(leaf.URIs))
	}
	u := leaf.URIs[0]
	if u.Scheme != "spiffe" || u.Host != a.trustDomain || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return refuse("SPIFFE ID %q is not of trust domain %q", u.String(), a.trustDomain)
	}
	nodeID, ok := strings.CutPrefix(u.Path, "/node/")
	if !ok || !ValidNodeID(nodeID) {
		return refuse("SPIFFE ID %q is not a node", u.String())
	}
	var role Role
	for _, ou := range leaf.Subject.OrganizationalUnit {
		if r, ok := strings.CutPrefix(ou, rolePrefix); ok {
			if role != "" {
				return refuse("more than one role")
			}
			role = Role(r)
		}
	}
	if !role.Valid() {
		return refuse("no valid role in the subject OU")
	}
	clientAuth := false
	for _, eku := range leaf.ExtKeyUsage {
		clientAuth = clientAuth || eku == x509.ExtKeyUsageClientAuth
	}
	if !clientAuth {
		return refuse("not a client certificate")
	}
	serial := serialString(leaf.SerialNumber)
	if a.IsRevoked(serial) {
		return NodeIdentity{}, fmt.Errorf("%w: %w: serial %s", ErrPeerRefused, ErrRevoked, serial)
	}
	return NodeIdentity{NodeID: nodeID, Role: role, Serial: serial, NotAfter: leaf.NotAfter}, nil
}

// PeerNode returns the node identity of a connection's verified client
// certificate; ok is false when the peer presented none.
//
// Where crypto/tls verified a chain whose second certificate is the node
// CA, it checked the leaf's signature against it already, so VerifyNode's
// own check of that signature is skipped: with the gateway's second call at
// a session's open, those ECDSA verifications were 7.6 % of its CPU in a
// reconnect storm (docs/benchmarks.md).
func (a *Authority) PeerNode(cs tls.ConnectionState) (id NodeIdentity, ok bool, err error) {
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return NodeIdentity{}, false, nil
	}
	signed := false
	nodeCAs := a.liveCAs(caNode)
	for _, chain := range cs.VerifiedChains {
		for _, c := range nodeCAs {
			signed = signed || (len(chain) > 1 && chain[1].Equal(c))
		}
	}
	id, err = a.verifyNode(cs.VerifiedChains[0][0], signed)
	return id, err == nil, err
}

// GatewayTLSConfig is the gateway's server configuration: TLS 1.3 only, a
// client certificate verified against NodeCAPool and VerifyNode when one is
// given (Join has none yet; the gateway requires one on Renew and Session),
// and certificate times judged by the authority's clock.
//
// VerifyNode runs in VerifyConnection rather than VerifyPeerCertificate:
// crypto/tls skips VerifyPeerCertificate on resumed sessions, which would let
// a session ticket from before a revocation bypass it.
func (a *Authority) GatewayTLSConfig(cert tls.Certificate) *tls.Config {
	base := &tls.Config{
		MinVersion: tls.VersionTLS13,
		ClientAuth: tls.VerifyClientCertIfGiven,
		Time:       a.clk.Now,
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, _, err := a.PeerNode(cs)
			return err
		},
	}
	// A rotation changes the client pool and, once the new generation
	// serves, the serving certificate: each handshake takes the
	// configuration of the generations as they stand, rebuilt only when
	// they change. Open sessions are not touched.
	var (
		mu     sync.Mutex
		cur    = cert
		cached *tls.Config
		epoch  uint64
		// ours: issued here (IssueServing), so replaced on a switch; one
		// installed by hand (pki issue-gateway) is the operator's to replace.
		ours = a.issuedServing(cert)
	)
	cfg := base.Clone()
	cfg.Certificates = []tls.Certificate{cert}
	cfg.ClientCAs = a.NodeCAPool()
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		a.mu.RLock()
		e := a.tlsEpoch
		a.mu.RUnlock()
		mu.Lock()
		defer mu.Unlock()
		if cached != nil && e == epoch {
			return cached, nil
		}
		if ours {
			if next, ok := a.reissueServing(cur); ok {
				cur = next
			}
		}
		c := base.Clone()
		c.Certificates = []tls.Certificate{cur}
		c.ClientCAs = a.NodeCAPool()
		cached, epoch = c, e
		return c, nil
	}
	return cfg
}

func leafOf(c tls.Certificate) *x509.Certificate {
	if c.Leaf != nil || len(c.Certificate) == 0 {
		return c.Leaf
	}
	leaf, _ := x509.ParseCertificate(c.Certificate[0])
	return leaf
}

// issuedServing reports whether a live generation's serving CA issued c.
func (a *Authority) issuedServing(c tls.Certificate) bool {
	leaf := leafOf(c)
	if leaf == nil {
		return false
	}
	for _, ca := range a.liveCAs(caServing) {
		if leaf.CheckSignatureFrom(ca) == nil {
			return true
		}
	}
	return false
}

// reissueServing replaces a serving certificate of a generation that no
// longer serves with one of the serving generation, for the same hosts.
func (a *Authority) reissueServing(c tls.Certificate) (tls.Certificate, bool) {
	leaf := leafOf(c)
	if leaf == nil || leaf.CheckSignatureFrom(a.serving().cas[caServing].cert) == nil {
		return c, false
	}
	hosts := append([]string(nil), leaf.DNSNames...)
	for _, ip := range leaf.IPAddresses {
		hosts = append(hosts, ip.String())
	}
	next, err := a.IssueServing(hosts)
	if err != nil {
		return c, false
	}
	return next, true
}

// Revoke revokes one certificate by serial (lowercase hex). Revoking a
// revoked certificate again is not an error; an unknown serial is
// ErrUnknownCertificate.
func (a *Authority) Revoke(ctx context.Context, serial, reason string) error {
	serial = strings.ToLower(serial)
	err := a.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		done, err := certRevoke(ctx, tx, serial, reason)
		if err != nil || done {
			return err
		}
		ok, err := certExists(ctx, tx, serial)
		if err == nil && !ok {
			err = ErrUnknownCertificate
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("pki: revoke %s: %w", serial, err)
	}
	a.markRevoked(serial)
	return nil
}

// RevokeNode revokes every unexpired certificate of a node and returns how
// many it revoked now.
func (a *Authority) RevokeNode(ctx context.Context, nodeID, reason string) (int, error) {
	var serials []string
	err := a.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		serials, err = certRevokeNode(ctx, tx, nodeID, reason)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("pki: revoke node %s: %w", nodeID, err)
	}
	a.markRevoked(serials...)
	return len(serials), nil
}

func (a *Authority) markRevoked(serials ...string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range serials {
		a.revoked[s] = struct{}{}
	}
}

// IsRevoked reports whether a serial is in the in-memory revocation set:
// loaded by Load, updated by this Authority's revocations, and reloaded by
// Refresh to learn other replicas'.
func (a *Authority) IsRevoked(serial string) bool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	_, ok := a.revoked[strings.ToLower(serial)]
	return ok
}

// Bounds of a renew nonce.
const (
	minNonceLen = 16
	maxNonceLen = 64
)

// UseNonce records a renew nonce in tx until expire; a nonce seen before is
// ErrReplay, after which tx is unusable (PostgreSQL aborts it) and must be
// rolled back. Expired nonces are pruned on the way.
func (a *Authority) UseNonce(ctx context.Context, tx store.Tx, nonce []byte, expire time.Time) error {
	if len(nonce) < minNonceLen || len(nonce) > maxNonceLen {
		return fmt.Errorf("pki: a nonce must be %d to %d bytes, got %d", minNonceLen, maxNonceLen, len(nonce))
	}
	if !expire.After(a.clk.Now()) {
		return errors.New("pki: the nonce has already expired")
	}
	if err := noncePrune(ctx, tx); err != nil {
		return fmt.Errorf("pki: prune nonces: %w", err)
	}
	if err := nonceInsert(ctx, tx, hex.EncodeToString(nonce), expire); err != nil {
		if errors.Is(err, store.ErrUnique) {
			return ErrReplay
		}
		return fmt.Errorf("pki: record nonce: %w", err)
	}
	return nil
}

// VerifyPinnedChain is the agent's check on its first dial, before it has a
// trust bundle: the presented chain must verify from the leaf (for server
// auth) up to a certificate in the chain whose SubjectPublicKeyInfo SHA-256
// is pin. Host names are not checked; the pin is the trust.
func VerifyPinnedChain(rawCerts [][]byte, pin string) error {
	if len(rawCerts) == 0 {
		return errors.New("pki: no certificates presented")
	}
	pin = strings.ToLower(pin)
	certs := make([]*x509.Certificate, len(rawCerts))
	for i, raw := range rawCerts {
		c, err := x509.ParseCertificate(raw)
		if err != nil {
			return fmt.Errorf("pki: presented certificate %d: %w", i, err)
		}
		certs[i] = c
	}
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	pinned := false
	for _, c := range certs {
		sum := sha256.Sum256(c.RawSubjectPublicKeyInfo)
		if hex.EncodeToString(sum[:]) == pin {
			roots.AddCert(c)
			pinned = true
		} else {
			inter.AddCert(c)
		}
	}
	if !pinned {
		return ErrPinMismatch
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{
		Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}); err != nil {
		return fmt.Errorf("pki: the presented chain does not verify to the pinned certificate: %w", err)
	}
	return nil
}
