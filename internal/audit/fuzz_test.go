package audit_test

import (
	"testing"
	"time"

	"github.com/better-compute/better-compute/internal/audit"
	"github.com/better-compute/better-compute/internal/envelope"
)

// FuzzDecodeLeaf: any bytes either fail to decode or are canonical (they
// re-encode to themselves), never panic.
func FuzzDecodeLeaf(f *testing.F) {
	f.Add(audit.EncodeLeaf(envelope.AuditEntry{ID: "aud_1", Time: time.Unix(1, 2000).UTC(), Action: "a", Detail: "é"}))
	f.Add([]byte{1})
	f.Add([]byte{1, 0, 0, 0, 255})
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := audit.DecodeLeaf(b)
		if err != nil {
			return
		}
		if got := audit.EncodeLeaf(e); string(got) != string(b) {
			t.Fatalf("decoded a leaf that is not canonical: %x re-encodes to %x", b, got)
		}
	})
}

// FuzzParseCheckpointBody: a parsed body prints back to itself.
func FuzzParseCheckpointBody(f *testing.F) {
	f.Add(audit.CheckpointBody("better-compute.local/audit", 1042, make([]byte, 32)))
	f.Add("o\n01\nAAAA\n")
	f.Add("o\n1\n\n")
	f.Add("o\n1\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\rAB=\n")
	f.Fuzz(func(t *testing.T, text string) {
		origin, size, root, err := audit.ParseCheckpointBody(text)
		if err != nil {
			return
		}
		if got := audit.CheckpointBody(origin, size, root); got != text {
			t.Fatalf("parsed a body that is not canonical: %q prints as %q", text, got)
		}
	})
}

// FuzzParseBundle: a bundle from outside never panics the verifier.
func FuzzParseBundle(f *testing.F) {
	f.Add([]byte(`{"kind":"inclusion","checkpoint":"o\n1\nAAAA\n","leaf":"AQ==","proof":["AA=="]}`))
	f.Add([]byte(`{"kind":"consistency","from_checkpoint":"x","checkpoint":"y","proof":[]}`))
	_, key, err := audit.NewLogKey("o")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		b, err := audit.ParseBundle(raw)
		if err != nil {
			return
		}
		if _, err := audit.VerifyBundle(b, key); err == nil {
			t.Fatalf("a bundle verified under a key that signed nothing: %q", raw)
		}
	})
}
