package nodesecret_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/nodesecret"
)

func request(t *testing.T) *agentv1.FetchSecretRequest {
	t.Helper()
	k, err := nodesecret.NewKey()
	require.NoError(t, err)
	nonce := make([]byte, 32)
	_, _ = rand.Read(nonce)
	return &agentv1.FetchSecretRequest{Ref: "secret://db", Nonce: nonce, Time: timestamppb.New(time.Unix(1700000000, 5)),
		RecipientPublicKey: k.PublicKey().Bytes()}
}

func TestSignVerify(t *testing.T) {
	t.Parallel()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	req := request(t)
	require.NoError(t, nodesecret.Sign(key, "td", "node_a", req))
	require.NoError(t, nodesecret.Verify(&key.PublicKey, "td", "node_a", req))

	require.ErrorIs(t, nodesecret.Verify(&other.PublicKey, "td", "node_a", req), nodesecret.ErrBadSignature, "another key")
	require.ErrorIs(t, nodesecret.Verify(&key.PublicKey, "td", "node_b", req), nodesecret.ErrBadSignature, "another node")
	require.ErrorIs(t, nodesecret.Verify(&key.PublicKey, "other", "node_a", req), nodesecret.ErrBadSignature, "another trust domain")
	// Every signed field is covered.
	for name, change := range map[string]func(r *agentv1.FetchSecretRequest){
		"ref":       func(r *agentv1.FetchSecretRequest) { r.Ref = "secret://other" },
		"nonce":     func(r *agentv1.FetchSecretRequest) { r.Nonce = append(bytes.Clone(r.Nonce), 0) },
		"time":      func(r *agentv1.FetchSecretRequest) { r.Time = timestamppb.New(r.Time.AsTime().Add(time.Nanosecond)) },
		"recipient": func(r *agentv1.FetchSecretRequest) { r.RecipientPublicKey = request(t).GetRecipientPublicKey() },
		"unsigned":  func(r *agentv1.FetchSecretRequest) { r.Signature = nil },
	} {
		r := &agentv1.FetchSecretRequest{Ref: req.GetRef(), Nonce: req.GetNonce(), Time: req.GetTime(),
			RecipientPublicKey: req.GetRecipientPublicKey(), Signature: req.GetSignature()}
		change(r)
		require.ErrorIs(t, nodesecret.Verify(&key.PublicKey, "td", "node_a", r), nodesecret.ErrBadSignature, name)
	}
}

func TestRequestBytesAreUnambiguous(t *testing.T) {
	t.Parallel()
	// Moving a byte from one field to the next must change the bytes.
	a := nodesecret.RequestBytes("td", "node_ab", &agentv1.FetchSecretRequest{Ref: "c"})
	b := nodesecret.RequestBytes("td", "node_a", &agentv1.FetchSecretRequest{Ref: "bc"})
	require.NotEqual(t, a, b)
}

func TestSealOpensOnlyForTheRecipientAndBinding(t *testing.T) {
	t.Parallel()
	a, err := nodesecret.NewKey()
	require.NoError(t, err)
	b, err := nodesecret.NewKey()
	require.NoError(t, err)
	bind := nodesecret.Binding{TrustDomain: "td", NodeID: "node_a", Ref: "secret://db", Version: 3, Nonce: []byte("0123456789abcdef")}
	value := []byte("hunter2")
	enc, ct, err := nodesecret.Seal(a.PublicKey().Bytes(), bind, value)
	require.NoError(t, err)
	require.False(t, bytes.Contains(ct, value), "the ciphertext carries the value in the clear")

	got, err := nodesecret.Open(a, bind, enc, ct)
	require.NoError(t, err)
	require.Equal(t, value, got)

	// An answer captured for node A does not open without A's key.
	_, err = nodesecret.Open(b, bind, enc, ct)
	require.ErrorIs(t, err, nodesecret.ErrOpen)
	// Nor under another binding, even with A's key.
	for name, change := range map[string]func(x *nodesecret.Binding){
		"node":         func(x *nodesecret.Binding) { x.NodeID = "node_b" },
		"trust domain": func(x *nodesecret.Binding) { x.TrustDomain = "other" },
		"ref":          func(x *nodesecret.Binding) { x.Ref = "secret://other" },
		"version":      func(x *nodesecret.Binding) { x.Version = 2 },
		"nonce":        func(x *nodesecret.Binding) { x.Nonce = []byte("fedcba9876543210") },
	} {
		x := bind
		change(&x)
		_, err := nodesecret.Open(a, x, enc, ct)
		require.ErrorIs(t, err, nodesecret.ErrOpen, name)
	}
	// A flipped bit anywhere fails.
	bad := bytes.Clone(ct)
	bad[0] ^= 1
	_, err = nodesecret.Open(a, bind, enc, bad)
	require.ErrorIs(t, err, nodesecret.ErrOpen)
	badEnc := bytes.Clone(enc)
	badEnc[0] ^= 1
	_, err = nodesecret.Open(a, bind, badEnc, ct)
	require.ErrorIs(t, err, nodesecret.ErrOpen)

	// Two seals of one value differ (a fresh server key each time).
	enc2, ct2, err := nodesecret.Seal(a.PublicKey().Bytes(), bind, value)
	require.NoError(t, err)
	require.NotEqual(t, enc, enc2)
	require.NotEqual(t, ct, ct2)
}

func TestCheckRecipient(t *testing.T) {
	t.Parallel()
	k, err := nodesecret.NewKey()
	require.NoError(t, err)
	require.NoError(t, nodesecret.CheckRecipient(k.PublicKey().Bytes()))
	require.Error(t, nodesecret.CheckRecipient(nil))
	require.Error(t, nodesecret.CheckRecipient(make([]byte, 31)))
	_, _, err = nodesecret.Seal(make([]byte, 5), nodesecret.Binding{}, []byte("x"))
	require.Error(t, err)
}
