package gateway

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/nodesecret"
	"github.com/better-compute/better-compute/internal/store"
)

// NodeSecret is a secret opened for the node that asked for it.
type NodeSecret struct {
	ID      string
	Version int64
	Value   []byte
}

// ErrSecretNotFound: OpenNodeSecret has nothing the node may read under
// that ref (no such secret, not the node's tenant's, not node-readable).
var ErrSecretNotFound = errors.New("secret not found")

// Reasons a FetchSecret refusal carries (errdetails.ErrorInfo.Reason),
// so bcd and an operator reading its error know which check failed.
const (
	FetchReasonInvalid     = "INVALID_REQUEST"
	FetchReasonStaleTime   = "STALE_TIME"
	FetchReasonSignature   = "BAD_SIGNATURE"
	FetchReasonReplay      = "REPLAYED_NONCE"
	FetchReasonWrongRole   = "WRONG_ROLE"
	FetchReasonNodeRetired = "NODE_RETIRED"
	FetchReasonNotFound    = "NOT_FOUND"
	// fetchReasonDomain is the ErrorInfo domain of these reasons.
	fetchReasonDomain = "agent.bettercompute"
)

// maxSecretRefBytes bounds the ref a node sends (secret:// and a name of
// at most 63 characters; the rest is noise).
const maxSecretRefBytes = 128

// fetchRefusal is a refused fetch: the gRPC code, its machine reason and
// the message the node reads.
type fetchRefusal struct {
	code   codes.Code
	reason string
	msg    string
}

func (r *fetchRefusal) Error() string { return r.msg }

func refuseFetch(code codes.Code, reason, format string, args ...any) *fetchRefusal {
	return &fetchRefusal{code: code, reason: reason, msg: fmt.Sprintf(format, args...)}
}

// status is the refusal as the node gets it, with its reason attached.
func (r *fetchRefusal) status() error {
	st := status.New(r.code, r.reason+": "+r.msg)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: r.reason, Domain: fetchReasonDomain}); err == nil {
		st = d
	}
	return st.Err()
}

// FetchReason is the machine reason of a FetchSecret refusal, "" for
// another error.
func FetchReason(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == fetchReasonDomain {
			return info.GetReason()
		}
	}
	return ""
}

// errSecretNotFound is the one answer for a secret the node may not read,
// whichever the cause, so a node learns nothing of what exists.
func errSecretNotFound(ref string) *fetchRefusal {
	return refuseFetch(codes.NotFound, FetchReasonNotFound, "secret %s not found", ref)
}

// FetchSecret answers a node's signed request for a secret of its tenant
// that the tenant marked node-readable, sealed to the one-use key the
// request names (internal/nodesecret). The checks, in order: the peer is a
// node by its certificate, the request is well formed, its time is within
// RenewSkew, its signature verifies with the presented certificate's key,
// the node is not retired, its nonce is new, and the secret is readable by
// it. Every outcome writes one audit row (secrets.fetch), and nothing else
// but the nonce: a verified request's nonce is used even when the secret is
// refused, so it cannot be replayed after a grant. The value appears in no
// log and no row.
func (g *Gateway) FetchSecret(ctx context.Context, req *agentv1.FetchSecretRequest) (*agentv1.FetchSecretResponse, error) {
	ident, leaf, err := g.peerIdentity(ctx)
	if err != nil {
		return nil, g.refused(g.log.With("rpc", "FetchSecret", "peer", peerAddr(ctx)), "secret fetch refused", err)
	}
	log := g.log.With("rpc", "FetchSecret", "node", ident.NodeID)
	ref := truncateMessage(req.GetRef())
	if err := decodeError(req); err != nil {
		return nil, g.fetchRefused(ctx, log, ident.NodeID, ref, refuseFetch(codes.InvalidArgument, FetchReasonInvalid, "%v", status.Convert(err).Message()))
	}
	if g.cfg.OpenNodeSecret == nil {
		return nil, status.Error(codes.Unimplemented, "this gateway serves no secrets")
	}
	now := g.cfg.Clock.Now()
	if r := g.checkFetch(ident, leaf.PublicKey, req, now); r != nil {
		return nil, g.fetchRefused(ctx, log, ident.NodeID, ref, r)
	}
	var (
		resp    *agentv1.FetchSecretResponse
		refusal *fetchRefusal
	)
	err = g.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		resp, refusal = nil, nil
		n, err := fleet.NodeStatusGet(ctx, tx, ident.NodeID)
		if errors.Is(err, store.ErrNotFound) || (err == nil && n.State == "retired") {
			return refuseFetch(codes.PermissionDenied, FetchReasonNodeRetired, "node %s is not a live node", ident.NodeID)
		}
		if err != nil {
			return err
		}
		err = g.cfg.Authority.UseNonce(ctx, tx, req.GetNonce(), now.Add(2*g.cfg.RenewSkew))
		if errors.Is(err, ErrReplay) {
			// The failed insert ends the transaction on PostgreSQL: the
			// audit row goes in one of its own.
			return refuseFetch(codes.PermissionDenied, FetchReasonReplay, "nonce: already used")
		}
		if err != nil {
			return err
		}
		audit := envelope.AuditEntry{
			ID: envelope.NewID("aud", now), Time: now, TenantID: n.TenantID, PrincipalID: ident.NodeID, PrincipalKind: "node",
			Action: "secrets.fetch", ResourceType: "Secret", ResourceID: "unknown",
		}
		v, err := g.cfg.OpenNodeSecret(ctx, tx, n.TenantID, req.GetRef())
		switch {
		case errors.Is(err, ErrSecretNotFound):
			refusal = errSecretNotFound(ref)
			audit.Decision, audit.Result = envelope.DecisionDeny, codes.NotFound.String()
			audit.Detail = fetchDetail(ident.NodeID, ref, 0, refusal)
		case err != nil:
			return err
		default:
			enc, ct, err := nodesecret.Seal(req.GetRecipientPublicKey(), nodesecret.Binding{
				TrustDomain: g.cfg.Authority.TrustDomain(), NodeID: ident.NodeID, Ref: req.GetRef(), Version: v.Version, Nonce: req.GetNonce(),
			}, v.Value)
			clear(v.Value)
			if err != nil {
				return err
			}
			resp = &agentv1.FetchSecretResponse{Version: v.Version, EncapsulatedKey: enc, Ciphertext: ct}
			audit.ResourceID, audit.Decision, audit.Result = v.ID, envelope.DecisionAllow, codes.OK.String()
			audit.Detail = fetchDetail(ident.NodeID, ref, v.Version, nil)
		}
		return g.cfg.Recorder.InsertAudits(ctx, tx, []envelope.AuditEntry{audit})
	})
	var r *fetchRefusal
	switch {
	case errors.As(err, &r):
		return nil, g.fetchRefused(ctx, log, ident.NodeID, ref, r)
	case err != nil:
		return nil, g.refused(log, "secret fetch failed", err)
	case refusal != nil:
		log.Warn("secret fetch refused", "ref", ref, "reason", refusal.reason)
		return nil, refusal.status()
	}
	log.Info("secret fetched", "ref", ref, "version", resp.GetVersion())
	return resp, nil
}

// checkFetch is FetchSecret's checks that need no database: the role, the
// request's shape, its time and its signature.
func (g *Gateway) checkFetch(ident NodeIdentity, pub any, req *agentv1.FetchSecretRequest, now time.Time) *fetchRefusal {
	if ident.Role != RoleNode {
		// A site agent or a commissioning ramdisk runs no tenant workload.
		return refuseFetch(codes.PermissionDenied, FetchReasonWrongRole, "only nodes fetch secrets; this certificate's role is %s", ident.Role)
	}
	switch {
	case !strings.HasPrefix(req.GetRef(), "secret://") || len(req.GetRef()) > maxSecretRefBytes:
		return refuseFetch(codes.InvalidArgument, FetchReasonInvalid, "ref: must be secret://<name>")
	case len(req.GetNonce()) < nodesecret.MinNonceBytes || len(req.GetNonce()) > nodesecret.MaxNonceBytes:
		return refuseFetch(codes.InvalidArgument, FetchReasonInvalid, "nonce: must be %d-%d random bytes", nodesecret.MinNonceBytes, nodesecret.MaxNonceBytes)
	case req.GetTime() == nil || req.GetTime().CheckValid() != nil:
		return refuseFetch(codes.InvalidArgument, FetchReasonInvalid, "time: required")
	}
	if err := nodesecret.CheckRecipient(req.GetRecipientPublicKey()); err != nil {
		return refuseFetch(codes.InvalidArgument, FetchReasonInvalid, "recipient_public_key: %v", err)
	}
	if d := req.GetTime().AsTime().Sub(now); d > g.cfg.RenewSkew || d < -g.cfg.RenewSkew {
		return refuseFetch(codes.InvalidArgument, FetchReasonStaleTime, "time: %v from the gateway's clock (at most %v)", d.Round(time.Second), g.cfg.RenewSkew)
	}
	if err := nodesecret.Verify(pub, g.cfg.Authority.TrustDomain(), ident.NodeID, req); err != nil {
		return refuseFetch(codes.PermissionDenied, FetchReasonSignature, "signature: does not verify with the presented certificate's key")
	}
	return nil
}

// fetchDetail is an audit row's detail: who asked for what, and the
// decision's reason. Never the value.
func fetchDetail(nodeID, ref string, version int64, r *fetchRefusal) string {
	if r == nil {
		return truncateMessage(fmt.Sprintf("node %s fetched %s version %d", nodeID, ref, version))
	}
	return truncateMessage(fmt.Sprintf("node %s was refused %s: %s: %s", nodeID, ref, r.reason, r.msg))
}

// fetchRefused writes the audit row of a fetch refused before (or by the
// rollback of) its transaction, in a transaction of its own, and returns
// the refusal as the node gets it.
func (g *Gateway) fetchRefused(ctx context.Context, log interface {
	Warn(string, ...any)
	Error(string, ...any)
}, nodeID, ref string, r *fetchRefusal) error {
	log.Warn("secret fetch refused", "ref", ref, "reason", r.reason, "err", r.msg)
	now := g.cfg.Clock.Now()
	err := g.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		tenant := ""
		if n, err := fleet.NodeStatusGet(ctx, tx, nodeID); err == nil {
			tenant = n.TenantID
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		return g.cfg.Recorder.InsertAudits(ctx, tx, []envelope.AuditEntry{{
			ID: envelope.NewID("aud", now), Time: now, TenantID: tenant, PrincipalID: nodeID, PrincipalKind: "node",
			Action: "secrets.fetch", ResourceType: "Secret", ResourceID: "unknown", Decision: envelope.DecisionDeny,
			Result: r.code.String(), Detail: fetchDetail(nodeID, ref, 0, r),
		}})
	})
	if err != nil && status.Code(err) != codes.Canceled {
		log.Error("audit a refused secret fetch", "err", err)
	}
	return r.status()
}
