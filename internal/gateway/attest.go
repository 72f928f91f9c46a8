package gateway

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/attestor"
	"github.com/better-compute/better-compute/internal/attestor/cloudiid"
	"github.com/better-compute/better-compute/internal/attestor/kubelet"
	"github.com/better-compute/better-compute/internal/attestor/tpm"
	"github.com/better-compute/better-compute/internal/attestor/x509pop"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/store"
)

// ChallengeTTL is how long a join challenge stays answerable.
const ChallengeTTL = 5 * time.Minute

// maxAnchors bounds the trust anchors of one attestor a join is checked
// against.
const maxAnchors = 100

// attested is what admitted a join: the attestor, what it proved and the
// trust anchor that vouched; kind attestor.JoinToken and no id when the
// token alone did. nodeName is the Kubernetes Node a kubelet proof named:
// the node is recorded under that name.
type attested struct {
	kind, id, anchorID string
	nodeName           string
}

// JoinChallenge answers an attested join's first half (agentv1's
// JoinChallenge): it checks the token and CSR as Join will, and for a TPM
// the EK against the tenant's anchors, then seals what Join must check into
// the challenge. It writes nothing: a challenge never answered costs the
// control plane nothing.
func (g *Gateway) JoinChallenge(ctx context.Context, req *agentv1.JoinChallengeRequest) (*agentv1.JoinChallengeResponse, error) {
	log := g.log.With("rpc", "JoinChallenge", "peer", peerAddr(ctx))
	if err := decodeError(req); err != nil {
		return nil, g.refused(log, "join challenge refused", err)
	}
	switch {
	case req.GetToken() == "" || len(req.GetToken()) > maxTokenBytes:
		return nil, g.refused(log, "join challenge refused", invalid("token: required, at most %d bytes", maxTokenBytes))
	case len(req.GetCsrDer()) == 0 || len(req.GetCsrDer()) > maxCSRBytes:
		return nil, g.refused(log, "join challenge refused", invalid("csr_der: required, at most %d bytes", maxCSRBytes))
	case !attestor.Valid(req.GetAttestor()):
		return nil, g.refused(log, "join challenge refused", invalid("attestor: must be one of %s", strings.Join(attestor.Kinds, ", ")))
	case (req.GetAttestor() == attestor.TPM) != (req.GetTpm() != nil):
		return nil, g.refused(log, "join challenge refused", invalid("tpm: required with attestor tpm, and only then"))
	}
	claims, err := g.cfg.Authority.OpenJoinToken(req.GetToken())
	if errors.Is(err, ErrTokenExpired) {
		return nil, g.refused(log, "join challenge refused", denied("join token expired"))
	}
	if err != nil {
		log.Warn("join challenge refused: token does not open", "err", err)
		return nil, status.Error(codes.Unauthenticated, "invalid join token")
	}
	csr, err := g.cfg.Authority.ParseCSR(req.GetCsrDer())
	if err != nil {
		return nil, g.refused(log, "join challenge refused", invalid("csr_der: %v", err))
	}
	sum := sha256.Sum256(csr.Raw)
	now := g.cfg.Clock.Now()
	ch := pki.JoinChallenge{TokenID: claims.TokenID, CSRSHA256: hex.EncodeToString(sum[:]), Attestor: req.GetAttestor(),
		Nonce: make([]byte, attestor.NonceSize), ExpiresAt: now.Add(ChallengeTTL)}
	if _, err := rand.Read(ch.Nonce); err != nil {
		return nil, g.refused(log, "join challenge", err)
	}
	resp := &agentv1.JoinChallengeResponse{Nonce: ch.Nonce, ExpireTime: timestamppb.New(ch.ExpiresAt)}
	err = g.cfg.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		tok, err := fleet.JoinTokenGet(ctx, tx, "", claims.TokenID)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return denied("unknown join token")
		case err != nil:
			return err
		case tok.RevokeTime != nil:
			return denied("join token revoked")
		case !now.Before(tok.ExpireTime):
			return denied("join token expired")
		case tok.CSRSHA256 != "" && tok.CSRSHA256 != ch.CSRSHA256:
			return denied("token already used")
		}
		required, why, err := g.requiredAttestor(ctx, tx, tok)
		if err != nil {
			return err
		}
		if required != "" && required != req.GetAttestor() {
			return denied("%s requires %s attestation; this node offered %s", why, required, req.GetAttestor())
		}
		resp.RequiredAttestor = required
		if req.GetAttestor() != attestor.TPM {
			return nil
		}
		anchors, err := g.anchors(ctx, tx, tok.TenantID, attestor.TPM)
		if err != nil {
			return err
		}
		id := tpmIdentity(req.GetTpm())
		ek, err := tpm.VerifyEK(id, ekTrusts(anchors), now)
		if err != nil {
			return evidenceRefused(err)
		}
		secret, cred, encSecret, err := tpm.Challenge(ek, id)
		if err != nil {
			return evidenceRefused(err)
		}
		ch.TPMSecret, ch.AKPublic, ch.EKSubject, ch.AnchorID = secret, id.AKPublic, ek.Subject, anchors[ek.Trust].ID
		resp.TpmCredential, resp.TpmSecret = cred, encSecret
		return nil
	})
	if err != nil {
		return nil, g.refused(log.With("token", claims.TokenID), "join challenge refused", err)
	}
	if resp.Challenge, err = g.cfg.Authority.SealJoinChallenge(ch); err != nil {
		return nil, g.refused(log, "join challenge", err)
	}
	return resp, nil
}

// verifyAttestation checks a join's evidence against the token: a token
// that requires an attestor refuses a join without its evidence, and
// evidence, when given, must answer a challenge for this token and CSR and
// verify against the token tenant's trust anchors, never another tenant's.
func (g *Gateway) verifyAttestation(ctx context.Context, tx store.Tx, req *agentv1.JoinRequest, tok fleet.JoinToken, csrSHA string) (attested, error) {
	required, why, err := g.requiredAttestor(ctx, tx, tok)
	if err != nil {
		return attested{}, err
	}
	att := req.GetAttestation()
	if att == nil {
		if required != "" {
			return attested{}, denied("%s requires %s attestation; this join brought none (run bcd with --attest %s)", why, required, required)
		}
		return attested{kind: attestor.JoinToken}, nil
	}
	ch, err := g.cfg.Authority.OpenJoinChallenge(att.GetChallenge())
	if err != nil {
		return attested{}, denied("attestation.challenge: %v; ask JoinChallenge for a new one", strings.TrimPrefix(err.Error(), "pki: "))
	}
	kind := evidenceKind(att)
	switch {
	case ch.TokenID != tok.ID || ch.CSRSHA256 != csrSHA:
		return attested{}, denied("attestation.challenge: issued for another join token or CSR")
	case kind == "":
		return attested{}, invalid("attestation: evidence (tpm, x509, cloud or kubelet) is required with a challenge")
	case kind != ch.Attestor:
		return attested{}, denied("attestation: the challenge was for %s evidence, the join brought %s", ch.Attestor, kind)
	case required != "" && kind != required:
		return attested{}, denied("%s requires %s attestation; this join brought %s", why, required, kind)
	}
	csrSum, _ := hex.DecodeString(csrSHA)
	digest := attestor.BindingDigest(kind, ch.Nonce, csrSum)
	now := g.cfg.Clock.Now()
	switch kind {
	case attestor.TPM:
		// The EK was checked at the challenge; its anchor must still be
		// there (an operator who deletes it stops the joins it vouched for).
		if _, err := fleet.TrustAnchorGet(ctx, tx, tok.TenantID, ch.AnchorID); errors.Is(err, store.ErrNotFound) {
			return attested{}, denied("attestation refused: tpm: the trust anchor that vouched for the EK was deleted")
		} else if err != nil {
			return attested{}, err
		}
		ev := att.GetTpm()
		q := tpm.Quote{Quote: ev.GetQuote(), Signature: ev.GetQuoteSignature(), PCRs: make(map[int][]byte, len(ev.GetPcrs()))}
		for i, d := range ev.GetPcrs() {
			q.PCRs[int(i)] = d
		}
		if _, err := tpm.VerifyQuote(ch.AKPublic, ch.TPMSecret, ev.GetActivatedSecret(), q, digest); err != nil {
			return attested{}, evidenceRefused(err)
		}
		return attested{kind: kind, id: ch.EKSubject, anchorID: ch.AnchorID}, nil
	case attestor.X509:
		roots, owner, err := g.anchorCAs(ctx, tx, tok.TenantID, attestor.X509)
		if err != nil {
			return attested{}, err
		}
		res, err := x509pop.Verify(att.GetX509().GetCertificateChain(), att.GetX509().GetSignature(), digest, roots, now)
		if err != nil {
			return attested{}, evidenceRefused(err)
		}
		return attested{kind: kind, id: res.Subject, anchorID: owner[res.Root]}, nil
	case attestor.Kubelet:
		roots, owner, err := g.anchorCAs(ctx, tx, tok.TenantID, attestor.Kubelet)
		if err != nil {
			return attested{}, err
		}
		res, err := kubelet.Verify(att.GetKubelet().GetCertificateChain(), att.GetKubelet().GetSignature(), digest, roots, now)
		if err != nil {
			return attested{}, evidenceRefused(err)
		}
		return attested{kind: kind, id: res.Subject, anchorID: owner[res.Root], nodeName: res.NodeName}, nil
	default: // cloud
		anchors, err := g.anchors(ctx, tx, tok.TenantID, attestor.Cloud)
		if err != nil {
			return attested{}, err
		}
		var trusts []cloudiid.Trust
		var ids []string
		for _, a := range anchors {
			certs, err := fleet.ParseCertificatesPEM(a.CertificatesPEM)
			if err != nil {
				continue
			}
			for _, c := range certs {
				trusts = append(trusts, cloudiid.Trust{Certificate: c, AccountID: a.CloudAccount, Region: a.CloudRegion})
				ids = append(ids, a.ID)
			}
		}
		res, err := cloudiid.Verify(att.GetCloud().GetDocument(), att.GetCloud().GetSignature(), trusts, cloudiid.Nonce(digest))
		if err != nil {
			return attested{}, evidenceRefused(err)
		}
		return attested{kind: kind, id: res.Subject, anchorID: ids[res.Trust]}, nil
	}
}

// requiredAttestor is the attestor a join with tok must bring and who
// requires it: the token's own, else the pool's the token names. A token
// and a pool that require different attestors admit nothing, and say so.
func (g *Gateway) requiredAttestor(ctx context.Context, q store.Querier, tok fleet.JoinToken) (kind, why string, err error) {
	var poolKind string
	if tok.Pool != "" && g.cfg.PoolAttestor != nil {
		if poolKind, err = g.cfg.PoolAttestor(ctx, q, tok.TenantID, tok.Pool); err != nil {
			return "", "", err
		}
	}
	switch {
	case tok.Attestor != "" && poolKind != "" && tok.Attestor != poolKind:
		return "", "", denied("join token %s requires %s attestation but its pool %s requires %s; mint a token for %s", tok.ID, tok.Attestor, tok.Pool, poolKind, poolKind)
	case tok.Attestor != "":
		return tok.Attestor, "join token " + tok.ID, nil
	case poolKind != "":
		return poolKind, "pool " + tok.Pool, nil
	}
	return "", "", nil
}

func (g *Gateway) anchors(ctx context.Context, tx store.Tx, tenantID, kind string) ([]fleet.TrustAnchor, error) {
	return fleet.TrustAnchorList(ctx, tx, &fleet.TrustAnchorListParams{TenantID: tenantID, Attestor: kind, Limit: maxAnchors})
}

// anchorCAs are the CA certificates of the tenant's anchors of kind, and
// the anchor each came from.
func (g *Gateway) anchorCAs(ctx context.Context, tx store.Tx, tenantID, kind string) ([]*x509.Certificate, map[*x509.Certificate]string, error) {
	anchors, err := g.anchors(ctx, tx, tenantID, kind)
	if err != nil {
		return nil, nil, err
	}
	var roots []*x509.Certificate
	owner := map[*x509.Certificate]string{}
	for _, a := range anchors {
		certs, err := fleet.ParseCertificatesPEM(a.CertificatesPEM)
		if err != nil {
			continue // validated when registered; a bad row vouches for nothing
		}
		for _, c := range certs {
			roots = append(roots, c)
			owner[c] = a.ID
		}
	}
	return roots, owner, nil
}

func ekTrusts(anchors []fleet.TrustAnchor) []tpm.EKTrust {
	out := make([]tpm.EKTrust, len(anchors))
	for i, a := range anchors {
		out[i].EKPublicSHA = a.EKPublicSHA256
		if a.CertificatesPEM != "" {
			out[i].Certificates, _ = fleet.ParseCertificatesPEM(a.CertificatesPEM)
		}
	}
	return out
}

func tpmIdentity(p *agentv1.TPMIdentity) tpm.Identity {
	return tpm.Identity{
		EKCertificate: p.GetEkCertificateDer(), EKPublic: p.GetEkPublicDer(), AKPublic: p.GetAkPublic(),
		AKCreateData: p.GetAkCreateData(), AKCreateAttestation: p.GetAkCreateAttestation(), AKCreateSignature: p.GetAkCreateSignature(),
	}
}

func evidenceKind(a *agentv1.Attestation) string {
	switch {
	case a.GetTpm() != nil:
		return attestor.TPM
	case a.GetX509() != nil:
		return attestor.X509
	case a.GetCloud() != nil:
		return attestor.Cloud
	case a.GetKubelet() != nil:
		return attestor.Kubelet
	}
	return ""
}

// evidenceRefused turns a verifier's refusal into PERMISSION_DENIED with
// its reason; anything else stays an internal error.
func evidenceRefused(err error) error {
	if errors.Is(err, attestor.ErrEvidence) {
		return denied("%s", err.Error())
	}
	return fmt.Errorf("attestation: %w", err)
}
