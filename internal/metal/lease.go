package metal

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/erase"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/steprecord"
	"github.com/better-compute/better-compute/internal/store"
)

// Dedicated-root leases (binding "machine"). A lessee tenant gets a whole
// machine deployed with its own signed image and root by its own SSH key;
// the deployed OS gets no platform join token, so nothing it says reaches
// the platform's trust (and the platform never takes an attestation from
// it). The release is a teardown whose every step leaves evidence signed
// by someone the control plane can check — the site agent's node key for
// BMC steps, the ramdisk's join key for what ran on the machine — and the
// machine is ready again only when all of it verified and its firmware
// matches the baseline its commissioning recorded. Anything less holds the
// machine in maintenance (quarantine) under the lease.

// Lease operations, the machine state of a machine under a lease and the
// boot that fences it off the provisioning network.
const (
	OpLeaseDeploy         = "lease-deploy"
	OpLeaseTeardown       = "lease-teardown"
	StateLeased     State = "leased"
	// BootFenced: the site's iPXE decision treats the machine as unknown
	// (it waits, booting nothing) until a teardown step boots it into the
	// platform's ramdisk.
	BootFenced = "fenced"
)

// Lease states. Every state but returned holds the machine (one such lease
// per machine: a partial unique index); returned is the end.
const (
	LeaseOffered     = "offered"
	LeaseDeploying   = "deploying"
	LeaseActive      = "active"
	LeaseFailed      = "failed"
	LeaseReleasing   = "releasing"
	LeaseQuarantined = "quarantined"
	LeaseReturned    = "returned"
)

// leaseReleasableFrom are the lease states a release starts the teardown
// from: a quarantined lease may be torn down again once the cause is fixed.
var leaseReleasableFrom = []string{LeaseOffered, LeaseActive, LeaseFailed, LeaseQuarantined}

// leaseOp reports whether op is one of a lease's own workflows.
func leaseOp(op string) bool { return op == OpLeaseDeploy || op == OpLeaseTeardown }

// Teardown step names: each leaves one evidence row.
const (
	stepFence       = "fence"
	stepBootRamdisk = "boot-ramdisk"
	stepJoined      = "ramdisk-joined"
	stepFirmware    = "firmware"
	stepErase       = "erase"
	stepDiagnostics = "gpu-diagnostics"
	stepPowerOff    = "power-off"
	stepRotate      = "rotate-bmc"
)

// TeardownSteps lists the teardown's steps in order: all of them must leave
// verified evidence before the machine is ready again.
var TeardownSteps = []string{stepFence, stepBootRamdisk, stepJoined, stepFirmware, stepErase, stepDiagnostics, stepPowerOff, stepRotate}

// firmwareOf is an inventory's firmware section (BIOS and board), the
// part a baseline holds; nil when it reports none.
func firmwareOf(inv map[string]any) map[string]any {
	fw, _ := inv["firmware"].(map[string]any)
	if len(fw) == 0 {
		return nil
	}
	return fw
}

// firmwareDrift describes how got differs from the baseline ("" when it
// does not).
func firmwareDrift(baseline, got map[string]any) string {
	keys := slices.Sorted(maps.Keys(baseline))
	for k := range got {
		if _, ok := baseline[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var diffs []string
	for _, k := range slices.Compact(keys) {
		b, g := fmt.Sprint(baseline[k]), fmt.Sprint(got[k])
		if b != g {
			diffs = append(diffs, fmt.Sprintf("%s %q → %q", k, b, g))
		}
	}
	return strings.Join(diffs, ", ")
}

// OfferTx puts a ready machine (locked by the caller) under a new lease
// offered to lesseeTenantID. It checks what the teardown will need — a BMC
// whose password rotates and a signed firmware baseline — so that a lease
// is never granted on a machine that could not be given back. Nothing runs
// on the machine until the lessee accepts.
func (r *Runtime) OfferTx(ctx context.Context, tx *envelope.Tx, m *Machine, lesseeTenantID, by string) (Lease, error) {
	l := Lease{LesseeTenantID: lesseeTenantID, CreatedBy: by}
	ev, err := r.offer(ctx, tx, m, &l, StateReady, tx.Now())
	if err != nil {
		return Lease{}, err
	}
	tx.Emit(ev)
	return l, nil
}

// offer puts m, in state from, under the new lease l.
func (r *Runtime) offer(ctx context.Context, tx store.Tx, m *Machine, l *Lease, from State, now time.Time) (envelope.Event, error) {
	if err := idle(*m, OpLeaseDeploy); err != nil {
		return envelope.Event{}, err
	}
	if err := inMaintenance(*m, OpLeaseDeploy); err != nil {
		return envelope.Event{}, err
	}
	if m.LeaseID != "" {
		return envelope.Event{}, envelope.Errorf(envelope.CodeFailedPrecondition, "machine %s is already under lease %s", m.Name, m.LeaseID)
	}
	if m.State != from {
		return envelope.Event{}, envelope.Errorf(envelope.CodeFailedPrecondition, "machine %s is %s: a lease starts from %s", m.Name, m.State, from)
	}
	if !slices.Contains(rotatingDrivers, m.BMCDriver) {
		return envelope.Event{}, &envelope.Error{Code: envelope.CodeFailedPrecondition,
			Message: fmt.Sprintf("machine %s cannot be leased: its teardown rotates the BMC password, which its %s BMC does not set", m.Name, m.BMCDriver),
			Violations: []envelope.Violation{{Field: "machine",
				Reason: fmt.Sprintf("its BMC driver %s does not set passwords (rotation speaks %v)", m.BMCDriver, rotatingDrivers)}}}
	}
	if len(m.FirmwareBaseline) == 0 {
		return envelope.Event{}, &envelope.Error{Code: envelope.CodeFailedPrecondition,
			Message:    fmt.Sprintf("machine %s has no firmware baseline: commission it (with a ramdisk that signs its inventory) first", m.Name),
			Violations: []envelope.Violation{{Field: "machine", Reason: "no signed firmware baseline from a commissioning"}}}
	}
	l.ID, l.MachineID, l.OwnerTenantID, l.State, l.CreateTime, l.UpdateTime = envelope.NewID(LeaseIDPrefix, now), m.ID, m.TenantID, LeaseOffered, now, now
	if err := LeaseInsert(ctx, tx, l); err != nil {
		if errors.Is(err, store.ErrUnique) {
			return envelope.Event{}, envelope.Errorf(envelope.CodeFailedPrecondition, "machine %s is already under a lease", m.Name)
		}
		return envelope.Event{}, err
	}
	m.LeaseID, m.UpdateTime = l.ID, now
	if err := MachineUpdate(ctx, tx, m); err != nil {
		return envelope.Event{}, err
	}
	data := map[string]any{}
	if l.ReservationID != "" {
		data["reservation_id"] = l.ReservationID
	}
	return leaseEvent("machine_lease.offered", *l, data), nil
}

// OfferForReservation leases the machine behind nodeID to a tenant's
// binding machine reservation: the machine must be deployed (the node is
// its platform OS) and leasable as for an owner's offer. The lessee
// accepts it (AcceptLease) with its image and root key.
func (r *Runtime) OfferForReservation(ctx context.Context, tx store.Tx, reservationID, tenantID, nodeID string, now time.Time) (string, error) {
	// The machine a deploy's own join token admitted the node for, not
	// what a label says: anyone may label a node.
	machineID, err := machineOfNode(ctx, tx, nodeID)
	if err != nil {
		return "", err
	}
	if machineID == "" {
		return "", envelope.Errorf(envelope.CodeFailedPrecondition, "node %s did not join from a machine's deploy: there is no machine to lease", nodeID)
	}
	m, err := MachineByID(ctx, tx, machineID, store.ForUpdate(tx))
	if errors.Is(err, store.ErrNotFound) {
		return "", envelope.Errorf(envelope.CodeFailedPrecondition, "node %s's machine %s is gone", nodeID, machineID)
	}
	if err != nil {
		return "", err
	}
	l := Lease{LesseeTenantID: tenantID, CreatedBy: "system:capacity", ReservationID: reservationID, NodeID: nodeID}
	ev, err := r.offer(ctx, tx, &m, &l, StateDeployed, now)
	if err != nil {
		return "", err
	}
	return l.ID, r.record(ctx, tx, now, ev)
}

// record writes events outside a request's envelope.
func (r *Runtime) record(ctx context.Context, tx store.Tx, now time.Time, evs ...envelope.Event) error {
	if r.rec == nil {
		return nil
	}
	for i := range evs {
		evs[i].Time = now
	}
	return r.rec.InsertEvents(ctx, tx, evs)
}

// AcceptTx is the lessee's acceptance of an offered lease: it verifies the
// lessee's image (signed by a key on the lessee's or the platform's
// allowlist), retires whatever platform node identity the machine still
// has, and starts the lease's deploy with root's SSH key and no join
// token.
func (r *Runtime) AcceptTx(ctx context.Context, tx *envelope.Tx, l *Lease, image, sshKey, by string) error {
	if l.State != LeaseOffered {
		return envelope.Errorf(envelope.CodeFailedPrecondition, "lease %s is %s: only an offered lease is accepted", l.ID, l.State)
	}
	m, err := MachineByID(ctx, tx, l.MachineID, store.ForUpdate(tx))
	if err != nil {
		return err
	}
	if err := idle(m, OpLeaseDeploy); err != nil {
		return err
	}
	from := StateReady
	if l.ReservationID != "" {
		from = StateDeployed // a reservation leases the machine behind a node
	}
	if m.LeaseID != l.ID || m.State != from {
		return envelope.Errorf(envelope.CodeFailedPrecondition, "lease %s's machine is %s, not %s under the lease", l.ID, m.State, from)
	}
	input, err := deployImage(ctx, tx, &m, l.LesseeTenantID, image)
	if err != nil {
		return err
	}
	now := tx.Now()
	// The platform's identity on the machine ends before the lessee's OS
	// is written: the nodes a platform deploy joined as are retired (their
	// certificates no longer renew or open sessions).
	if err := r.retireDeployed(ctx, tx, m.ID); err != nil {
		return err
	}
	if l.NodeID != "" && r.ended != nil {
		if err := r.ended(ctx, tx, []string{l.NodeID}); err != nil {
			return err
		}
	}
	input["lease_id"], input["ssh_authorized_key"] = l.ID, sshKey
	w, err := r.Engine.StartTx(ctx, tx.Tx, provision.StartParams{TenantID: cmp.Or(m.TenantID, "platform"), TargetID: m.ID,
		Profile: OpLeaseDeploy, Input: input, CreatedBy: by})
	if err != nil {
		return err
	}
	m.State, m.WorkflowID, m.Operation, m.UpdateTime = StateDeploying, w.ID, OpLeaseDeploy, now
	if err := MachineUpdate(ctx, tx, &m); err != nil {
		return err
	}
	img, _ := input["image"].(map[string]any)
	l.ImageID, l.ImageName = m.ImageID, m.ImageName
	l.ImageSHA256, _ = img["sha256"].(string)
	l.SSHKeyFingerprint = sshFingerprint(sshKey)
	l.State, l.UpdateTime = LeaseDeploying, now
	if err := LeaseUpdate(ctx, tx, l); err != nil {
		return err
	}
	tx.Emit(leaseEvent("machine_lease.deploying", *l, map[string]any{"workflow_id": w.ID}))
	tx.Emit(envelope.Event{Type: "machine." + string(StateDeploying), TenantID: m.TenantID, ResourceType: "Machine", ResourceID: m.ID,
		Data: map[string]any{"state": string(m.State), "from": string(from), "operation": OpLeaseDeploy, "workflow_id": w.ID, "lease_id": l.ID}})
	if l.ReservationID != "" && r.LeaseHooks.Deploying != nil {
		return r.LeaseHooks.Deploying(ctx, tx.Tx, l.ReservationID, l.ID)
	}
	return nil
}

// sshFingerprint is OpenSSH's SHA256 fingerprint of a key line.
func sshFingerprint(line string) string {
	f := strings.Fields(line)
	if len(f) < 2 {
		return ""
	}
	blob, err := base64.StdEncoding.DecodeString(f[1])
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(blob)
	return "SHA256:" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// retireDeployed retires the nodes a platform deploy of the machine joined
// as.
func (r *Runtime) retireDeployed(ctx context.Context, tx store.Tx, machineID string) error {
	nodes, err := deployedNodes(ctx, tx, machineID)
	if err != nil || len(nodes) == 0 || r.ended == nil {
		return err
	}
	return r.ended(ctx, tx, nodes)
}

// ReleaseLeaseTx starts a lease's teardown: the machine is fenced off the
// provisioning network at once (its site boot record), a new BMC password
// is sealed as pending, and the teardown workflow runs. A reservation's
// lease is released by releasing the reservation (which ends the lessee's
// use and its metering with it), once the reservation has ended.
func (r *Runtime) ReleaseLeaseTx(ctx context.Context, tx *envelope.Tx, l *Lease, by string) error {
	if l.ReservationID != "" && r.LeaseHooks.Live != nil {
		live, err := r.LeaseHooks.Live(ctx, tx.Tx, l.ReservationID)
		if err != nil {
			return err
		}
		if live {
			return &envelope.Error{Code: envelope.CodeFailedPrecondition,
				Message:    fmt.Sprintf("lease %s binds reservation %s: release the reservation (reservations release %s)", l.ID, l.ReservationID, l.ReservationID),
				Violations: []envelope.Violation{{Field: "lease", Reason: "bound to a live reservation"}}}
		}
	}
	evs, err := r.releaseLease(ctx, tx.Tx, l, by, tx.Now())
	for _, e := range evs {
		tx.Emit(e)
	}
	return err
}

// ReleaseForReservation tears down the lease of a binding machine
// reservation that ended (withdraws it when never accepted). A lease still
// deploying is torn down when its deploy ends; one already releasing,
// quarantined or returned is left as it is.
func (r *Runtime) ReleaseForReservation(ctx context.Context, tx store.Tx, reservationID, reason string, now time.Time) error {
	l, err := LeaseOfReservation(ctx, tx, reservationID, store.ForUpdate(tx))
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	by := "system:capacity (reservation " + reservationID + " " + reason + ")"
	switch l.State {
	case LeaseDeploying:
		// Released when the deploy ends (leaseEnded).
		l.ReleasedBy, l.UpdateTime = by, now
		return LeaseUpdate(ctx, tx, &l)
	case LeaseReleasing, LeaseQuarantined, LeaseReturned:
		return nil
	}
	evs, err := r.releaseLease(ctx, tx, &l, by, now)
	if err != nil {
		return err
	}
	return r.record(ctx, tx, now, evs...)
}

// releaseLease starts l's teardown (or withdraws an offer nobody accepted).
func (r *Runtime) releaseLease(ctx context.Context, tx store.Tx, l *Lease, by string, now time.Time) ([]envelope.Event, error) {
	if !slices.Contains(leaseReleasableFrom, l.State) {
		return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "lease %s is %s: a release starts from %s", l.ID, l.State,
			strings.Join(leaseReleasableFrom, ", "))
	}
	m, err := MachineByID(ctx, tx, l.MachineID, store.ForUpdate(tx))
	if err != nil {
		return nil, err
	}
	if err := idle(m, OpLeaseTeardown); err != nil {
		return nil, err
	}
	if m.LeaseID != l.ID {
		return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "machine %s is not under lease %s", m.Name, l.ID)
	}
	if l.State == LeaseOffered {
		// Never accepted: nothing of the lessee's reached the machine.
		m.LeaseID, m.UpdateTime = "", now
		if err := MachineUpdate(ctx, tx, &m); err != nil {
			return nil, err
		}
		l.State, l.ReleasedBy, l.ReleaseTime, l.EndTime, l.UpdateTime = LeaseReturned, by, &now, &now, now
		l.Reason = "withdrawn before it was accepted"
		if err := LeaseUpdate(ctx, tx, l); err != nil {
			return nil, err
		}
		return []envelope.Event{leaseEvent("machine_lease.returned", *l, map[string]any{"reason": l.Reason})}, nil
	}
	input, err := r.preparePending(ctx, tx, &m)
	if err != nil {
		return nil, err
	}
	// Cut the provisioning network first: from now on the site boots the
	// machine into nothing but the teardown's own ramdisk.
	if err := MachineBootSet(ctx, tx, m.ID, BootFenced, now); err != nil {
		return nil, err
	}
	if err := r.Sites.pushIfLeased(ctx, tx, m.SiteID); err != nil {
		return nil, err
	}
	input["lease_id"], input["burn_in"] = l.ID, true
	w, err := r.Engine.StartTx(ctx, tx, provision.StartParams{TenantID: cmp.Or(m.TenantID, "platform"), TargetID: m.ID,
		Profile: OpLeaseTeardown, Input: input, CreatedBy: by})
	if err != nil {
		return nil, err
	}
	from := m.State
	m.State, m.WorkflowID, m.Operation, m.UpdateTime = StateReleasing, w.ID, OpLeaseTeardown, now
	if err := MachineUpdate(ctx, tx, &m); err != nil {
		return nil, err
	}
	l.State, l.ReleasedBy, l.ReleaseTime, l.UpdateTime, l.Reason = LeaseReleasing, by, &now, now, ""
	if err := LeaseUpdate(ctx, tx, l); err != nil {
		return nil, err
	}
	return []envelope.Event{leaseEvent("machine_lease.releasing", *l, map[string]any{"workflow_id": w.ID}),
		{Type: "machine." + string(StateReleasing), TenantID: m.TenantID, ResourceType: "Machine", ResourceID: m.ID,
			Data: map[string]any{"state": string(m.State), "from": string(from), "operation": OpLeaseTeardown, "workflow_id": w.ID, "lease_id": l.ID}}}, nil
}

// leaseEvent is an event about a lease, for its lessee.
func leaseEvent(typ string, l Lease, data map[string]any) envelope.Event {
	data["state"], data["machine_id"] = l.State, l.MachineID
	return envelope.Event{Type: typ, TenantID: l.LesseeTenantID, ResourceType: "MachineLease", ResourceID: l.ID, Data: data}
}

// leaseEnded settles a lease's workflow in its ending transaction.
func (r *Runtime) leaseEnded(ctx context.Context, tx store.Tx, m *Machine, w provision.Workflow, steps []provision.WorkflowStep,
	ramdiskKey []byte, failedLogs string) error {
	now := r.clock.Now()
	l, err := LeaseByID(ctx, tx, m.LeaseID, store.ForUpdate(tx))
	if err != nil {
		return fmt.Errorf("machine %s's lease %s: %w", m.ID, m.LeaseID, err)
	}
	if w.Profile == OpLeaseDeploy {
		if w.State == provision.WorkflowSucceeded {
			m.State, l.State = StateDeployed, LeaseActive
			m.FailedOperation, m.FailedStep, m.FailureReason, m.FailureLogs = "", "", "", ""
		} else {
			// What the lessee's image left on the disk is the teardown's to
			// erase: the lease stays, failed, until it is released.
			m.State, l.State = StateFailed, LeaseFailed
			m.FailedOperation, m.FailedStep, m.FailureReason, m.FailureLogs = w.Profile, w.FailedStep, cmp.Or(w.Reason, string(w.State)), failedLogs
			l.Reason = "the deploy failed at " + w.FailedStep + ": " + m.FailureReason
		}
		if err := r.saveLease(ctx, tx, m, &l, now); err != nil {
			return err
		}
		return r.deployEnded(ctx, tx, &l, now)
	}

	ev, promoted, err := r.teardownEvidence(ctx, tx, m, l.ID, w, steps, ramdiskKey)
	if err != nil {
		return err
	}
	for i := range ev {
		if err := EvidenceUpsert(ctx, tx, &ev[i]); err != nil {
			return err
		}
	}
	if promoted {
		m.BMCCredentialRef, m.BMCPendingRef, m.BMCPendingCredential = w.Input["pending_ref"].(string), "", nil
	} else if m.BMCPendingRef != "" {
		if err := MachineBMCPendingClear(ctx, tx, m.ID, now); err != nil {
			return err
		}
		m.BMCPendingRef, m.BMCPendingCredential = "", nil
	}
	var missing []string
	for _, e := range ev {
		if !e.Verified {
			missing = append(missing, e.Step+": "+e.Detail)
		}
	}
	if w.State == provision.WorkflowSucceeded && len(missing) == 0 {
		if err := r.unpinImage(ctx, tx, m); err != nil {
			return err
		}
		m.State, m.LeaseID, m.RescueExpireTime = StateReady, "", nil
		m.FailedOperation, m.FailedStep, m.FailureReason, m.FailureLogs = "", "", "", ""
		m.MaintenanceReason, m.MaintenanceTime = "", nil
		l.State, l.EndTime, l.Reason = LeaseReturned, &now, ""
		return r.saveLease(ctx, tx, m, &l, now)
	}
	// Quarantine: the machine stays under the lease, failed and in
	// maintenance, and runs nothing but another teardown (or a rotation).
	reason := "the teardown did not complete"
	if w.State != provision.WorkflowSucceeded {
		reason = fmt.Sprintf("the teardown failed at %s: %s", w.FailedStep, cmp.Or(w.Reason, string(w.State)))
	}
	if len(missing) > 0 {
		reason += "; evidence missing or refused: " + strings.Join(missing, "; ")
	}
	reason = truncateReason("lease " + l.ID + " quarantined: " + reason)
	m.State = StateFailed
	m.FailedOperation, m.FailedStep, m.FailureReason, m.FailureLogs = w.Profile, cmp.Or(w.FailedStep, firstStep(missing)), reason, failedLogs
	m.MaintenanceReason, m.MaintenanceTime = reason, &now
	l.State, l.Reason = LeaseQuarantined, reason
	return r.saveLease(ctx, tx, m, &l, now)
}

// deployEnded tells a reservation how its lease's deploy ended, and tears
// the lease down at once when the reservation ended while it deployed.
func (r *Runtime) deployEnded(ctx context.Context, tx store.Tx, l *Lease, now time.Time) error {
	if l.ReservationID == "" {
		return nil
	}
	if l.ReleasedBy != "" {
		evs, err := r.releaseLease(ctx, tx, l, l.ReleasedBy, now)
		if err != nil {
			return err
		}
		return r.record(ctx, tx, now, evs...)
	}
	h := r.LeaseHooks
	if l.State == LeaseActive && h.Active != nil {
		return h.Active(ctx, tx, l.ReservationID, l.ID)
	}
	if l.State == LeaseFailed && h.Failed != nil {
		return h.Failed(ctx, tx, l.ReservationID, l.ID, l.Reason)
	}
	return nil
}

func firstStep(missing []string) string {
	if len(missing) == 0 {
		return ""
	}
	s, _, _ := strings.Cut(missing[0], ":")
	return s
}

// saveLease writes the machine and the lease and tells both owners.
func (r *Runtime) saveLease(ctx context.Context, tx store.Tx, m *Machine, l *Lease, now time.Time) error {
	m.UpdateTime, l.UpdateTime = now, now
	if err := MachineUpdate(ctx, tx, m); err != nil {
		return err
	}
	if err := LeaseUpdate(ctx, tx, l); err != nil {
		return err
	}
	if r.rec == nil {
		return nil
	}
	data := map[string]any{"state": string(m.State), "lease_id": l.ID, "lease_state": l.State}
	if m.MaintenanceReason != "" {
		data["reason"] = m.MaintenanceReason
	}
	return r.rec.InsertEvents(ctx, tx, []envelope.Event{
		{Type: "machine." + string(m.State), TenantID: m.TenantID, ResourceType: "Machine", ResourceID: m.ID, Time: now, Data: data},
		func() envelope.Event {
			e := leaseEvent("machine_lease."+l.State, *l, map[string]any{})
			e.Time = now
			if l.Reason != "" {
				e.Data["reason"] = l.Reason
			}
			return e
		}(),
	})
}

// teardownEvidence checks each teardown step's evidence: the site agent's
// signed report for BMC steps, the ramdisk's signed records for what ran on
// the machine (and the firmware against the baseline), the ramdisk's join
// key for the join. It reports whether the BMC rotation verified and its
// pending credential became current.
func (r *Runtime) teardownEvidence(ctx context.Context, tx store.Tx, m *Machine, leaseID string, w provision.Workflow,
	steps []provision.WorkflowStep, ramdiskKey []byte) ([]Evidence, bool, error) {
	now := r.clock.Now()
	byName := map[string]provision.WorkflowStep{}
	for _, s := range steps {
		if s.Phase == provision.PhaseMain {
			byName[s.Name] = s
		}
	}
	keyFP := ""
	if len(ramdiskKey) > 0 {
		sum := sha256.Sum256(ramdiskKey)
		keyFP = hex.EncodeToString(sum[:])[:16]
	}
	promoted := false
	var out []Evidence
	for _, name := range TeardownSteps {
		s, ok := byName[name]
		e := Evidence{LeaseID: leaseID, Step: name, Kind: s.Kind, WorkflowID: w.ID, CreateTime: now}
		switch {
		case !ok:
			e.Detail = "the step is not in the workflow"
		case s.State != provision.StepSucceeded:
			e.Detail = "the step did not succeed (" + string(s.State) + ")"
			if s.Error != "" {
				e.Detail += ": " + s.Error
			}
		case name == stepJoined:
			if len(ramdiskKey) == 0 {
				e.Detail = "no ramdisk key is on record for this boot"
				break
			}
			sum := sha256.Sum256(ramdiskKey)
			e.Verified, e.Digest, e.Signer = true, hex.EncodeToString(sum[:]), "ramdisk key "+keyFP
			e.Detail = "the platform's ramdisk joined with a fresh discovery token"
		case name == stepErase:
			rec, err := attestedWipe(s.Output, ramdiskKey, m.ID, w.ID)
			if err != nil {
				e.Detail = "the wipe result was refused: " + err.Error()
				break
			}
			// The digest of the bytes the ramdisk signed: the record's
			// canonical encoding.
			signed, err := erase.FromOutput(s.Output)
			if err != nil {
				e.Detail = "the wipe result was refused: " + err.Error()
				break
			}
			sum := sha256.Sum256(signed.Record.Canonical())
			e.Verified, e.Digest, e.Signer = true, hex.EncodeToString(sum[:]), "ramdisk key "+keyFP
			e.Detail = "attested erase of every drive, read back as zeros"
			m.EraseRecord = rec
		case name == stepFirmware || name == stepDiagnostics:
			v, err := steprecord.Verify(ramdiskKey, s.Output, m.ID, w.ID, s.Kind)
			if err != nil {
				e.Detail = err.Error()
				break
			}
			e.Digest, e.Signer = v.Digest, "ramdisk key "+v.KeyFingerprint
			if name == stepDiagnostics {
				if passed, _ := v.Record.Output["passed"].(bool); !passed {
					e.Detail = "the diagnostics did not pass"
					break
				}
				e.Verified, e.Detail = true, "diagnostics passed"
				break
			}
			fw := firmwareOf(v.Record.Output)
			switch drift := firmwareDrift(m.FirmwareBaseline, fw); {
			case fw == nil:
				e.Detail = "the inventory reports no firmware"
			case drift != "":
				e.Detail = "firmware drifted from the commissioning baseline: " + drift
			default:
				e.Verified, e.Detail = true, "firmware matches the commissioning baseline"
			}
		case name == stepRotate:
			pending, _ := w.Input["pending_ref"].(string)
			cmd, err := stepCommand(ctx, tx, s)
			if err != nil {
				return nil, false, err
			}
			rep, err := r.verifiedRotation(ctx, tx, cmd, pending)
			if err != nil {
				e.Detail = "the BMC rotation was not accepted: " + err.Error()
				break
			}
			ok, err := MachineBMCPromote(ctx, tx, m.ID, pending, now)
			if err != nil {
				return nil, false, err
			}
			if !ok {
				e.Detail = "the pending BMC credential " + pending + " was gone"
				break
			}
			promoted = true
			e.Verified, e.Digest, e.Signer = true, rep.digest, rep.signer
			e.Detail = "the BMC takes a new password; the lessee's is gone"
		default:
			cmd, err := stepCommand(ctx, tx, s)
			if err != nil {
				return nil, false, err
			}
			rep, err := r.verifiedSiteReport(ctx, tx, cmd)
			if err != nil {
				e.Detail = "no verified site agent report: " + err.Error()
				break
			}
			e.Verified, e.Digest, e.Signer = true, rep.digest, rep.signer
			e.Detail = "the site agent's signed report"
			if name == stepFence {
				e.Detail = "powered off and fenced off the provisioning network; the site agent's signed report"
			}
		}
		e.Detail = truncateReason(e.Detail)
		out = append(out, e)
	}
	return out, promoted, nil
}

// stepCommand is the command a BMC step became: the site dispatch of its
// idempotency key, else the step's handle. The dispatch row is the one to
// trust: a fast site agent's result can end the step before the engine
// recorded the handle.
func stepCommand(ctx context.Context, q store.Querier, s provision.WorkflowStep) (string, error) {
	d, err := SiteDispatchGet(ctx, q, s.IdempotencyKey)
	switch {
	case err == nil && d.CommandID != "":
		return d.CommandID, nil
	case err == nil || errors.Is(err, store.ErrNotFound):
		return s.Handle, nil
	}
	return "", err
}

// siteReport is a verified node-signed report.
type siteReport struct {
	digest string
	signer string
}

// verifiedSiteReport finds the site agent's signed final update for the
// command a BMC step became and checks it (checkReport).
func (r *Runtime) verifiedSiteReport(ctx context.Context, tx store.Tx, commandID string) (siteReport, error) {
	if commandID == "" {
		return siteReport{}, errors.New("no command carried the step")
	}
	if r.nodeRoots == nil || r.nodeRoots() == nil {
		return siteReport{}, errors.New("this control plane has no node CA to check the site agent's signature against")
	}
	c, err := fleet.CommandGet(ctx, tx, "", commandID)
	if err != nil {
		return siteReport{}, fmt.Errorf("command %s: %w", commandID, err)
	}
	reports, err := fleet.NodeReportsFor(ctx, tx, commandID)
	if err != nil {
		return siteReport{}, err
	}
	var errs []error
	for _, rep := range reports {
		if rep.Kind != "command.succeeded" {
			continue
		}
		if _, err := checkReport(rep, r.nodeRoots(), c.NodeID, commandID); err != nil {
			errs = append(errs, err)
			continue
		}
		sum := sha256.Sum256(rep.Signed)
		return siteReport{digest: hex.EncodeToString(sum[:]), signer: "node/" + c.NodeID}, nil
	}
	if len(errs) == 0 {
		return siteReport{}, errors.New("no node-signed success report for the command")
	}
	return siteReport{}, errors.Join(errs...)
}

// verifiedRotation is verifyRotation with the report's digest and signer.
func (r *Runtime) verifiedRotation(ctx context.Context, tx store.Tx, commandID, pending string) (siteReport, error) {
	if err := r.verifyRotation(ctx, tx, commandID, pending); err != nil {
		return siteReport{}, err
	}
	return r.verifiedSiteReport(ctx, tx, commandID)
}

// signedFirmware is the firmware of a workflow's inventory step as the
// ramdisk signed it; nil when it is unsigned, does not verify or reports
// none.
func signedFirmware(steps []provision.WorkflowStep, ramdiskKey []byte, machineID, workflowID string) map[string]any {
	for _, s := range steps {
		if s.Kind != KindInventory || s.State != provision.StepSucceeded || s.Phase != provision.PhaseMain {
			continue
		}
		v, err := steprecord.Verify(ramdiskKey, s.Output, machineID, workflowID, KindInventory)
		if err != nil {
			return nil
		}
		return firmwareOf(v.Record.Output)
	}
	return nil
}
