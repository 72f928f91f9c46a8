package audit

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"

	"github.com/better-compute/better-compute/internal/envelope"
)

// Bundle kinds.
const (
	BundleInclusion   = "inclusion"
	BundleConsistency = "consistency"
)

// maxProofHashes bounds a proof a verifier reads: a tree of 2^64 leaves
// needs at most 2*64 hashes.
const maxProofHashes = 128

// Bundle is a proof saved for a third party: everything needed to check it
// offline except the log's public key, which the verifier brings. Its JSON
// form is what `audit prove --out` and `audit verify --out` write.
type Bundle struct {
	Kind string `json:"kind"`
	// Checkpoint is the signed note the proof ends at.
	Checkpoint string `json:"checkpoint"`
	// Inclusion: the entry's canonical leaf bytes and its index.
	LeafIndex uint64 `json:"leaf_index,omitempty"`
	Leaf      []byte `json:"leaf,omitempty"`
	// Consistency: the older signed checkpoint the proof starts from.
	FromCheckpoint string `json:"from_checkpoint,omitempty"`
	// Proof is the RFC 6962 proof, hashes in order.
	Proof [][]byte `json:"proof"`
}

// Verified is what a bundle proved.
type Verified struct {
	Kind       string
	Checkpoint Checkpoint
	// Entry and LeafIndex are set for an inclusion proof.
	Entry     envelope.AuditEntry
	LeafIndex uint64
	// From is set for a consistency proof.
	From Checkpoint
}

// ParseBundle reads a bundle's JSON.
func ParseBundle(b []byte) (Bundle, error) {
	var out Bundle
	if err := json.Unmarshal(b, &out); err != nil {
		return Bundle{}, fmt.Errorf("audit: proof bundle: %w", err)
	}
	return out, nil
}

// ErrProof: a proof that does not lead to the signed root.
var ErrProof = errors.New("audit: proof does not verify")

// VerifyBundle checks a bundle offline against the log's verifier key: the
// checkpoints' signatures, then the inclusion of the leaf or the
// consistency of the two trees.
func VerifyBundle(b Bundle, verifierKey string) (Verified, error) {
	if len(b.Proof) > maxProofHashes {
		return Verified{}, fmt.Errorf("%w: %d hashes, at most %d", ErrProof, len(b.Proof), maxProofHashes)
	}
	cp, err := OpenCheckpoint([]byte(b.Checkpoint), verifierKey)
	if err != nil {
		return Verified{}, err
	}
	switch b.Kind {
	case BundleInclusion:
		e, err := VerifyInclusion(b.Leaf, b.LeafIndex, b.Proof, cp)
		if err != nil {
			return Verified{}, err
		}
		return Verified{Kind: b.Kind, Checkpoint: cp, Entry: e, LeafIndex: b.LeafIndex}, nil
	case BundleConsistency:
		from, err := OpenCheckpoint([]byte(b.FromCheckpoint), verifierKey)
		if err != nil {
			return Verified{}, fmt.Errorf("from checkpoint: %w", err)
		}
		if err := VerifyConsistency(from, cp, b.Proof); err != nil {
			return Verified{}, err
		}
		return Verified{Kind: b.Kind, Checkpoint: cp, From: from}, nil
	default:
		return Verified{}, fmt.Errorf("audit: proof bundle: kind %q is neither %q nor %q", b.Kind, BundleInclusion, BundleConsistency)
	}
}

// VerifyInclusion checks that leaf sits at index in the tree cp signs, and
// returns the entry it encodes.
func VerifyInclusion(leaf []byte, index uint64, hashes [][]byte, cp Checkpoint) (envelope.AuditEntry, error) {
	e, err := DecodeLeaf(leaf)
	if err != nil {
		return envelope.AuditEntry{}, err
	}
	if err := proof.VerifyInclusion(rfc6962.DefaultHasher, index, cp.Size, HashLeaf(leaf), hashes, cp.Root); err != nil {
		return envelope.AuditEntry{}, fmt.Errorf("%w: entry %s at index %d in the tree of size %d: %w", ErrProof, e.ID, index, cp.Size, err)
	}
	return e, nil
}

// VerifyConsistency checks that the tree to signs extends the tree from
// signs: every entry from covered is still there, unchanged and in order.
func VerifyConsistency(from, to Checkpoint, hashes [][]byte) error {
	if from.Origin != to.Origin {
		return fmt.Errorf("%w: the checkpoints are of different logs (%q, %q)", ErrProof, from.Origin, to.Origin)
	}
	if err := proof.VerifyConsistency(rfc6962.DefaultHasher, from.Size, to.Size, hashes, from.Root, to.Root); err != nil {
		return fmt.Errorf("%w: size %d to %d: %w", ErrProof, from.Size, to.Size, err)
	}
	return nil
}
