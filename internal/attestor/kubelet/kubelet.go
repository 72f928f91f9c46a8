// Package kubelet is the kubelet attestor: bcd proves it runs on
// Kubernetes Node NAME by signing the join's binding digest with the
// kubelet's own client key, whose certificate (CN=system:node:NAME,
// O=system:nodes) the cluster's CA issued. The kubelet's credentials are
// confined to its own Node by the API server's Node authorizer and
// NodeRestriction admission; no service-account token, whose rights are
// wider, is ever the evidence.
//
// It must never accept a certificate of any other subject from the same
// CA (an administrator's, a controller's, another component's), nor one
// that does not chain to a registered cluster CA.
package kubelet

import (
	"crypto"
	"crypto/x509"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/attestor"
	"github.com/better-compute/better-compute/internal/attestor/x509pop"
)

// DefaultCert is where the kubelet keeps its current client certificate
// and key, in one PEM file (kubeadm and most distributions).
const DefaultCert = "/var/lib/kubelet/pki/kubelet-client-current.pem"

// The subject Kubernetes gives a kubelet's client certificate.
const (
	nodeUserPrefix = "system:node:"
	nodesGroup     = "system:nodes"
)

// maxNodeName is a Node name's limit (a DNS subdomain).
const maxNodeName = 253

// Result is what a verified kubelet proof says.
type Result struct {
	// NodeName is the Kubernetes Node the kubelet is.
	NodeName string
	// Root is the registered cluster CA the certificate chained to.
	Root *x509.Certificate
	// Subject names the node: "kubelet:NODE".
	Subject string
}

// Verify checks that chain (leaf first, DER) is a kubelet client
// certificate that verifies at now to one of the cluster CAs in roots, and
// that sig is its key's signature over digest.
func Verify(chain [][]byte, sig, digest []byte, roots []*x509.Certificate, now time.Time) (Result, error) {
	r, err := x509pop.VerifyAs(attestor.Kubelet, chain, sig, digest, roots, now)
	if err != nil {
		return Result{}, err
	}
	name, err := NodeName(r.Leaf)
	if err != nil {
		return Result{}, err
	}
	return Result{NodeName: name, Root: r.Root, Subject: "kubelet:" + name}, nil
}

// NodeName is the Node a kubelet client certificate names, refusing any
// certificate that is not a kubelet's.
func NodeName(c *x509.Certificate) (string, error) {
	name, ok := strings.CutPrefix(c.Subject.CommonName, nodeUserPrefix)
	switch {
	case !ok:
		return "", fmt.Errorf("%w: kubelet: the certificate's subject is %q, not a kubelet's (CN=system:node:NAME)", attestor.ErrEvidence, truncate(c.Subject.CommonName))
	case name == "" || len(name) > maxNodeName || strings.ContainsAny(name, "/ \x00"):
		return "", fmt.Errorf("%w: kubelet: %q is not a Node name", attestor.ErrEvidence, truncate(name))
	case !slices.Equal(c.Subject.Organization, []string{nodesGroup}):
		return "", fmt.Errorf("%w: kubelet: the certificate's organization is %q, not %s alone", attestor.ErrEvidence, c.Subject.Organization, nodesGroup)
	}
	return name, nil
}

// Load reads the kubelet's client certificate and key from one PEM file.
func Load(path string) (chain [][]byte, key crypto.Signer, err error) {
	chain, key, err = x509pop.Load(path, path)
	if err != nil {
		return nil, nil, fmt.Errorf("kubelet client certificate %s: %w", path, err)
	}
	return chain, key, nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
