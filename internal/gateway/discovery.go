package gateway

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/store"
)

// DiscoveryTokenPrefix starts a discovery token (metal mints them per
// ramdisk boot).
const DiscoveryTokenPrefix = "bcdt_"

// MachineLabel is the label of a ramdisk node naming its machine.
const MachineLabel = "bettercompute.io/machine"

// Discovery admits commissioning ramdisks that join with a machine's
// discovery token: the machine lifecycle (metal) implements it.
type Discovery interface {
	// ClaimDiscovery checks token for a join from an agent reporting macs
	// with the CSR of sha256 csrSHA, and marks it used, in tx. A refusal
	// is a *DiscoveryRefusedError.
	ClaimDiscovery(ctx context.Context, tx store.Tx, token string, macs []string, csrSHA string) (DiscoveryClaim, error)
	// DiscoveryJoined links the ramdisk node to its machine with the
	// public key of its CSR (PKIX DER) and ends the machine's wait, in tx.
	DiscoveryJoined(ctx context.Context, tx store.Tx, c DiscoveryClaim, nodeID string, publicKeyDER []byte) error
}

// DiscoveryClaim is a claimed discovery token.
type DiscoveryClaim struct {
	TokenID     string
	MachineID   string
	MachineName string
	TenantID    string
	SiteID      string
	WorkflowID  string
	// NodeID is set when the same ramdisk retries an admitted join.
	NodeID string
}

// DiscoveryRefusedError is a discovery join refused for its token.
type DiscoveryRefusedError struct {
	TokenID   string
	MachineID string
	TenantID  string
	Reason    string
}

func (e *DiscoveryRefusedError) Error() string { return e.Reason }

// platformTenant owns the ramdisk nodes of the platform's own machines
// (machines with no tenant), as it owns their workflows.
const platformTenant = "platform"

// joinDiscovery admits a commissioning ramdisk: the token must be a
// machine's live discovery token bound to a MAC the ramdisk reports, and
// unused (or used by this same CSR: a retry). The node is a ramdisk node
// linked to the machine; its certificate has the ramdisk role (at most
// 2 h). A refusal writes nothing but its audit row.
func (g *Gateway) joinDiscovery(ctx context.Context, req *agentv1.JoinRequest) (*agentv1.JoinResponse, error) {
	log := g.log.With("rpc", "Join", "peer", peerAddr(ctx), "discovery", true)
	refuse := func(r *DiscoveryRefusedError) error {
		g.auditDiscoveryRefusal(ctx, req, r)
		return g.refused(log, "join refused", denied("%s", r.Reason))
	}
	if roleOf(req.GetMode()) != RoleRamdisk {
		return nil, refuse(&DiscoveryRefusedError{Reason: fmt.Sprintf("a discovery token admits only a commissioning ramdisk; this agent asked to join as %s", roleOf(req.GetMode()))})
	}
	if g.cfg.Discovery == nil {
		return nil, refuse(&DiscoveryRefusedError{Reason: "this control plane admits no ramdisks by discovery token"})
	}
	csr, err := g.cfg.Authority.ParseCSR(req.GetCsrDer())
	if err != nil {
		return nil, g.refused(log, "join refused", invalid("csr_der: %v", err))
	}
	pub, err := x509.MarshalPKIXPublicKey(csr.PublicKey)
	if err != nil {
		return nil, g.refused(log, "join refused", invalid("csr_der: public key: %v", err))
	}
	sum := sha256.Sum256(csr.Raw)
	csrSHA := hex.EncodeToString(sum[:])
	var (
		claim   DiscoveryClaim
		nodeID  string
		created bool
	)
	err = g.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		created = false
		claim, err = g.cfg.Discovery.ClaimDiscovery(ctx, tx, req.GetToken(), req.GetIdentity().GetMacs(), csrSHA)
		if err != nil {
			return err
		}
		if claim.NodeID != "" {
			nodeID = claim.NodeID
			return nil
		}
		now := g.cfg.Clock.Now()
		nodeID = envelope.NewID(fleet.NodeIDPrefix, now)
		name, err := uniqueNodeName(ctx, tx, NodeName("ramdisk-"+claim.MachineName))
		if err != nil {
			return err
		}
		tenant := cmp.Or(claim.TenantID, platformTenant)
		labels := fmt.Sprintf(`{%q:%q}`, MachineLabel, claim.MachineID)
		// A ramdisk node lives for one boot: its hardware key is the
		// token's, so it never collides with the machine's own OS node.
		if err := fleet.NodeInsert(ctx, tx, &fleet.NodeInsertParams{
			ID: nodeID, Name: name, TenantID: tenant, Labels: labels, HardwareKey: "ramdisk:" + claim.TokenID,
			State: fleet.NodeJoining, Liveness: fleet.LivenessReady, Mode: RoleRamdisk, AgentVersion: req.GetAgentVersion(),
			LastHeartbeat: &now, CreateTime: now,
		}); err != nil {
			return err
		}
		if err := g.cfg.Discovery.DiscoveryJoined(ctx, tx, claim, nodeID, pub); err != nil {
			return err
		}
		created = true
		return g.cfg.Recorder.InsertEvents(ctx, tx, []envelope.Event{{
			Type: "node.joined", TenantID: tenant, ResourceType: "Node", ResourceID: nodeID, Time: now,
			Data: map[string]any{"name": name, "mode": RoleRamdisk, "machine_id": claim.MachineID, "discovery_token_id": claim.TokenID},
		}})
	})
	var refusal *DiscoveryRefusedError
	if errors.As(err, &refusal) {
		return nil, refuse(refusal)
	}
	if err != nil {
		return nil, g.refused(log, "join refused", err)
	}
	chain, notAfter, err := g.issue(ctx, csr.Raw, nodeID, RoleRamdisk)
	if err != nil {
		return nil, g.refused(log, "join: issue certificate", err)
	}
	log.Info("ramdisk admitted", "node", nodeID, "machine", claim.MachineID, "new", created)
	return &agentv1.JoinResponse{
		Status: agentv1.JoinStatus_JOIN_STATUS_ADMITTED, NodeId: nodeID, CertificateChain: chain,
		TrustBundlePem: g.cfg.Authority.TrustBundlePEM(), TrustDomain: g.cfg.Authority.TrustDomain(),
		NotAfter: timestamppb.New(notAfter), CommandTrust: g.commandTrust(),
	}, nil
}

// auditDiscoveryRefusal writes the audit row of a refused discovery join,
// in a transaction of its own (the join's rolled back).
func (g *Gateway) auditDiscoveryRefusal(ctx context.Context, req *agentv1.JoinRequest, r *DiscoveryRefusedError) {
	now := g.cfg.Clock.Now()
	resType, resID := "Machine", cmp.Or(r.MachineID, "unknown")
	detail := fmt.Sprintf("%s (peer %s, MACs %s, mode %s)", r.Reason, peerAddr(ctx), strings.Join(req.GetIdentity().GetMacs(), " "),
		roleOf(req.GetMode()))
	err := g.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return g.cfg.Recorder.InsertAudits(ctx, tx, []envelope.AuditEntry{{
			ID: envelope.NewID("aud", now), Time: now, TenantID: cmp.Or(r.TenantID, platformTenant),
			PrincipalID: "discovery:" + cmp.Or(r.TokenID, "unknown"), PrincipalKind: "node", Action: "nodes.join",
			ResourceType: resType, ResourceID: resID, Decision: envelope.DecisionDeny,
			Result: codes.PermissionDenied.String(), Detail: truncateMessage(detail),
		}})
	})
	if err != nil && status.Code(err) != codes.Canceled {
		g.log.Error("audit a refused discovery join", "err", err)
	}
}
