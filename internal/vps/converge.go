package vps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/events"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

// finishDelete ends a deleted instance's booking, gives its address back,
// detaches its volumes (they stay on the host) and marks it deleted; the
// tenant's private instances on its IP pool get their new peer list.
func (s *InstanceService) finishDelete(ctx context.Context, tx store.Tx, emit func(envelope.Event), in *Instance, from, reason string, now time.Time) error {
	if err := s.endDeleted(ctx, tx, emit, in, from, reason, now); err != nil {
		return err
	}
	if !leftPeers(from) {
		return nil
	}
	return s.pushPeers(ctx, tx, []Instance{*in}, now)
}

// endDeleted is finishDelete without the peer push, for callers that end
// several instances in one change and push once.
func (s *InstanceService) endDeleted(ctx context.Context, tx store.Tx, emit func(envelope.Event), in *Instance, from, reason string, now time.Time) error {
	evs, err := s.engine.EndInstance(ctx, tx, in.ReservationID, reason, now)
	if err != nil {
		return err
	}
	for _, ev := range evs {
		emit(ev)
	}
	if _, err := LeaseRelease(ctx, tx, in.IPPoolID, in.ID); err != nil {
		return err
	}
	vols, err := VolumesOfInstance(ctx, tx, in.ID)
	if err != nil {
		return err
	}
	for i := range vols {
		v := &vols[i]
		v.InstanceID, v.UpdateTime = "", now
		// An attach or detach in flight ends with the guest: its answer
		// finds the volume detached and changes nothing.
		if v.State == VolumeAttached || v.State == VolumeAttaching || v.State == VolumeDetaching {
			v.State = VolumeAvailable
		}
		if err := VolumeSave(ctx, tx, v); err != nil {
			return err
		}
	}
	in.State, in.SSHAddress, in.UpdateTime = StateDeleted, "", now
	ok, err := InstanceSave(ctx, tx, in, from)
	if err != nil || !ok {
		return errors.Join(err, errMoved(ok))
	}
	emit(instanceEvent("instance.deleted", in, map[string]any{"reason": reason}))
	return nil
}

// degradedCondition is PlacementDegraded from what the host reported it
// could not apply.
func degradedCondition(degraded []string, now time.Time) Condition {
	if len(degraded) == 0 {
		return Condition{Type: CondPlacementDegraded, Status: "false", Reason: "Applied", Message: "the host applied the placement", UpdateTime: now}
	}
	return Condition{Type: CondPlacementDegraded, Status: "true", Reason: "HostCouldNotApply",
		Message: "the host could not apply: " + strings.Join(degraded, ", "), UpdateTime: now}
}

// CommandDone converges an instance or a volume from bcd's answer to one
// of its commands, in the gateway's transaction that records it. Other
// kinds pass by.
func (s *InstanceService) CommandDone(ctx context.Context, tx store.Tx, c fleet.Command, state, message string, result map[string]any) error {
	if !slices.Contains(vmcmd.Kinds, c.Kind) {
		return nil
	}
	// A tunnel's answer changes nothing about its instance; a failure is
	// told to the request waiting for it on this replica.
	if c.Kind == vmcmd.KindInstanceTunnel {
		var p vmcmd.TunnelParams
		if state != fleet.CommandSucceeded && s.tunnels != nil && json.Unmarshal([]byte(c.Params), &p) == nil && p.TunnelID != "" {
			s.tunnels.Fail(p.TunnelID, c.NodeID, fmt.Errorf("instance.tunnel %s: %s", state, message))
		}
		return nil
	}
	// The failure code is on the row the gateway just updated.
	code := ""
	if state != fleet.CommandSucceeded {
		if cur, err := fleet.CommandGet(ctx, tx, "", c.ID); err == nil {
			code = cur.FailureCode
		}
	}
	now := s.env.Clock().Now()
	var evs []envelope.Event
	emit := func(ev envelope.Event) {
		if ev.Time.IsZero() {
			ev.Time = now
		}
		evs = append(evs, ev)
	}
	var err error
	switch c.Kind {
	case vmcmd.KindInstanceList:
		// Only the reconciler's own survey converges (and may delete a
		// stray): a list someone ran by hand is just an answer.
		if state == fleet.CommandSucceeded && c.CreatedBy == Principal {
			err = s.listDone(ctx, tx, emit, c, result, now)
		}
	case vmcmd.KindVolumeCreate, vmcmd.KindVolumeDelete:
		err = s.volumeDone(ctx, tx, emit, c, state, code, message, now)
	case vmcmd.KindVolumeAttach, vmcmd.KindVolumeDetach:
		err = s.attachDone(ctx, tx, emit, c, state, code, message, now)
	default:
		err = s.instanceDone(ctx, tx, emit, c, state, code, message, result, now)
	}
	if err != nil || len(evs) == 0 {
		return err
	}
	return s.rec.InsertEvents(ctx, tx, evs)
}

// CommandsExpired converges instances and volumes whose command's deadline
// passed before their host answered: a create that never answered fails,
// other commands leave their message.
func (s *InstanceService) CommandsExpired(ctx context.Context, tx store.Tx, expired []fleet.Command) error {
	for _, c := range expired {
		if err := s.CommandDone(ctx, tx, c, fleet.CommandExpired, "the host did not answer before the command's deadline", nil); err != nil {
			return err
		}
	}
	return nil
}

func (s *InstanceService) instanceDone(ctx context.Context, tx store.Tx, emit func(envelope.Event), c fleet.Command, state, code, message string,
	result map[string]any, now time.Time) error {
	var ref vmcmd.InstanceRef
	if json.Unmarshal([]byte(c.Params), &ref) != nil || ref.InstanceID == "" {
		return nil //nolint:nilerr // params that name no instance are no instance's to converge
	}
	in, err := InstanceByID(ctx, tx, apiID(ref.InstanceID), store.ForUpdate(tx))
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil || in.NodeID != c.NodeID {
		return err
	}
	var st vmcmd.Status
	if result != nil {
		if b, err := json.Marshal(result); err == nil {
			_ = json.Unmarshal(b, &st)
		}
	}
	from := in.State
	ok := state == fleet.CommandSucceeded
	pushed := false
	failure := strings.TrimSpace(strings.Join([]string{code, message}, ": "))
	switch c.Kind {
	case vmcmd.KindInstanceDelete:
		if in.State != StateDeleting {
			return nil
		}
		if ok || code == vmcmd.FailNotFound {
			return s.finishDelete(ctx, tx, emit, &in, from, "Deleted", now)
		}
		in.Message = "delete failed: " + failure
		emit(instanceEvent("instance.delete_failed", &in, map[string]any{"failure_code": code}))
	case vmcmd.KindInstanceCreate:
		if in.State != StateBooting {
			return nil // deleted (or lost) meanwhile: its delete converges it
		}
		if !ok {
			// The guest will not boot: its booking goes now, its address
			// and row when the user deletes it.
			evs, err := s.engine.EndInstance(ctx, tx, in.ReservationID, "InstanceFailed", now)
			if err != nil {
				return err
			}
			for _, ev := range evs {
				emit(ev)
			}
			in.State, in.Message = StateFailed, "create failed: "+failure
			emit(instanceEvent("instance.failed", &in, map[string]any{"failure_code": code}))
			pushed = true
			break
		}
		s.applyStatus(&in, &st, now)
		emit(instanceEvent("instance."+in.State, &in, map[string]any{"accel": in.Accel}))
		// It runs: the tenant's private guests on its network admit it.
		pushed = true
	case vmcmd.KindInstancePeers:
		// Nothing of the instance changes; a failure is left on it.
		if ok || (in.State != StateRunning && in.State != StateStopped) {
			return nil
		}
		in.Message = "peers failed: " + failure
		emit(instanceEvent("instance.action_failed", &in, map[string]any{"kind": c.Kind, "failure_code": code}))
	default: // start, stop, reboot, pause, resume, snapshot, restore
		if in.State != StateRunning && in.State != StateStopped {
			return nil
		}
		if !ok {
			in.Message = strings.TrimPrefix(c.Kind, "instance.") + " failed: " + failure
			emit(instanceEvent("instance.action_failed", &in, map[string]any{"kind": c.Kind, "failure_code": code}))
			break
		}
		s.applyStatus(&in, &st, now)
		emit(instanceEvent("instance."+in.State, &in, map[string]any{"kind": c.Kind}))
	}
	in.UpdateTime = now
	saved, err := InstanceSave(ctx, tx, &in, from)
	if err != nil || !saved {
		return errors.Join(err, errMoved(saved))
	}
	if pushed {
		return s.pushPeers(ctx, tx, []Instance{in}, now)
	}
	return nil
}

// applyStatus takes what bcd reports of a guest.
func (s *InstanceService) applyStatus(in *Instance, st *vmcmd.Status, now time.Time) {
	switch st.State {
	case vmcmd.StateStopped:
		in.State = StateStopped
		in.SSHAddress = ""
	default: // running, or paused (a warm guest)
		in.State = StateRunning
		if st.SSHAddress != "" {
			in.SSHAddress = st.SSHAddress
		}
	}
	if st.Accel != "" {
		in.Accel = st.Accel
	}
	in.Message = ""
	in.SetCondition(degradedCondition(st.Degraded, now))
}

func (s *InstanceService) volumeDone(ctx context.Context, tx store.Tx, emit func(envelope.Event), c fleet.Command, state, code, message string, now time.Time) error {
	var p vmcmd.VolumeParams
	if json.Unmarshal([]byte(c.Params), &p) != nil || p.VolumeID == "" {
		return nil //nolint:nilerr // params that name no volume are no volume's to converge
	}
	v, err := VolumeByID(ctx, tx, apiID(p.VolumeID), store.ForUpdate(tx))
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil || v.NodeID != c.NodeID {
		return err
	}
	ok := state == fleet.CommandSucceeded
	switch {
	case c.Kind == vmcmd.KindVolumeCreate && v.State == VolumeCreating:
		v.State = VolumeAvailable
		if !ok {
			v.State, v.Message = VolumeFailed, "create failed: "+code+": "+message
		}
	case c.Kind == vmcmd.KindVolumeDelete && v.State == VolumeDeleting:
		v.State = VolumeDeleted
		if !ok && code != vmcmd.FailNotFound {
			v.State, v.Message = VolumeAvailable, "delete failed: "+code+": "+message
		}
	default:
		return nil
	}
	v.UpdateTime = now
	if err := VolumeSave(ctx, tx, &v); err != nil {
		return err
	}
	emit(envelope.Event{Type: "volume." + v.State, TenantID: v.TenantID, ResourceType: "Volume", ResourceID: v.ID, Time: now,
		Data: map[string]any{"name": v.Name, "state": v.State}})
	return nil
}

// attachDone converges a volume from bcd's answer to volume.attach or
// volume.detach: attaching becomes attached (a failure leaves it
// available, with the host's message), detaching becomes available (a
// failure leaves it attached, with the message; an instance the host no
// longer has holds no volume). An answer that finds the volume moved on
// (its instance deleted meanwhile) changes nothing.
func (s *InstanceService) attachDone(ctx context.Context, tx store.Tx, emit func(envelope.Event), c fleet.Command, state, code, message string, now time.Time) error {
	var p vmcmd.AttachParams
	if json.Unmarshal([]byte(c.Params), &p) != nil || p.VolumeID == "" || p.InstanceID == "" {
		return nil //nolint:nilerr // params that name no volume are no volume's to converge
	}
	v, err := VolumeByID(ctx, tx, apiID(p.VolumeID), store.ForUpdate(tx))
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil || v.NodeID != c.NodeID || v.InstanceID != apiID(p.InstanceID) {
		return err
	}
	ok := state == fleet.CommandSucceeded
	failure := strings.TrimSpace(strings.Join([]string{code, message}, ": "))
	typ := ""
	switch {
	case c.Kind == vmcmd.KindVolumeAttach && v.State == VolumeAttaching:
		v.State, v.Message, typ = VolumeAttached, "", "volume.attached"
		if !ok {
			v.State, v.InstanceID, v.Message, typ = VolumeAvailable, "", "attach failed: "+failure, "volume.attach_failed"
		}
	case c.Kind == vmcmd.KindVolumeDetach && v.State == VolumeDetaching:
		v.State, v.InstanceID, v.Message, typ = VolumeAvailable, "", "", "volume.detached"
		if !ok && code != vmcmd.FailNotFound {
			v.State, v.InstanceID, v.Message, typ = VolumeAttached, apiID(p.InstanceID), "detach failed: "+failure, "volume.detach_failed"
		}
	default:
		return nil
	}
	v.UpdateTime = now
	if err := VolumeSave(ctx, tx, &v); err != nil {
		return err
	}
	data := map[string]any{"name": v.Name, "state": v.State, "instance_id": apiID(p.InstanceID)}
	if !ok {
		data["failure_code"] = code
	}
	emit(envelope.Event{Type: typ, TenantID: v.TenantID, ResourceType: "Volume", ResourceID: v.ID, Time: now, Data: data})
	return nil
}

// NodesLost marks the instances of lost hosts lost (capacity's hook, run
// first in the same transaction, released their bookings); an instance
// being deleted is deleted, as its guest went with the host. An instance
// whose policy asks for it (on_host_lost recreate) waits to be placed
// again instead, and its recreate job is queued in this transaction.
func (s *InstanceService) NodesLost(ctx context.Context, tx store.Tx, nodeIDs []string) error {
	now := s.env.Clock().Now()
	var evs []envelope.Event
	emit := func(ev envelope.Event) {
		if ev.Time.IsZero() {
			ev.Time = now
		}
		evs = append(evs, ev)
	}
	// One peer push for everything the lost hosts took.
	var gone []Instance
	for _, id := range nodeIDs {
		ins, err := InstancesOnNode(ctx, tx, id)
		if err != nil {
			return err
		}
		for i := range ins {
			in := &ins[i]
			from := in.State
			in.SetCondition(Condition{Type: CondNodeLost, Status: "true", Reason: "NodeLost",
				Message: "host " + in.NodeName + " stopped answering", UpdateTime: now})
			gone = append(gone, *in)
			if from == StateDeleting {
				if err := s.endDeleted(ctx, tx, emit, in, from, "NodeLost", now); err != nil {
					return err
				}
				continue
			}
			more, err := s.engine.EndInstance(ctx, tx, in.ReservationID, "NodeLost", now)
			if err != nil {
				return err
			}
			for _, ev := range more {
				emit(ev)
			}
			in.State, in.SSHAddress, in.UpdateTime = StateLost, "", now
			if in.OnHostLost == OnHostLostRecreate {
				if err := s.markRecreateLocked(ctx, tx, in, now); err != nil {
					return err
				}
			}
			ok, err := InstanceSave(ctx, tx, in, from)
			if err != nil || !ok {
				return errors.Join(err, errMoved(ok))
			}
			emit(instanceEvent("instance.lost", in, map[string]any{"on_host_lost": onHostLostOf(in.OnHostLost)}))
			gone[len(gone)-1].State = in.State
		}
	}
	if err := s.pushPeers(ctx, tx, gone, now); err != nil {
		return err
	}
	if len(evs) == 0 {
		return nil
	}
	return s.rec.InsertEvents(ctx, tx, evs)
}

// Watch streams the tenant's instance changes (or one instance's), after
// the cursor, then live ones.
func (s *InstanceService) Watch(ctx context.Context, req *connect.Request[apiv1.WatchInstancesRequest], stream *connect.ServerStream[apiv1.WatchInstancesResponse]) error {
	msg := req.Msg
	var vs envelope.Violations
	vs.Ref("tenant", msg.GetTenant(), "tnt")
	if msg.GetInstance() != "" {
		vs.Ref("instance", msg.GetInstance(), InstanceIDPrefix)
	}
	after := events.ParseCursor(&vs, msg.GetCursor())
	if err := vs.Err(); err != nil {
		return s.env.Fail(ctx, err)
	}
	var (
		tenantID, only string
		scopeRes       iam.Resource
	)
	if msg.GetInstance() != "" {
		var r instanceRef
		if err := s.env.Resolve(ctx, "instance", func(ctx context.Context, q store.Querier) (err error) {
			r, err = lookupInstance(ctx, q, msg.GetTenant(), msg.GetInstance())
			return err
		}); err != nil {
			return s.env.Fail(ctx, err)
		}
		if err := s.env.AuthorizeRead(ctx, r.Resource()); err != nil {
			return err
		}
		if err := r.NotFound(msg.GetInstance()); err != nil {
			return s.env.Fail(ctx, err)
		}
		tenantID, only, scopeRes = r.Obj.TenantID, r.Obj.ID, r.Resource()
	} else {
		t, err := tenancy.AuthorizeTenantRead(ctx, s.env, msg.GetTenant())
		if err != nil {
			return err
		}
		tenantID, scopeRes = t.ID, tenancy.TenantResource(t)
	}
	return events.ResourceWatch[Instance, apiv1.WatchInstancesResponse]{
		Env: s.env, Events: s.events, Poll: s.poll, TenantID: tenantID, Scope: scopeRes,
		ResourceType: "Instance", Only: only, After: after, FromNow: msg.GetCursor() == "",
		Load: func(ctx context.Context, q store.Querier, id string) (Instance, bool, error) {
			in, err := InstanceByID(ctx, q, id, "")
			if errors.Is(err, store.ErrNotFound) || (err == nil && in.TenantID != tenantID) {
				return in, false, nil
			}
			return in, err == nil, err
		},
		Owner: func(in Instance) (string, string) { return in.TenantID, in.ProjectID },
		Message: func(typ string, in Instance, cursor string) *apiv1.WatchInstancesResponse {
			return &apiv1.WatchInstancesResponse{Type: typ, Instance: InstanceProto(in, nil), Cursor: cursor}
		},
		Send: stream.Send,
	}.Run(ctx)
}
