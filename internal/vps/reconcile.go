package vps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

// ReconcileInterval is how often hosts are asked which guests they run.
const ReconcileInterval = 5 * time.Minute

// Principal is who the instance service's commands are created by; only
// an instance.list of its own (the reconciler's) converges instances and
// deletes strays.
const Principal = "system:instances"

// SendLists asks every reachable host that holds (or held) instances which
// guests it runs (instance.list); CommandDone converges from the answers.
// It returns how many hosts were asked.
func (s *InstanceService) SendLists(ctx context.Context) (int, error) {
	n := 0
	err := s.env.DB().Write(ctx, func(ctx context.Context, tx store.Tx) error {
		n = 0
		hosts, err := reachableHosts(ctx, tx)
		if err != nil {
			return err
		}
		now := s.env.Clock().Now()
		for _, h := range hosts {
			if _, err := s.engine.Commands.Send(ctx, tx, reservation.Command{TenantID: h.tenant, NodeID: h.id, Kind: vmcmd.KindInstanceList,
				Params: map[string]any{}, IdempotencyKey: fmt.Sprintf("%s/instance.list/%d", h.id, now.UnixNano()), CreatedBy: Principal,
				TTL: CommandTTL, Time: now}); err != nil {
				return fmt.Errorf("send instance.list to %s: %w", h.id, err)
			}
			n++
		}
		return nil
	})
	return n, err
}

// listDone converges a host's instances from its instance.list answer:
// a guest the control plane no longer holds (deleted, lost, failed, or
// unknown) is a stray and is deleted on the host; a running or stopped
// instance the host no longer runs has failed (its booking goes); one being
// deleted is deleted; a state that differs is taken. Instances that changed
// after the list was sent are left alone: the answer predates them.
func (s *InstanceService) listDone(ctx context.Context, tx store.Tx, emit func(envelope.Event), c fleet.Command, result map[string]any, now time.Time) error {
	var lr vmcmd.ListResult
	b, err := json.Marshal(result)
	if err != nil {
		return err
	}
	if json.Unmarshal(b, &lr) != nil {
		return nil //nolint:nilerr // an answer that is not a list converges nothing
	}
	reported := map[string]vmcmd.Status{}
	for _, st := range lr.Instances {
		if !vmcmd.ValidID(st.InstanceID) {
			continue
		}
		reported[apiID(st.InstanceID)] = st
		in, err := InstanceByID(ctx, tx, apiID(st.InstanceID), "")
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return err
		case in.NodeID == c.NodeID && in.State != StateDeleted && in.State != StateLost && in.State != StateFailed:
			continue // held: converged below
		}
		// A stray: nothing here holds a booking for it.
		host := Instance{TenantID: c.TenantID, NodeID: c.NodeID}
		if _, err := s.send(ctx, tx, &host, vmcmd.KindInstanceDelete, vmcmd.InstanceRef{InstanceID: st.InstanceID},
			fmt.Sprintf("%s/stray/%s", st.InstanceID, c.ID), now); err != nil {
			return err
		}
		if in.ID != "" {
			emit(instanceEvent("instance.stray_deleted", &in, map[string]any{"reason": "the host ran a guest no booking holds"}))
		}
	}
	ins, err := InstancesOnNode(ctx, tx, c.NodeID)
	if err != nil {
		return err
	}
	// One peer push for every guest this answer ends.
	var gone []Instance
	for i := range ins {
		in := &ins[i]
		if in.State == StateBooting || !in.UpdateTime.Before(c.CreateTime) {
			continue
		}
		from := in.State
		st, ok := reported[in.ID]
		switch {
		case !ok && from == StateDeleting:
			if err := s.endDeleted(ctx, tx, emit, in, from, "Deleted", now); err != nil {
				return err
			}
			gone = append(gone, *in)
			continue
		case !ok:
			evs, err := s.engine.EndInstance(ctx, tx, in.ReservationID, "InstanceGone", now)
			if err != nil {
				return err
			}
			for _, ev := range evs {
				emit(ev)
			}
			in.State, in.SSHAddress, in.Message = StateFailed, "", "the host no longer runs this guest"
			emit(instanceEvent("instance.failed", in, map[string]any{"reason": "missing on its host"}))
			gone = append(gone, *in)
		case from == StateRunning || from == StateStopped:
			before := in.State
			s.applyStatus(in, &st, now)
			if in.State == before {
				continue
			}
			emit(instanceEvent("instance."+in.State, in, map[string]any{"kind": vmcmd.KindInstanceList}))
		default:
			continue
		}
		in.UpdateTime = now
		saved, err := InstanceSave(ctx, tx, in, from)
		if err != nil || !saved {
			return errors.Join(err, errMoved(saved))
		}
	}
	return s.pushPeers(ctx, tx, gone, now)
}
