package erase_test

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

	"github.com/better-compute/better-compute/internal/erase"
)

func record() erase.Record {
	return erase.Record{MachineID: "mch_1", WorkflowID: "wf_1", NodeID: "nod_1", Time: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC),
		Drives: []erase.Drive{{Device: "/dev/vda", Method: erase.MethodOverwrite, Bytes: 4123168604160, DurationMS: 12,
			Verification: erase.Verification{Samples: 16, BlockBytes: 4096, Zero: true}}}}
}

func key(t *testing.T) (*ecdsa.PrivateKey, []byte) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKIXPublicKey(k.Public())
	require.NoError(t, err)
	return k, der
}

// roundTrip sends an output through JSON as a command result travels.
func roundTrip(t *testing.T, out map[string]any) map[string]any {
	b, err := json.Marshal(out)
	require.NoError(t, err)
	var got map[string]any
	require.NoError(t, json.Unmarshal(b, &got))
	return got
}

func TestSignVerify(t *testing.T) {
	t.Parallel()
	k, pub := key(t)
	s, err := erase.Sign(k, record())
	require.NoError(t, err)
	got, err := erase.FromOutput(roundTrip(t, s.Output()))
	require.NoError(t, err)
	require.NoError(t, erase.Verify(pub, got))
	require.Equal(t, record().Drives, got.Record.Drives)
}

func TestVerifyRefuses(t *testing.T) {
	t.Parallel()
	k, pub := key(t)
	_, otherPub := key(t)
	s, err := erase.Sign(k, record())
	require.NoError(t, err)

	tampered := roundTrip(t, s.Output())
	tampered["record"].(map[string]any)["drives"].([]any)[0].(map[string]any)["method"] = erase.MethodNVMeSanitize
	tamperedSigned, err := erase.FromOutput(tampered)
	require.NoError(t, err)

	extra := roundTrip(t, s.Output())
	extra["record"].(map[string]any)["note"] = "unsigned"

	notZero := record()
	notZero.Drives[0].Verification.Zero = false
	nz, err := erase.Sign(k, notZero)
	require.NoError(t, err)

	for _, tc := range []struct {
		name string
		pub  []byte
		s    erase.Signed
		want error
	}{
		{"another key", otherPub, s, erase.ErrSignature},
		{"no key on record", nil, s, erase.ErrSignature},
		{"tampered record", pub, tamperedSigned, erase.ErrSignature},
		{"not zero", pub, nz, erase.ErrIncomplete},
	} {
		require.ErrorIs(t, erase.Verify(tc.pub, tc.s), tc.want, tc.name)
	}
	_, err = erase.FromOutput(extra)
	require.True(t, errors.Is(err, erase.ErrMalformed), "unsigned field: %v", err)
	_, err = erase.FromOutput(map[string]any{"drives": []any{}})
	require.ErrorIs(t, err, erase.ErrMalformed)
}
