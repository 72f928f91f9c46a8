package cloudiid_test

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"math/big"
	"testing"
	"time"

	"github.com/better-compute/better-compute/internal/attestor/cloudiid"
)

// FuzzVerify feeds the verifier documents and signatures a hostile
// instance could send: it must refuse or accept, never panic, and accept
// only a document for the registered account with the nonce asked for.
// (The provider key is made here: the bctest emulator would pull the
// whole control plane into the fuzz build.)
func FuzzVerify(f *testing.F) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		f.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "provider"}, NotBefore: time.Unix(0, 0), NotAfter: time.Unix(1<<32, 0)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		f.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		f.Fatal(err)
	}
	sign := func(doc []byte) []byte {
		sum := sha256.Sum256(doc)
		s, _ := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, sum[:])
		return []byte(base64.StdEncoding.EncodeToString(s))
	}
	doc := []byte(`{"instanceId":"i-f","accountId":"1","region":"r","nonce":"n"}`)
	f.Add(doc, sign(doc), "n")
	f.Add([]byte(`{"instanceId":"i","accountId":"1","nonce":"n"}`), []byte("AAAA"), "n")
	f.Add([]byte("{"), []byte("!"), "")
	trust := []cloudiid.Trust{{Certificate: c, AccountID: "1"}}
	f.Fuzz(func(t *testing.T, doc, sig []byte, nonce string) {
		res, err := cloudiid.Verify(doc, sig, trust, nonce)
		if err == nil && (res.Document.Nonce != nonce || res.Document.AccountID != "1") {
			t.Fatalf("accepted a document for nonce %q account %q", res.Document.Nonce, res.Document.AccountID)
		}
	})
}
