package providerpools

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/riverqueue/river"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/providers"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vps"
)

// InstanceLabelKey labels the join token of an instance's server, and so
// the node its bcd joins as, with the instance's id.
const InstanceLabelKey = providers.InstanceLabel

// Converge makes an instance's server what its row asks: created (with a
// fresh join token in its cloud-init), powered, or deleted. Every provider
// call is made outside a transaction; what it answered is committed after.
// A call the provider refused for a while (rate limits) snoozes the job
// for as long as the provider asked.
func (m *Module) Converge(ctx context.Context, instanceID string) error {
	// One converge at a time per instance: a second job waits for the
	// lease (a crashed holder's runs out after LeaseDuration).
	var held bool
	if err := m.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		now := m.cfg.Clock.Now()
		var err error
		held, err = claim(ctx, tx, instanceID, now, now.Add(LeaseDuration))
		return err
	}); err != nil {
		return err
	}
	if !held {
		if ok, err := m.owns(ctx, instanceID); err != nil || !ok {
			return err
		}
		return river.JobSnooze(2 * time.Second)
	}
	defer func() {
		// A release that fails leaves the lease to run out.
		_ = m.cfg.DB.Write(context.WithoutCancel(ctx), func(ctx context.Context, tx store.Tx) error { return release(ctx, tx, instanceID) })
	}()
	return m.converge(ctx, instanceID)
}

// LeaseDuration bounds how long a converge holds an instance: longer than
// the job's timeout, so a live holder never loses it.
const LeaseDuration = 11 * time.Minute

func (m *Module) owns(ctx context.Context, instanceID string) (ok bool, err error) {
	err = m.cfg.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		ok, err = exists(ctx, tx, instanceID)
		return err
	})
	return ok, err
}

func (m *Module) converge(ctx context.Context, instanceID string) error {
	var (
		r  Row
		in vps.Instance
	)
	err := m.cfg.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		if r, err = get(ctx, tx, instanceID, ""); err != nil {
			return err
		}
		in, err = vps.InstanceByID(ctx, tx, instanceID, "")
		return err
	})
	if errors.Is(err, store.ErrNotFound) || (err == nil && r.Done) {
		return nil
	}
	if err != nil {
		return err
	}
	p, _, err := m.provider(ctx, r.AccountID)
	if err != nil {
		return m.callFailed(ctx, r.InstanceID, "open the account", err)
	}
	switch {
	case r.Desired == DesiredDeleted:
		if err := p.Delete(ctx, instanceID); err != nil {
			return m.callFailed(ctx, instanceID, "delete", err)
		}
		return m.deleted(ctx, instanceID)
	case r.ServerID == "":
		return m.create(ctx, p, r, in)
	case r.Power != "":
		if err := p.Power(ctx, instanceID, providers.PowerAction(r.Power)); err != nil {
			return m.callFailed(ctx, instanceID, "power "+r.Power, err)
		}
		return m.powered(ctx, instanceID, r.Power)
	}
	return nil
}

// permanent reports whether a provider's refusal will not change by
// retrying the same call.
func permanent(err error) bool {
	switch providers.KindOf(err) {
	case providers.KindInvalid, providers.KindAuth, providers.KindForbidden, providers.KindQuota, providers.KindNotSupported,
		providers.KindConflict:
		return true
	}
	return false
}

// callFailed records a failed call on the row and tells River when to try
// again: after the provider's Retry-After for a rate limit, with River's
// backoff otherwise.
func (m *Module) callFailed(ctx context.Context, instanceID, what string, callErr error) error {
	msg := what + ": " + callErr.Error()
	if err := m.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		r, err := get(ctx, tx, instanceID, store.ForUpdate(tx))
		if err != nil {
			return err
		}
		r.Attempts++
		r.LastError, r.UpdateTime = truncate(msg), m.cfg.Clock.Now()
		return save(ctx, tx, &r, r.Done)
	}); err != nil {
		return errors.Join(callErr, err)
	}
	if ok, after := providers.Retryable(callErr); ok {
		return river.JobSnooze(max(after, time.Second))
	}
	return fmt.Errorf("provider instance %s: %s", instanceID, msg)
}

// create mints a join token, asks the provider for the server and records
// it. The token is committed before the call, so a server made by a call
// whose answer was lost can still join with it; the row never stores it.
func (m *Module) create(ctx context.Context, p providers.Provider, r Row, in vps.Instance) error {
	token, err := m.mint(ctx, &in)
	if err != nil {
		return err
	}
	gateway := ""
	if m.cfg.Gateway != nil {
		gateway = m.cfg.Gateway()
	}
	srv, err := p.Create(ctx, providers.CreateRequest{InstanceID: in.ID, Name: serverName(&in), ServerType: r.ServerType,
		Image: r.Image, Location: r.Location, UserData: CloudInit(token, gateway, r.SSHKeys),
		Labels: map[string]string{"bettercompute.io/tenant": in.TenantID}})
	if err != nil {
		if permanent(err) {
			return m.fail(ctx, in.ID, "the provider refused the server: "+err.Error())
		}
		return m.callFailed(ctx, in.ID, "create", err)
	}
	return m.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		r, err := get(ctx, tx, in.ID, store.ForUpdate(tx))
		if err != nil {
			return err
		}
		in, err := vps.InstanceByID(ctx, tx, in.ID, store.ForUpdate(tx))
		if err != nil {
			return err
		}
		now := m.cfg.Clock.Now()
		r.ServerID, r.LastError, r.UpdateTime = srv.ID, "", now
		if err := save(ctx, tx, &r, false); err != nil {
			return err
		}
		var evs []envelope.Event
		from := in.State
		in.ProviderServerID, in.Address, in.UpdateTime = srv.ID, srv.IPv4, now
		if in.State == vps.StatePending {
			in.State = vps.StateBooting
			evs = append(evs, instanceEvent("instance.booting", &in, map[string]any{"server_id": srv.ID, "address": srv.IPv4}))
		}
		if ok, err := vps.InstanceSave(ctx, tx, &in, from); err != nil || !ok {
			return errors.Join(err, errMoved(ok))
		}
		if r.Desired == DesiredDeleted {
			// Deleted while the create was in flight: delete what it made.
			return errors.Join(m.cfg.Recorder.InsertEvents(ctx, tx, evs), m.enqueue(ctx, tx, in.ID))
		}
		more, err := m.joinedTx(ctx, tx, &r, &in, now)
		if err != nil {
			return err
		}
		return m.cfg.Recorder.InsertEvents(ctx, tx, append(evs, more...))
	})
}

func errMoved(ok bool) error {
	if ok {
		return nil
	}
	return errors.New("the instance changed concurrently")
}

// serverName is the server's name at the provider: unique (the instance's
// id as a host name), so a name taken by another tenant never fails it.
func serverName(in *vps.Instance) string { return vps.HostID(in.ID) }

// mint records a join token for the instance's server and returns it
// sealed: the node it admits is labelled with the instance and belongs to
// the instance's tenant, in no pool (nobody else's work places on it).
func (m *Module) mint(ctx context.Context, in *vps.Instance) (string, error) {
	if m.cfg.Tokens == nil {
		return "", errors.New("providerpools: no join token sealer (BETTER_COMPUTE_SECRET)")
	}
	labels := map[string]string{InstanceLabelKey: in.ID}
	var jt fleet.JoinToken
	err := m.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		now := m.cfg.Clock.Now()
		jt = fleet.JoinToken{ID: envelope.NewID(fleet.JoinTokenIDPrefix, now), TenantID: in.TenantID, ProjectID: in.ProjectID,
			Labels: labelsJSON(labels), CreatedBy: CreatedBy, CreateTime: now, ExpireTime: now.Add(m.cfg.TokenTTL), Role: fleet.RoleNode}
		if err := fleet.JoinTokenInsert(ctx, tx, &jt); err != nil {
			return err
		}
		return addToken(ctx, tx, in.ID, jt.ID)
	})
	if err != nil {
		return "", err
	}
	return m.cfg.Tokens.SealJoinToken(fleet.JoinClaims{TokenID: jt.ID, TenantID: jt.TenantID, ProjectID: jt.ProjectID,
		Labels: labels, ExpiresAt: jt.ExpireTime})
}

// joinedTx turns a booting instance running once its server's bcd joined
// with one of its tokens (the other tokens are revoked), and fails it when
// every token expired unused. It returns the events to record.
func (m *Module) joinedTx(ctx context.Context, tx store.Tx, r *Row, in *vps.Instance, now time.Time) ([]envelope.Event, error) {
	if in.State != vps.StateBooting {
		return nil, nil
	}
	ids, err := tokens(ctx, tx, in.ID)
	if err != nil {
		return nil, err
	}
	nodeID, live := "", false
	for _, id := range ids {
		tok, err := fleet.JoinTokenGet(ctx, tx, in.TenantID, id)
		if err != nil {
			return nil, err
		}
		if tok.NodeID != "" {
			nodeID = tok.NodeID
		}
		if tok.State(now) == fleet.JoinTokenActive {
			live = true
		}
	}
	switch {
	case nodeID != "":
		node, err := fleet.NodeStatusGet(ctx, tx, nodeID)
		if err != nil {
			return nil, err
		}
		if err := m.revokeUnused(ctx, tx, in); err != nil {
			return nil, err
		}
		in.State, in.NodeName, in.UpdateTime = vps.StateRunning, node.Name, now
		if ok, err := vps.InstanceSave(ctx, tx, in, vps.StateBooting); err != nil || !ok {
			return nil, errors.Join(err, errMoved(ok))
		}
		r.ActiveSince, r.UpdateTime = &now, now
		if err := save(ctx, tx, r, false); err != nil {
			return nil, err
		}
		return []envelope.Event{instanceEvent("instance.running", in, map[string]any{"node_id": nodeID, "node_name": node.Name})}, nil
	case !live && len(ids) > 0:
		return m.failTx(ctx, tx, r, in, fmt.Sprintf("server %s did not join within %s", r.ServerID, m.cfg.TokenTTL))
	}
	return nil, nil
}

func (m *Module) revokeUnused(ctx context.Context, tx store.Tx, in *vps.Instance) error {
	ids, err := tokens(ctx, tx, in.ID)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if _, err := fleet.JoinTokenRevoke(ctx, tx, in.TenantID, id); err != nil {
			return err
		}
	}
	return nil
}

// fail fails an instance the provider will not make, and queues the delete
// of whatever part of a server a refused create may have left.
func (m *Module) fail(ctx context.Context, instanceID, reason string) error {
	return m.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		r, err := get(ctx, tx, instanceID, store.ForUpdate(tx))
		if err != nil {
			return err
		}
		in, err := vps.InstanceByID(ctx, tx, instanceID, store.ForUpdate(tx))
		if err != nil {
			return err
		}
		evs, err := m.failTx(ctx, tx, &r, &in, reason)
		if err != nil {
			return err
		}
		return m.cfg.Recorder.InsertEvents(ctx, tx, evs)
	})
}

func (m *Module) failTx(ctx context.Context, tx store.Tx, r *Row, in *vps.Instance, reason string) ([]envelope.Event, error) {
	now := m.cfg.Clock.Now()
	from := in.State
	in.State, in.Message, in.UpdateTime = vps.StateFailed, truncate(reason), now
	if ok, err := vps.InstanceSave(ctx, tx, in, from); err != nil || !ok {
		return nil, errors.Join(err, errMoved(ok))
	}
	r.Desired, r.LastError, r.UpdateTime = DesiredDeleted, truncate(reason), now
	if err := save(ctx, tx, r, false); err != nil {
		return nil, err
	}
	if err := m.revokeUnused(ctx, tx, in); err != nil {
		return nil, err
	}
	return []envelope.Event{instanceEvent("instance.failed", in, map[string]any{"reason": in.Message})}, m.enqueue(ctx, tx, in.ID)
}

// deleted ends an instance whose server the provider deleted.
func (m *Module) deleted(ctx context.Context, instanceID string) error {
	return m.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		r, err := get(ctx, tx, instanceID, store.ForUpdate(tx))
		if err != nil || r.Done {
			return err
		}
		in, err := vps.InstanceByID(ctx, tx, instanceID, store.ForUpdate(tx))
		if err != nil {
			return err
		}
		now := m.cfg.Clock.Now()
		var evs []envelope.Event
		if in.State != vps.StateFailed && in.State != vps.StateLost && in.State != vps.StateDeleted {
			from := in.State
			in.State, in.UpdateTime = vps.StateDeleted, now
			if ok, err := vps.InstanceSave(ctx, tx, &in, from); err != nil || !ok {
				return errors.Join(err, errMoved(ok))
			}
			evs = append(evs, instanceEvent("instance.deleted", &in, map[string]any{"server_id": r.ServerID}))
		}
		if err := m.revokeUnused(ctx, tx, &in); err != nil {
			return err
		}
		if r.ActiveSince != nil && r.ActiveUntil == nil {
			r.ActiveUntil = &now
		}
		r.LastError, r.UpdateTime = "", now
		if err := save(ctx, tx, &r, true); err != nil {
			return err
		}
		return m.cfg.Recorder.InsertEvents(ctx, tx, evs)
	})
}

// powered records a power action the provider carried out.
func (m *Module) powered(ctx context.Context, instanceID, action string) error {
	return m.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		r, err := get(ctx, tx, instanceID, store.ForUpdate(tx))
		if err != nil {
			return err
		}
		in, err := vps.InstanceByID(ctx, tx, instanceID, store.ForUpdate(tx))
		if err != nil {
			return err
		}
		now := m.cfg.Clock.Now()
		if r.Power == action {
			r.Power = ""
		}
		r.UpdateTime = now
		if err := save(ctx, tx, &r, false); err != nil {
			return err
		}
		from, typ := in.State, "instance.rebooted"
		switch {
		case action == string(providers.PowerOff) && in.State == vps.StateRunning:
			in.State, typ = vps.StateStopped, "instance.stopped"
		case action == string(providers.PowerOn) && in.State == vps.StateStopped:
			in.State, typ = vps.StateRunning, "instance.started"
		}
		in.UpdateTime = now
		if ok, err := vps.InstanceSave(ctx, tx, &in, from); err != nil || !ok {
			return errors.Join(err, errMoved(ok))
		}
		if err := m.cfg.Recorder.InsertEvents(ctx, tx, []envelope.Event{instanceEvent(typ, &in, nil)}); err != nil {
			return err
		}
		if r.Power != "" {
			return m.enqueue(ctx, tx, in.ID) // another action came meanwhile
		}
		return nil
	})
}

func truncate(s string) string {
	const n = 512
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
