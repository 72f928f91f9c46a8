// Package erase is the attested wipe's record: what a commissioning
// ramdisk did to each drive of a machine, in a canonical encoding that the
// ramdisk signs with the private key of its mTLS certificate and the
// control plane verifies against the public key it saw at the ramdisk's
// join. A gateway relays the record but holds no ramdisk key, so it cannot
// forge one. The package never touches a disk or the database.
package erase

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Wipe methods, strongest first: a ramdisk uses the first one its drive
// supports.
const (
	MethodNVMeSanitize = "nvme-sanitize"
	MethodNVMeFormat   = "nvme-format"
	MethodATASecure    = "ata-secure-erase"
	MethodDiscard      = "blkdiscard"
	MethodOverwrite    = "overwrite"
)

// Methods lists every method a record may name.
var Methods = []string{MethodNVMeSanitize, MethodNVMeFormat, MethodATASecure, MethodDiscard, MethodOverwrite}

// Verification is the read-back sample taken after a drive was wiped.
type Verification struct {
	// Samples blocks of BlockBytes were read at random offsets.
	Samples    int `json:"samples"`
	BlockBytes int `json:"block_bytes"`
	// Zero is true when every sampled byte read back as zero.
	Zero bool `json:"zero"`
}

// Drive is one drive's wipe.
type Drive struct {
	Device       string       `json:"device"`
	Method       string       `json:"method"`
	Bytes        int64        `json:"bytes"`
	DurationMS   int64        `json:"duration_ms"`
	Verification Verification `json:"verification"`
}

// Record is what a ramdisk signs: the machine and workflow it wiped for
// (so a record cannot be replayed onto another machine or a later
// release) and each drive.
type Record struct {
	MachineID  string    `json:"machine_id"`
	WorkflowID string    `json:"workflow_id"`
	NodeID     string    `json:"node_id"`
	Time       time.Time `json:"time"`
	Drives     []Drive   `json:"drives"`
}

// Canonical is the signed encoding: the record's JSON with fields in
// declaration order, time in UTC with nanoseconds, no extra space.
func (r Record) Canonical() []byte {
	r.Time = r.Time.UTC()
	if r.Drives == nil {
		r.Drives = []Drive{}
	}
	b, err := json.Marshal(r)
	if err != nil {
		// Only strings, integers, bools and a time: Marshal cannot fail.
		panic(fmt.Sprintf("erase: marshal record: %v", err))
	}
	return b
}

// Signed is a record and the ramdisk's signature over its canonical
// encoding (ECDSA ASN.1 over SHA-256, or Ed25519 over the encoding).
type Signed struct {
	Record    Record
	Signature []byte
}

// Sign signs r with the ramdisk's key.
func Sign(key crypto.Signer, r Record) (Signed, error) {
	msg := r.Canonical()
	var (
		sig []byte
		err error
	)
	switch key.Public().(type) {
	case ed25519.PublicKey:
		sig, err = key.Sign(rand.Reader, msg, crypto.Hash(0))
	case *ecdsa.PublicKey:
		sum := sha256.Sum256(msg)
		sig, err = key.Sign(rand.Reader, sum[:], crypto.SHA256)
	default:
		return Signed{}, fmt.Errorf("erase: unsupported key type %T", key.Public())
	}
	if err != nil {
		return Signed{}, fmt.Errorf("erase: sign: %w", err)
	}
	return Signed{Record: r, Signature: sig}, nil
}

// Verification errors.
var (
	// ErrMalformed: the output is not a signed record.
	ErrMalformed = errors.New("erase: malformed wipe record")
	// ErrSignature: the signature does not verify with the ramdisk's key.
	ErrSignature = errors.New("erase: wipe record signature does not verify with the ramdisk's key")
	// ErrIncomplete: the record verifies but does not attest a full wipe.
	ErrIncomplete = errors.New("erase: wipe record does not attest a complete wipe")
)

// Verify checks s against the PKIX DER public key the ramdisk joined with,
// and that it attests a complete wipe: at least one drive, each with a
// known method, some bytes, and a zero read-back.
func Verify(publicKeyDER []byte, s Signed) error {
	if len(publicKeyDER) == 0 {
		return fmt.Errorf("%w: no ramdisk key is on record for the machine", ErrSignature)
	}
	pub, err := x509.ParsePKIXPublicKey(publicKeyDER)
	if err != nil {
		return fmt.Errorf("%w: the ramdisk key on record does not parse: %w", ErrSignature, err)
	}
	msg := s.Record.Canonical()
	ok := false
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		sum := sha256.Sum256(msg)
		ok = ecdsa.VerifyASN1(k, sum[:], s.Signature)
	case ed25519.PublicKey:
		ok = ed25519.Verify(k, msg, s.Signature)
	}
	if !ok {
		return ErrSignature
	}
	if len(s.Record.Drives) == 0 {
		return fmt.Errorf("%w: no drives", ErrIncomplete)
	}
	for _, d := range s.Record.Drives {
		known := false
		for _, m := range Methods {
			known = known || d.Method == m
		}
		switch {
		case !known:
			return fmt.Errorf("%w: drive %s: unknown method %q", ErrIncomplete, d.Device, d.Method)
		case d.Bytes <= 0:
			return fmt.Errorf("%w: drive %s: no bytes wiped", ErrIncomplete, d.Device)
		case d.Verification.Samples <= 0 || !d.Verification.Zero:
			return fmt.Errorf("%w: drive %s: the read-back sample did not read zeros", ErrIncomplete, d.Device)
		}
	}
	return nil
}

// Output is a signed record as a step's or command's result: {"record":
// {...}, "signature": "<base64>"}.
func (s Signed) Output() map[string]any {
	var rec map[string]any
	// Canonical is JSON of a plain struct: it always decodes.
	dec := json.NewDecoder(bytes.NewReader(s.Record.Canonical()))
	dec.UseNumber()
	_ = dec.Decode(&rec)
	return map[string]any{"record": rec, "signature": base64.StdEncoding.EncodeToString(s.Signature)}
}

// maxOutputBytes bounds what FromOutput parses.
const maxOutputBytes = 1 << 20

// FromOutput reads a signed record back from a result (after any JSON
// round trip). Unknown fields are refused: whatever was not signed must
// not ride along.
func FromOutput(out map[string]any) (Signed, error) {
	sigText, _ := out["signature"].(string)
	if sigText == "" {
		return Signed{}, fmt.Errorf("%w: no signature", ErrMalformed)
	}
	sig, err := base64.StdEncoding.DecodeString(sigText)
	if err != nil {
		return Signed{}, fmt.Errorf("%w: signature: %w", ErrMalformed, err)
	}
	raw, err := json.Marshal(out["record"])
	if err != nil || len(raw) > maxOutputBytes {
		return Signed{}, fmt.Errorf("%w: record does not encode", ErrMalformed)
	}
	var r Record
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return Signed{}, fmt.Errorf("%w: record: %w", ErrMalformed, err)
	}
	if r.MachineID == "" || r.WorkflowID == "" {
		return Signed{}, fmt.Errorf("%w: record lacks machine_id or workflow_id", ErrMalformed)
	}
	return Signed{Record: r, Signature: sig}, nil
}
