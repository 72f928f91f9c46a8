package x509pop_test

import (
	"crypto/x509"
	"testing"
	"time"

	"github.com/better-compute/better-compute/internal/attestor"
	"github.com/better-compute/better-compute/internal/attestor/x509pop"
)

// FuzzVerify feeds the verifier chains and signatures a hostile machine
// could send: it must never panic, and never accept without the CA.
func FuzzVerify(f *testing.F) {
	corp := newCA(f, "corp")
	leaf, key := corp.machine(f)
	digest := attestor.BindingDigest(attestor.X509, []byte("n"), make([]byte, 32))
	sig, _ := x509pop.Sign(key, digest)
	f.Add(leaf, []byte(nil), sig)
	f.Add([]byte("junk"), corp.cert.Raw, []byte{1})
	roots := []*x509.Certificate{corp.cert}
	other := newCA(f, "other")
	f.Fuzz(func(t *testing.T, c0, c1, s []byte) {
		chain := [][]byte{c0}
		if len(c1) > 0 {
			chain = append(chain, c1)
		}
		_, _ = x509pop.Verify(chain, s, digest, roots, time.Now())
		if _, err := x509pop.Verify(chain, s, digest, []*x509.Certificate{other.cert}, time.Now()); err == nil {
			t.Fatal("accepted a chain to a CA that signed nothing of it")
		}
	})
}
