package agent

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"time"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/attestor"
	"github.com/better-compute/better-compute/internal/attestor/cloudiid"
	"github.com/better-compute/better-compute/internal/attestor/kubelet"
	"github.com/better-compute/better-compute/internal/attestor/tpm"
	"github.com/better-compute/better-compute/internal/attestor/x509pop"
)

// AttestConfig says what evidence bcd brings to its join besides the token
// (docs/attestation.md). The zero value brings none.
type AttestConfig struct {
	// Attestor is tpm, x509, cloud or kubelet; "" for the join token
	// alone.
	Attestor string
	// TPM is the TPM for tpm: a device (/dev/tpmrm0) or tcp://host:port.
	TPM string
	// X509Cert and X509Key are the machine certificate (PEM, chain) and
	// its key for x509.
	X509Cert, X509Key string
	// MetadataURL is the cloud metadata service's base URL for cloud
	// (default DefaultMetadataURL).
	MetadataURL string
	// KubeletCert is the kubelet's client certificate and key (one PEM
	// file) for kubelet (default DefaultKubeletCert).
	KubeletCert string
	// HTTPClient fetches the instance document (default: one with a 10 s
	// timeout).
	HTTPClient *http.Client
}

// DefaultKubeletCert is where the kubelet keeps its client certificate.
const DefaultKubeletCert = kubelet.DefaultCert

// DefaultMetadataURL is the link-local metadata address clouds serve.
const DefaultMetadataURL = "http://169.254.169.254"

// Validate checks the config before bcd starts.
func (c AttestConfig) Validate() error {
	switch c.Attestor {
	case "":
		return nil
	case attestor.TPM:
		if c.TPM == "" {
			return errors.New("attestor tpm needs the TPM (--attest-tpm /dev/tpmrm0 or tcp://HOST:PORT)")
		}
	case attestor.X509:
		if c.X509Cert == "" || c.X509Key == "" {
			return errors.New("attestor x509 needs --attest-x509-cert and --attest-x509-key")
		}
	case attestor.Cloud, attestor.Kubelet:
	default:
		return fmt.Errorf("unknown attestor %q: tpm, x509, cloud or kubelet", c.Attestor)
	}
	return nil
}

// attest asks the gateway for a challenge for req's token and CSR and
// answers it with the configured evidence.
func (a *Agent) attest(ctx context.Context, client agentv1.AgentServiceClient, req *agentv1.JoinRequest) (*agentv1.Attestation, error) {
	c := a.cfg.Attest
	creq := &agentv1.JoinChallengeRequest{Token: req.GetToken(), CsrDer: req.GetCsrDer(), Attestor: c.Attestor}
	var node *tpm.Node
	if c.Attestor == attestor.TPM {
		var err error
		if node, err = tpm.Open(c.TPM); err != nil {
			return nil, err
		}
		defer func() { _ = node.Close() }()
		id, err := node.Identity()
		if err != nil {
			return nil, err
		}
		creq.Tpm = &agentv1.TPMIdentity{
			EkCertificateDer: id.EKCertificate, EkPublicDer: id.EKPublic, AkPublic: id.AKPublic,
			AkCreateData: id.AKCreateData, AkCreateAttestation: id.AKCreateAttestation, AkCreateSignature: id.AKCreateSignature,
		}
	}
	ch, err := client.JoinChallenge(ctx, creq)
	if err != nil {
		return nil, fmt.Errorf("join challenge: %w", err)
	}
	sum := sha256.Sum256(req.GetCsrDer())
	digest := attestor.BindingDigest(c.Attestor, ch.GetNonce(), sum[:])
	out := &agentv1.Attestation{Challenge: ch.GetChallenge()}
	switch c.Attestor {
	case attestor.TPM:
		secret, q, err := node.Activate(ch.GetTpmCredential(), ch.GetTpmSecret(), digest)
		if err != nil {
			return nil, err
		}
		ev := &agentv1.TPMEvidence{ActivatedSecret: secret, Quote: q.Quote, QuoteSignature: q.Signature, Pcrs: make(map[int32][]byte, len(q.PCRs))}
		for i, d := range q.PCRs {
			ev.Pcrs[int32(i)] = d
		}
		out.Evidence = &agentv1.Attestation_Tpm{Tpm: ev}
	case attestor.X509:
		chain, key, err := x509pop.Load(c.X509Cert, c.X509Key)
		if err != nil {
			return nil, err
		}
		sig, err := x509pop.Sign(key, digest)
		if err != nil {
			return nil, err
		}
		out.Evidence = &agentv1.Attestation_X509{X509: &agentv1.X509Evidence{CertificateChain: chain, Signature: sig}}
	case attestor.Kubelet:
		chain, key, err := kubelet.Load(cmp.Or(c.KubeletCert, DefaultKubeletCert))
		if err != nil {
			return nil, err
		}
		sig, err := x509pop.Sign(key, digest)
		if err != nil {
			return nil, err
		}
		out.Evidence = &agentv1.Attestation_Kubelet{Kubelet: &agentv1.X509Evidence{CertificateChain: chain, Signature: sig}}
	case attestor.Cloud:
		hc := cmp.Or(c.HTTPClient, &http.Client{Timeout: 10 * time.Second})
		doc, sig, err := cloudiid.Fetch(ctx, hc, cmp.Or(c.MetadataURL, DefaultMetadataURL), cloudiid.Nonce(digest))
		if err != nil {
			return nil, err
		}
		out.Evidence = &agentv1.Attestation_Cloud{Cloud: &agentv1.CloudEvidence{Document: doc, Signature: sig}}
	}
	return out, nil
}
