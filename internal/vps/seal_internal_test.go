package vps

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

func testSealer(t *testing.T) *pki.Sealer {
	t.Helper()
	secret, err := pki.GenerateSecret()
	require.NoError(t, err)
	s, err := pki.NewSealer(secret)
	require.NoError(t, err)
	return s
}

func createMap(t *testing.T, p vmcmd.CreateParams) map[string]any {
	t.Helper()
	m, err := paramsMap(p)
	require.NoError(t, err)
	return m
}

// TestSealSeedRoundTrip: the seed's secrets leave the stored params and
// come back, exactly, for delivery; params with nothing secret are stored
// and delivered as they are.
func TestSealSeedRoundTrip(t *testing.T) {
	t.Parallel()
	sealer := testSealer(t)
	s := &InstanceService{sealer: sealer}
	want := vmcmd.CreateParams{InstanceID: "ins-1", VCPUs: 2, MemoryMiB: 2048, Network: vmcmd.Network{MAC: "52:54:00:00:00:01", Policy: "egress"},
		Seed: vmcmd.Seed{Hostname: "vm1", User: GuestUser, HostKey: "-----BEGIN OPENSSH PRIVATE KEY-----\nk\n", UserData: "#cloud-config\nsecret: s3cr3t\n"}}
	m := createMap(t, want)
	require.NoError(t, s.sealSeed("tnt_a", m))
	stored, err := json.Marshal(m)
	require.NoError(t, err)
	require.NotContains(t, string(stored), "s3cr3t")
	require.NotContains(t, string(stored), "PRIVATE KEY")

	out, err := OpenCreateParams(sealer)(fleet.Command{Kind: vmcmd.KindInstanceCreate, TenantID: "tnt_a", Params: string(stored)})
	require.NoError(t, err)
	var got vmcmd.CreateParams
	require.NoError(t, vmcmd.Decode([]byte(out), &got), "bcd's strict decoder takes the opened params")
	require.Equal(t, want, got)

	// Nothing secret: nothing sealed, delivered as stored.
	plain := createMap(t, vmcmd.CreateParams{InstanceID: "ins-2", Seed: vmcmd.Seed{Hostname: "vm2"}})
	require.NoError(t, (&InstanceService{}).sealSeed("tnt_a", plain))
	b, err := json.Marshal(plain)
	require.NoError(t, err)
	out, err = OpenCreateParams(nil)(fleet.Command{TenantID: "tnt_a", Params: string(b)})
	require.NoError(t, err)
	require.Equal(t, string(b), out)
}

// TestSealRefusals: without a sealer user data and host keys are refused
// (FAILED_PRECONDITION), never stored in the clear; a sealed seed does not
// open under another tenant, tampered, or without the sealer.
func TestSealRefusals(t *testing.T) {
	t.Parallel()
	none := &InstanceService{}
	_, err := none.sealUserData("ins_1", "#cloud-config\n")
	var ee *envelope.Error
	require.ErrorAs(t, err, &ee)
	require.Equal(t, envelope.CodeFailedPrecondition, ee.Code)
	require.Contains(t, ee.Message, "BETTER_COMPUTE_SECRET")
	b, err := none.sealUserData("ins_1", "")
	require.NoError(t, err, "no user data needs no sealer")
	require.Nil(t, b)
	err = none.sealSeed("tnt_a", createMap(t, vmcmd.CreateParams{InstanceID: "ins-1", Seed: vmcmd.Seed{HostKey: "k"}}))
	require.ErrorAs(t, err, &ee)
	require.Equal(t, envelope.CodeFailedPrecondition, ee.Code)

	sealer := testSealer(t)
	m := createMap(t, vmcmd.CreateParams{InstanceID: "ins-1", Seed: vmcmd.Seed{UserData: "secret"}})
	require.NoError(t, (&InstanceService{sealer: sealer}).sealSeed("tnt_a", m))
	stored, err := json.Marshal(m)
	require.NoError(t, err)
	_, err = OpenCreateParams(sealer)(fleet.Command{TenantID: "tnt_b", Params: string(stored)})
	require.ErrorIs(t, err, pki.ErrSealed, "moved to another tenant's command")
	_, err = OpenCreateParams(testSealer(t))(fleet.Command{TenantID: "tnt_a", Params: string(stored)})
	require.ErrorIs(t, err, pki.ErrSealed, "under another deployment secret")
	_, err = OpenCreateParams(nil)(fleet.Command{TenantID: "tnt_a", Params: string(stored)})
	require.ErrorContains(t, err, "no sealing secret")
	seed := m["seed"].(map[string]any)
	seed[SealedSeedField] = "AAAA" + seed[SealedSeedField].(string)[4:]
	tampered, err := json.Marshal(m)
	require.NoError(t, err)
	_, err = OpenCreateParams(sealer)(fleet.Command{TenantID: "tnt_a", Params: string(tampered)})
	require.ErrorIs(t, err, pki.ErrSealed, "tampered")
}
