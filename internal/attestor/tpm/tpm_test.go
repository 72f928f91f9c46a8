package tpm_test

import (
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/attestor"
	"github.com/better-compute/better-compute/internal/attestor/tpm"
)

func parsePEM(t *testing.T, b []byte) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return out
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		require.NoError(t, err)
		out = append(out, c)
	}
}

// TestSWTPMActivationAndQuote runs the whole exchange against a real
// swtpm: the EK certificate from NV memory chains to the local CA, the
// credential activates only on that TPM, and the quote verifies with the
// challenge's nonce and no other.
func TestSWTPMActivationAndQuote(t *testing.T) {
	t.Parallel()
	sw := bctest.StartSWTPM(t)
	other := bctest.StartSWTPM(t) // another manufacturer CA, another TPM
	node, err := tpm.Open(sw.Addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = node.Close() })
	id, err := node.Identity()
	require.NoError(t, err)
	require.NotEmpty(t, id.EKCertificate, "swtpm_setup --create-ek-cert writes the EK certificate to NV memory")

	now := time.Now()
	_, err = tpm.VerifyEK(id, []tpm.EKTrust{{Certificates: parsePEM(t, other.EKCAPEM)}}, now)
	require.ErrorIs(t, err, attestor.ErrEvidence)
	require.ErrorContains(t, err, "does not chain to a registered EK CA")
	_, err = tpm.VerifyEK(id, nil, now)
	require.ErrorContains(t, err, "registered no TPM EK CA")

	ek, err := tpm.VerifyEK(id, []tpm.EKTrust{{Certificates: parsePEM(t, other.EKCAPEM)}, {Certificates: parsePEM(t, sw.EKCAPEM)}}, now)
	require.NoError(t, err)
	require.Equal(t, 1, ek.Trust)
	require.Contains(t, ek.Subject, "tpm:ek-sha256:")

	// A TPM without an EK certificate is admitted by its pinned EK key.
	pinned := id
	pinned.EKCertificate = nil
	_, err = tpm.VerifyEK(pinned, []tpm.EKTrust{{Certificates: parsePEM(t, sw.EKCAPEM)}}, now)
	require.ErrorContains(t, err, "is not pinned")
	byPin, err := tpm.VerifyEK(pinned, []tpm.EKTrust{{EKPublicSHA: ek.Subject[len("tpm:ek-sha256:"):]}}, now)
	require.NoError(t, err)
	require.Equal(t, ek.Subject, byPin.Subject)

	secret, cred, encSecret, err := tpm.Challenge(ek, id)
	require.NoError(t, err)
	nonce := make([]byte, 32)
	_, _ = rand.Read(nonce)
	got, q, err := node.Activate(cred, encSecret, nonce)
	require.NoError(t, err)
	require.Equal(t, secret, got)

	pcrs, err := tpm.VerifyQuote(id.AKPublic, secret, got, q, nonce)
	require.NoError(t, err)
	require.Len(t, pcrs, 24)

	other32 := make([]byte, 32)
	_, err = tpm.VerifyQuote(id.AKPublic, secret, got, q, other32)
	require.ErrorIs(t, err, attestor.ErrEvidence, "a quote for another nonce")
	_, err = tpm.VerifyQuote(id.AKPublic, secret, other32, q, nonce)
	require.ErrorContains(t, err, "activated secret is wrong")

	// The credential is encrypted to this TPM's EK: another TPM cannot
	// activate it even with the same AK parameters.
	otherNode, err := tpm.Open(other.Addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = otherNode.Close() })
	_, err = otherNode.Identity()
	require.NoError(t, err)
	_, _, err = otherNode.Activate(cred, encSecret, nonce)
	require.Error(t, err)
}
