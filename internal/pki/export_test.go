package pki

import (
	"crypto"
	"crypto/x509"
)

// SignForTest signs tmpl with one of the authority's CAs ("node",
// "serving", ...), so tests can forge leaves a real CA signed.
func (a *Authority) SignForTest(kind string, tmpl *x509.Certificate, pub crypto.PublicKey) (*x509.Certificate, error) {
	c := a.cas[caKind(kind)]
	return sign(tmpl, c.cert, pub, c.key)
}

// CAForTest returns one of the authority's CA certificates.
func (a *Authority) CAForTest(kind string) *x509.Certificate { return a.cas[caKind(kind)].cert }
