package release

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// PayloadType heads every envelope: what the manifest inside is.
const PayloadType = "application/vnd.better-compute.release-manifest.v1+json"

// signingContext starts the bytes a release key signs. No other signature
// in the system starts so (commands sign "better-compute command v1",
// images "better-compute-image-v1"), so a release signature cannot be
// replayed as another kind, nor another kind as a release.
const signingContext = "better-compute release manifest v1\n"

// Envelope is a signed manifest as it is written to manifest.json. The
// manifest is kept as the exact bytes that were signed (the canonical
// encoding), readable as JSON.
type Envelope struct {
	PayloadType string          `json:"payload_type"`
	Manifest    json.RawMessage `json:"manifest"`
	KeyID       string          `json:"key_id"`
	// Signature is Ed25519 over the signed bytes, or ASN.1 ECDSA P-256 over
	// their SHA-256.
	Signature []byte `json:"signature"`
}

func signedBytes(manifest []byte) []byte {
	return append([]byte(signingContext), manifest...)
}

// Sign validates m and signs its canonical bytes with key, returning the
// envelope encoded as manifest.json holds it.
func Sign(m Manifest, key Key) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	body, err := Canonical(m)
	if err != nil {
		return nil, err
	}
	sig, err := key.sign(signedBytes(body))
	if err != nil {
		return nil, err
	}
	return encodeEnvelope(Envelope{PayloadType: PayloadType, Manifest: body, KeyID: key.Public.ID, Signature: sig})
}

func encodeEnvelope(e Envelope) ([]byte, error) {
	out, err := json.MarshalIndent(e, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// Verify checks an envelope against trusted (the keys the verifier was
// given, never a key the envelope brings) and returns its manifest. It
// refuses, naming the field: a malformed envelope or manifest, an unknown
// field in either, a key id that is not a release key's, a key not in
// trusted, a signature that does not verify, a manifest that is not in
// canonical form or whose fields are invalid.
func Verify(envelope []byte, trusted []PublicKey) (Manifest, *PublicKey, error) {
	var e Envelope
	if err := decodeStrict(envelope, &e, "envelope", ""); err != nil {
		return Manifest{}, nil, err
	}
	if e.PayloadType != PayloadType {
		return Manifest{}, nil, refuse("payload_type", ErrInvalid, "is %q: want %q", e.PayloadType, PayloadType)
	}
	if len(e.Manifest) == 0 || string(e.Manifest) == "null" {
		return Manifest{}, nil, refuse("manifest", ErrMalformed, "is missing")
	}
	id, ok := bytes.CutPrefix([]byte(e.KeyID), []byte(KeyIDPrefix))
	if !ok || !digestRE.Match(id) {
		return Manifest{}, nil, refuse("key_id", ErrWrongPurpose, "%q is not a release key id (%s and a sha256)", e.KeyID, KeyIDPrefix)
	}
	var key *PublicKey
	for i := range trusted {
		if trusted[i].ID == e.KeyID {
			key = &trusted[i]
			break
		}
	}
	if key == nil {
		return Manifest{}, nil, refuse("key_id", ErrUnknownKey, "%s is none of the %d trusted release key(s)", e.KeyID, len(trusted))
	}
	if len(e.Signature) == 0 {
		return Manifest{}, nil, refuse("signature", ErrBadSignature, "is missing")
	}
	// The envelope may have been re-indented on its way; the signature is
	// over the compact (canonical) form.
	var body bytes.Buffer
	if err := json.Compact(&body, e.Manifest); err != nil {
		return Manifest{}, nil, refuse("manifest", ErrMalformed, "%v", err)
	}
	if !key.verify(signedBytes(body.Bytes()), e.Signature) {
		return Manifest{}, nil, refuse("signature", ErrBadSignature, "does not verify under %s", key.ID)
	}
	var m Manifest
	if err := decodeStrict(body.Bytes(), &m, "manifest", "manifest."); err != nil {
		return Manifest{}, nil, err
	}
	if err := m.Validate(); err != nil {
		var re *Error
		if errors.As(err, &re) {
			re.Field = "manifest." + re.Field
		}
		return Manifest{}, nil, err
	}
	canon, err := Canonical(m)
	if err != nil {
		return Manifest{}, nil, err
	}
	if !bytes.Equal(canon, body.Bytes()) {
		return Manifest{}, nil, refuse("manifest", ErrMalformed, "is not in canonical form (binaries sorted by platform, created_at in UTC to the second)")
	}
	return m, key, nil
}

// Digest returns the sha256 (lower-case hex) and size of r's bytes.
func Digest(r io.Reader) (string, int64, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		return "", n, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// CheckFile checks that r holds the file the manifest pins: at names it in
// a refusal ("binaries[linux-amd64]"). It reads at most want.Size+1 bytes,
// so a longer file fails without being read to its end.
func CheckFile(r io.Reader, want File, at string) error {
	sum, n, err := Digest(io.LimitReader(r, want.Size+1))
	if err != nil {
		return fmt.Errorf("release: read %s: %w", at, err)
	}
	if n > want.Size {
		return refuse(at+".size", ErrDigestMismatch, "the file is longer than the manifest's %d bytes", want.Size)
	}
	if n < want.Size {
		return refuse(at+".size", ErrDigestMismatch, "the file has %d bytes, the manifest says %d", n, want.Size)
	}
	if sum != want.SHA256 {
		return refuse(at+".sha256", ErrDigestMismatch, "the file's sha256 is %s, the manifest says %s", sum, want.SHA256)
	}
	return nil
}

// CheckBinary checks that r holds b's binary.
func CheckBinary(r io.Reader, b Binary) error {
	return CheckFile(r, File{Name: b.Name, SHA256: b.SHA256, Size: b.Size}, "binaries["+b.Platform+"]")
}

// CheckSBOM checks that r holds b's SBOM.
func CheckSBOM(r io.Reader, b Binary) error {
	return CheckFile(r, b.SBOM, "binaries["+b.Platform+"].sbom")
}
