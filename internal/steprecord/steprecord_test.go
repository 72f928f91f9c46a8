package steprecord_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/steprecord"
)

func key(t *testing.T) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKIXPublicKey(k.Public())
	require.NoError(t, err)
	return k, der
}

// roundTrip is what the wire does to a result: JSON and back.
func roundTrip(t *testing.T, m map[string]any) map[string]any {
	t.Helper()
	b, err := json.Marshal(m)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}

// TestSignVerify: a signed inventory verifies with the ramdisk's key after
// a JSON round trip, and the verified output is the signed one: a field
// changed beside the attestation does not change it. Another key, another
// machine, workflow or kind, a missing or mangled attestation are refused.
func TestSignVerify(t *testing.T) {
	t.Parallel()
	k, der := key(t)
	_, otherDER := key(t)
	out, err := steprecord.Sign(k, steprecord.Record{MachineID: "mch_1", WorkflowID: "wf_1", NodeID: "n1", Kind: "inventory.refresh",
		Time: time.Now(), Output: map[string]any{"firmware": map[string]any{"bios_version": "1.2"}}})
	require.NoError(t, err)
	out = roundTrip(t, out)
	out["firmware"] = map[string]any{"bios_version": "forged"}

	v, err := steprecord.Verify(der, out, "mch_1", "wf_1", "inventory.refresh")
	require.NoError(t, err)
	require.Equal(t, "1.2", v.Record.Output["firmware"].(map[string]any)["bios_version"], "the signed output, not the field beside it")
	require.Len(t, v.Digest, 64)
	require.Len(t, v.KeyFingerprint, 16)

	cases := []struct {
		name string
		der  []byte
		out  map[string]any
		m, w string
		kind string
		want error
	}{
		{"another key", otherDER, out, "mch_1", "wf_1", "inventory.refresh", steprecord.ErrSignature},
		{"no key on record", nil, out, "mch_1", "wf_1", "inventory.refresh", steprecord.ErrSignature},
		{"another machine", der, out, "mch_2", "wf_1", "inventory.refresh", steprecord.ErrMismatch},
		{"another workflow", der, out, "mch_1", "wf_2", "inventory.refresh", steprecord.ErrMismatch},
		{"another kind", der, out, "mch_1", "wf_1", "burnin.run", steprecord.ErrMismatch},
		{"unsigned", der, map[string]any{"firmware": map[string]any{}}, "mch_1", "wf_1", "inventory.refresh", steprecord.ErrMissing},
		{"mangled", der, map[string]any{steprecord.Field: map[string]any{"payload": "!!", "signature": "AA=="}}, "mch_1", "wf_1",
			"inventory.refresh", steprecord.ErrMalformed},
	}
	for _, c := range cases {
		_, err := steprecord.Verify(c.der, c.out, c.m, c.w, c.kind)
		require.True(t, errors.Is(err, c.want), "%s: got %v, want %v", c.name, err, c.want)
	}
}
