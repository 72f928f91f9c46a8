package gateway_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bctest"
	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/attestor"
	"github.com/better-compute/better-compute/internal/attestor/cloudiid"
	"github.com/better-compute/better-compute/internal/attestor/tpm"
	"github.com/better-compute/better-compute/internal/attestor/x509pop"
	"github.com/better-compute/better-compute/internal/gateway"
	"github.com/better-compute/better-compute/internal/pki"
)

// machineCA is an operator's existing CA for machine certificates.
type machineCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  string
}

func newMachineCA(t testing.TB, name string) machineCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(t, err)
	c, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return machineCA{cert: c, key: key, pem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))}
}

// machine issues a machine certificate (client auth) and returns it with
// its key.
func (ca machineCA) machine(t testing.TB, host string) ([]byte, crypto.Signer) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: host},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	require.NoError(t, err)
	return der, key
}

func (f fixture) tenant(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	_, err := f.cp.Admin().Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: name}))
	require.NoError(t, err)
	_, err = f.cp.Admin().Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: name, Name: "gpu"}))
	require.NoError(t, err)
}

func (f fixture) anchor(t testing.TB, req *apiv1.CreateTrustAnchorRequest) *apiv1.TrustAnchor {
	t.Helper()
	res, err := f.cp.Admin().TrustAnchors.Create(context.Background(), connect.NewRequest(req))
	require.NoError(t, err)
	return res.Msg.GetTrustAnchor()
}

func (f fixture) attestedToken(t testing.TB, tenant, kind string) string {
	t.Helper()
	res, err := f.cp.Admin().JoinTokens.Create(context.Background(), connect.NewRequest(&apiv1.CreateJoinTokenRequest{
		Tenant: tenant, Project: "gpu", Pool: "a100", Attestor: kind,
	}))
	require.NoError(t, err)
	require.Equal(t, kind, res.Msg.GetJoinToken().GetAttestor())
	return res.Msg.GetToken()
}

// challenge asks for a join challenge for the agent's CSR.
func (a *agent) challenge(token, kind string, id *agentv1.TPMIdentity) (*agentv1.JoinChallengeResponse, error) {
	return a.dial(nil).JoinChallenge(context.Background(), &agentv1.JoinChallengeRequest{Token: token, CsrDer: a.csr, Attestor: kind, Tpm: id})
}

func (a *agent) digest(kind string, nonce []byte) []byte {
	sum := sha256.Sum256(a.csr)
	return attestor.BindingDigest(kind, nonce, sum[:])
}

// x509Join proves possession of a machine certificate and joins.
func (a *agent) x509Join(token string, chain [][]byte, key crypto.Signer) (*agentv1.JoinResponse, error) {
	a.t.Helper()
	ch, err := a.challenge(token, attestor.X509, nil)
	if err != nil {
		return nil, err
	}
	sig, err := x509pop.Sign(key, a.digest(attestor.X509, ch.GetNonce()))
	require.NoError(a.t, err)
	req := a.joinRequest(token)
	req.Attestation = &agentv1.Attestation{Challenge: ch.GetChallenge(), Evidence: &agentv1.Attestation_X509{X509: &agentv1.X509Evidence{CertificateChain: chain, Signature: sig}}}
	return a.dial(nil).Join(context.Background(), req)
}

// cloudJoin fetches the instance document from the metadata service for
// the challenge and joins.
func (a *agent) cloudJoin(token, metadataURL string) (*agentv1.JoinResponse, error) {
	a.t.Helper()
	ch, err := a.challenge(token, attestor.Cloud, nil)
	if err != nil {
		return nil, err
	}
	doc, sig, err := cloudiid.Fetch(context.Background(), http.DefaultClient, metadataURL, cloudiid.Nonce(a.digest(attestor.Cloud, ch.GetNonce())))
	require.NoError(a.t, err)
	req := a.joinRequest(token)
	req.Attestation = &agentv1.Attestation{Challenge: ch.GetChallenge(), Evidence: &agentv1.Attestation_Cloud{Cloud: &agentv1.CloudEvidence{Document: doc, Signature: sig}}}
	return a.dial(nil).Join(context.Background(), req)
}

func requireDenied(t *testing.T, err error, code codes.Code, contains string) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, code, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), contains)
}

// admitted checks the join's certificate and the node record say which
// attestor admitted it.
func (f fixture) admitted(t testing.TB, res *agentv1.JoinResponse, kind, anchorID string) *apiv1.Node {
	t.Helper()
	require.Equal(t, agentv1.JoinStatus_JOIN_STATUS_ADMITTED, res.GetStatus())
	leaf, err := x509.ParseCertificate(res.GetCertificateChain()[0])
	require.NoError(t, err)
	require.Equal(t, kind, pki.AttestorOf(leaf))
	n, err := f.cp.Admin().Nodes.Get(context.Background(), connect.NewRequest(&apiv1.GetNodeRequest{Node: res.GetNodeId()}))
	require.NoError(t, err)
	require.Equal(t, kind, n.Msg.GetNode().GetAttestor())
	require.Equal(t, anchorID, n.Msg.GetNode().GetTrustAnchorId())
	return n.Msg.GetNode()
}

func TestAttestedJoinX509(t *testing.T) {
	t.Parallel()
	f := setup(t)
	corp := newMachineCA(t, "corp machines")
	anc := f.anchor(t, &apiv1.CreateTrustAnchorRequest{Tenant: "acme", Name: "corp", Attestor: attestor.X509, CertificatesPem: corp.pem})
	token := f.attestedToken(t, "acme", attestor.X509)
	a := newAgent(t, f, "x1")

	// The token alone no longer admits.
	_, err := a.tryJoin(token)
	requireDenied(t, err, codes.PermissionDenied, "requires x509 attestation; this join brought none")
	// Nor does the wrong attestor.
	_, err = a.cloudJoin(token, "http://127.0.0.1:1")
	requireDenied(t, err, codes.PermissionDenied, "requires x509 attestation; this node offered cloud")
	// Nor a machine certificate of a CA the tenant did not register.
	stray := newMachineCA(t, "stray")
	chain, key := stray.machine(t, "x1")
	_, err = a.x509Join(token, [][]byte{chain}, key)
	requireDenied(t, err, codes.PermissionDenied, "does not chain to a registered CA")
	// Nor a signature by another key than the certificate's.
	chain, key = corp.machine(t, "x1")
	_, otherKey := corp.machine(t, "x1-other")
	_, err = a.x509Join(token, [][]byte{chain}, otherKey)
	requireDenied(t, err, codes.PermissionDenied, "does not verify with the certificate's key")

	res, err := a.x509Join(token, [][]byte{chain}, key)
	require.NoError(t, err)
	n := f.admitted(t, res, attestor.X509, anc.GetId())
	require.Contains(t, n.GetAttestedId(), "x509:sha256:")

	// A renewal keeps what admitted the node in the new certificate.
	a.cert = &tls.Certificate{Certificate: res.GetCertificateChain(), PrivateKey: a.key}
	oldKey := a.key
	a.newKey()
	nonce := randBytes(32)
	now := f.cp.Clock.Now()
	rsig, err := ecdsa.SignASN1(rand.Reader, oldKey, gateway.RenewDigest(nonce, now, a.csr))
	require.NoError(t, err)
	renewed, err := a.dial(nil).Renew(context.Background(), &agentv1.RenewRequest{CsrDer: a.csr, Nonce: nonce, Time: timestamppb.New(now), Signature: rsig})
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(renewed.GetCertificateChain()[0])
	require.NoError(t, err)
	require.Equal(t, attestor.X509, pki.AttestorOf(leaf))

	// A challenge answers one CSR: replayed with another key's CSR it fails.
	b := newAgent(t, f, "x2")
	token2 := f.attestedToken(t, "acme", attestor.X509)
	ch, err := a.challenge(token2, attestor.X509, nil)
	require.NoError(t, err)
	sig, err := x509pop.Sign(key, a.digest(attestor.X509, ch.GetNonce()))
	require.NoError(t, err)
	req := b.joinRequest(token2)
	req.Attestation = &agentv1.Attestation{Challenge: ch.GetChallenge(), Evidence: &agentv1.Attestation_X509{X509: &agentv1.X509Evidence{CertificateChain: [][]byte{chain}, Signature: sig}}}
	_, err = b.dial(nil).Join(context.Background(), req)
	requireDenied(t, err, codes.PermissionDenied, "issued for another join token or CSR")
}

func TestAttestedJoinCloud(t *testing.T) {
	t.Parallel()
	f := setup(t)
	md := bctest.NewMetadataService(t, bctest.InstanceIdentity{InstanceID: "i-0123456789", AccountID: "111122223333", Region: "eu-central-1"})
	anc := f.anchor(t, &apiv1.CreateTrustAnchorRequest{Tenant: "acme", Name: "aws-prod", Attestor: attestor.Cloud,
		CertificatesPem: string(md.CertificatePEM), CloudAccount: "111122223333", CloudRegion: "eu-central-1"})
	token := f.attestedToken(t, "acme", attestor.Cloud)

	// An instance of another account of the same provider key is refused.
	otherAccount := bctest.NewMetadataService(t, bctest.InstanceIdentity{InstanceID: "i-0ffff", AccountID: "999988887777", Region: "eu-central-1"})
	a := newAgent(t, f, "c1")
	_, err := a.cloudJoin(token, otherAccount.URL)
	requireDenied(t, err, codes.PermissionDenied, "does not verify with a registered provider certificate")

	res, err := a.cloudJoin(token, md.URL)
	require.NoError(t, err)
	n := f.admitted(t, res, attestor.Cloud, anc.GetId())
	require.Equal(t, "cloud:111122223333/eu-central-1/i-0123456789", n.GetAttestedId())

	// A document fetched for one challenge does not answer another.
	b := newAgent(t, f, "c2")
	token2 := f.attestedToken(t, "acme", attestor.Cloud)
	old, err := b.challenge(token2, attestor.Cloud, nil)
	require.NoError(t, err)
	doc, sig, err := cloudiid.Fetch(context.Background(), http.DefaultClient, md.URL, cloudiid.Nonce(b.digest(attestor.Cloud, old.GetNonce())))
	require.NoError(t, err)
	fresh, err := b.challenge(token2, attestor.Cloud, nil)
	require.NoError(t, err)
	req := b.joinRequest(token2)
	req.Attestation = &agentv1.Attestation{Challenge: fresh.GetChallenge(), Evidence: &agentv1.Attestation_Cloud{Cloud: &agentv1.CloudEvidence{Document: doc, Signature: sig}}}
	_, err = b.dial(nil).Join(context.Background(), req)
	requireDenied(t, err, codes.PermissionDenied, "nonce is not this join's challenge")
}

// tpmJoin runs the TPM exchange: identity, challenge, activation, quote.
func (a *agent) tpmJoin(token, addr string) (*agentv1.JoinResponse, error) {
	a.t.Helper()
	node, err := tpm.Open(addr)
	require.NoError(a.t, err)
	defer func() { _ = node.Close() }()
	id, err := node.Identity()
	require.NoError(a.t, err)
	ch, err := a.challenge(token, attestor.TPM, &agentv1.TPMIdentity{
		EkCertificateDer: id.EKCertificate, EkPublicDer: id.EKPublic, AkPublic: id.AKPublic,
		AkCreateData: id.AKCreateData, AkCreateAttestation: id.AKCreateAttestation, AkCreateSignature: id.AKCreateSignature,
	})
	if err != nil {
		return nil, err
	}
	secret, q, err := node.Activate(ch.GetTpmCredential(), ch.GetTpmSecret(), a.digest(attestor.TPM, ch.GetNonce()))
	require.NoError(a.t, err)
	ev := &agentv1.TPMEvidence{ActivatedSecret: secret, Quote: q.Quote, QuoteSignature: q.Signature, Pcrs: map[int32][]byte{}}
	for i, d := range q.PCRs {
		ev.Pcrs[int32(i)] = d
	}
	req := a.joinRequest(token)
	req.Attestation = &agentv1.Attestation{Challenge: ch.GetChallenge(), Evidence: &agentv1.Attestation_Tpm{Tpm: ev}}
	return a.dial(nil).Join(context.Background(), req)
}

// TestAttestedJoinTPM joins with a real swtpm: its EK certificate chains
// to the tenant's registered EK CA, the credential activates on it, and
// the quote carries the challenge's nonce.
func TestAttestedJoinTPM(t *testing.T) {
	t.Parallel()
	f := setup(t)
	sw, other := bctest.StartSWTPM(t), bctest.StartSWTPM(t)
	// The TPMs were manufactured after the control plane's clock was set:
	// their EK certificates are valid from a moment ago.
	f.cp.Clock.Advance(time.Minute)
	a := newAgent(t, f, "t1")

	// Before any EK CA is registered, a token cannot even require a TPM.
	_, err := f.cp.Admin().JoinTokens.Create(context.Background(), connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "gpu", Attestor: attestor.TPM}))
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err), "%v", err)
	require.ErrorContains(t, err, "has no tpm trust anchor")

	anc := f.anchor(t, &apiv1.CreateTrustAnchorRequest{Tenant: "acme", Name: "swtpm-ca", Attestor: attestor.TPM, CertificatesPem: string(sw.EKCAPEM)})
	token := f.attestedToken(t, "acme", attestor.TPM)
	res, err := a.tpmJoin(token, sw.Addr)
	require.NoError(t, err)
	n := f.admitted(t, res, attestor.TPM, anc.GetId())
	require.Contains(t, n.GetAttestedId(), "tpm:ek-sha256:")

	// Another TPM, whose EK CA the tenant never registered, is refused.
	b := newAgent(t, f, "t2")
	_, err = b.tpmJoin(f.attestedToken(t, "acme", attestor.TPM), other.Addr)
	requireDenied(t, err, codes.PermissionDenied, "does not chain to a registered EK CA")
}

// TestAttestationTenantIsolation: anchors another tenant registered never
// admit into acme, with that tenant's CA, provider account or EK CA.
func TestAttestationTenantIsolation(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.tenant(t, "globex")
	acmeCA, globexCA := newMachineCA(t, "acme"), newMachineCA(t, "globex")
	f.anchor(t, &apiv1.CreateTrustAnchorRequest{Tenant: "acme", Name: "corp", Attestor: attestor.X509, CertificatesPem: acmeCA.pem})
	globexAnchor := f.anchor(t, &apiv1.CreateTrustAnchorRequest{Tenant: "globex", Name: "corp", Attestor: attestor.X509, CertificatesPem: globexCA.pem})
	acmeMD := bctest.NewMetadataService(t, bctest.InstanceIdentity{InstanceID: "i-a", AccountID: "111111111111", Region: "us-east-1"})
	globexMD := bctest.NewMetadataService(t, bctest.InstanceIdentity{InstanceID: "i-g", AccountID: "222222222222", Region: "us-east-1"})
	f.anchor(t, &apiv1.CreateTrustAnchorRequest{Tenant: "acme", Name: "aws", Attestor: attestor.Cloud, CertificatesPem: string(acmeMD.CertificatePEM), CloudAccount: "111111111111"})
	f.anchor(t, &apiv1.CreateTrustAnchorRequest{Tenant: "globex", Name: "aws", Attestor: attestor.Cloud, CertificatesPem: string(globexMD.CertificatePEM), CloudAccount: "222222222222"})

	a := newAgent(t, f, "iso")
	chain, key := globexCA.machine(t, "iso")
	_, err := a.x509Join(f.attestedToken(t, "acme", attestor.X509), [][]byte{chain}, key)
	requireDenied(t, err, codes.PermissionDenied, "does not chain to a registered CA")
	_, err = a.cloudJoin(f.attestedToken(t, "acme", attestor.Cloud), globexMD.URL)
	requireDenied(t, err, codes.PermissionDenied, "does not verify with a registered provider certificate")

	// The same evidence admits into globex, its own tenant.
	res, err := a.x509Join(f.attestedToken(t, "globex", attestor.X509), [][]byte{chain}, key)
	require.NoError(t, err)
	n := f.admitted(t, res, attestor.X509, globexAnchor.GetId())
	require.Equal(t, n.GetTenantId(), tenantID(t, f, "globex"))

	// Acme cannot list or delete globex's anchors by naming them.
	_, err = f.cp.Admin().TrustAnchors.Delete(context.Background(), connect.NewRequest(&apiv1.DeleteTrustAnchorRequest{Tenant: "acme", TrustAnchor: n.GetTrustAnchorId()}))
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err), "%v", err)

	// A TPM whose EK CA only globex registered does not join acme.
	sw, acmeTPM := bctest.StartSWTPM(t), bctest.StartSWTPM(t)
	f.cp.Clock.Advance(time.Minute) // past the EK certificates' start
	{
		f.anchor(t, &apiv1.CreateTrustAnchorRequest{Tenant: "globex", Name: "ek", Attestor: attestor.TPM, CertificatesPem: string(sw.EKCAPEM)})
		f.anchor(t, &apiv1.CreateTrustAnchorRequest{Tenant: "acme", Name: "ek", Attestor: attestor.TPM, CertificatesPem: string(acmeTPM.EKCAPEM)})
		_, err = newAgent(t, f, "iso-tpm").tpmJoin(f.attestedToken(t, "acme", attestor.TPM), sw.Addr)
		requireDenied(t, err, codes.PermissionDenied, "does not chain to a registered EK CA")
	}
}

func tenantID(t *testing.T, f fixture, name string) string {
	t.Helper()
	res, err := f.cp.Admin().Tenants.Get(context.Background(), connect.NewRequest(&apiv1.GetTenantRequest{Tenant: name}))
	require.NoError(t, err)
	return res.Msg.GetTenant().GetId()
}

// TestTrustAnchorRefusals: bad input names its field and writes nothing.
func TestTrustAnchorRefusals(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ca := newMachineCA(t, "corp")
	leaf, _ := ca.machine(t, "h")
	leafPEM := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf}))
	for name, tc := range map[string]struct {
		req   *apiv1.CreateTrustAnchorRequest
		field string
	}{
		"unknown attestor":   {&apiv1.CreateTrustAnchorRequest{Tenant: "acme", Name: "a", Attestor: "tpm2", CertificatesPem: ca.pem}, "attestor"},
		"not PEM":            {&apiv1.CreateTrustAnchorRequest{Tenant: "acme", Name: "a", Attestor: attestor.X509, CertificatesPem: "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"}, "certificates_pem"},
		"x509 leaf not a CA": {&apiv1.CreateTrustAnchorRequest{Tenant: "acme", Name: "a", Attestor: attestor.X509, CertificatesPem: leafPEM}, "certificates_pem"},
		"cloud no account":   {&apiv1.CreateTrustAnchorRequest{Tenant: "acme", Name: "a", Attestor: attestor.Cloud, CertificatesPem: ca.pem}, "cloud_account"},
		"tpm both":           {&apiv1.CreateTrustAnchorRequest{Tenant: "acme", Name: "a", Attestor: attestor.TPM, CertificatesPem: ca.pem, EkPublicSha256: "00"}, "ek_public_sha256"},
		"tpm bad pin":        {&apiv1.CreateTrustAnchorRequest{Tenant: "acme", Name: "a", Attestor: attestor.TPM, EkPublicSha256: "XYZ"}, "ek_public_sha256"},
		"bad name":           {&apiv1.CreateTrustAnchorRequest{Tenant: "acme", Name: "Not A Name", Attestor: attestor.X509, CertificatesPem: ca.pem}, "name"},
	} {
		_, err := f.cp.Admin().TrustAnchors.Create(context.Background(), connect.NewRequest(tc.req))
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), name)
		require.ErrorContains(t, err, tc.field, name)
	}
	f.anchor(t, &apiv1.CreateTrustAnchorRequest{Tenant: "acme", Name: "corp", Attestor: attestor.X509, CertificatesPem: ca.pem})
	_, err := f.cp.Admin().TrustAnchors.Create(context.Background(), connect.NewRequest(&apiv1.CreateTrustAnchorRequest{Tenant: "acme", Name: "corp", Attestor: attestor.X509, CertificatesPem: ca.pem}))
	require.Equal(t, connect.CodeAlreadyExists, connect.CodeOf(err), "%v", err)
	list, err := f.cp.Admin().TrustAnchors.List(context.Background(), connect.NewRequest(&apiv1.ListTrustAnchorsRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Len(t, list.Msg.GetTrustAnchors(), 1, "only the valid anchor was written")

	_, err = f.cp.Admin().JoinTokens.Create(context.Background(), connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "gpu", Attestor: "sgx"}))
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	require.ErrorContains(t, err, "attestor")

	// A refused attested join leaves the token unused and no node behind.
	token := f.attestedToken(t, "acme", attestor.X509)
	a := newAgent(t, f, "r1")
	req := a.joinRequest(token)
	req.Attestation = &agentv1.Attestation{Challenge: []byte("forged"), Evidence: &agentv1.Attestation_X509{X509: &agentv1.X509Evidence{}}}
	_, err = a.dial(nil).Join(context.Background(), req)
	requireDenied(t, err, codes.PermissionDenied, "attestation.challenge")
	toks, err := f.cp.Admin().JoinTokens.List(context.Background(), connect.NewRequest(&apiv1.ListJoinTokensRequest{Tenant: "acme"}))
	require.NoError(t, err)
	for _, jt := range toks.Msg.GetJoinTokens() {
		require.Equal(t, "active", jt.GetState())
	}
	nodes, err := f.cp.Admin().Nodes.List(context.Background(), connect.NewRequest(&apiv1.ListNodesRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Empty(t, nodes.Msg.GetNodes())

	// Deleting the anchor stops the joins it vouched for.
	_, err = f.cp.Admin().TrustAnchors.Delete(context.Background(), connect.NewRequest(&apiv1.DeleteTrustAnchorRequest{Tenant: "acme", TrustAnchor: "corp"}))
	require.NoError(t, err)
	chain, key := ca.machine(t, "r1")
	_, err = a.x509Join(token, [][]byte{chain}, key)
	requireDenied(t, err, codes.PermissionDenied, "registered no x509 CA")
}

// TestPoolRequiresAttestor: a pool that requires an attestor refuses a join
// with a plain token naming it, admits one with the evidence, and a token
// requiring another attestor than its pool's admits nothing.
func TestPoolRequiresAttestor(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	md := bctest.NewMetadataService(t, bctest.InstanceIdentity{InstanceID: "i-pool", AccountID: "111122223333", Region: "eu-west-1"})
	f.anchor(t, &apiv1.CreateTrustAnchorRequest{Tenant: "acme", Name: "aws", Attestor: attestor.Cloud, CertificatesPem: string(md.CertificatePEM), CloudAccount: "111122223333"})
	ca := newMachineCA(t, "corp")
	f.anchor(t, &apiv1.CreateTrustAnchorRequest{Tenant: "acme", Name: "corp", Attestor: attestor.X509, CertificatesPem: ca.pem})
	_, err := f.cp.Admin().Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "a100",
		Policy: &apiv1.PoolPolicy{RequiredAttestor: attestor.Cloud}}))
	require.NoError(t, err)
	_, err = f.cp.Admin().Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "bad",
		Policy: &apiv1.PoolPolicy{RequiredAttestor: "sgx"}}))
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	require.ErrorContains(t, err, "policy.required_attestor")

	_, token := f.token(t, nil) // a plain token for pool a100
	a := newAgent(t, f, "p1")
	_, err = a.tryJoin(token)
	requireDenied(t, err, codes.PermissionDenied, "pool a100 requires cloud attestation; this join brought none")
	res, err := a.cloudJoin(token, md.URL)
	require.NoError(t, err)
	f.admitted(t, res, attestor.Cloud, f.anchorID(t, "aws"))

	x509Token := f.attestedToken(t, "acme", attestor.X509) // also for pool a100
	chain, key := ca.machine(t, "p2")
	_, err = newAgent(t, f, "p2").x509Join(x509Token, [][]byte{chain}, key)
	requireDenied(t, err, codes.PermissionDenied, "but its pool a100 requires cloud")
}

func (f fixture) anchorID(t *testing.T, name string) string {
	t.Helper()
	res, err := f.cp.Admin().TrustAnchors.List(context.Background(), connect.NewRequest(&apiv1.ListTrustAnchorsRequest{Tenant: "acme"}))
	require.NoError(t, err)
	for _, a := range res.Msg.GetTrustAnchors() {
		if a.GetName() == name {
			return a.GetId()
		}
	}
	t.Fatalf("no trust anchor %s", name)
	return ""
}
