package erase_test

import (
	"encoding/json"
	"testing"

	"github.com/better-compute/better-compute/internal/erase"
)

// FuzzFromOutput feeds a ramdisk's command result (outside bytes, relayed
// by the gateway) to the decoder and the verifier: neither may panic, and
// nothing a fuzzer makes without the key verifies.
func FuzzFromOutput(f *testing.F) {
	f.Add([]byte(`{"record":{"machine_id":"m","workflow_id":"w","node_id":"n","time":"2026-01-02T03:04:05Z","drives":[{"device":"/dev/vda","method":"overwrite","bytes":1,"duration_ms":1,"verification":{"samples":1,"block_bytes":4096,"zero":true}}]},"signature":"MEUCIQ=="}`))
	f.Add([]byte(`{"record":{"drives":null},"signature":""}`))
	f.Add([]byte(`{"record":[],"signature":"!!"}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var out map[string]any
		if json.Unmarshal(b, &out) != nil {
			return
		}
		s, err := erase.FromOutput(out)
		if err != nil {
			return
		}
		if erase.Verify(nil, s) == nil {
			t.Fatal("a record verified without a key")
		}
		_ = s.Output()
	})
}
