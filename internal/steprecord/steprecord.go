// Package steprecord signs and verifies what a commissioning ramdisk
// reports for a step other than the wipe (internal/erase has that one):
// the inventory (with the firmware a lease's teardown compares against its
// baseline) and the burn-in (GPU diagnostics). The ramdisk signs the exact
// bytes of a record naming the machine, the workflow and the step kind with
// the private key of its mTLS certificate; the control plane verifies them
// against the public key it saw at the ramdisk's join and then reads the
// step's result from those signed bytes only, never from fields beside
// them. The package never touches a device or the database.
package steprecord

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Field is the key of a step's output that carries its attestation.
const Field = "attestation"

// maxPayload bounds what Verify decodes.
const maxPayload = 1 << 20

// Record is what a ramdisk signs for a step.
type Record struct {
	MachineID  string         `json:"machine_id"`
	WorkflowID string         `json:"workflow_id"`
	NodeID     string         `json:"node_id"`
	Kind       string         `json:"kind"`
	Time       time.Time      `json:"time"`
	Output     map[string]any `json:"output"`
}

// Errors Verify returns.
var (
	// ErrMissing: the output carries no attestation.
	ErrMissing = errors.New("steprecord: the step's result is not signed")
	// ErrMalformed: the attestation does not decode.
	ErrMalformed = errors.New("steprecord: malformed attestation")
	// ErrSignature: the signature does not verify with the ramdisk's key.
	ErrSignature = errors.New("steprecord: the signature does not verify with the ramdisk's key")
	// ErrMismatch: the record is for another machine, workflow or kind.
	ErrMismatch = errors.New("steprecord: the signed record is for another step")
)

// Sign returns output with its attestation added: the record's JSON
// (payload) and the key's signature over it (ECDSA ASN.1 over SHA-256, or
// Ed25519 over the payload).
func Sign(key crypto.Signer, r Record) (map[string]any, error) {
	r.Time = r.Time.UTC()
	payload, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("steprecord: encode: %w", err)
	}
	var sig []byte
	switch key.Public().(type) {
	case ed25519.PublicKey:
		sig, err = key.Sign(rand.Reader, payload, crypto.Hash(0))
	case *ecdsa.PublicKey:
		sum := sha256.Sum256(payload)
		sig, err = key.Sign(rand.Reader, sum[:], crypto.SHA256)
	default:
		return nil, fmt.Errorf("steprecord: unsupported key type %T", key.Public())
	}
	if err != nil {
		return nil, fmt.Errorf("steprecord: sign: %w", err)
	}
	out := make(map[string]any, len(r.Output)+1)
	for k, v := range r.Output {
		out[k] = v
	}
	out[Field] = map[string]any{"payload": base64.StdEncoding.EncodeToString(payload),
		"signature": base64.StdEncoding.EncodeToString(sig)}
	return out, nil
}

// Verified is a record whose signature verified.
type Verified struct {
	Record Record
	// Digest is the sha256 of the signed payload, hex.
	Digest string
	// KeyFingerprint is the sha256 of the signing key (PKIX DER), hex, the
	// first 16 characters.
	KeyFingerprint string
}

// Verify checks out's attestation against the PKIX DER public key the
// ramdisk joined with, and that it is about this machine, workflow and
// kind. The result to act on is Verified.Record.Output.
func Verify(publicKeyDER []byte, out map[string]any, machineID, workflowID, kind string) (Verified, error) {
	att, _ := out[Field].(map[string]any)
	if att == nil {
		return Verified{}, ErrMissing
	}
	pText, _ := att["payload"].(string)
	sText, _ := att["signature"].(string)
	payload, err := base64.StdEncoding.DecodeString(pText)
	if err != nil || len(payload) == 0 || len(payload) > maxPayload {
		return Verified{}, fmt.Errorf("%w: payload", ErrMalformed)
	}
	sig, err := base64.StdEncoding.DecodeString(sText)
	if err != nil || len(sig) == 0 {
		return Verified{}, fmt.Errorf("%w: signature", ErrMalformed)
	}
	if len(publicKeyDER) == 0 {
		return Verified{}, fmt.Errorf("%w: no ramdisk key is on record for the machine", ErrSignature)
	}
	pub, err := x509.ParsePKIXPublicKey(publicKeyDER)
	if err != nil {
		return Verified{}, fmt.Errorf("%w: the ramdisk key on record does not parse: %w", ErrSignature, err)
	}
	ok := false
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		sum := sha256.Sum256(payload)
		ok = ecdsa.VerifyASN1(k, sum[:], sig)
	case ed25519.PublicKey:
		ok = ed25519.Verify(k, payload, sig)
	}
	if !ok {
		return Verified{}, ErrSignature
	}
	var r Record
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return Verified{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if r.MachineID != machineID || r.WorkflowID != workflowID || r.Kind != kind {
		return Verified{}, fmt.Errorf("%w: it names machine %q, workflow %q, kind %q", ErrMismatch, r.MachineID, r.WorkflowID, r.Kind)
	}
	sum := sha256.Sum256(payload)
	ksum := sha256.Sum256(publicKeyDER)
	return Verified{Record: r, Digest: hex.EncodeToString(sum[:]), KeyFingerprint: hex.EncodeToString(ksum[:])[:16]}, nil
}
