package metal

import (
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/metal/bmc"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/store"
)

// Two-phase BMC password rotation. The control plane generates the new
// password and seals it into the machine's pending slot; the site agent's
// bmc.rotate command names the current and the pending credential by
// reference only, and both are opened as the gateway delivers it over the
// agent's mTLS session. The agent sets the new password, logs in with it
// and signs its final update with its node key. The pending credential
// becomes current only in the workflow's ending transaction, and only when
// that signed report is there and verifies; anything else keeps the old
// password current, clears the slot and holds the machine in maintenance.

// The rotation's operation, step kind and site command kind.
const (
	OpRotateBMC      = "rotate-bmc"
	KindBMCRotate    = "bmc.rotate" // one of fleet.DestructiveKinds
	CommandBMCRotate = "bmc.rotate" // one of fleet.SiteCommandKinds
)

// rotateFrom are the states a rotation starts from: any idle machine not
// retired. The machine keeps its state.
var rotateFrom = powerFrom

// rotatingDrivers are the BMC drivers whose site-agent driver sets
// passwords (bmc.PasswordSetter).
var rotatingDrivers = []string{"ipmi"}

// passwordAlphabet is what a generated password is drawn from: letters and
// digits only, which every BMC's password rules accept.
const passwordAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

// GeneratePassword returns n random characters of passwordAlphabet with at
// least one upper-case letter, one lower-case letter and one digit (BMCs
// with complexity rules refuse less). 16 characters carry about 95 bits.
func GeneratePassword(n int) (string, error) {
	if n < 3 {
		return "", fmt.Errorf("a password needs at least 3 characters, not %d", n)
	}
	limit := big.NewInt(int64(len(passwordAlphabet)))
	for {
		b := make([]byte, n)
		for i := range b {
			k, err := rand.Int(rand.Reader, limit)
			if err != nil {
				return "", err
			}
			b[i] = passwordAlphabet[k.Int64()]
		}
		s := string(b)
		if strings.ContainsAny(s, passwordAlphabet[:26]) && strings.ContainsAny(s, passwordAlphabet[26:52]) &&
			strings.ContainsAny(s, passwordAlphabet[52:]) {
			return s, nil
		}
	}
}

// RotateBMCPassword starts a BMC password rotation on an idle machine: a
// one-step workflow whose new password becomes current only on the site
// agent's signed success.
func (s *MachineService) RotateBMCPassword(ctx context.Context, req *connect.Request[apiv1.RotateBMCPasswordRequest]) (*connect.Response[apiv1.RotateBMCPasswordResponse], error) {
	return start(ctx, s, req, req.Msg.GetTenant(), req.Msg.GetMachine(), OpRotateBMC, nil,
		func(ctx context.Context, tx *envelope.Tx, m *Machine) (map[string]any, error) {
			if err := quorumGateKind(ctx, tx, m, KindBMCRotate, "rotate-bmc"); err != nil {
				return nil, err
			}
			return s.rt.preparePending(ctx, tx, m)
		},
		func(m *apiv1.Machine) *apiv1.RotateBMCPasswordResponse {
			return &apiv1.RotateBMCPasswordResponse{Machine: m}
		})
}

// preparePending seals a new password into the machine's pending slot and
// returns the workflow's input: the pending credential's reference.
func (r *Runtime) preparePending(ctx context.Context, tx store.Tx, m *Machine) (map[string]any, error) {
	if !slices.Contains(rotatingDrivers, m.BMCDriver) {
		return nil, &envelope.Error{Code: envelope.CodeFailedPrecondition,
			Message: fmt.Sprintf("machine %s's BMC (%s) cannot have its password rotated: rotation speaks %v", m.Name, m.BMCDriver, rotatingDrivers),
			Violations: []envelope.Violation{{Field: "machine",
				Reason: fmt.Sprintf("its BMC driver %s does not set passwords (rotation speaks %v)", m.BMCDriver, rotatingDrivers)}}}
	}
	if r == nil || r.sealer == nil {
		return nil, envelope.Errorf(envelope.CodeFailedPrecondition,
			"a new BMC password cannot be sealed: the control plane runs without BETTER_COMPUTE_SECRET")
	}
	pw, err := GeneratePassword(bmc.MaxIPMIPassword)
	if err != nil {
		return nil, fmt.Errorf("generate a BMC password: %w", err)
	}
	now := r.clock.Now()
	ref := envelope.NewID(CredentialIDPrefix, now)
	sealed, err := r.sealer.Seal(sealRef(ref), []byte(pw))
	if err != nil {
		return nil, fmt.Errorf("seal the new BMC credential: %w", err)
	}
	if err := MachineBMCPendingSet(ctx, tx, m.ID, ref, sealed, now); err != nil {
		return nil, err
	}
	m.BMCPendingRef, m.BMCPendingCredential = ref, sealed
	return map[string]any{"pending_ref": ref}, nil
}

// RotateBMCTx starts a BMC password rotation on a tenant's machine in the
// caller's transaction (a quorum batch's bmc.rotate leaf) and returns its
// workflow id. It refuses what RotateBMCPassword refuses.
func (r *Runtime) RotateBMCTx(ctx context.Context, tx *envelope.Tx, tenantID, machineID string) (string, error) {
	m, err := MachineGet(ctx, tx, tenantID, machineID, store.ForUpdate(tx))
	if errors.Is(err, store.ErrNotFound) {
		return "", envelope.NotFound("machine", machineID)
	}
	if err != nil {
		return "", err
	}
	if err := idle(m, OpRotateBMC); err != nil {
		return "", err
	}
	if !slices.Contains(rotateFrom, m.State) {
		return "", envelope.Errorf(envelope.CodeFailedPrecondition, "machine %s is %s: %s starts from %s", m.Name, m.State, OpRotateBMC, stateList(rotateFrom))
	}
	input, err := r.preparePending(ctx, tx, &m)
	if err != nil {
		return "", err
	}
	w, err := r.Engine.StartTx(ctx, tx.Tx, provision.StartParams{TenantID: m.TenantID, TargetID: m.ID, Profile: OpRotateBMC,
		Input: input, CreatedBy: tx.Caller().Principal.ID})
	if err != nil {
		return "", err
	}
	m.WorkflowID, m.Operation, m.UpdateTime = w.ID, OpRotateBMC, tx.Now()
	if err := MachineUpdate(ctx, tx, &m); err != nil {
		return "", err
	}
	tx.Emit(envelope.Event{Type: "machine.bmc_rotation_requested", TenantID: m.TenantID, ResourceType: "Machine", ResourceID: m.ID,
		Data: map[string]any{"state": string(m.State), "operation": OpRotateBMC, "workflow_id": w.ID, "pending_ref": m.BMCPendingRef}})
	return w.ID, nil
}

// MachineLeafTx runs a quorum batch's machine leaf by its kind: a power
// action or a BMC password rotation (quorum.Machines).
func (r *Runtime) MachineLeafTx(ctx context.Context, tx *envelope.Tx, tenantID, machineID, kind string) (string, error) {
	if kind == KindBMCRotate {
		return r.RotateBMCTx(ctx, tx, tenantID, machineID)
	}
	return r.PowerTx(ctx, tx, tenantID, machineID, strings.TrimPrefix(kind, "power."))
}

// inMaintenance refuses every operation but a rotation on a machine a
// failed rotation left in maintenance.
func inMaintenance(m Machine, op string) error {
	if m.MaintenanceReason == "" || op == OpRotateBMC || op == OpLeaseTeardown && m.LeaseID != "" {
		return nil
	}
	return envelope.Errorf(envelope.CodeFailedPrecondition,
		"machine %s is in maintenance: %s; fix the BMC, then end it with a successful machines rotate-bmc before %s",
		m.Name, m.MaintenanceReason, op)
}

// dispatchRotate turns a rotation step into a bmc.rotate command for the
// site's lease holder, once per idempotency key. The command names the
// current and the pending credential by reference; no password, sealed or
// not, is in its row.
func (s *SiteCommands) dispatchRotate(ctx context.Context, t Target, run provision.StepRun) (provision.Dispatched, error) {
	pending, _ := run.Input["pending_ref"].(string)
	var out provision.Dispatched
	err := s.r.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		now := s.r.clock.Now()
		l, err := BootLeaseGet(ctx, tx, t.SiteID, store.ForUpdate(tx))
		if errors.Is(err, store.ErrNotFound) || err == nil && !l.Live(now) {
			return fmt.Errorf("%w: site %s has no connected site agent (none holds its boot lease)", provision.ErrNotDispatched, t.SiteID)
		}
		if err != nil {
			return err
		}
		m, err := MachineByID(ctx, tx, t.MachineID, "")
		if err != nil {
			return err
		}
		if m.SiteID != t.SiteID || m.State == StateRetired {
			return fmt.Errorf("%w: machine %s is not an enrolled machine of site %s", provision.ErrNotDispatched, t.MachineID, t.SiteID)
		}
		if pending == "" || m.BMCPendingRef != pending {
			return fmt.Errorf("%w: machine %s holds no pending BMC credential %q", provision.ErrNotDispatched, m.ID, pending)
		}
		d := SiteDispatch{IdempotencyKey: run.IdempotencyKey, SiteID: t.SiteID, MachineID: m.ID, NodeID: l.HolderNodeID,
			CommandID: envelope.NewID(fleet.CommandIDPrefix, now), Epoch: l.Epoch, CreateTime: now}
		stored, inserted, err := SiteDispatchInsert(ctx, tx, &d)
		if err != nil {
			return err
		}
		if !inserted {
			if stored.CommandID == "" {
				return fmt.Errorf("%w: key %s is fenced", provision.ErrNotDispatched, run.IdempotencyKey)
			}
			out.Handle = stored.CommandID
			return nil
		}
		// Checked for a new key only (a repeat was sent, whatever the
		// agent reports now); returning rolls the dispatch row back.
		if why, err := holderLacksDriver(ctx, tx, l, m); err != nil || why != "" {
			return cmp.Or(err, fmt.Errorf("%w: %s", provision.ErrNotDispatched, why))
		}
		deadline := run.Deadline
		if deadline.IsZero() {
			deadline = now.Add(5 * time.Minute)
		}
		c, err := s.insertKeyed(ctx, tx, l, d.CommandID, CommandBMCRotate, run.IdempotencyKey, map[string]any{
			"epoch": l.Epoch, "machine_id": m.ID, "mac": m.MAC, "pending_ref": pending,
			"bmc": map[string]any{"driver": m.BMCDriver, "address": m.BMCAddress, "username": m.BMCUsername,
				"credential_ref": m.BMCCredentialRef}}, deadline)
		if err != nil {
			return err
		}
		out.Handle = c.ID
		return nil
	})
	return out, err
}

// rotateParams opens a bmc.rotate's credentials at delivery, by the
// references it carries: the current password and the pending one, each
// only while the machine still holds it under that reference.
func (s *SiteCommands) rotateParams(m Machine, p map[string]any) error {
	bmcp, _ := p["bmc"].(map[string]any)
	pending, _ := p["pending_ref"].(string)
	if bmcp == nil || s.r.sealer == nil {
		return errors.New("no BMC credential to open (no sealer or no bmc params)")
	}
	if ref, _ := bmcp["credential_ref"].(string); ref != m.BMCCredentialRef {
		return fmt.Errorf("%w: machine %s's current BMC credential is no longer %s", fleet.ErrCommandFenced, m.ID, ref)
	}
	if pending == "" || pending != m.BMCPendingRef {
		return fmt.Errorf("%w: machine %s holds no pending BMC credential %q", fleet.ErrCommandFenced, m.ID, pending)
	}
	cur, err := s.r.sealer.Open(sealRef(m.BMCCredentialRef), m.BMCCredential)
	if err != nil {
		return fmt.Errorf("open the BMC credential: %w", err)
	}
	next, err := s.r.sealer.Open(sealRef(m.BMCPendingRef), m.BMCPendingCredential)
	if err != nil {
		return fmt.Errorf("open the pending BMC credential: %w", err)
	}
	bmcp["password"], bmcp["new_password"] = string(cur), string(next)
	return nil
}

// SetNodeRoots hands the runtime the node CA pool a site agent's signed
// report must chain to before a rotation's new password becomes current.
// Without it no rotation succeeds.
func (r *Runtime) SetNodeRoots(fn func() *x509.CertPool) { r.nodeRoots = fn }

// rotationEnded settles a rotation when its workflow ends, in the
// workflow's transaction: the pending credential becomes current on a
// verified signed success; otherwise the old one stays, the slot is
// cleared and the machine goes into maintenance with the reason.
func (r *Runtime) rotationEnded(ctx context.Context, tx store.Tx, m *Machine, w provision.Workflow, steps []provision.WorkflowStep) error {
	now := r.clock.Now()
	pending, _ := w.Input["pending_ref"].(string)
	reason := ""
	var step *provision.WorkflowStep
	for i := range steps {
		if steps[i].Kind == KindBMCRotate && steps[i].Phase == provision.PhaseMain {
			step = &steps[i]
		}
	}
	switch {
	case w.State != provision.WorkflowSucceeded:
		reason = "BMC password rotation failed: " + w.Reason
		if w.State == provision.WorkflowCancelled {
			reason = "BMC password rotation was cancelled"
		}
		if step != nil && step.Logs != "" {
			reason += " (" + step.Logs + ")"
		}
		if step != nil && step.Dispatched {
			// The agent may have reached the BMC before it failed, was
			// stopped, or timed out.
			reason += "; check that the BMC still takes the current password"
		}
	case step == nil || pending == "":
		reason = "BMC password rotation ended without its step or pending credential"
	default:
		cmd, err := stepCommand(ctx, tx, *step)
		if err != nil {
			return err
		}
		if err := r.verifyRotation(ctx, tx, cmd, pending); err != nil {
			reason = fmt.Sprintf("the site agent's success was not accepted: %v; the BMC may now hold the new password, which was discarded", err)
			break
		}
		ok, err := MachineBMCPromote(ctx, tx, m.ID, pending, now)
		if err != nil {
			return err
		}
		if !ok {
			reason = "the pending BMC credential " + pending + " was gone when the rotation succeeded"
			break
		}
		m.BMCCredentialRef, m.BMCPendingRef, m.BMCPendingCredential = pending, "", nil
		m.MaintenanceReason, m.MaintenanceTime, m.UpdateTime = "", nil, now
		if err := MachineUpdate(ctx, tx, m); err != nil {
			return err
		}
		return r.event(ctx, tx, m, "machine.bmc_rotated", map[string]any{"workflow_id": w.ID, "credential_ref": pending})
	}
	if err := MachineBMCPendingClear(ctx, tx, m.ID, now); err != nil {
		return err
	}
	m.BMCPendingRef, m.BMCPendingCredential = "", nil
	m.MaintenanceReason, m.MaintenanceTime, m.UpdateTime = truncateReason(reason), &now, now
	if err := MachineUpdate(ctx, tx, m); err != nil {
		return err
	}
	return r.event(ctx, tx, m, "machine.maintenance", map[string]any{"workflow_id": w.ID, "reason": m.MaintenanceReason,
		"credential_ref": m.BMCCredentialRef})
}

func (r *Runtime) event(ctx context.Context, tx store.Tx, m *Machine, typ string, data map[string]any) error {
	if r.rec == nil {
		return nil
	}
	data["state"] = string(m.State)
	return r.rec.InsertEvents(ctx, tx, []envelope.Event{{Type: typ, TenantID: m.TenantID, ResourceType: "Machine",
		ResourceID: m.ID, Time: m.UpdateTime, Data: data}})
}

// maxReason bounds a maintenance reason (it quotes the agent's message).
const maxReason = 2 << 10

func truncateReason(s string) string {
	if len(s) <= maxReason {
		return s
	}
	return s[:maxReason] + "…"
}

// verifyRotation checks the site agent's own word that the new password
// logs in: the signed final update the gateway kept for the command
// (node_reports), made by the node the command went to, with a key whose
// certificate chains to the node CA and names that node, saying the
// command succeeded with a verified login for this pending credential.
// The command row's state alone is not trusted: a database writer could
// set it.
func (r *Runtime) verifyRotation(ctx context.Context, tx store.Tx, commandID, pending string) error {
	if commandID == "" {
		return errors.New("no command carried the rotation")
	}
	if r.nodeRoots == nil || r.nodeRoots() == nil {
		return errors.New("this control plane has no node CA to check the site agent's signature against")
	}
	c, err := fleet.CommandGet(ctx, tx, "", commandID)
	if err != nil {
		return fmt.Errorf("command %s: %w", commandID, err)
	}
	reports, err := fleet.NodeReportsFor(ctx, tx, commandID)
	if err != nil {
		return err
	}
	var errs []error
	for _, rep := range reports {
		if rep.Kind != "command.succeeded" {
			continue
		}
		err := checkRotationReport(rep, r.nodeRoots(), c.NodeID, commandID, pending)
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return errors.New("no node-signed success report for the command")
	}
	return errors.Join(errs...)
}

// checkRotationReport verifies one kept report (see verifyRotation).
func checkRotationReport(rep fleet.NodeReport, roots *x509.CertPool, nodeID, commandID, pending string) error {
	u, err := checkReport(rep, roots, nodeID, commandID)
	if err != nil {
		return err
	}
	res := u.GetResult().AsMap()
	switch {
	case res["login_verified"] != true:
		return errors.New("the report does not say the new password logs in")
	case res["pending_ref"] != pending:
		return fmt.Errorf("the report is about credential %v, not %s", res["pending_ref"], pending)
	}
	return nil
}

// checkReport verifies a kept report of a node's final command update: the
// certificate chains to the node CA and names nodeID, the signature
// verifies, and the signed update says command commandID succeeded.
func checkReport(rep fleet.NodeReport, roots *x509.CertPool, nodeID, commandID string) (*agentv1.CommandUpdate, error) {
	if rep.NodeID != nodeID {
		return nil, fmt.Errorf("the report is node %s's, not %s's", rep.NodeID, nodeID)
	}
	cert, err := x509.ParseCertificate(rep.CertDER)
	if err != nil {
		return nil, fmt.Errorf("the report's certificate: %w", err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
		CurrentTime: rep.CreateTime}); err != nil {
		return nil, fmt.Errorf("the report's certificate does not chain to the node CA: %w", err)
	}
	if !slices.ContainsFunc(cert.URIs, func(u *url.URL) bool {
		return strings.HasSuffix(u.String(), "/node/"+nodeID)
	}) {
		return nil, fmt.Errorf("the report's certificate does not name node %s", nodeID)
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("the report's key is %T", cert.PublicKey)
	}
	sum := sha256.Sum256(rep.Signed)
	if !ecdsa.VerifyASN1(pub, sum[:], rep.Signature) {
		return nil, errors.New("the report's signature does not verify")
	}
	u, signer, err := signedUpdate(rep.Signed)
	if err != nil {
		return nil, err
	}
	switch {
	case signer != nodeID:
		return nil, fmt.Errorf("the report was signed as node %s", signer)
	case u.GetCommandId() != commandID:
		return nil, fmt.Errorf("the report is about command %s", u.GetCommandId())
	case u.GetState() != agentv1.CommandState_COMMAND_STATE_SUCCEEDED:
		return nil, fmt.Errorf("the report says %s", u.GetState())
	}
	return u, nil
}

// signedUpdate decodes the bytes a node signed for a CommandUpdate
// (nodesig.Bytes: the context, trust domain, node id and message type,
// each length-prefixed, then the message) and returns it with the node id.
func signedUpdate(b []byte) (*agentv1.CommandUpdate, string, error) {
	var fields [4]string
	for i := range fields {
		if len(b) < 4 {
			return nil, "", errors.New("the signed report is truncated")
		}
		n := binary.BigEndian.Uint32(b)
		if uint64(n) > uint64(len(b)-4) {
			return nil, "", errors.New("the signed report is truncated")
		}
		fields[i], b = string(b[4:4+n]), b[4+n:]
	}
	u := &agentv1.CommandUpdate{}
	if fields[3] != string(u.ProtoReflect().Descriptor().FullName()) {
		return nil, "", fmt.Errorf("the signed report is a %s, not a command update", fields[3])
	}
	if err := proto.Unmarshal(b, u); err != nil {
		return nil, "", fmt.Errorf("the signed report: %w", err)
	}
	return u, fields[2], nil
}
