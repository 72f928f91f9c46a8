// Package tpm is the TPM 2.0 attestor, on go-attestation. The node shows
// its endorsement key (EK: its certificate from the TPM's NV memory when
// the TPM has one, and its public key), and a fresh attestation key (AK)
// the TPM created. The control plane checks the EK against the tenant's
// registered EK CAs (or an EK public key the operator pinned), then sends a
// credential encrypted to the EK and bound to the AK's name
// (TPM2_MakeCredential): only that TPM, holding both keys, can recover the
// secret (TPM2_ActivateCredential). The node answers with the secret and a
// quote over its PCRs by the AK, whose nonce is the join's binding digest.
//
// It proves the join comes from a TPM a trusted manufacturer (or the
// operator) vouched for, and what its PCRs held at that moment. It must
// never admit on an EK it did not check, nor on a quote whose nonce is not
// the challenge's.
package tpm

import (
	"crypto"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/asn1"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/google/go-attestation/attest"

	"github.com/better-compute/better-compute/internal/attestor"
)

// Limits on what the control plane parses.
const (
	MaxBlob = 4 << 10
	MaxPCRs = 24
)

// Identity is what the node shows before the challenge: its EK and a new AK.
type Identity struct {
	// EKCertificate is the EK certificate, DER; empty when the TPM has none.
	EKCertificate []byte
	// EKPublic is the EK public key, PKIX DER.
	EKPublic []byte
	// The AK's TPMT_PUBLIC and its creation data, attestation and
	// signature (go-attestation's AttestationParameters).
	AKPublic            []byte
	AKCreateData        []byte
	AKCreateAttestation []byte
	AKCreateSignature   []byte
}

// Quote is the node's answer to a challenge.
type Quote struct {
	Quote     []byte
	Signature []byte
	// PCRs are the SHA-256 bank, index → digest.
	PCRs map[int][]byte
}

// Node is a TPM opened on the node, with the AK of one join.
type Node struct {
	tpm *attest.TPM
	ak  *attest.AK
	ek  attest.EK
}

type channel struct{ io.ReadWriteCloser }

// MeasurementLog: a join quotes PCRs only; the event log is not sent.
func (channel) MeasurementLog() ([]byte, error) { return nil, nil }

// Open opens the TPM at addr: "tcp://host:port" is a TPM speaking the raw
// command protocol over TCP (swtpm's --server type=tcp), anything else a
// device path (/dev/tpmrm0, the kernel's resource manager).
func Open(addr string) (*Node, error) {
	var rwc io.ReadWriteCloser
	if hostport, ok := strings.CutPrefix(addr, "tcp://"); ok {
		c, err := net.DialTimeout("tcp", hostport, 10*time.Second)
		if err != nil {
			return nil, fmt.Errorf("tpm: %w", err)
		}
		rwc = c
	} else {
		f, err := os.OpenFile(addr, os.O_RDWR, 0)
		if err != nil {
			return nil, fmt.Errorf("tpm: %w", err)
		}
		rwc = f
	}
	t, err := attest.OpenTPM(&attest.OpenConfig{CommandChannel: channel{rwc}})
	if err != nil {
		_ = rwc.Close()
		return nil, fmt.Errorf("tpm: open %s: %w", addr, err)
	}
	return &Node{tpm: t}, nil
}

// Close flushes the AK and closes the TPM.
func (n *Node) Close() error {
	var errs []error
	if n.ak != nil {
		errs = append(errs, n.ak.Close(n.tpm))
	}
	return errors.Join(append(errs, n.tpm.Close())...)
}

// Identity reads the EK (an RSA one preferred, as most EK CAs certify it)
// and creates the join's AK.
func (n *Node) Identity() (Identity, error) {
	eks, err := n.tpm.EKs()
	if err != nil {
		return Identity{}, fmt.Errorf("tpm: read EKs: %w", err)
	}
	if len(eks) == 0 {
		return Identity{}, errors.New("tpm: the TPM has no endorsement key")
	}
	n.ek = eks[0]
	pub, err := x509.MarshalPKIXPublicKey(n.ek.Public)
	if err != nil {
		return Identity{}, fmt.Errorf("tpm: EK public key: %w", err)
	}
	if n.ak == nil {
		if n.ak, err = n.tpm.NewAK(nil); err != nil {
			return Identity{}, fmt.Errorf("tpm: create AK: %w", err)
		}
	}
	ap := n.ak.AttestationParameters()
	id := Identity{EKPublic: pub, AKPublic: ap.Public, AKCreateData: ap.CreateData, AKCreateAttestation: ap.CreateAttestation, AKCreateSignature: ap.CreateSignature}
	if n.ek.Certificate != nil {
		id.EKCertificate = n.ek.Certificate.Raw
	}
	return id, nil
}

// Activate recovers the challenge's secret (TPM2_ActivateCredential) and
// quotes the SHA-256 PCRs with nonce.
func (n *Node) Activate(credential, secret, nonce []byte) ([]byte, Quote, error) {
	if n.ak == nil {
		return nil, Quote{}, errors.New("tpm: Identity must come first")
	}
	got, err := n.ak.ActivateCredentialWithEK(n.tpm, attest.EncryptedCredential{Credential: credential, Secret: secret}, n.ek)
	if err != nil {
		return nil, Quote{}, fmt.Errorf("tpm: activate credential: %w", err)
	}
	q, err := n.ak.Quote(n.tpm, nonce, attest.HashSHA256)
	if err != nil {
		return nil, Quote{}, fmt.Errorf("tpm: quote: %w", err)
	}
	pcrs, err := n.tpm.PCRs(attest.HashSHA256)
	if err != nil {
		return nil, Quote{}, fmt.Errorf("tpm: read PCRs: %w", err)
	}
	out := Quote{Quote: q.Quote, Signature: q.Signature, PCRs: make(map[int][]byte, len(pcrs))}
	for _, p := range pcrs {
		out.PCRs[p.Index] = p.Digest
	}
	return got, out, nil
}

// EKTrust is one registered trust for EKs: a CA bundle (roots and the
// intermediates a TPM does not carry) or the SHA-256 of one EK public key.
type EKTrust struct {
	Certificates []*x509.Certificate
	EKPublicSHA  string
}

// EK is a checked endorsement key.
type EK struct {
	Public crypto.PublicKey
	// Trust is the index of the EKTrust that vouched for it.
	Trust int
	// Subject names the TPM: "tpm:ek-sha256:<hex of the PKIX EK key>".
	Subject string
}

var oidSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}

// VerifyEK checks the node's EK against trusts: its certificate must
// chain to a CA of one of them (and certify that very public key), or its
// public key's SHA-256 must be pinned by one.
func VerifyEK(id Identity, trusts []EKTrust, now time.Time) (EK, error) {
	if len(id.EKPublic) == 0 || len(id.EKPublic) > MaxBlob || len(id.EKCertificate) > MaxBlob {
		return EK{}, fmt.Errorf("%w: tpm: ek_public is required and at most %d bytes", attestor.ErrEvidence, MaxBlob)
	}
	pub, err := x509.ParsePKIXPublicKey(id.EKPublic)
	if err != nil {
		return EK{}, fmt.Errorf("%w: tpm: ek_public: %w", attestor.ErrEvidence, err)
	}
	sum := sha256.Sum256(id.EKPublic)
	pin := hex.EncodeToString(sum[:])
	ek := EK{Public: pub, Subject: "tpm:ek-sha256:" + pin, Trust: -1}
	for i, t := range trusts {
		if t.EKPublicSHA != "" && subtle.ConstantTimeCompare([]byte(t.EKPublicSHA), []byte(pin)) == 1 {
			ek.Trust = i
			return ek, nil
		}
	}
	if len(id.EKCertificate) == 0 {
		return EK{}, fmt.Errorf("%w: tpm: the TPM has no EK certificate and its EK (sha256 %s) is not pinned", attestor.ErrEvidence, pin)
	}
	cert, err := x509.ParseCertificate(id.EKCertificate)
	if err != nil {
		return EK{}, fmt.Errorf("%w: tpm: ek_certificate: %w", attestor.ErrEvidence, err)
	}
	if !samePublic(cert.PublicKey, pub) {
		return EK{}, fmt.Errorf("%w: tpm: the EK certificate certifies another key than ek_public", attestor.ErrEvidence)
	}
	// The TCG profile makes the SAN (the TPM's manufacturer, model and
	// version as a directoryName) critical when the subject is empty;
	// crypto/x509 parses it but keeps it listed as unhandled.
	cert.UnhandledCriticalExtensions = slices.DeleteFunc(cert.UnhandledCriticalExtensions, func(o asn1.ObjectIdentifier) bool { return o.Equal(oidSubjectAltName) })
	var lastErr error
	for i, t := range trusts {
		if len(t.Certificates) == 0 {
			continue
		}
		roots, inter := x509.NewCertPool(), x509.NewCertPool()
		for _, c := range t.Certificates {
			if isSelfSigned(c) {
				roots.AddCert(c)
			} else {
				inter.AddCert(c)
			}
		}
		// EK certificates carry the TCG EK usage, not a Go-known one.
		_, err := cert.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		if err == nil {
			ek.Trust = i
			return ek, nil
		}
		lastErr = err
	}
	if lastErr == nil {
		return EK{}, fmt.Errorf("%w: tpm: the tenant registered no TPM EK CA, and this EK (sha256 %s) is not pinned", attestor.ErrEvidence, pin)
	}
	return EK{}, fmt.Errorf("%w: tpm: the EK certificate does not chain to a registered EK CA: %w", attestor.ErrEvidence, lastErr)
}

func isSelfSigned(c *x509.Certificate) bool {
	return c.CheckSignatureFrom(c) == nil
}

func samePublic(a, b crypto.PublicKey) bool {
	ka, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ka.Equal(b)
}

// Challenge makes the credential for ek and the node's AK: it checks the
// AK's creation attestation (a restricted signing key made by this TPM)
// and returns the secret to keep and the encrypted credential to send.
func Challenge(ek EK, id Identity) (secret, credential, encSecret []byte, err error) {
	for _, b := range [][]byte{id.AKPublic, id.AKCreateData, id.AKCreateAttestation, id.AKCreateSignature} {
		if len(b) == 0 || len(b) > MaxBlob {
			return nil, nil, nil, fmt.Errorf("%w: tpm: the AK parameters are required and at most %d bytes each", attestor.ErrEvidence, MaxBlob)
		}
	}
	p := attest.ActivationParameters{EK: ek.Public, AK: attest.AttestationParameters{
		Public: id.AKPublic, CreateData: id.AKCreateData, CreateAttestation: id.AKCreateAttestation, CreateSignature: id.AKCreateSignature,
	}}
	secret, ec, err := p.Generate()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%w: tpm: AK: %w", attestor.ErrEvidence, err)
	}
	return secret, ec.Credential, ec.Secret, nil
}

// VerifyQuote checks the activated secret against want and the quote by
// the AK over the PCRs with nonce. It returns the PCRs the quote covers.
func VerifyQuote(akPublic, want, got []byte, q Quote, nonce []byte) (map[int][]byte, error) {
	if len(got) == 0 || subtle.ConstantTimeCompare(want, got) != 1 {
		return nil, fmt.Errorf("%w: tpm: the activated secret is wrong (not this TPM's EK, or not its AK)", attestor.ErrEvidence)
	}
	if len(q.Quote) == 0 || len(q.Quote) > MaxBlob || len(q.Signature) == 0 || len(q.Signature) > MaxBlob || len(q.PCRs) == 0 || len(q.PCRs) > MaxPCRs {
		return nil, fmt.Errorf("%w: tpm: quote, signature and 1-%d PCRs are required", attestor.ErrEvidence, MaxPCRs)
	}
	ak, err := attest.ParseAKPublic(akPublic)
	if err != nil {
		return nil, fmt.Errorf("%w: tpm: AK public: %w", attestor.ErrEvidence, err)
	}
	pcrs := make([]attest.PCR, 0, len(q.PCRs))
	for i, d := range q.PCRs {
		if i < 0 || i >= MaxPCRs || len(d) != sha256.Size {
			return nil, fmt.Errorf("%w: tpm: PCR %d must be a SHA-256 digest of index 0-%d", attestor.ErrEvidence, i, MaxPCRs-1)
		}
		pcrs = append(pcrs, attest.PCR{Index: i, Digest: d, DigestAlg: crypto.SHA256})
	}
	if err := ak.Verify(attest.Quote{Quote: q.Quote, Signature: q.Signature}, pcrs, nonce); err != nil {
		return nil, fmt.Errorf("%w: tpm: quote: %w", attestor.ErrEvidence, err)
	}
	out := make(map[int][]byte, len(pcrs))
	for _, p := range pcrs {
		if p.QuoteVerified() {
			out[p.Index] = p.Digest
		}
	}
	return out, nil
}
