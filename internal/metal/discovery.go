package metal

// Discovery tokens: how a machine's commissioning ramdisk joins.

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/erase"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/store"
)

// DiscoveryTokenPrefix starts a discovery token: "bcdt_<pin>.<secret>",
// the pin (the sha256 of the gateway's trust anchor, 64 hex) so the
// ramdisk can dial the gateway before it has a trust bundle, the secret 32
// random bytes in base64url. It fits an iPXE kernel command line.
const DiscoveryTokenPrefix = "bcdt_"

// DiscoveryTTL bounds a discovery token: the boot and the ramdisk's join
// (the await step allows 20 minutes) must happen within it.
const DiscoveryTTL = 30 * time.Minute

const discoveryIDPrefix = "dtok"

// DiscoveryClaim is a discovery token a join presented and the machine it
// boots.
type DiscoveryClaim struct {
	TokenID     string
	MachineID   string
	MachineName string
	TenantID    string
	SiteID      string
	WorkflowID  string
	// NodeID is set on a retry of a join that was admitted: the same
	// ramdisk (the same CSR) asks again.
	NodeID string
}

// DiscoveryRefusal is a join refused for its discovery token: replayed,
// from another MAC, expired, unknown. It names what the operator needs
// and is audited by the caller.
type DiscoveryRefusal struct {
	TokenID   string
	MachineID string
	TenantID  string
	Reason    string
}

func (e *DiscoveryRefusal) Error() string { return e.Reason }

// discoveryPin returns the gateway pin tokens carry, "" when none is
// configured (then no token is minted: an in-process site agent's ramdisk
// needs none).
func (r *Runtime) discoveryPin() string {
	if r.pin == nil {
		return ""
	}
	return r.pin()
}

// mintDiscovery makes the token for a ramdisk boot of m under its active
// workflow. Earlier unused tokens of the machine are deleted: only the
// latest boot's token admits a ramdisk.
func (r *Runtime) mintDiscovery(ctx context.Context, m Machine) (string, error) {
	pin := r.discoveryPin()
	if pin == "" {
		return "", nil
	}
	var secret [32]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return "", err
	}
	s := base64.RawURLEncoding.EncodeToString(secret[:])
	sum := sha256.Sum256([]byte(s))
	err := r.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		now := r.clock.Now()
		return discoveryTokenReplace(ctx, tx, envelope.NewID(discoveryIDPrefix, now), hex.EncodeToString(sum[:]), m, now, now.Add(DiscoveryTTL))
	})
	if err != nil {
		return "", fmt.Errorf("mint a discovery token: %w", err)
	}
	return DiscoveryTokenPrefix + pin + "." + s, nil
}

// IsDiscoveryToken reports whether a join token is a discovery token.
func IsDiscoveryToken(token string) bool { return strings.HasPrefix(token, DiscoveryTokenPrefix) }

// discoverySecretSHA returns the stored hash of a token's secret.
func discoverySecretSHA(token string) (string, error) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(token), DiscoveryTokenPrefix)
	if !ok {
		return "", errors.New("not a discovery token")
	}
	_, secret, ok := strings.Cut(rest, ".")
	if !ok || secret == "" || len(secret) > 128 {
		return "", errors.New("malformed discovery token")
	}
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:]), nil
}

func sameMAC(a, b string) bool {
	ha, err1 := net.ParseMAC(a)
	hb, err2 := net.ParseMAC(b)
	return err1 == nil && err2 == nil && strings.EqualFold(ha.String(), hb.String())
}

// ClaimDiscoveryTx checks a discovery token for a ramdisk's join, in the
// join's transaction: known, not expired, bound to one of macs, for the
// machine's boot that is still on, and unused or used by this same CSR (a
// retry). It marks the token used; a refusal is a *DiscoveryRefusal and
// writes nothing.
func (r *Runtime) ClaimDiscoveryTx(ctx context.Context, tx store.Tx, token string, macs []string, csrSHA string) (DiscoveryClaim, error) {
	sha, err := discoverySecretSHA(token)
	if err != nil {
		return DiscoveryClaim{}, &DiscoveryRefusal{Reason: err.Error()}
	}
	var (
		c         DiscoveryClaim
		mac       string
		expire    time.Time
		used      *time.Time
		boundCSR  string
		tokenNode string
	)
	err = discoveryTokenForUpdate(ctx, tx, sha).Scan(&c.TokenID, &c.MachineID, &c.SiteID, &mac, &c.WorkflowID, &expire, &used, &boundCSR, &tokenNode)
	if errors.Is(err, store.ErrNotFound) {
		return DiscoveryClaim{}, &DiscoveryRefusal{Reason: "unknown discovery token (its boot ended, or a later boot replaced it)"}
	}
	if err != nil {
		return DiscoveryClaim{}, err
	}
	m, err := MachineByID(ctx, tx, c.MachineID, "")
	if err != nil {
		return DiscoveryClaim{}, err
	}
	c.MachineName, c.TenantID = m.Name, m.TenantID
	refuse := func(format string, args ...any) (DiscoveryClaim, error) {
		return DiscoveryClaim{}, &DiscoveryRefusal{TokenID: c.TokenID, MachineID: c.MachineID, TenantID: c.TenantID,
			Reason: fmt.Sprintf(format, args...)}
	}
	bound := false
	for _, got := range macs {
		bound = bound || sameMAC(got, mac)
	}
	switch {
	case !r.clock.Now().Before(expire):
		return refuse("discovery token %s expired at %s", c.TokenID, expire.UTC().Format(time.RFC3339))
	case !bound:
		return refuse("discovery token %s is bound to machine %s's MAC; this ramdisk reports another", c.TokenID, m.Name)
	case used != nil && boundCSR == csrSHA && tokenNode != "":
		c.NodeID = tokenNode
		return c, nil
	case used != nil:
		return refuse("discovery token %s was already used", c.TokenID)
	case m.WorkflowID != c.WorkflowID:
		return refuse("discovery token %s is for a boot of machine %s that ended", c.TokenID, m.Name)
	}
	n, err := discoveryTokenUse(ctx, tx, c.TokenID, r.clock.Now(), csrSHA)
	if err != nil {
		return DiscoveryClaim{}, err
	}
	if n != 1 {
		return refuse("discovery token %s was already used", c.TokenID)
	}
	return c, nil
}

// DiscoveryJoinedTx records the ramdisk node that joined with a claimed
// token and its public key (PKIX DER, the key of its CSR and so of its
// certificate, which signs its wipe records), and ends the machine's wait
// for its ramdisk, in the join's transaction.
func (r *Runtime) DiscoveryJoinedTx(ctx context.Context, tx store.Tx, c DiscoveryClaim, nodeID string, publicKeyDER []byte) error {
	if err := discoveryTokenJoined(ctx, tx, c.TokenID, nodeID, base64.StdEncoding.EncodeToString(publicKeyDER)); err != nil {
		return err
	}
	return r.ramdiskJoinedTx(ctx, tx, c.MachineID, c.WorkflowID, nodeID)
}

func (r *Runtime) ramdiskJoinedTx(ctx context.Context, tx store.Tx, machineID, workflowID, nodeID string) error {
	m, err := MachineByID(ctx, tx, machineID, "")
	if err != nil {
		return err
	}
	if r.rec != nil {
		if err := r.rec.InsertEvents(ctx, tx, []envelope.Event{{Type: "machine.ramdisk_joined", TenantID: m.TenantID,
			ResourceType: "Machine", ResourceID: m.ID, Time: r.clock.Now(),
			Data: map[string]any{"node_id": nodeID, "workflow_id": workflowID}}}); err != nil {
			return err
		}
	}
	_, err = r.Engine.SignalProvingTx(ctx, tx, machineID, provision.KindAwaitRejoin, KindPowerCycle, provision.Result{})
	return err
}

// JoinedRamdisk is Joined for an in-process site agent that plays the
// ramdisk itself (bctest.SimSite): it records publicKeyDER as the key of
// the machine's ramdisk for its active workflow, as a discovery join
// would. Only code in the control plane's process can call it.
func (r *Runtime) JoinedRamdisk(ctx context.Context, siteID, machineID string, publicKeyDER []byte) error {
	return r.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		m, err := MachineByID(ctx, tx, machineID, "")
		if errors.Is(err, store.ErrNotFound) || err == nil && m.SiteID != siteID {
			return envelope.Errorf(envelope.CodePermissionDenied, "machine %s is not enrolled at site %s", machineID, siteID)
		}
		if err != nil {
			return err
		}
		if m.WorkflowID == "" {
			return envelope.Errorf(envelope.CodeFailedPrecondition, "machine %s runs no workflow", m.Name)
		}
		now := r.clock.Now()
		var secret [32]byte
		if _, err := rand.Read(secret[:]); err != nil {
			return err
		}
		if err := discoveryTokenInsertUsed(ctx, tx, envelope.NewID(discoveryIDPrefix, now), hex.EncodeToString(secret[:]), m, now,
			base64.StdEncoding.EncodeToString(publicKeyDER)); err != nil {
			return err
		}
		return r.ramdiskJoinedTx(ctx, tx, m.ID, m.WorkflowID, "")
	})
}

// attestedWipe verifies a disk.wipe step's output: a record signed by the
// key of the ramdisk that joined for this workflow, naming this machine
// and workflow, attesting every drive. It returns the erase record the
// machine shows.
func attestedWipe(out map[string]any, ramdiskKey []byte, machineID, workflowID string) (map[string]any, error) {
	signed, err := erase.FromOutput(out)
	if err != nil {
		return nil, err
	}
	if err := erase.Verify(ramdiskKey, signed); err != nil {
		return nil, err
	}
	if signed.Record.MachineID != machineID || signed.Record.WorkflowID != workflowID {
		return nil, fmt.Errorf("%w: the record is for machine %s, workflow %s", erase.ErrIncomplete, signed.Record.MachineID, signed.Record.WorkflowID)
	}
	rec := signed.Output()
	body, _ := rec["record"].(map[string]any)
	body["signature"], body["attested"] = rec["signature"], true
	return body, nil
}

// refuseWipe fails a machine whose wipe result did not verify, audits the
// refusal and emits machine.failed, in the workflow's transaction.
func (r *Runtime) refuseWipe(ctx context.Context, tx store.Tx, m *Machine, op, step string, cause error) error {
	now := r.clock.Now()
	m.State = StateFailed
	m.FailedOperation, m.FailedStep = op, step
	m.FailureReason = "the wipe result was refused: " + cause.Error()
	m.FailureLogs = ""
	if err := MachineUpdate(ctx, tx, m); err != nil {
		return err
	}
	r.log.Warn("wipe result refused", "machine", m.ID, "err", cause)
	if r.rec == nil {
		return nil
	}
	if err := r.rec.InsertAudits(ctx, tx, []envelope.AuditEntry{{
		ID: envelope.NewID("aud", now), Time: now, TenantID: m.TenantID, PrincipalID: "system:metal", PrincipalKind: "system",
		Action: "machines.attestWipe", ResourceType: "Machine", ResourceID: m.ID, Decision: envelope.DecisionDeny,
		Result: string(envelope.CodePermissionDenied), Detail: m.FailureReason,
	}}); err != nil {
		return err
	}
	return r.rec.InsertEvents(ctx, tx, []envelope.Event{{Type: "machine.failed", TenantID: m.TenantID, ResourceType: "Machine",
		ResourceID: m.ID, Time: now, Data: map[string]any{"state": string(m.State), "operation": op, "failed_step": step,
			"reason": m.FailureReason}}})
}
