package pki

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"
)

// ReplicaTTL is a replica certificate's lifetime: a replica issues itself a
// new one well before it ends (at start, and on a timer).
const ReplicaTTL = 24 * time.Hour

// ReplicaSPIFFEID is the SPIFFE ID of a control plane replica.
func (a *Authority) ReplicaSPIFFEID(name string) *url.URL {
	return &url.URL{Scheme: "spiffe", Host: a.trustDomain, Path: "/replica/" + name}
}

// IssueReplica issues a certificate of the internal CA to a control plane
// replica for talking to its peers: a fresh P-256 key, client and server
// auth, the URI SAN spiffe://<trust-domain>/replica/<name>, and DNS and IP
// SANs from hosts (where peers reach it). Only the internal CA signs these,
// so a node's or a gateway's certificate never passes for a replica's.
func (a *Authority) IssueReplica(name string, hosts []string) (tls.Certificate, error) {
	if !ValidNodeID(name) {
		return tls.Certificate{}, fmt.Errorf("pki: invalid replica name %q", name)
	}
	internal := a.cas[caInternal]
	if internal == nil || internal.key == nil {
		return tls.Certificate{}, errors.New("pki: the internal CA is not available")
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: name, OrganizationalUnit: []string{rolePrefix + "replica"}},
		URIs:        []*url.URL{a.ReplicaSPIFFEID(name)},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
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
	now := a.clk.Now()
	tmpl.NotBefore = now.Add(-backdate)
	tmpl.NotAfter = minTime(now.Add(ReplicaTTL), internal.cert.NotAfter)
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

// InternalCAPool verifies replica certificates: the internal CA alone is
// its anchor, so nothing the node or serving CA signed chains to it.
func (a *Authority) InternalCAPool() *x509.CertPool {
	p := x509.NewCertPool()
	if internal := a.cas[caInternal]; internal != nil {
		p.AddCert(internal.cert)
	}
	return p
}
