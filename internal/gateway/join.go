package gateway

import (
	"cmp"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/attestor"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/store"
)

// Join limits.
const (
	maxTokenBytes = 8 << 10
	maxCSRBytes   = 16 << 10
	maxNonceBytes = 64
)

// CodeDuplicateIdentity is the machine code in the message of a join
// refused because another live node holds the machine's hardware key.
const CodeDuplicateIdentity = "DuplicateIdentity"

func denied(format string, args ...any) error {
	return status.Errorf(codes.PermissionDenied, format, args...)
}

// joinOutcome is what the join transaction decided.
type joinOutcome struct {
	nodeID    string
	role      string
	attested  attested
	created   bool
	pending   bool
	requestID string
	reason    string
}

// Join admits a node: it checks the sealed token and its row (not revoked,
// not expired, unused or bound to this same CSR), defers machines whose DMI
// identity is a placeholder to an operator's approval, refuses a machine a
// live node already holds, creates the node, and issues its certificate. A
// retry with the same token and CSR returns the same node with a fresh
// certificate.
func (g *Gateway) Join(ctx context.Context, req *agentv1.JoinRequest) (*agentv1.JoinResponse, error) {
	if err := decodeError(req); err != nil {
		return nil, g.refused(g.log.With("rpc", "Join", "peer", peerAddr(ctx)), "join refused", err)
	}
	if err := validateJoin(req); err != nil {
		return nil, g.refused(g.log.With("rpc", "Join", "peer", peerAddr(ctx)), "join refused", err)
	}
	fleet.SanitizeNodeText(req.GetIdentity()) // the host name reaches join requests and events
	if strings.HasPrefix(req.GetToken(), DiscoveryTokenPrefix) {
		return g.joinDiscovery(ctx, req)
	}
	claims, err := g.cfg.Authority.OpenJoinToken(req.GetToken())
	if errors.Is(err, ErrTokenExpired) {
		g.log.Warn("join refused: token expired", "peer", peerAddr(ctx))
		return nil, denied("join token expired")
	}
	if err != nil {
		g.log.Warn("join refused: token does not open", "err", err, "peer", peerAddr(ctx))
		return nil, status.Error(codes.Unauthenticated, "invalid join token")
	}
	csr, err := g.cfg.Authority.ParseCSR(req.GetCsrDer())
	if err != nil {
		return nil, invalid("csr_der: %v", err)
	}
	sum := sha256.Sum256(csr.Raw)
	csrSHA := hex.EncodeToString(sum[:])
	identity := req.GetIdentity()
	hwKey := HardwareKey(identity)
	placeholder := PlaceholderReason(identity)
	log := g.log.With("rpc", "Join", "token", claims.TokenID, "peer", peerAddr(ctx))

	var out joinOutcome
	err = g.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		out = joinOutcome{}
		return g.joinTx(ctx, tx, req, claims, csrSHA, hwKey, placeholder, &out)
	})
	if err != nil {
		return nil, g.refused(log, "join refused", err)
	}
	if out.pending {
		log.Info("join deferred to an operator", "join_request", out.requestID, "reason", out.reason)
		return &agentv1.JoinResponse{
			Status: agentv1.JoinStatus_JOIN_STATUS_PENDING_APPROVAL, JoinRequestId: out.requestID,
			Reason: out.reason, RetryAfterSeconds: int32(g.cfg.JoinRetryAfter / time.Second),
		}, nil
	}
	chain, notAfter, err := g.issue(ctx, csr.Raw, out.nodeID, out.role, out.attested.kind)
	if err != nil {
		return nil, g.refused(log, "join: issue certificate", err)
	}
	log.Info("node admitted", "node", out.nodeID, "new", out.created, "attestor", out.attested.kind, "attested_id", out.attested.id)
	return &agentv1.JoinResponse{
		Status: agentv1.JoinStatus_JOIN_STATUS_ADMITTED, NodeId: out.nodeID, CertificateChain: chain,
		TrustBundlePem: g.cfg.Authority.TrustBundlePEM(), TrustDomain: g.cfg.Authority.TrustDomain(),
		NotAfter: timestamppb.New(notAfter), CommandTrust: g.commandTrust(),
	}, nil
}

func validateJoin(req *agentv1.JoinRequest) error {
	id := req.GetIdentity()
	switch {
	case req.GetToken() == "":
		return invalid("token: required")
	case len(req.GetToken()) > maxTokenBytes:
		return invalid("token: longer than %d bytes", maxTokenBytes)
	case len(req.GetCsrDer()) == 0 || len(req.GetCsrDer()) > maxCSRBytes:
		return invalid("csr_der: required, at most %d bytes", maxCSRBytes)
	case id == nil:
		return invalid("identity: required")
	case len(id.GetGpuUuids()) > 256 || len(id.GetMacs()) > maxListItems:
		return invalid("identity: too many GPU UUIDs or MACs")
	case agentv1.AgentMode_name[int32(req.GetMode())] == "":
		return invalid("mode: unknown mode %d", req.GetMode())
	}
	for _, f := range []string{id.GetDmiProductUuid(), id.GetDmiProductSerial(), id.GetDmiBoardSerial(), id.GetDmiProductName(), id.GetHostname()} {
		if len(f) > maxShort {
			return invalid("identity: a field is longer than %d bytes", maxShort)
		}
	}
	for _, f := range append(append([]string{}, id.GetGpuUuids()...), id.GetMacs()...) {
		if len(f) > maxShort {
			return invalid("identity: a GPU UUID or MAC is longer than %d bytes", maxShort)
		}
	}
	return validShort("agent_version", req.GetAgentVersion(), false)
}

func (g *Gateway) joinTx(ctx context.Context, tx store.Tx, req *agentv1.JoinRequest, claims JoinClaims, csrSHA, hwKey, placeholder string, out *joinOutcome) error {
	tok, err := fleet.JoinTokenGet(ctx, tx, "", claims.TokenID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return denied("unknown join token")
	case err != nil:
		return err
	case tok.RevokeTime != nil:
		return denied("join token revoked")
	case !g.cfg.Clock.Now().Before(tok.ExpireTime):
		return denied("join token expired")
	case tok.CSRSHA256 != "" && tok.CSRSHA256 != csrSHA:
		return denied("token already used")
	}
	// Evidence is checked on every join with it, a retry's too, inside this
	// transaction: the anchors read are the ones committed with the node.
	att, err := g.verifyAttestation(ctx, tx, req, tok, csrSHA)
	if err != nil {
		return err
	}
	out.attested = att
	// The token decides the role, never the agent: a site or ramdisk
	// certificate opens paths a node's does not. A join asking for another
	// role is refused rather than quietly given the token's, so a
	// misconfigured agent hears why.
	out.role = cmp.Or(tok.Role, RoleNode)
	if asked := roleOf(req.GetMode()); asked != out.role {
		return denied("join token %s admits a %s agent; this agent asked to join as %s", tok.ID, out.role, asked)
	}
	if tok.NodeID != "" {
		// A retry of an admitted join: same node, fresh certificate.
		n, err := fleet.NodeStatusGet(ctx, tx, tok.NodeID)
		if err != nil {
			return err
		}
		if n.State == "retired" {
			return denied("node %s was retired; join with a new token", n.ID)
		}
		out.nodeID = n.ID
		return nil
	}
	jr, err := fleet.JoinRequestGetByToken(ctx, tx, tok.ID)
	hasRequest := err == nil
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	if hasRequest {
		switch jr.State {
		case "pending":
			out.pending, out.requestID, out.reason = true, jr.ID, jr.Reason
			return nil
		case "rejected":
			return denied("join request %s was rejected", jr.ID)
		case "admitted":
			out.nodeID = jr.NodeID
			return nil
		}
		// approved: admit this one join below.
	} else if placeholder != "" {
		now := g.cfg.Clock.Now()
		identity, err := protojson.Marshal(req.GetIdentity())
		if err != nil {
			return err
		}
		jr := fleet.JoinRequest{
			ID: envelope.NewID(fleet.JoinRequestIDPrefix, now), TenantID: tok.TenantID, TokenID: tok.ID, CSRSHA256: csrSHA,
			HardwareKey: hwKey, Identity: string(identity), Reason: placeholder, CreateTime: now,
		}
		if err := fleet.JoinRequestInsert(ctx, tx, &jr); err != nil {
			return err
		}
		if err := bindToken(ctx, tx, tok.ID, csrSHA, ""); err != nil {
			return err
		}
		out.pending, out.requestID, out.reason = true, jr.ID, jr.Reason
		return g.cfg.Recorder.InsertEvents(ctx, tx, []envelope.Event{{
			Type: "join_request.created", TenantID: tok.TenantID, ResourceType: "JoinRequest", ResourceID: jr.ID, Time: now,
			Data: map[string]any{"reason": placeholder, "hostname": req.GetIdentity().GetHostname(), "token_id": tok.ID},
		}})
	}

	holder, err := fleet.NodeIDByHardwareKey(ctx, tx, hwKey)
	if err != nil {
		return err
	}
	if holder != "" {
		return g.duplicateIdentity(ctx, tx, holder, tok.TenantID)
	}
	// A kubelet's proof binds the node to its Kubernetes Node: one node a
	// Node, however many machines hold a copy of its key, and named after it.
	hostname := req.GetIdentity().GetHostname()
	if att.kind == attestor.Kubelet {
		other, err := fleet.NodeIDByAttestedID(ctx, tx, tok.TenantID, att.anchorID, att.id)
		if err != nil {
			return err
		}
		if other != "" {
			return denied("the kubelet of Node %s already joined as node %s; retire that node before another machine joins as this Node", att.nodeName, other)
		}
		hostname = att.nodeName
	}
	now := g.cfg.Clock.Now()
	nodeID := envelope.NewID(fleet.NodeIDPrefix, now)
	name, err := uniqueNodeName(ctx, tx, NodeName(hostname))
	if err != nil {
		return err
	}
	mode := out.role
	// The first heartbeat is now, so that a node that never opens a
	// session still turns unreachable.
	err = fleet.NodeInsert(ctx, tx, &fleet.NodeInsertParams{
		ID: nodeID, Name: name, TenantID: tok.TenantID, ProjectID: tok.ProjectID, Pool: tok.Pool, Labels: tok.Labels,
		HardwareKey: hwKey, State: fleet.NodeJoining, Liveness: fleet.LivenessReady, Mode: mode,
		AgentVersion: req.GetAgentVersion(), LastHeartbeat: &now, CreateTime: now, SiteID: tok.SiteID,
		Attestor: att.kind, AttestedID: att.id, TrustAnchorID: att.anchorID,
	})
	if errors.Is(err, store.ErrUnique) {
		// A concurrent join of the same machine won the race.
		if holder, _ := fleet.NodeIDByHardwareKey(ctx, tx, hwKey); holder != "" {
			return g.duplicateIdentity(ctx, tx, holder, tok.TenantID)
		}
		return status.Error(codes.Aborted, "a concurrent join took the node name; retry")
	}
	if err != nil {
		return err
	}
	if hasRequest {
		ok, err := fleet.JoinRequestAdmit(ctx, tx, jr.ID, nodeID)
		if err != nil {
			return err
		}
		if !ok {
			return denied("join request %s is not approved", jr.ID)
		}
	}
	if err := bindToken(ctx, tx, tok.ID, csrSHA, nodeID); err != nil {
		return err
	}
	out.nodeID, out.created = nodeID, true
	data := map[string]any{"name": name, "pool": tok.Pool, "mode": mode, "token_id": tok.ID, "attestor": att.kind}
	if att.id != "" {
		data["attested_id"], data["trust_anchor_id"] = att.id, att.anchorID
	}
	if hasRequest {
		data["join_request_id"] = jr.ID
	}
	return g.cfg.Recorder.InsertEvents(ctx, tx, []envelope.Event{{
		Type: "node.joined", TenantID: tok.TenantID, ResourceType: "Node", ResourceID: nodeID, Time: now, Data: data,
	}})
}

func bindToken(ctx context.Context, tx store.Tx, tokenID, csrSHA, nodeID string) error {
	ok, err := fleet.JoinTokenBind(ctx, tx, tokenID, csrSHA, nodeID)
	if err != nil {
		return err
	}
	if !ok {
		return denied("token already used")
	}
	return nil
}

// duplicateIdentity refuses a join of a machine live node holder already
// is. The holder's id is named only to a token of the holder's own tenant:
// a join token of another tenant must not learn node ids outside it. The
// log, for the operator, always names it.
func (g *Gateway) duplicateIdentity(ctx context.Context, tx store.Tx, holder, tokenTenant string) error {
	n, err := fleet.NodeStatusGet(ctx, tx, holder)
	if err != nil {
		return err
	}
	if n.TenantID == tokenTenant {
		return status.Errorf(codes.AlreadyExists, "%s: this machine's hardware identity is held by live node %s; retire it first", CodeDuplicateIdentity, holder)
	}
	g.log.Warn("join refused: the machine is a live node of another tenant", "holder", holder, "holder_tenant", n.TenantID, "token_tenant", tokenTenant)
	return status.Errorf(codes.AlreadyExists, "%s: this machine's hardware identity is held by a live node; ask the platform operator", CodeDuplicateIdentity)
}

// uniqueNodeName returns base, or base-2, base-3 … whichever is free.
func uniqueNodeName(ctx context.Context, tx store.Tx, base string) (string, error) {
	for i := 1; i < 10000; i++ {
		name := base
		if i > 1 {
			name = base + "-" + strconv.Itoa(i)
		}
		taken, err := fleet.NodeNameTaken(ctx, tx, name)
		if err != nil {
			return "", err
		}
		if !taken {
			return name, nil
		}
	}
	return "", status.Errorf(codes.ResourceExhausted, "no free node name for %q", base)
}

// issue signs a node certificate and records its serial on the node. The
// PKI writes its own transaction, so this runs after the join's.
func (g *Gateway) issue(ctx context.Context, csrDER []byte, nodeID, role, attestor string) ([][]byte, time.Time, error) {
	chain, notAfter, err := g.cfg.Authority.IssueNode(ctx, csrDER, nodeID, role, attestor, g.cfg.CertTTL)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("issue node certificate: %w", err)
	}
	if len(chain) == 0 {
		return nil, time.Time{}, errors.New("issue node certificate: empty chain")
	}
	leaf, err := x509.ParseCertificate(chain[0])
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("parse issued certificate: %w", err)
	}
	err = g.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return fleet.NodeUpdateCert(ctx, tx, nodeID, leaf.SerialNumber.Text(16), notAfter)
	})
	return chain, notAfter, err
}

// RenewDigest is what a renew request's signature covers: SHA-256 over the
// nonce, the request time in RFC 3339 with nanoseconds in UTC, and the CSR.
func RenewDigest(nonce []byte, t time.Time, csrDER []byte) []byte {
	h := sha256.New()
	h.Write(nonce)
	h.Write([]byte(t.UTC().Format(time.RFC3339Nano)))
	h.Write(csrDER)
	return h.Sum(nil)
}

// Renew issues a new certificate, for a new key, to the node the presented
// certificate names: the request is signed by the current key over
// RenewDigest, its time is within RenewSkew of now, and its nonce is fresh.
func (g *Gateway) Renew(ctx context.Context, req *agentv1.RenewRequest) (*agentv1.RenewResponse, error) {
	if err := decodeError(req); err != nil {
		return nil, g.refused(g.log.With("rpc", "Renew", "peer", peerAddr(ctx)), "renew refused", err)
	}
	ident, leaf, err := g.peerIdentity(ctx)
	if err != nil {
		return nil, g.refused(g.log.With("rpc", "Renew", "peer", peerAddr(ctx)), "renew refused", err)
	}
	log := g.log.With("rpc", "Renew", "node", ident.NodeID)
	now := g.cfg.Clock.Now()
	err = func() error {
		switch {
		case len(req.GetNonce()) < MinNonceBytes || len(req.GetNonce()) > maxNonceBytes:
			return invalid("nonce: must be %d-%d random bytes", MinNonceBytes, maxNonceBytes)
		case req.GetTime() == nil || req.GetTime().CheckValid() != nil:
			return invalid("time: required")
		case len(req.GetCsrDer()) == 0 || len(req.GetCsrDer()) > maxCSRBytes:
			return invalid("csr_der: required, at most %d bytes", maxCSRBytes)
		}
		if d := req.GetTime().AsTime().Sub(now); d > g.cfg.RenewSkew || d < -g.cfg.RenewSkew {
			return invalid("time: %v from the gateway's clock (at most %v)", d.Round(time.Second), g.cfg.RenewSkew)
		}
		if _, err := g.cfg.Authority.ParseCSR(req.GetCsrDer()); err != nil {
			return invalid("csr_der: %v", err)
		}
		digest := RenewDigest(req.GetNonce(), req.GetTime().AsTime(), req.GetCsrDer())
		if !verifySignature(leaf.PublicKey, digest, req.GetSignature()) {
			return denied("signature: does not verify with the presented certificate's key")
		}
		return g.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			n, err := fleet.NodeStatusGet(ctx, tx, ident.NodeID)
			if errors.Is(err, store.ErrNotFound) {
				return denied("node %s is not known", ident.NodeID)
			}
			if err != nil {
				return err
			}
			if n.State == "retired" {
				return denied("node %s is retired", ident.NodeID)
			}
			err = g.cfg.Authority.UseNonce(ctx, tx, req.GetNonce(), now.Add(2*g.cfg.RenewSkew))
			if errors.Is(err, ErrReplay) {
				return denied("nonce: already used")
			}
			return err
		})
	}()
	if err != nil {
		return nil, g.refused(log, "renew refused", err)
	}
	// A renewed certificate keeps what admitted the node.
	chain, notAfter, err := g.issue(ctx, req.GetCsrDer(), ident.NodeID, ident.Role, pki.AttestorOf(leaf))
	if err != nil {
		return nil, g.refused(log, "renew: issue certificate", err)
	}
	log.Info("node certificate renewed", "not_after", notAfter)
	return &agentv1.RenewResponse{
		CertificateChain: chain, TrustBundlePem: g.cfg.Authority.TrustBundlePEM(), NotAfter: timestamppb.New(notAfter),
		CommandTrust: g.commandTrust(),
	}, nil
}

// verifySignature checks sig over a SHA-256 digest with pub: ECDSA (ASN.1),
// Ed25519 (over the digest as message) or RSA PKCS #1 v1.5.
func verifySignature(pub any, digest, sig []byte) bool {
	if len(sig) == 0 || len(sig) > 1024 {
		return false
	}
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		return ecdsa.VerifyASN1(k, digest, sig)
	case ed25519.PublicKey:
		return ed25519.Verify(k, digest, sig)
	case *rsa.PublicKey:
		return rsa.VerifyPKCS1v15(k, crypto.SHA256, digest, sig) == nil
	}
	return false
}

// peerIdentity returns the node a verified client certificate names.
func (g *Gateway) peerIdentity(ctx context.Context) (NodeIdentity, *x509.Certificate, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return NodeIdentity{}, nil, status.Error(codes.Unauthenticated, "a node certificate is required")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return NodeIdentity{}, nil, status.Error(codes.Unauthenticated, "a node certificate is required")
	}
	if len(info.State.VerifiedChains) == 0 {
		return NodeIdentity{}, nil, status.Error(codes.Unauthenticated, "the node certificate was not verified")
	}
	leaf := info.State.PeerCertificates[0]
	ident, err := g.cfg.Authority.VerifyPeer(info.State)
	if err != nil {
		return NodeIdentity{}, nil, status.Errorf(codes.Unauthenticated, "node certificate refused: %v", err)
	}
	return ident, leaf, nil
}

func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// refused logs a refusal and returns it as a gRPC status: a status error
// as it is, anything else (a database failure) as INTERNAL without detail.
func (g *Gateway) refused(log interface {
	Warn(string, ...any)
	Error(string, ...any)
}, msg string, err error) error {
	if st, ok := status.FromError(err); ok {
		log.Warn(msg, "code", st.Code().String(), "err", st.Message())
		return st.Err()
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		log.Warn(msg, "err", err)
		return status.FromContextError(err).Err()
	}
	log.Error(msg, "err", err)
	return status.Error(codes.Internal, "internal error; retry later")
}
