package cloudiid_test

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/attestor"
	"github.com/better-compute/better-compute/internal/attestor/cloudiid"
)

func cert(t *testing.T, b []byte) *x509.Certificate {
	t.Helper()
	blk, _ := pem.Decode(b)
	require.NotNil(t, blk)
	c, err := x509.ParseCertificate(blk.Bytes)
	require.NoError(t, err)
	return c
}

func TestFetchAndVerify(t *testing.T) {
	t.Parallel()
	md := bctest.NewMetadataService(t, bctest.InstanceIdentity{InstanceID: "i-0abc", AccountID: "111122223333", Region: "eu-west-1"})
	foreign := bctest.NewMetadataService(t, bctest.InstanceIdentity{InstanceID: "i-0def", AccountID: "444455556666", Region: "eu-west-1"})
	nonce := cloudiid.Nonce(attestor.BindingDigest(attestor.Cloud, []byte("n"), make([]byte, 32)))
	doc, sig, err := cloudiid.Fetch(context.Background(), http.DefaultClient, md.URL, nonce)
	require.NoError(t, err)

	trust := cloudiid.Trust{Certificate: cert(t, md.CertificatePEM), AccountID: "111122223333"}
	res, err := cloudiid.Verify(doc, sig, []cloudiid.Trust{{Certificate: cert(t, foreign.CertificatePEM), AccountID: "444455556666"}, trust}, nonce)
	require.NoError(t, err)
	require.Equal(t, 1, res.Trust)
	require.Equal(t, "cloud:111122223333/eu-west-1/i-0abc", res.Subject)

	fdoc, fsig, err := cloudiid.Fetch(context.Background(), http.DefaultClient, foreign.URL, nonce)
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		doc, sig []byte
		trusts   []cloudiid.Trust
		nonce    string
		want     string
	}{
		"another challenge":           {doc, sig, []cloudiid.Trust{trust}, "other", "nonce is not this join's challenge"},
		"another provider's document": {fdoc, fsig, []cloudiid.Trust{trust}, nonce, "does not verify with a registered provider certificate"},
		"another account":             {doc, sig, []cloudiid.Trust{{Certificate: trust.Certificate, AccountID: "999"}}, nonce, `account "111122223333" is not a registered account`},
		"another region":              {doc, sig, []cloudiid.Trust{{Certificate: trust.Certificate, AccountID: "111122223333", Region: "us-east-1"}}, nonce, "not the registered region"},
		"edited document":             {append([]byte(" "), doc...), sig, []cloudiid.Trust{trust}, nonce, "does not verify"},
		"no trust":                    {doc, sig, nil, nonce, "registered no cloud provider certificate"},
		"signature not base64":        {doc, []byte("!!"), []cloudiid.Trust{trust}, nonce, "not base64"},
	} {
		_, err := cloudiid.Verify(tc.doc, tc.sig, tc.trusts, tc.nonce)
		require.ErrorIs(t, err, attestor.ErrEvidence, name)
		require.ErrorContains(t, err, tc.want, name)
	}
}
