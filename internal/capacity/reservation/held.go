package reservation

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/internal/capacity/booking"
	"github.com/better-compute/better-compute/internal/capacity/placer"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/store"
)

// A kubernetes binding hands the GPUs to the node's kubelet, and the pods
// the kubelet gave them to do not stop when the reservation is released:
// the node reports AllocationReleased only once no pod holds them. Until
// then the reservation is releasing. It keeps its GPUs and host share booked
// (so the placer never books them again under running pods) and billed (its
// active interval stays open), until the node reports AllocationReleased,
// the node is lost, or the booking's end finds the devices needed by
// another booking.

// HeldStep is how far a releasing reservation's booking is extended when
// its end comes while the node's pods still hold its devices.
const HeldStep = 5 * time.Minute

// Reasons of a releasing reservation's conditions and ends.
const (
	// ReasonHeldByPods: DevicesHeld while the node's pods may hold them.
	ReasonHeldByPods = "HeldByPods"
	// ReasonPodsLetGo: the node reported AllocationReleased.
	ReasonPodsLetGo = "PodsLetGo"
	// ReasonDevicesNeeded: the booking could not be extended past its end
	// (another booking starts on the devices), so it ended.
	ReasonDevicesNeeded = "DevicesNeeded"
)

// hold starts the release of an active kubernetes binding that ends as state: allocation.release goes to the node, and the
// reservation is releasing with its bookings kept as they are.
func (e *Engine) hold(ctx context.Context, tx store.Tx, r *Reservation, state, reason string, now time.Time) ([]envelope.Event, error) {
	from := r.State
	if err := e.sendHeldRelease(ctx, tx, r, r.ID+"/release", now); err != nil {
		return nil, err
	}
	t := now
	r.State, r.EndsAs, r.ReleaseTime, r.BindDeadline = StateReleasing, state, &t, nil
	r.SetCondition(Condition{Type: CondNodeReleased, Status: "false", Reason: "ReleaseSent",
		Message: "waiting for node " + r.Placement.NodeName + " to report that no pod holds the reservation's GPUs", UpdateTime: now})
	r.SetCondition(Condition{Type: CondDevicesHeld, Status: "true", Reason: ReasonHeldByPods,
		Message: fmt.Sprintf("%s at %s; the GPUs and host share stay booked, and billed, until the node reports that its pods let go of them (the booking ends at %s; held longer, it is extended %s at a time while the devices are free)",
			reason, now.UTC().Format(time.RFC3339), r.EndsAt.Format(time.RFC3339), HeldStep),
		UpdateTime: now})
	if err := saveMoved(ctx, tx, r, from, now); err != nil {
		return nil, err
	}
	return []envelope.Event{event("reservation.releasing", r, map[string]any{"reason": reason, "ends_as": state})}, nil
}

// sendHeldRelease sends allocation.release for a kubernetes binding. It
// lives one HeldStep: the node may be away, or bcd may give up waiting on
// the pods, and each extension sends another while none is open (resendHeldRelease).
func (e *Engine) sendHeldRelease(ctx context.Context, tx store.Tx, r *Reservation, key string, now time.Time) error {
	if _, err := e.Commands.Send(ctx, tx, Command{
		TenantID: r.TenantID, NodeID: r.NodeID, Kind: KindAllocationRelease, Params: map[string]any{"allocation_id": r.ID},
		IdempotencyKey: key, CreatedBy: "system:capacity", TTL: HeldStep, Time: now,
	}); err != nil {
		return fmt.Errorf("send allocation.release: %w", err)
	}
	return nil
}

// resendHeldRelease sends allocation.release again when no earlier one is
// still open on the node (it expired undelivered, or failed): otherwise a
// node that was away when it was sent would hold the devices for good.
func (e *Engine) resendHeldRelease(ctx context.Context, tx store.Tx, r *Reservation, now time.Time) error {
	open, err := fleet.CommandListOpenForAllocation(ctx, tx, r.NodeID, KindAllocationRelease, r.ID)
	if err != nil || len(open) > 0 {
		return err
	}
	return e.sendHeldRelease(ctx, tx, r, fmt.Sprintf("%s/release/%d", r.ID, r.EndsAt.UnixMicro()), now)
}

// finishHeld ends a releasing reservation's bookings at at and moves it to
// the state it ends as; its active interval closes at at too.
func (e *Engine) finishHeld(ctx context.Context, tx store.Tx, r *Reservation, reason, message string, at, now time.Time) ([]envelope.Event, error) {
	at = at.UTC().Truncate(booking.Resolution)
	if at.After(r.EndsAt) {
		at = r.EndsAt
	}
	if err := e.endBookings(ctx, tx, r, at); err != nil {
		return nil, err
	}
	r.SetCondition(Condition{Type: CondDevicesHeld, Status: "false", Reason: reason, Message: message, UpdateTime: now})
	if r.ActiveSince != nil {
		t := at
		r.ActiveUntil = &t
	}
	switch {
	case at.Before(r.EndsAt) && at.After(r.StartsAt):
		r.EndsAt = at
	case !at.After(r.StartsAt):
		r.EndsAt = r.StartsAt.Add(booking.Resolution)
	}
	state := r.EndsAs
	if state == "" {
		state = StateReleased
	}
	r.State = state
	if err := saveMoved(ctx, tx, r, StateReleasing, now); err != nil {
		return nil, err
	}
	if err := e.bookingsEnded(ctx, tx, r, at); err != nil {
		return nil, err
	}
	return []envelope.Event{event("reservation."+state, r, map[string]any{"reason": reason})}, nil
}

// heldAtEnd acts on a releasing reservation whose booking's end came while
// the node's pods may still hold its devices: the booking is extended by
// HeldStep steps to just past now when the devices are free for it, else it
// ends at its end and HeldPastEnd says so. The check is the bookings'
// overlap constraint, in this transaction (under a savepoint, so a refusal
// undoes only the extension): what commits is what was checked.
func (e *Engine) heldAtEnd(ctx context.Context, b *placer.Batch, r *Reservation, now time.Time) ([]envelope.Event, error) {
	tx := b.Tx()
	prev := r.EndsAt
	steps := now.Sub(prev)/HeldStep + 1
	end := prev.Add(steps * HeldStep)
	err := placer.Savepoint(ctx, tx, "held", func() error { return booking.Extend(ctx, tx, r.ID, end) })
	switch {
	case errors.Is(err, booking.ErrOverlap):
		r.SetCondition(Condition{Type: CondHeldPastEnd, Status: "true", Reason: ReasonDevicesNeeded,
			Message: fmt.Sprintf("the node had not reported that its pods let go of the GPUs by the booking's end %s, and another booking starts on them before %s: the booking ended; pods may still run there",
				prev.Format(time.RFC3339), end.Format(time.RFC3339)),
			UpdateTime: now})
		return e.finishHeld(ctx, tx, r, ReasonDevicesNeeded, "the booking ended at its end: another booking needs the devices", prev, now)
	case err != nil:
		return nil, err
	}
	if ix := b.Index(); ix != nil {
		// Marked now, so the batch's later placements see it; undone if
		// the batch rolls back.
		nodeID, id := r.NodeID, r.ID
		ix.Extended(nodeID, id, end, now)
		b.OnUndo(func() { ix.Shortened(nodeID, id, prev, b.Now()) })
	}
	r.EndsAt = end
	r.SetCondition(Condition{Type: CondDevicesHeld, Status: "true", Reason: ReasonHeldByPods,
		Message: fmt.Sprintf("the node's pods still hold the GPUs past the booking's end: extended to %s (booked and billed); it is extended %s at a time while the devices are free",
			end.Format(time.RFC3339), HeldStep),
		UpdateTime: now})
	if err := e.resendHeldRelease(ctx, tx, r, now); err != nil {
		return nil, err
	}
	if err := saveMoved(ctx, tx, r, StateReleasing, now); err != nil {
		return nil, err
	}
	return []envelope.Event{event("reservation.extended", r, map[string]any{
		"end_time": end.Format(time.RFC3339Nano), "previous_end_time": prev.Format(time.RFC3339Nano), "reason": ReasonHeldByPods,
	})}, nil
}
