package pki

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// ReplicaTTL is a replica certificate's lifetime; replicas renew well
// before it ends (internal/replica).
const ReplicaTTL = 24 * time.Hour

// replicaOU is the Subject OU of a replica certificate. It is not a Role: a
// node certificate can never carry it (IssueNode takes only valid roles).
const replicaOU = rolePrefix + "replica"

// ReplicaSPIFFEID is the identity a replica certificate carries:
// spiffe://<trust-domain>/replica/<replicaID>.
func (a *Authority) ReplicaSPIFFEID(replicaID string) *url.URL {
	return &url.URL{Scheme: "spiffe", Host: a.trustDomain, Path: "/replica/" + replicaID}
}

// IssueReplica issues a control plane replica its certificate for a fresh
// P-256 key, from the internal CA: server and client auth, the SPIFFE ID
// ReplicaSPIFFEID(replicaID) and OU bc-role:replica, ReplicaTTL. Replicas
// present it to each other on every replica-to-replica connection; the
// chain is the leaf and the internal CA.
func (a *Authority) IssueReplica(replicaID string) (tls.Certificate, error) {
	if replicaID == "" || strings.ContainsAny(replicaID, "/?#% ") {
		return tls.Certificate{}, fmt.Errorf("pki: invalid replica id %q", replicaID)
	}
	internal := a.serving().cas[caInternal]
	if internal == nil || internal.key == nil {
		return tls.Certificate{}, errors.New("pki: the internal CA or its key is missing")
	}
	now := a.clk.Now()
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: replicaID, OrganizationalUnit: []string{replicaOU}},
		URIs:        []*url.URL{a.ReplicaSPIFFEID(replicaID)},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		NotBefore:   now.Add(-backdate),
		NotAfter:    minTime(now.Add(ReplicaTTL), internal.cert.NotAfter),
	}
	key, err := newKey()
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := sign(tmpl, internal.cert, key.Public(), internal.key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: issue replica certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{leaf.Raw, internal.cert.Raw}, PrivateKey: key, Leaf: leaf}, nil
}

// InternalCAPool is the trust anchor of replica certificates: the internal
// CAs alone (one per live generation), so a node, site or gateway
// certificate (other intermediates of the same roots) never verifies as a
// replica.
func (a *Authority) InternalCAPool() *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range a.liveCAs(caInternal) {
		p.AddCert(c)
	}
	return p
}

// VerifyReplica checks a peer's certificate chain (leaf first) as a
// replica's at now: issued by the internal CA for client or server auth
// (usage), with OU bc-role:replica and a replica SPIFFE ID of this trust
// domain. It returns the replica id.
func (a *Authority) VerifyReplica(chain []*x509.Certificate, usage x509.ExtKeyUsage, now time.Time) (string, error) {
	if len(chain) == 0 {
		return "", errors.New("no replica certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	leaf := chain[0]
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: a.InternalCAPool(), Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return "", fmt.Errorf("not a certificate of this control plane's internal CA: %w", err)
	}
	if len(leaf.Subject.OrganizationalUnit) != 1 || leaf.Subject.OrganizationalUnit[0] != replicaOU || len(leaf.URIs) != 1 {
		return "", errors.New("not a replica certificate")
	}
	u := leaf.URIs[0]
	id, ok := strings.CutPrefix(u.Path, "/replica/")
	if u.Scheme != "spiffe" || u.Host != a.trustDomain || !ok || id == "" || strings.Contains(id, "/") {
		return "", fmt.Errorf("not a replica identity of trust domain %s: %s", a.trustDomain, u)
	}
	return id, nil
}
