package release

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type fixture struct {
	key, other Key
	trusted    []PublicKey
	manifest   Manifest
	binary     []byte // linux-amd64's bytes
	sbom       []byte
}

func setup(t testing.TB) fixture {
	t.Helper()
	key, _, err := GenerateKey(AlgEd25519)
	require.NoError(t, err)
	other, _, err := GenerateKey(AlgECDSAP256)
	require.NoError(t, err)
	f := fixture{key: key, other: other, trusted: []PublicKey{key.Public}, binary: []byte("bcd for linux-amd64"), sbom: []byte(`{"bomFormat":"CycloneDX"}`)}
	digest := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
	arm := []byte("bcd for linux-arm64")
	f.manifest = Manifest{
		Schema: Schema, Version: "v1.4.0", MinControlPlaneVersion: "v1.3.0",
		CreatedAt: time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC),
		Binaries: []Binary{
			{Platform: "linux-arm64", Name: "bcd-linux-arm64", SHA256: digest(arm), Size: int64(len(arm)),
				SBOM: File{Name: "bcd-linux-arm64.sbom.json", SHA256: digest(f.sbom), Size: int64(len(f.sbom))}},
			{Platform: "linux-amd64", Name: "bcd-linux-amd64", SHA256: digest(f.binary), Size: int64(len(f.binary)),
				SBOM: File{Name: "bcd-linux-amd64.sbom.json", SHA256: digest(f.sbom), Size: int64(len(f.sbom))}},
		},
	}
	return f
}

// requireRefused checks err is an *Error of kind naming field.
func requireRefused(t *testing.T, err error, kind error, field string) {
	t.Helper()
	require.Error(t, err)
	require.ErrorIs(t, err, kind, err.Error())
	var re *Error
	require.True(t, errors.As(err, &re), "%T is not a *release.Error", err)
	require.Equal(t, field, re.Field, err.Error())
	require.True(t, strings.HasPrefix(err.Error(), field+": "), "the message starts with its field: %s", err)
}

func TestSignVerifyRoundTrip(t *testing.T) {
	t.Parallel()
	for _, alg := range []string{AlgEd25519, AlgECDSAP256} {
		t.Run(alg, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			key, priv, err := GenerateKey(alg)
			require.NoError(t, err)
			// The key survives its PEM encoding.
			parsed, err := ParsePrivateKeyPEM(priv)
			require.NoError(t, err)
			require.Equal(t, key.Public.ID, parsed.Public.ID)
			pub, err := ParsePublicKeyPEM(key.Public.PEM())
			require.NoError(t, err)
			require.Equal(t, alg, pub.Algorithm())

			env, err := Sign(f.manifest, parsed)
			require.NoError(t, err)
			got, by, err := Verify(env, []PublicKey{f.other.Public, pub})
			require.NoError(t, err)
			require.Equal(t, key.Public.ID, by.ID)
			require.Equal(t, "v1.4.0", got.Version)
			require.Equal(t, []string{"linux-amd64", "linux-arm64"}, []string{got.Binaries[0].Platform, got.Binaries[1].Platform}, "canonical order")
			b, ok := got.Binary("linux-amd64")
			require.True(t, ok)
			require.NoError(t, CheckBinary(bytes.NewReader(f.binary), b))
			require.NoError(t, CheckSBOM(bytes.NewReader(f.sbom), b))

			// Re-indenting the envelope on its way keeps it valid: the
			// signature is over the compact manifest.
			var again bytes.Buffer
			require.NoError(t, json.Indent(&again, env, "", "\t"))
			require.NotEqual(t, env, again.Bytes())
			_, _, err = Verify(again.Bytes(), []PublicKey{pub})
			require.NoError(t, err)
		})
	}
}

func TestVerifyRefusesTamperedManifest(t *testing.T) {
	t.Parallel()
	f := setup(t)
	env, err := Sign(f.manifest, f.key)
	require.NoError(t, err)
	for _, c := range []struct{ from, to string }{
		{`"version": "v1.4.0"`, `"version": "v1.4.1"`},
		{`"min_control_plane_version": "v1.3.0"`, `"min_control_plane_version": "v1.2.0"`},
		{`"size": 19`, `"size": 18`},
		{f.manifest.Binaries[1].SHA256[:8], "00000000"},
	} {
		require.Contains(t, string(env), c.from)
		bad := []byte(strings.Replace(string(env), c.from, c.to, 1))
		_, _, err := Verify(bad, f.trusted)
		requireRefused(t, err, ErrBadSignature, "signature")
	}
	// One flipped byte of the signature.
	var e Envelope
	require.NoError(t, json.Unmarshal(env, &e))
	e.Signature[0] ^= 1
	bad, err := encodeEnvelope(e)
	require.NoError(t, err)
	_, _, err = Verify(bad, f.trusted)
	requireRefused(t, err, ErrBadSignature, "signature")
}

func TestCheckBinaryRefusesTamperedFile(t *testing.T) {
	t.Parallel()
	f := setup(t)
	b, _ := f.manifest.Binary("linux-amd64")
	tampered := bytes.Clone(f.binary)
	tampered[0] ^= 1
	requireRefused(t, CheckBinary(bytes.NewReader(tampered), b), ErrDigestMismatch, "binaries[linux-amd64].sha256")
	requireRefused(t, CheckBinary(bytes.NewReader(append(bytes.Clone(f.binary), 0)), b), ErrDigestMismatch, "binaries[linux-amd64].size")
	requireRefused(t, CheckBinary(bytes.NewReader(f.binary[1:]), b), ErrDigestMismatch, "binaries[linux-amd64].size")
	requireRefused(t, CheckSBOM(bytes.NewReader([]byte(`{"bomFormat":"CycloneDX" }`)), b), ErrDigestMismatch, "binaries[linux-amd64].sbom.size")
}

func TestVerifyRefusesKeysItDoesNotTrust(t *testing.T) {
	t.Parallel()
	f := setup(t)
	env, err := Sign(f.manifest, f.other)
	require.NoError(t, err)
	_, _, err = Verify(env, f.trusted)
	requireRefused(t, err, ErrUnknownKey, "key_id")
	_, _, err = Verify(env, nil)
	requireRefused(t, err, ErrUnknownKey, "key_id")

	// A signature by another key under the trusted key's id.
	var e Envelope
	require.NoError(t, json.Unmarshal(env, &e))
	e.KeyID = f.key.Public.ID
	bad, err := encodeEnvelope(e)
	require.NoError(t, err)
	_, _, err = Verify(bad, f.trusted)
	requireRefused(t, err, ErrBadSignature, "signature")
}

// commandRootKey returns a key in the form the command-signing root's
// offline key file has (pki writes command-root-<n>.key: PEM "PRIVATE
// KEY", PKCS#8, ECDSA P-256) and its certificate's public key as PEM.
func commandRootKey(t *testing.T) (*ecdsa.PrivateKey, []byte, []byte) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKCS8PrivateKey(k)
	require.NoError(t, err)
	pub, err := x509.MarshalPKIXPublicKey(k.Public())
	require.NoError(t, err)
	return k, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})
}

func TestCommandRootKeyIsNotAReleaseKey(t *testing.T) {
	t.Parallel()
	f := setup(t)
	root, rootPEM, rootPub := commandRootKey(t)

	_, err := ParsePrivateKeyPEM(rootPEM)
	requireRefused(t, err, ErrWrongPurpose, "key")
	_, err = ParsePublicKeyPEM(rootPub)
	requireRefused(t, err, ErrWrongPurpose, "pubkey")
	_, err = ParsePublicKeyPEM(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{0x30}}))
	requireRefused(t, err, ErrWrongPurpose, "pubkey")

	// A manifest signed by the command-signing root, by hand, with every
	// key id it could claim.
	body, err := Canonical(f.manifest)
	require.NoError(t, err)
	sum := sha256.Sum256(signedBytes(body))
	sig, err := ecdsa.SignASN1(rand.Reader, root, sum[:])
	require.NoError(t, err)
	pubDER, err := x509.MarshalPKIXPublicKey(root.Public())
	require.NoError(t, err)
	fp := sha256.Sum256(pubDER)
	for _, c := range []struct {
		id   string
		kind error
	}{
		{KeyIDPrefix + hex.EncodeToString(fp[:]), ErrUnknownKey},
		{hex.EncodeToString(fp[:]), ErrWrongPurpose},
		{"command-root:1", ErrWrongPurpose},
		{f.key.Public.ID, ErrBadSignature},
	} {
		env, err := encodeEnvelope(Envelope{PayloadType: PayloadType, Manifest: body, KeyID: c.id, Signature: sig})
		require.NoError(t, err)
		_, _, err = Verify(env, f.trusted)
		field := "key_id"
		if errors.Is(c.kind, ErrBadSignature) {
			field = "signature"
		}
		requireRefused(t, err, c.kind, field)
	}
}

// signRaw signs manifest bytes as given, so a test can make a manifest
// Sign would never produce and see Verify refuse what is inside it.
func signRaw(t *testing.T, key Key, body string) []byte {
	t.Helper()
	sig, err := key.sign(signedBytes([]byte(body)))
	require.NoError(t, err)
	env, err := encodeEnvelope(Envelope{PayloadType: PayloadType, Manifest: json.RawMessage(body), KeyID: key.Public.ID, Signature: sig})
	require.NoError(t, err)
	return env
}

func TestVerifyRefusalsNameTheirField(t *testing.T) {
	t.Parallel()
	f := setup(t)
	body, err := Canonical(f.manifest)
	require.NoError(t, err)
	good := string(body)
	env, err := Sign(f.manifest, f.key)
	require.NoError(t, err)
	amd := f.manifest.Binaries[1]
	unsorted, err := json.Marshal(f.manifest) // linux-arm64 first
	require.NoError(t, err)
	unsigned, err := encodeEnvelope(Envelope{PayloadType: PayloadType, Manifest: body, KeyID: f.key.Public.ID})
	require.NoError(t, err)
	noManifest, err := encodeEnvelope(Envelope{PayloadType: PayloadType, KeyID: f.key.Public.ID, Signature: []byte{1}})
	require.NoError(t, err)

	for _, c := range []struct {
		name  string
		env   []byte
		kind  error
		field string
	}{
		{"not JSON", []byte("not json"), ErrMalformed, "envelope"},
		{"two values", append(bytes.Clone(env), []byte("{}")...), ErrMalformed, "envelope"},
		{"unknown envelope field", []byte(strings.Replace(string(env), `"key_id"`, `"extra": 1, "key_id"`, 1)), ErrMalformed, "extra"},
		{"payload type", []byte(strings.Replace(string(env), PayloadType, "application/json", 1)), ErrInvalid, "payload_type"},
		{"signature not base64", []byte(strings.Replace(string(env), `"signature": "`, `"signature": "!`, 1)), ErrMalformed, "signature"},
		{"no signature", unsigned, ErrBadSignature, "signature"},
		{"no manifest", noManifest, ErrMalformed, "manifest"},
		{"unknown manifest field", signRaw(t, f.key, strings.Replace(good, `"version"`, `"channel":"beta","version"`, 1)), ErrMalformed, "manifest.channel"},
		{"unknown binary field", signRaw(t, f.key, strings.Replace(good, `"platform"`, `"arch":"x","platform"`, 1)), ErrMalformed, "manifest.binaries[0].arch"},
		{"size as text", signRaw(t, f.key, strings.Replace(good, `"size":19`, `"size":"19"`, 1)), ErrMalformed, "manifest.binaries.size"},
		{"created_at", signRaw(t, f.key, strings.Replace(good, `"2026-12-05T08:00:00Z"`, `"yesterday"`, 1)), ErrMalformed, "manifest.created_at"},
		{"schema", signRaw(t, f.key, strings.Replace(good, Schema, "better-compute.release-manifest/v2", 1)), ErrInvalid, "manifest.schema"},
		{"version", signRaw(t, f.key, strings.Replace(good, `"version":"v1.4.0"`, `"version":"1.4"`, 1)), ErrInvalid, "manifest.version"},
		{"min version", signRaw(t, f.key, strings.Replace(good, `"min_control_plane_version":"v1.3.0"`, `"min_control_plane_version":"latest"`, 1)), ErrInvalid, "manifest.min_control_plane_version"},
		{"platform", signRaw(t, f.key, strings.Replace(good, `"platform":"linux-amd64"`, `"platform":"darwin-arm64"`, 1)), ErrInvalid, "manifest.binaries[0].platform"},
		{"platform twice", signRaw(t, f.key, strings.Replace(good, `"platform":"linux-arm64"`, `"platform":"linux-amd64"`, 1)), ErrInvalid, "manifest.binaries[linux-amd64].platform"},
		{"name", signRaw(t, f.key, strings.Replace(good, `"name":"bcd-linux-amd64"`, `"name":"../bcd"`, 1)), ErrInvalid, "manifest.binaries[linux-amd64].name"},
		{"sha256", signRaw(t, f.key, strings.Replace(good, amd.SHA256, strings.ToUpper(amd.SHA256), 1)), ErrInvalid, "manifest.binaries[linux-amd64].sha256"},
		{"size", signRaw(t, f.key, strings.Replace(good, `"size":19`, `"size":0`, 1)), ErrInvalid, "manifest.binaries[linux-amd64].size"},
		{"sbom name", signRaw(t, f.key, strings.Replace(good, `"bcd-linux-amd64.sbom.json"`, `"other.json"`, 1)), ErrInvalid, "manifest.binaries[linux-amd64].sbom.name"},
		{"no binaries", signRaw(t, f.key, good[:strings.Index(good, `"binaries"`)]+`"binaries":[]}`), ErrInvalid, "manifest.binaries"},
		{"unknown sbom field", signRaw(t, f.key, strings.Replace(good, `"sbom":{`, `"sbom":{"url":"x",`, 1)), ErrMalformed, "manifest.binaries[0].sbom.url"},
		{"not canonical", signRaw(t, f.key, string(unsorted)), ErrMalformed, "manifest"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := Verify(c.env, f.trusted)
			requireRefused(t, err, c.kind, c.field)
		})
	}
}

func TestValidateRefusesBadFields(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for _, c := range []struct {
		field  string
		mutate func(*Manifest)
	}{
		{"version", func(m *Manifest) { m.Version = "v1.4.0+build.7" }},
		{"min_control_plane_version", func(m *Manifest) { m.MinControlPlaneVersion = "" }},
		{"created_at", func(m *Manifest) { m.CreatedAt = time.Time{} }},
		{"binaries[linux-amd64].name", func(m *Manifest) { m.Binaries[1].Name = "bcd-linux-arm64" }},
		{"binaries[linux-arm64].sbom.sha256", func(m *Manifest) { m.Binaries[0].SBOM.SHA256 = "" }},
	} {
		m := f.manifest
		m.Binaries = append([]Binary(nil), f.manifest.Binaries...)
		c.mutate(&m)
		_, err := Sign(m, f.key)
		requireRefused(t, err, ErrInvalid, c.field)
	}
}

// FuzzVerify: whatever bytes arrive as manifest.json, Verify returns a
// manifest only for a valid, canonical one signed by the trusted key, and
// otherwise an *Error naming a field; it never panics.
func FuzzVerify(f *testing.F) {
	fx := setup(f)
	env, err := Sign(fx.manifest, fx.key)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(env)
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"manifest":null}`))
	f.Add([]byte(strings.Replace(string(env), `"v1.4.0"`, `"v1.4.1"`, 1)))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, key, err := Verify(data, fx.trusted)
		if err != nil {
			var re *Error
			require.True(t, errors.As(err, &re), "%v", err)
			require.NotEmpty(t, re.Field)
			return
		}
		require.Equal(t, fx.key.Public.ID, key.ID)
		require.NoError(t, m.Validate())
	})
}
