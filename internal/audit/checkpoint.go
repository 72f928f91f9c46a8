package audit

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
)

// Checkpoint is a signed statement of the tree: its origin (the log's
// name), its size and root hash. Its signed-note text is what a third party
// keeps and checks; the fields are parsed from that text.
type Checkpoint struct {
	Origin string
	Size   uint64
	Root   []byte
	// Note is the whole signed note: the body and its signature lines.
	Note []byte
}

// CheckpointBody is the note text of a checkpoint, in the format of Go's
// checksum database and the transparency-dev logs: the origin line, the
// tree size in decimal, the base64 root hash, each ending in a newline.
func CheckpointBody(origin string, size uint64, root []byte) string {
	return fmt.Sprintf("%s\n%d\n%s\n", origin, size, base64.StdEncoding.EncodeToString(root))
}

// ParseCheckpointBody parses CheckpointBody's text, refusing anything else
// (extra lines included) so one checkpoint has one text.
func ParseCheckpointBody(text string) (origin string, size uint64, root []byte, err error) {
	lines := strings.SplitAfter(text, "\n")
	if len(lines) != 4 || lines[3] != "" {
		return "", 0, nil, errors.New("audit: checkpoint: want three lines: origin, size, root hash")
	}
	origin = strings.TrimSuffix(lines[0], "\n")
	if origin == "" {
		return "", 0, nil, errors.New("audit: checkpoint: empty origin")
	}
	sizeText := strings.TrimSuffix(lines[1], "\n")
	size, err = strconv.ParseUint(sizeText, 10, 64)
	if err != nil || strconv.FormatUint(size, 10) != sizeText {
		return "", 0, nil, fmt.Errorf("audit: checkpoint: size %q is not a decimal number", sizeText)
	}
	rootText := strings.TrimSuffix(lines[2], "\n")
	root, err = base64.StdEncoding.DecodeString(rootText)
	// The decoder skips CR and LF and tolerates stray trailing bits; a
	// checkpoint has one spelling.
	if err != nil || len(root) != hashSize || base64.StdEncoding.EncodeToString(root) != rootText {
		return "", 0, nil, errors.New("audit: checkpoint: root hash is not base64 of 32 bytes")
	}
	return origin, size, root, nil
}

const hashSize = 32

// SignCheckpoint signs a checkpoint of the tree with s.
func SignCheckpoint(s note.Signer, size uint64, root []byte) (Checkpoint, error) {
	origin := s.Name()
	msg, err := note.Sign(&note.Note{Text: CheckpointBody(origin, size, root)}, s)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("audit: sign checkpoint: %w", err)
	}
	return Checkpoint{Origin: origin, Size: size, Root: bytes.Clone(root), Note: msg}, nil
}

// ErrCheckpointSignature: a checkpoint not signed by the key the verifier
// trusts, or whose text is not a checkpoint of that key's log.
var ErrCheckpointSignature = errors.New("audit: checkpoint is not signed by the trusted log key")

// OpenCheckpoint verifies a signed checkpoint against verifierKey (a note
// verifier key, "<origin>+<hash>+<key>") and returns what it states. A note
// signed by any other key, or a checkpoint naming another origin than the
// key's, is refused.
func OpenCheckpoint(msg []byte, verifierKey string) (Checkpoint, error) {
	v, err := note.NewVerifier(strings.TrimSpace(verifierKey))
	if err != nil {
		return Checkpoint{}, fmt.Errorf("audit: log key: %w", err)
	}
	n, err := note.Open(msg, note.VerifierList(v))
	if err != nil {
		return Checkpoint{}, fmt.Errorf("%w: %w", ErrCheckpointSignature, err)
	}
	origin, size, root, err := ParseCheckpointBody(n.Text)
	if err != nil {
		return Checkpoint{}, err
	}
	if origin != v.Name() {
		return Checkpoint{}, fmt.Errorf("%w: it names log %q, the key is %q's", ErrCheckpointSignature, origin, v.Name())
	}
	return Checkpoint{Origin: origin, Size: size, Root: root, Note: bytes.Clone(msg)}, nil
}

// NewLogKey generates an Ed25519 note key named origin: the signer key
// (secret) and its verifier key (published).
func NewLogKey(origin string) (signerKey, verifierKey string, err error) {
	return note.GenerateKey(rand.Reader, origin)
}
