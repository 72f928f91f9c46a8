package audit

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/transparency-dev/merkle/rfc6962"

	"github.com/better-compute/better-compute/internal/envelope"
)

// LeafVersion is the first byte of every leaf this release encodes. A new
// column, or any change to the encoding, takes a new version; leaves already
// in the tree keep theirs.
const LeafVersion byte = 1

// leafFields is the number of fields of a version 1 leaf.
const leafFields = 13

// maxLeafBytes bounds a leaf a verifier decodes: far above any audit row,
// low enough that a hostile bundle cannot make it allocate much.
const maxLeafBytes = 1 << 20

// leafTimeLayout is how a leaf writes an entry's time: UTC, fixed width,
// microseconds (what both stores keep).
const leafTimeLayout = "2006-01-02T15:04:05.000000Z"

// EncodeLeaf returns the canonical bytes of an audit row, as docs/audit.md
// specifies them: the version byte 0x01, then the row's 13 columns in a
// fixed order (id, time, tenant_id, principal_id, principal_kind, action,
// resource_type, resource_id, decision, request_id, trace_id, result,
// detail), each as a 4-byte big-endian length and its UTF-8 bytes; time is
// written as UTC "2006-01-02T15:04:05.000000Z". A third party recomputes it
// from the row alone.
func EncodeLeaf(e envelope.AuditEntry) []byte {
	fields := leafValues(e)
	n := 1
	for _, f := range fields {
		n += 4 + len(f)
	}
	out := make([]byte, 0, n)
	out = append(out, LeafVersion)
	for _, f := range fields {
		out = binary.BigEndian.AppendUint32(out, uint32(len(f)))
		out = append(out, f...)
	}
	return out
}

func leafValues(e envelope.AuditEntry) [leafFields]string {
	return [leafFields]string{e.ID, e.Time.UTC().Format(leafTimeLayout), e.TenantID, e.PrincipalID, e.PrincipalKind,
		e.Action, e.ResourceType, e.ResourceID, e.Decision, e.RequestID, e.TraceID, e.Result, e.Detail}
}

// ErrLeaf: bytes that are not a canonical leaf.
var ErrLeaf = errors.New("audit: not a canonical audit leaf")

// DecodeLeaf parses a leaf EncodeLeaf wrote. It accepts only canonical
// bytes (EncodeLeaf of the result gives b back), so the entry a verifier
// shows is exactly the one the leaf hash commits to.
func DecodeLeaf(b []byte) (envelope.AuditEntry, error) {
	if len(b) > maxLeafBytes {
		return envelope.AuditEntry{}, fmt.Errorf("%w: %d bytes, at most %d", ErrLeaf, len(b), maxLeafBytes)
	}
	if len(b) == 0 || b[0] != LeafVersion {
		return envelope.AuditEntry{}, fmt.Errorf("%w: unknown version", ErrLeaf)
	}
	rest := b[1:]
	var fs [leafFields]string
	for i := range fs {
		if len(rest) < 4 {
			return envelope.AuditEntry{}, fmt.Errorf("%w: field %d truncated", ErrLeaf, i+1)
		}
		n := binary.BigEndian.Uint32(rest)
		rest = rest[4:]
		if uint64(n) > uint64(len(rest)) {
			return envelope.AuditEntry{}, fmt.Errorf("%w: field %d truncated", ErrLeaf, i+1)
		}
		fs[i] = string(rest[:n])
		if !utf8.ValidString(fs[i]) {
			return envelope.AuditEntry{}, fmt.Errorf("%w: field %d is not UTF-8", ErrLeaf, i+1)
		}
		rest = rest[n:]
	}
	if len(rest) != 0 {
		return envelope.AuditEntry{}, fmt.Errorf("%w: %d bytes after the last field", ErrLeaf, len(rest))
	}
	t, err := time.Parse(leafTimeLayout, fs[1])
	if err != nil || t.Format(leafTimeLayout) != fs[1] {
		return envelope.AuditEntry{}, fmt.Errorf("%w: time %q is not in the canonical layout", ErrLeaf, fs[1])
	}
	return envelope.AuditEntry{ID: fs[0], Time: t, TenantID: fs[2], PrincipalID: fs[3], PrincipalKind: fs[4],
		Action: fs[5], ResourceType: fs[6], ResourceID: fs[7], Decision: fs[8], RequestID: fs[9], TraceID: fs[10],
		Result: fs[11], Detail: fs[12]}, nil
}

// HashLeaf is the RFC 6962 leaf hash of leaf bytes: SHA-256(0x00 || leaf).
func HashLeaf(leaf []byte) []byte { return rfc6962.DefaultHasher.HashLeaf(leaf) }
