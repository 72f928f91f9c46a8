// Package approval is the pure cryptography of quorum batches: the
// canonical encoding of a batch's leaves, their RFC 6962 Merkle root, the
// bytes an approver signs for a batch or for a new approver set, and the
// parsing and checking of approver keys and signatures.
//
// The control plane and the CLI both use it, so the CLI recomputes what it
// signs from the leaves themselves and never signs a root the server hands
// it. It must never touch a database, the network or a private key's
// storage: a signer is passed in.
package approval

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/transparency-dev/merkle/compact"
	"github.com/transparency-dev/merkle/rfc6962"
	"golang.org/x/crypto/ssh"
)

// Domain-separation strings: each kind of signed message starts with its
// own, so a signature made for one can never be replayed as another (an
// approver-set approval as a batch approval, or an SSH login as either).
const (
	LeafContext        = "better-compute/command-batch/leaf/v1"
	BatchContext       = "better-compute/command-batch/approval/v1"
	ApproverSetContext = "better-compute/approver-set/v1"
)

// Leaf is one command of a batch as its approvers see it.
type Leaf struct {
	Kind    string
	Subject string
	// ParamsDigest is SHA-256 of the params' canonical JSON (ParamsDigest).
	ParamsDigest [32]byte
}

// appendLP appends a string with a 4-byte big-endian length, so that no
// two different field lists encode alike.
func appendLP(b []byte, s []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

// Encode is the leaf's canonical encoding: its context, kind and subject
// length-prefixed, then the 32-byte params digest.
func (l Leaf) Encode() []byte {
	b := appendLP(nil, []byte(LeafContext))
	b = appendLP(b, []byte(l.Kind))
	b = appendLP(b, []byte(l.Subject))
	return append(b, l.ParamsDigest[:]...)
}

// CanonicalParams is the canonical JSON of a command's params: keys sorted,
// no spaces, numbers as encoding/json writes a float64 (what a protobuf
// Struct holds); nil is {}.
func CanonicalParams(params map[string]any) ([]byte, error) {
	if params == nil {
		params = map[string]any{}
	}
	return json.Marshal(params)
}

// ParamsDigest hashes params' canonical JSON.
func ParamsDigest(params map[string]any) ([32]byte, []byte, error) {
	b, err := CanonicalParams(params)
	if err != nil {
		return [32]byte{}, nil, err
	}
	return sha256.Sum256(b), b, nil
}

// Root is the RFC 6962 Merkle tree head over the leaves' encodings, in
// order; a batch has at least one leaf.
func Root(leaves []Leaf) ([32]byte, error) {
	if len(leaves) == 0 {
		return [32]byte{}, errors.New("approval: a batch has no leaves")
	}
	h := rfc6962.DefaultHasher
	rf := compact.RangeFactory{Hash: h.HashChildren}
	r := rf.NewEmptyRange(0)
	for _, l := range leaves {
		if err := r.Append(h.HashLeaf(l.Encode()), nil); err != nil {
			return [32]byte{}, err
		}
	}
	root, err := r.GetRootHash(nil)
	if err != nil {
		return [32]byte{}, err
	}
	var out [32]byte
	copy(out[:], root)
	return out, nil
}

// BatchMessage is what an approver signs for a batch: the context, the
// trust domain, the batch id, its root and the approver set epoch.
func BatchMessage(trustDomain, batchID string, root [32]byte, epoch int64) []byte {
	b := appendLP(nil, []byte(BatchContext))
	b = appendLP(b, []byte(trustDomain))
	b = appendLP(b, []byte(batchID))
	b = append(b, root[:]...)
	return binary.BigEndian.AppendUint64(b, uint64(epoch))
}

// SetMessage is the canonical bytes of an approver set, which the previous
// set's quorum signs to admit it: the context, trust domain, tenant, the
// new epoch, threshold, and the keys' wire forms sorted.
func SetMessage(trustDomain, tenantID string, epoch int64, threshold int, keys []ssh.PublicKey) []byte {
	wires := make([][]byte, len(keys))
	for i, k := range keys {
		wires[i] = k.Marshal()
	}
	slices.SortFunc(wires, bytes.Compare)
	b := appendLP(nil, []byte(ApproverSetContext))
	b = appendLP(b, []byte(trustDomain))
	b = appendLP(b, []byte(tenantID))
	b = binary.BigEndian.AppendUint64(b, uint64(epoch))
	b = binary.BigEndian.AppendUint32(b, uint32(threshold))
	b = binary.BigEndian.AppendUint32(b, uint32(len(wires)))
	for _, w := range wires {
		b = appendLP(b, w)
	}
	return b
}

// keyTypes are the approver key types accepted: Ed25519 and the NIST ECDSA
// curves, as OpenSSH names them. RSA is refused (no small, modern keys) and
// so are certificates and security-key types (their signatures carry
// extra flags this check does not read).
var keyTypes = []string{ssh.KeyAlgoED25519, ssh.KeyAlgoECDSA256, ssh.KeyAlgoECDSA384, ssh.KeyAlgoECDSA521}

// ParseKey reads an approver's public key: an authorized_keys line or a PEM
// (PKIX) Ed25519 or ECDSA public key.
func ParseKey(s string) (ssh.PublicKey, error) {
	s = strings.TrimSpace(s)
	var (
		k   ssh.PublicKey
		err error
	)
	if blk, _ := pem.Decode([]byte(s)); blk != nil {
		if blk.Type != "PUBLIC KEY" {
			return nil, fmt.Errorf("a PEM key must be a PUBLIC KEY, got %q", blk.Type)
		}
		pub, perr := x509.ParsePKIXPublicKey(blk.Bytes)
		if perr != nil {
			return nil, fmt.Errorf("not a PKIX public key: %w", perr)
		}
		switch pub.(type) {
		case ed25519.PublicKey, *ecdsa.PublicKey:
		default:
			return nil, fmt.Errorf("a PEM key must be Ed25519 or ECDSA, got %T", pub)
		}
		if k, err = ssh.NewPublicKey(pub); err != nil {
			return nil, err
		}
	} else if k, _, _, _, err = ssh.ParseAuthorizedKey([]byte(s)); err != nil {
		return nil, fmt.Errorf("neither an authorized_keys line nor a PEM public key: %w", err)
	}
	if !slices.Contains(keyTypes, k.Type()) {
		return nil, fmt.Errorf("key type %s is not accepted: use %s", k.Type(), strings.Join(keyTypes, ", "))
	}
	return k, nil
}

// KeyID is a key's SHA-256 fingerprint as ssh-keygen -l prints it.
func KeyID(k ssh.PublicKey) string { return ssh.FingerprintSHA256(k) }

// AuthorizedKey is a key's one-line authorized_keys form, without comment.
func AuthorizedKey(k ssh.PublicKey) string {
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k)))
}

// Sign signs msg with s and returns the signature's SSH wire form. An agent
// key signs through the same interface (agent.ExtendedAgent.Signers).
func Sign(s ssh.Signer, msg []byte) ([]byte, error) {
	sig, err := s.Sign(rand.Reader, msg)
	if err != nil {
		return nil, err
	}
	return ssh.Marshal(sig), nil
}

// ErrBadSignature says a signature does not verify under its key.
var ErrBadSignature = errors.New("signature does not verify")

// Verify checks a signature in SSH wire form over msg by k; its format
// must be k's own algorithm.
func Verify(k ssh.PublicKey, msg, wire []byte) error {
	var sig ssh.Signature
	if err := ssh.Unmarshal(wire, &sig); err != nil {
		return fmt.Errorf("%w: not an SSH signature: %w", ErrBadSignature, err)
	}
	if sig.Format != k.Type() {
		return fmt.Errorf("%w: format %s for a %s key", ErrBadSignature, sig.Format, k.Type())
	}
	if err := k.Verify(msg, &sig); err != nil {
		return fmt.Errorf("%w: %w", ErrBadSignature, err)
	}
	return nil
}

// HexRoot is the hex form a batch's root is shown in.
func HexRoot(r [32]byte) string { return hex.EncodeToString(r[:]) }

// ParseRoot reads a hex root.
func ParseRoot(s string) ([32]byte, error) {
	var r [32]byte
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != 32 {
		return r, fmt.Errorf("a root is 64 hex digits, got %q", s)
	}
	copy(r[:], b)
	return r, nil
}
