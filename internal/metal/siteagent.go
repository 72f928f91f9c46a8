package metal

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/metal/bmc"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/store"
)

// Command kinds the control plane sends a site agent (bcd --mode site).
const (
	// CommandBMCPower drives a machine's BMC: params epoch, machine_id,
	// mac, action (cycle or off), boot, and bmc {driver, address,
	// username, credential_ref} with the password sealed in the row
	// (credential_sealed) and opened only as the gateway delivers it.
	CommandBMCPower = "bmc.power" // one of fleet.SiteCommandKinds
	// CommandSiteMachines hands the site agent the enrolled machines of
	// its site with the boot of each: the only targets it accepts, and
	// what its iPXE scripts say.
	CommandSiteMachines = "site.machines"
)

// DefaultBootLeaseTTL is how long a site agent's boot lease lasts after
// its last heartbeat.
const DefaultBootLeaseTTL = 30 * time.Second

// SiteCommands is the SiteAgent of every site whose agent is bcd in site
// mode, connected through the gateway: a BMC step becomes a persisted
// command for the agent that holds the site's boot lease, keyed by the
// step's idempotency key, and its result comes back through the gateway
// (SiteCommandEnded). An in-process agent registered in Agents (such as
// bctest.SimSite) takes precedence for its site.
type SiteCommands struct {
	r        *Runtime
	ttl      time.Duration
	notifier fleet.CommandNotifier
	signer   fleet.CommandSigner
}

// SetSigner hands the replica's command signer: every site command is
// signed as it is inserted.
func (s *SiteCommands) SetSigner(sg fleet.CommandSigner) { s.signer = sg }

// SetNotifier hands the gateway that wakes a site agent's session once a
// command for it commits (nil: the session's next recheck finds it).
func (s *SiteCommands) SetNotifier(n fleet.CommandNotifier) { s.notifier = n }

func (s *SiteCommands) notify(tx store.Tx, nodeID string) {
	if s.notifier != nil {
		s.notifier.NotifyCommand(tx, nodeID)
	}
}

// errNoSiteAgent: no site agent ever held the site's boot lease, so
// nothing was sent through it.
var errNoSiteAgent = errors.New("no site agent")

// SiteAlive is BootLeaseRenew for the gateway's site hooks.
func (s *SiteCommands) SiteAlive(ctx context.Context, nodeID string) error {
	_, _, err := s.BootLeaseRenew(ctx, nodeID)
	return err
}

// BootLeaseRenew renews the boot lease of nodeID's site when nodeID holds it,
// takes it when it is free or expired (epoch + 1), and otherwise leaves
// nodeID a standby. The gateway calls it when a site agent's session opens
// and at each of its heartbeats. A new holder is sent its site's machines;
// the former holder's open BMC commands are canceled.
func (s *SiteCommands) BootLeaseRenew(ctx context.Context, nodeID string) (lease BootLease, held bool, err error) {
	err = s.r.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		lease, held = BootLease{}, false
		siteID, err := fleet.NodeSiteID(ctx, tx, nodeID)
		if err != nil {
			return err
		}
		if siteID == "" {
			return envelope.Errorf(envelope.CodePermissionDenied, "node %s joined with a token bound to no site: it cannot hold a boot lease", nodeID)
		}
		now := s.r.clock.Now()
		l, err := BootLeaseGet(ctx, tx, siteID, store.ForUpdate(tx))
		switch {
		case errors.Is(err, store.ErrNotFound):
			l = BootLease{SiteID: siteID, HolderNodeID: nodeID, Epoch: 1, AcquireTime: now, ExpireTime: now.Add(s.ttl)}
			ok, err := BootLeaseInsert(ctx, tx, &l)
			if err != nil {
				return err
			}
			if !ok {
				return nil // another agent of the site took it first: a standby
			}
			lease, held = l, true
			return s.acquired(ctx, tx, l, "")
		case err != nil:
			return err
		case l.Live(now) && l.HolderNodeID != nodeID:
			lease = l // a standby
			return nil
		case l.Live(now):
			l.ExpireTime = now.Add(s.ttl)
			if _, err := BootLeaseUpdate(ctx, tx, &l, l.Epoch); err != nil {
				return err
			}
			lease, held = l, true
			return nil
		}
		prev, from := l.HolderNodeID, l.Epoch
		l.HolderNodeID, l.Epoch, l.AcquireTime, l.ExpireTime = nodeID, l.Epoch+1, now, now.Add(s.ttl)
		ok, err := BootLeaseUpdate(ctx, tx, &l, from)
		if err != nil || !ok {
			return err
		}
		lease, held = l, true
		return s.acquired(ctx, tx, l, prev)
	})
	return lease, held, err
}

// acquired fences the former holder's BMC commands, hands the new holder
// its site's machines and records the takeover.
func (s *SiteCommands) acquired(ctx context.Context, tx store.Tx, l BootLease, prev string) error {
	if prev != "" {
		if _, err := fleet.CommandCancel(ctx, tx, &fleet.CommandCancelParams{NodeID: prev, Kind: CommandBMCPower,
			Message: fmt.Sprintf("the site's boot lease passed to %s under epoch %d", l.HolderNodeID, l.Epoch)}); err != nil {
			return err
		}
		s.notify(tx, prev)
	}
	if err := s.pushMachines(ctx, tx, l); err != nil {
		return err
	}
	if s.r.rec == nil {
		return nil
	}
	tenantID, err := SiteTenant(ctx, tx, l.SiteID)
	if err != nil {
		return err
	}
	return s.r.rec.InsertEvents(ctx, tx, []envelope.Event{{Type: "site.boot_lease_acquired", TenantID: tenantID,
		ResourceType: "Site", ResourceID: l.SiteID, Time: l.AcquireTime,
		Data: map[string]any{"node_id": l.HolderNodeID, "epoch": l.Epoch, "previous_node_id": prev}}})
}

// pushMachines queues the site's machine list for the lease holder.
func (s *SiteCommands) pushMachines(ctx context.Context, tx store.Tx, l BootLease) error {
	ms, err := SiteMachines(ctx, tx, l.SiteID)
	if err != nil {
		return err
	}
	list := make([]any, 0, len(ms))
	for _, m := range ms {
		e := map[string]any{"id": m.ID, "name": m.Name, "mac": m.MAC, "bmc_driver": m.BMCDriver,
			"bmc_address": m.BMCAddress, "state": string(m.State), "boot": m.Boot}
		if m.State == StateDeploying && m.ImageID != "" {
			// The site caches the image while the ramdisk boots.
			img, err := s.r.siteImage(ctx, tx, l.SiteID, l.HolderNodeID, m.ImageID)
			if err != nil {
				return err
			}
			if img != nil {
				e["image"] = img
			}
		}
		list = append(list, e)
	}
	_, err = s.insert(ctx, tx, l, CommandSiteMachines, "", map[string]any{"epoch": l.Epoch, "site_id": l.SiteID, "machines": list}, time.Time{})
	return err
}

// pushIfLeased sends the site's machine list to the holder of its boot
// lease, when one holds it now (a fence reaches the site's iPXE decision
// at once; without a holder the next holder gets the list on taking it).
func (s *SiteCommands) pushIfLeased(ctx context.Context, tx store.Tx, siteID string) error {
	l, err := BootLeaseGet(ctx, tx, siteID, store.ForUpdate(tx))
	if errors.Is(err, store.ErrNotFound) || err == nil && !l.Live(s.r.clock.Now()) {
		return nil
	}
	if err != nil {
		return err
	}
	return s.pushMachines(ctx, tx, l)
}

// insert queues a command for the lease holder and wakes its session.
func (s *SiteCommands) insert(ctx context.Context, tx store.Tx, l BootLease, kind, key string, params map[string]any, deadline time.Time) (fleet.Command, error) {
	return s.insertKeyed(ctx, tx, l, envelope.NewID(fleet.CommandIDPrefix, s.r.clock.Now()), kind, key, params, deadline)
}

// insertKeyed is insert with the command's id chosen by the caller (the
// one its site dispatch recorded).
func (s *SiteCommands) insertKeyed(ctx context.Context, tx store.Tx, l BootLease, id, kind, key string, params map[string]any, deadline time.Time) (fleet.Command, error) {
	n, err := fleet.NodeStatusGet(ctx, tx, l.HolderNodeID)
	if err != nil {
		return fleet.Command{}, fmt.Errorf("the boot lease holder %s: %w", l.HolderNodeID, err)
	}
	b, err := json.Marshal(params)
	if err != nil {
		return fleet.Command{}, err
	}
	now := s.r.clock.Now()
	if deadline.IsZero() {
		deadline = now.Add(5 * time.Minute)
	}
	c, _, err := fleet.CommandInsert(ctx, tx, &fleet.CommandInsertParams{ID: id,
		TenantID: n.TenantID, NodeID: n.ID, Kind: kind, Params: string(b), IdempotencyKey: key, CreatedBy: "system:metal",
		Deadline: deadline, CreateTime: now, Signer: s.signer})
	if err != nil {
		return fleet.Command{}, err
	}
	s.notify(tx, n.ID)
	return c, nil
}

// powerAction is the bmc.power action of a step kind.
func powerAction(kind string) (string, bool) {
	switch kind {
	case KindPowerCycle:
		return "cycle", true
	case KindPowerOff:
		return "off", true
	case KindPowerOn:
		return "on", true
	}
	return "", false
}

// discoverySealRef binds a sealed discovery token to the step key it was
// sent under.
func discoverySealRef(key string) string { return "machine-discovery/" + key }

// powerStatusWait bounds how long PowerStatus waits for the site agent's
// answer when the caller's context has no deadline.
const powerStatusWait = 30 * time.Second

// PowerStatus asks the site's lease holder to read a machine's power from
// its BMC: a bmc.power command with action status (a read, so no
// idempotency record), waited for until it ends or ctx does.
func (s *SiteCommands) PowerStatus(ctx context.Context, t Target) (bmc.PowerState, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, powerStatusWait)
		defer cancel()
	}
	var cmd fleet.Command
	err := s.r.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		now := s.r.clock.Now()
		l, err := BootLeaseGet(ctx, tx, t.SiteID, "")
		if errors.Is(err, store.ErrNotFound) || err == nil && !l.Live(now) {
			return envelope.Errorf(envelope.CodeUnavailable, "site %s has no connected site agent (none holds its boot lease)", t.SiteID)
		}
		if err != nil {
			return err
		}
		m, err := MachineByID(ctx, tx, t.MachineID, "")
		if err != nil {
			return err
		}
		if why, err := holderLacksDriver(ctx, tx, l, m); err != nil || why != "" {
			return cmp.Or[error](err, envelope.Errorf(envelope.CodeFailedPrecondition, "%s", why))
		}
		cmd, err = s.insert(ctx, tx, l, CommandBMCPower, "", map[string]any{"epoch": l.Epoch, "machine_id": m.ID, "mac": m.MAC,
			"action": "status", "bmc": map[string]any{"driver": m.BMCDriver, "address": m.BMCAddress, "username": m.BMCUsername,
				"credential_ref": m.BMCCredentialRef, "credential_sealed": base64.StdEncoding.EncodeToString(m.BMCCredential)}},
			now.Add(powerStatusWait))
		return err
	})
	if err != nil {
		return "", err
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		var c fleet.Command
		if err := s.r.db.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
			c, err = fleet.CommandGet(ctx, tx, cmd.TenantID, cmd.ID)
			return err
		}); err != nil {
			return "", err
		}
		switch o := commandOutcome(c); o.Status {
		case provision.OutcomeSucceeded:
			p, _ := o.Result.Output["power"].(string)
			return bmc.PowerState(p), nil
		case provision.OutcomeFailed, provision.OutcomeUnknown:
			return "", envelope.Errorf(envelope.CodeUnavailable, "the site agent could not read the BMC: %s", o.Result.Error)
		}
		select {
		case <-ctx.Done():
			return "", envelope.Errorf(envelope.CodeUnavailable, "the site agent did not answer in time: %v", ctx.Err())
		case <-tick.C:
		}
	}
}

// Dispatch turns a power step into a bmc.power command for the site's
// lease holder, once per idempotency key. Other kinds are the machine's
// ramdisk's, never the site agent's: they are refused as not dispatched.
func (s *SiteCommands) Dispatch(ctx context.Context, t Target, run provision.StepRun) (provision.Dispatched, error) {
	if run.Kind == KindBMCRotate {
		return s.dispatchRotate(ctx, t, run)
	}
	action, ok := powerAction(run.Kind)
	if run.Kind == KindDriverInvoke {
		var err error
		if action, err = driverAction(run); err != nil {
			return provision.Dispatched{}, err
		}
		ok = true
	}
	if !ok {
		return provision.Dispatched{}, fmt.Errorf("%w: the site agent of site %s carries BMC steps only, not %s", provision.ErrNotDispatched, t.SiteID, run.Kind)
	}
	boot, _ := run.Params["boot"].(string)
	switch action {
	case "cycle":
		// A cycle without a boot (machines power cycle) keeps the
		// machine's boot as it is.
		if boot != "" && boot != BootRamdisk && boot != BootRescue && boot != BootDisk {
			return provision.Dispatched{}, fmt.Errorf("%w: step %s: boot must be ramdisk, rescue or disk, got %q", provision.ErrNotDispatched, run.Name, boot)
		}
	case "off":
		// A lease's fence: off, and the site boots the machine into
		// nothing until the teardown boots its ramdisk.
		if boot != "" && boot != BootFenced {
			return provision.Dispatched{}, fmt.Errorf("%w: step %s: an off step's boot can only be fenced, got %q", provision.ErrNotDispatched, run.Name, boot)
		}
	default:
		boot = ""
	}
	var out provision.Dispatched
	err := s.r.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		now := s.r.clock.Now()
		// The lease row's lock orders a site's dispatches: the machine list
		// one pushes must see the boot another set just before it (two
		// machines cycled at once on PostgreSQL each pushed a list without
		// the other's boot, and the later list sent a ramdisk boot to disk).
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
			out.Handle = stored.CommandID // a repeat: sent once
			return nil
		}
		// Checked for a new key only (a repeat was sent, whatever the
		// agent reports now); returning rolls the dispatch row back.
		if why, err := holderLacksDriver(ctx, tx, l, m); err != nil || why != "" {
			return cmp.Or(err, fmt.Errorf("%w: %s", provision.ErrNotDispatched, why))
		}
		if boot != "" {
			// The boot goes to the site's iPXE decision before the power
			// cycle: commands reach the agent in sequence.
			if err := MachineBootSet(ctx, tx, m.ID, boot, now); err != nil {
				return err
			}
			if err := s.pushMachines(ctx, tx, l); err != nil {
				return err
			}
		}
		params := map[string]any{"epoch": l.Epoch, "machine_id": m.ID, "mac": m.MAC, "action": action, "boot": boot,
			"bmc": map[string]any{"driver": m.BMCDriver, "address": m.BMCAddress, "username": m.BMCUsername,
				"credential_ref": m.BMCCredentialRef, "credential_sealed": base64.StdEncoding.EncodeToString(m.BMCCredential)}}
		if t.DiscoveryToken != "" && (boot == BootRamdisk || boot == BootRescue) {
			// The ramdisk's discovery token goes to the site agent's iPXE
			// script with the cycle; like the BMC password it is sealed
			// in the row and opened only at delivery.
			if s.r.sealer == nil {
				return errors.New("no sealer (BETTER_COMPUTE_SECRET) to seal the discovery token")
			}
			sealed, err := s.r.sealer.Seal(discoverySealRef(run.IdempotencyKey), []byte(t.DiscoveryToken))
			if err != nil {
				return err
			}
			params["discovery_sealed"] = base64.StdEncoding.EncodeToString(sealed)
		}
		n, err := fleet.NodeStatusGet(ctx, tx, l.HolderNodeID)
		if err != nil {
			return err
		}
		b, err := json.Marshal(params)
		if err != nil {
			return err
		}
		deadline := run.Deadline
		if deadline.IsZero() {
			deadline = now.Add(5 * time.Minute)
		}
		if _, _, err := fleet.CommandInsert(ctx, tx, &fleet.CommandInsertParams{ID: d.CommandID, TenantID: n.TenantID, NodeID: n.ID,
			Kind: CommandBMCPower, Params: string(b), IdempotencyKey: run.IdempotencyKey, CreatedBy: "system:metal",
			Deadline: deadline, CreateTime: now, Signer: s.signer}); err != nil {
			return err
		}
		s.notify(tx, n.ID)
		out.Handle = d.CommandID
		return nil
	})
	return out, err
}

// Lookup answers from the command a key became. A key that never became
// one is fenced first, so a late Dispatch of it is refused; a command
// canceled, expired or interrupted may have reached the BMC, so its
// outcome is unknown.
func (s *SiteCommands) Lookup(ctx context.Context, t Target, run provision.StepRun) (provision.Outcome, error) {
	var out provision.Outcome
	err := s.r.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		d, err := SiteDispatchGet(ctx, tx, run.IdempotencyKey)
		if errors.Is(err, store.ErrNotFound) {
			if _, err := BootLeaseGet(ctx, tx, t.SiteID, ""); errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("site %s: %w connected yet", t.SiteID, errNoSiteAgent)
			} else if err != nil {
				return err
			}
			fence := SiteDispatch{IdempotencyKey: run.IdempotencyKey, SiteID: t.SiteID, MachineID: t.MachineID, CreateTime: s.r.clock.Now()}
			if d, _, err = SiteDispatchInsert(ctx, tx, &fence); err != nil {
				return err
			}
		} else if err != nil {
			return err
		}
		if d.CommandID == "" {
			out = provision.Outcome{Status: provision.OutcomeNotDispatched}
			return nil
		}
		c, err := fleet.CommandGet(ctx, tx, "", d.CommandID)
		if err != nil {
			return err
		}
		out = commandOutcome(c)
		return nil
	})
	return out, err
}

// commandOutcome maps a bmc.power command's row to the step's outcome.
func commandOutcome(c fleet.Command) provision.Outcome {
	o := provision.Outcome{Handle: c.ID}
	switch c.State {
	case fleet.CommandSucceeded:
		o.Status = provision.OutcomeSucceeded
		_ = json.Unmarshal([]byte(cmp.Or(c.Result, "{}")), &o.Result.Output)
	case fleet.CommandFailed:
		o.Status = provision.OutcomeFailed
		if c.FailureCode == failInterrupted {
			// bcd stopped while the BMC call was out: it may have acted.
			o.Status = provision.OutcomeUnknown
		}
		o.Result.Error = c.FailureCode + ": " + c.Message
		o.Result.Logs = c.Message
	case fleet.CommandCanceled, fleet.CommandExpired:
		o.Status = provision.OutcomeUnknown
		o.Result.Error = c.State + ": " + c.Message
	default:
		o.Status = provision.OutcomeRunning
	}
	return o
}

// failInterrupted is bcd's failure code for a command it stopped in the
// middle of (agent.FailInterrupted).
const failInterrupted = "INTERRUPTED"

// SiteCommandParams are the params a site agent's command is delivered
// with: a bmc.power command gets its BMC password opened, only while the
// agent still holds the lease under the command's epoch — otherwise
// fleet.ErrCommandFenced, and the command is not sent with a credential.
func (s *SiteCommands) SiteCommandParams(ctx context.Context, nodeID string, c fleet.Command) (string, error) {
	if c.Kind != CommandBMCPower && c.Kind != CommandBMCRotate {
		return c.Params, nil
	}
	var p map[string]any
	if err := json.Unmarshal([]byte(c.Params), &p); err != nil {
		return "", err
	}
	epoch, _ := p["epoch"].(float64)
	machineID, _ := p["machine_id"].(string)
	var (
		l BootLease
		m Machine
	)
	if err := s.r.db.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		if m, err = MachineByID(ctx, tx, machineID, ""); err != nil {
			return err
		}
		l, err = BootLeaseGet(ctx, tx, m.SiteID, "")
		return err
	}); errors.Is(err, store.ErrNotFound) {
		return "", fmt.Errorf("%w: machine %s or its site's lease is gone", fleet.ErrCommandFenced, machineID)
	} else if err != nil {
		return "", err
	}
	if l.HolderNodeID != nodeID || int64(epoch) != l.Epoch || !l.Live(s.r.clock.Now()) {
		return "", fmt.Errorf("%w: sent under epoch %d; the boot lease of site %s is epoch %d, held by %s", fleet.ErrCommandFenced,
			int64(epoch), l.SiteID, l.Epoch, l.HolderNodeID)
	}
	if c.Kind == CommandBMCRotate {
		if err := s.rotateParams(m, p); err != nil {
			return "", err
		}
		b, err := json.Marshal(p)
		return string(b), err
	}
	bmcp, _ := p["bmc"].(map[string]any)
	if bmcp == nil || s.r.sealer == nil {
		return "", errors.New("no BMC credential to open (no sealer or no bmc params)")
	}
	sealed, err := base64.StdEncoding.DecodeString(fmt.Sprint(bmcp["credential_sealed"]))
	if err != nil {
		return "", err
	}
	pw, err := s.r.sealer.Open(sealRef(fmt.Sprint(bmcp["credential_ref"])), sealed)
	if err != nil {
		return "", fmt.Errorf("open the BMC credential: %w", err)
	}
	delete(bmcp, "credential_sealed")
	bmcp["password"] = string(pw)
	if ds, ok := p["discovery_sealed"].(string); ok {
		sealed, err := base64.StdEncoding.DecodeString(ds)
		if err != nil {
			return "", err
		}
		tok, err := s.r.sealer.Open(discoverySealRef(c.IdempotencyKey), sealed)
		if err != nil {
			return "", fmt.Errorf("open the discovery token: %w", err)
		}
		delete(p, "discovery_sealed")
		p["discovery_token"] = string(tok)
	}
	b, err := json.Marshal(p)
	return string(b), err
}

// SiteCommandEnded hands a finished bmc.power command's result to the
// provision engine, in the gateway's transaction. A result whose outcome
// is unknown (interrupted) is left for the engine's Lookup.
func (s *SiteCommands) SiteCommandEnded(ctx context.Context, tx store.Tx, c fleet.Command) error {
	if c.Kind != CommandBMCPower && c.Kind != CommandBMCRotate {
		return nil
	}
	d, err := SiteDispatchByCommand(ctx, tx, c.ID)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	o := commandOutcome(c)
	if o.Status != provision.OutcomeSucceeded && o.Status != provision.OutcomeFailed {
		return nil
	}
	err = s.r.Engine.CompleteTx(ctx, tx, d.IdempotencyKey, o.Result)
	var ee *envelope.Error
	if errors.As(err, &ee) && ee.Code == envelope.CodeNotFound {
		return nil // the workflow is gone
	}
	if err != nil {
		return err
	}
	if boot, _ := o.Result.Output["boot"].(string); boot == BootDisk && o.Status == provision.OutcomeSucceeded {
		// The OS may have joined before this result arrived.
		return s.r.osJoinedTx(ctx, tx, d.MachineID)
	}
	return nil
}

// ResolveSite resolves a site of a tenant by name or id for a site token
// (fleet.SiteResolver).
func (s *SiteCommands) ResolveSite(ctx context.Context, q store.Querier, tenantID, ref string) (string, bool, error) {
	site, err := SiteGet(ctx, q, tenantID, ref, "")
	if errors.Is(err, store.ErrNotFound) {
		return "", false, nil
	}
	return site.ID, err == nil, err
}
