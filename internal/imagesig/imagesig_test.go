package imagesig_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/imagesig"
)

func TestPayloadIsExact(t *testing.T) {
	t.Parallel()
	got := imagesig.Payload("debian-12", "raw", strings.Repeat("ab", 32))
	require.Equal(t, "better-compute-image-v1\ndebian-12\nraw\n"+strings.Repeat("ab", 32)+"\n", string(got))
}

func TestSignVerifyBothAlgorithms(t *testing.T) {
	t.Parallel()
	for _, alg := range []string{imagesig.AlgEd25519, imagesig.AlgECDSAP256} {
		t.Run(alg, func(t *testing.T) {
			t.Parallel()
			s, pemText, err := imagesig.GenerateKey(alg)
			require.NoError(t, err)
			again, err := imagesig.ParsePrivateKeyPEM(pemText)
			require.NoError(t, err)
			require.Equal(t, s.Public.Fingerprint, again.Public.Fingerprint)
			pub, err := imagesig.ParsePublicKeyPEM([]byte(s.Public.PEM()))
			require.NoError(t, err)
			require.Equal(t, alg, pub.Algorithm)
			require.Len(t, pub.Fingerprint, 64)

			payload := imagesig.Payload("a", "raw", strings.Repeat("0", 64))
			sig, err := s.Sign(payload)
			require.NoError(t, err)
			require.NoError(t, pub.Verify(payload, sig))
			require.ErrorIs(t, pub.Verify(imagesig.Payload("b", "raw", strings.Repeat("0", 64)), sig), imagesig.ErrBadSignature)
			require.ErrorIs(t, pub.Verify(imagesig.Payload("a", "ramdisk", strings.Repeat("0", 64)), sig), imagesig.ErrBadSignature)
		})
	}
}

func TestParsePublicKeyRefusals(t *testing.T) {
	t.Parallel()
	_, priv, err := imagesig.GenerateKey(imagesig.AlgEd25519)
	require.NoError(t, err)
	for name, text := range map[string]string{
		"not pem":     "ssh-ed25519 AAAA",
		"private key": string(priv),
		"garbage der": "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
	} {
		_, err := imagesig.ParsePublicKeyPEM([]byte(text))
		require.Error(t, err, name)
	}
}

func TestCopyVerified(t *testing.T) {
	t.Parallel()
	signer, _, err := imagesig.GenerateKey(imagesig.AlgEd25519)
	require.NoError(t, err)
	stranger, _, err := imagesig.GenerateKey(imagesig.AlgECDSAP256)
	require.NoError(t, err)
	content := bytes.Repeat([]byte("disk"), 10000)
	sum := sha256.Sum256(content)
	d := imagesig.Descriptor{Name: "img", Kind: "raw", SHA256: hex.EncodeToString(sum[:]), Size: int64(len(content))}
	sig, err := signer.Sign(imagesig.Payload(d.Name, d.Kind, d.SHA256))
	require.NoError(t, err)
	d.Signatures = []imagesig.Signature{{KeyFingerprint: signer.Public.Fingerprint, Signature: sig}}

	var out bytes.Buffer
	n, err := imagesig.CopyVerified(&out, bytes.NewReader(content), d, []imagesig.PublicKey{signer.Public})
	require.NoError(t, err)
	require.Equal(t, int64(len(content)), n)
	require.Equal(t, content, out.Bytes())

	tampered := bytes.Clone(content)
	tampered[100] ^= 1
	_, err = imagesig.CopyVerified(&bytes.Buffer{}, bytes.NewReader(tampered), d, []imagesig.PublicKey{signer.Public})
	require.ErrorIs(t, err, imagesig.ErrDigestMismatch)

	_, err = imagesig.CopyVerified(&bytes.Buffer{}, bytes.NewReader(append(bytes.Clone(content), 'x')), d, []imagesig.PublicKey{signer.Public})
	require.ErrorIs(t, err, imagesig.ErrDigestMismatch, "a longer source")

	_, err = imagesig.CopyVerified(&bytes.Buffer{}, bytes.NewReader(content), d, []imagesig.PublicKey{stranger.Public})
	require.ErrorIs(t, err, imagesig.ErrUntrusted, "a key the verifier does not trust")

	// A signature by a trusted key over another image does not carry over.
	other := d
	other.Name = "other"
	_, err = imagesig.CopyVerified(&bytes.Buffer{}, bytes.NewReader(content), other, []imagesig.PublicKey{signer.Public})
	require.ErrorIs(t, err, imagesig.ErrUntrusted)
}
