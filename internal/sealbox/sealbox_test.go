package sealbox_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/sealbox"
)

func TestSealOpens(t *testing.T) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKIXPublicKey(k.Public())
	require.NoError(t, err)
	box, err := sealbox.Seal(der, "join/mch_1", []byte("secret-token"))
	require.NoError(t, err)
	require.NotContains(t, box, "secret-token")
	got, err := sealbox.Open(k, "join/mch_1", box)
	require.NoError(t, err)
	require.Equal(t, "secret-token", string(got))

	// Another key, another use, or a changed byte: refused.
	other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	_, err = sealbox.Open(other, "join/mch_1", box)
	require.Error(t, err)
	_, err = sealbox.Open(k, "join/mch_2", box)
	require.Error(t, err)
	b := []byte(box)
	b[len(b)-3] ^= 1
	_, err = sealbox.Open(k, "join/mch_1", string(b))
	require.Error(t, err)
	_, err = sealbox.Open(k, "join/mch_1", "plain")
	require.ErrorContains(t, err, "not a sealed box")
}
