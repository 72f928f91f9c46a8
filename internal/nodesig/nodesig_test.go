package nodesig_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/nodesig"
)

func final() *agentv1.CommandUpdate {
	res, _ := structpb.NewStruct(map[string]any{"wiped_bytes": 1 << 40, "disk": "nvme0n1"})
	return &agentv1.CommandUpdate{CommandId: "cmd_1", Seq: 9, State: agentv1.CommandState_COMMAND_STATE_SUCCEEDED, Progress: 100, Result: res}
}

// TestSignVerify: a report verifies with the node's key for its node and
// trust domain only, and not once any field changed.
func TestSignVerify(t *testing.T) {
	t.Parallel()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	u := final()
	require.True(t, nodesig.Signed(u))
	require.False(t, nodesig.Signed(&agentv1.CommandUpdate{State: agentv1.CommandState_COMMAND_STATE_RUNNING}), "progress is not signed")
	require.NoError(t, nodesig.Sign(key, "fleet.example", "nod_1", u))
	signed, err := nodesig.Verify(&key.PublicKey, "fleet.example", "nod_1", u)
	require.NoError(t, err)
	require.NotEmpty(t, signed)

	_, err = nodesig.Verify(&key.PublicKey, "fleet.example", "nod_2", u)
	require.ErrorIs(t, err, nodesig.ErrBadSignature, "another node")
	_, err = nodesig.Verify(&key.PublicKey, "other.example", "nod_1", u)
	require.ErrorIs(t, err, nodesig.ErrBadSignature, "another trust domain")
	other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	_, err = nodesig.Verify(&other.PublicKey, "fleet.example", "nod_1", u)
	require.ErrorIs(t, err, nodesig.ErrBadSignature, "another key")
	u.State = agentv1.CommandState_COMMAND_STATE_FAILED
	_, err = nodesig.Verify(&key.PublicKey, "fleet.example", "nod_1", u)
	require.ErrorIs(t, err, nodesig.ErrBadSignature, "a changed state")
	_, err = nodesig.Verify(&key.PublicKey, "fleet.example", "nod_1", final())
	require.ErrorIs(t, err, nodesig.ErrBadSignature, "unsigned")

	// The same fields signed as another message type do not verify.
	b := &agentv1.AllocationBound{AllocationId: "alc_1", CommandId: "cmd_1"}
	require.NoError(t, nodesig.Sign(key, "fleet.example", "nod_1", b))
	r := &agentv1.AllocationReleased{AllocationId: "alc_1", CommandId: "cmd_1", NodeSignature: b.GetNodeSignature()}
	_, err = nodesig.Verify(&key.PublicKey, "fleet.example", "nod_1", r)
	require.ErrorIs(t, err, nodesig.ErrBadSignature, "a bound's signature on a released")
}

func BenchmarkSign(b *testing.B) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(b, err)
	u := final()
	for b.Loop() {
		if err := nodesig.Sign(key, "fleet.example", "nod_1", u); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerify(b *testing.B) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(b, err)
	u := final()
	require.NoError(b, nodesig.Sign(key, "fleet.example", "nod_1", u))
	for b.Loop() {
		if _, err := nodesig.Verify(&key.PublicKey, "fleet.example", "nod_1", u); err != nil {
			b.Fatal(err)
		}
	}
}
