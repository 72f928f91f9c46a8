package gateway_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/attestor"
)

// BenchmarkJoin measures one admitted join, end to end over loopback gRPC
// and the real store, per attestor: the token alone, x509 proof of
// possession, a cloud document from the emulator, and a TPM (swtpm: the AK
// is created, the credential activated and the PCRs quoted by a software
// TPM, so the node's side is a software TPM's speed, not a chip's). Minting
// the token and the node key is outside the timing.
func BenchmarkJoin(b *testing.B) {
	f := setup(b)
	sw := bctest.StartSWTPM(b)
	f.cp.Clock.Advance(60e9) // past the EK certificate's start
	corp := newMachineCA(b, "corp")
	md := bctest.NewMetadataService(b, bctest.InstanceIdentity{InstanceID: "i-b", AccountID: "1", Region: "r"})
	f.anchor(b, &apiv1.CreateTrustAnchorRequest{Tenant: "acme", Name: "corp", Attestor: attestor.X509, CertificatesPem: corp.pem})
	f.anchor(b, &apiv1.CreateTrustAnchorRequest{Tenant: "acme", Name: "aws", Attestor: attestor.Cloud, CertificatesPem: string(md.CertificatePEM), CloudAccount: "1"})
	f.anchor(b, &apiv1.CreateTrustAnchorRequest{Tenant: "acme", Name: "ek", Attestor: attestor.TPM, CertificatesPem: string(sw.EKCAPEM)})
	chain, key := corp.machine(b, "bench")
	for _, kind := range []string{"token", attestor.X509, attestor.Cloud, attestor.TPM} {
		b.Run(kind, func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				var token string
				if kind == "token" {
					_, token = f.token(b, nil)
				} else {
					token = f.attestedToken(b, "acme", kind)
				}
				a := newAgent(b, f, "bench")
				b.StartTimer()
				var (
					res *agentv1.JoinResponse
					err error
				)
				switch kind {
				case "token":
					res, err = a.tryJoin(token)
				case attestor.X509:
					res, err = a.x509Join(token, [][]byte{chain}, key)
				case attestor.Cloud:
					res, err = a.cloudJoin(token, md.URL)
				case attestor.TPM:
					res, err = a.tpmJoin(token, sw.Addr)
				}
				require.NoError(b, err)
				require.Equal(b, agentv1.JoinStatus_JOIN_STATUS_ADMITTED, res.GetStatus())
			}
		})
	}
}
