package vps

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

// What an instance asks for when its host is declared lost
// (CreateInstanceRequest.on_host_lost).
const (
	// OnHostLostKeep leaves the instance lost: the default, as a guest's
	// disk went with its host.
	OnHostLostKeep = "keep"
	// OnHostLostRecreate places the instance again and boots it from its
	// image on another host, keeping its id, name, address, SSH keys and
	// flavor. Its volumes stay on the lost host (marked failed).
	OnHostLostRecreate = "recreate"
)

// CondRecreated says where a recreate stands: false while the instance
// waits for a host (reason Placing or the refusal's code), true once it
// was placed again (its message names the lost host, the new one, and what
// did not follow: volumes, the old address).
const CondRecreated = "Recreated"

// RecreateSweepInterval is how often instances waiting to be recreated try
// again: a host may have freed room or joined.
const RecreateSweepInterval = 30 * time.Second

func onHostLostOf(p string) string {
	if p == "" {
		return OnHostLostKeep
	}
	return p
}

func validateOnHostLost(vs *envelope.Violations, p string) {
	if p != "" && p != OnHostLostKeep && p != OnHostLostRecreate {
		vs.Add("on_host_lost", "must be keep or recreate, got %q", truncate(p))
	}
}

// awaitingRecreate: the instance lost its host and asked to be recreated,
// and no recreate has placed it yet.
func awaitingRecreate(in *Instance) bool {
	return in.State == StatePlacing && in.OnHostLost == OnHostLostRecreate && in.NodeID == ""
}

// SetRecreateQueue hands the service the job inserter that queues a
// recreate in the transaction that lost the host (the app's River job);
// nil leaves waiting instances to RecreateWaiting's sweep.
func (s *InstanceService) SetRecreateQueue(fn func(ctx context.Context, tx store.Tx, instanceID string) error) {
	s.recreateQueue = fn
}

// markRecreateLocked turns a lost instance whose policy asks for it into
// one waiting to be recreated, and queues the recreate, in the
// transaction that declared its host lost; in is locked by the caller.
func (s *InstanceService) markRecreateLocked(ctx context.Context, tx store.Tx, in *Instance, now time.Time) error {
	in.SetCondition(Condition{Type: CondRecreated, Status: "false", Reason: "Placing",
		Message: "host " + in.NodeName + " was lost: placing the instance again from its image", UpdateTime: now})
	// No host holds it: an old host's late answer no longer matches it.
	// node_name keeps naming the lost host until the recreate places it.
	in.State, in.NodeID, in.CPUSet, in.Accel = StatePlacing, "", "", ""
	if s.recreateQueue == nil {
		return nil
	}
	return s.recreateQueue(ctx, tx, in.ID)
}

// Recreate places an instance waiting to be recreated through its pool's
// placer, as Create places, and sends instance.create to the new host. It
// is the recreate job's work: idempotent (an instance already placed, or
// deleted, is left alone) and safe on two replicas (the instance row is
// locked and re-read inside the placer batch). When nothing fits, the
// instance keeps waiting with the refusal in its Recreated condition.
func (s *InstanceService) Recreate(ctx context.Context, instanceID string) error {
	var in Instance
	if err := s.env.DB().Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		in, err = InstanceByID(ctx, tx, instanceID, "")
		return err
	}); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		return err
	}
	if !awaitingRecreate(&in) {
		return nil
	}
	err := s.engine.SubmitInstance(ctx, in.PoolID, in.TenantID, func(ctx context.Context, b *envelope.Batch) error {
		cur, err := InstanceByID(ctx, b.Tx, instanceID, store.ForUpdate(b.Tx))
		if err != nil {
			return err
		}
		if !awaitingRecreate(&cur) {
			return nil // recreated (or deleted) meanwhile
		}
		now := s.env.Clock().Now()
		var evs []envelope.Event
		emit := func(ev envelope.Event) {
			if ev.Time.IsZero() {
				ev.Time = now
			}
			evs = append(evs, ev)
		}
		if err := s.recreateLocked(ctx, b.Tx, emit, &cur, now); err != nil {
			return err
		}
		return s.rec.InsertEvents(ctx, b.Tx, evs)
	})
	var apiErr *envelope.Error
	if errors.As(err, &apiErr) && apiErr.Code != envelope.CodeUnavailable {
		// No room, an exhausted quota or IP pool: the refusal is the
		// reason it waits; the sweep tries again. Unavailable (another
		// replica owns the pool's placer) is not a reason: the job's retry
		// or the sweep lands on the owner.
		return s.recreateWaits(ctx, instanceID, apiErr)
	}
	return err
}

// recreateWaits records why a recreate could not place the instance.
func (s *InstanceService) recreateWaits(ctx context.Context, instanceID string, why *envelope.Error) error {
	return s.env.DB().Write(ctx, func(ctx context.Context, tx store.Tx) error {
		in, err := InstanceByID(ctx, tx, instanceID, store.ForUpdate(tx))
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil || !awaitingRecreate(&in) {
			return err
		}
		now := s.env.Clock().Now()
		if !in.SetCondition(Condition{Type: CondRecreated, Status: "false", Reason: string(why.Code),
			Message: "waiting for a host: " + why.Message, UpdateTime: now}) {
			return nil
		}
		in.UpdateTime = now
		ok, err := InstanceSave(ctx, tx, &in, in.State)
		if err != nil || !ok {
			return errors.Join(err, errMoved(ok))
		}
		ev := instanceEvent("instance.recreate_waiting", &in, map[string]any{"reason": string(why.Code), "message": why.Message})
		ev.Time = now
		return s.rec.InsertEvents(ctx, tx, []envelope.Event{ev})
	})
}

// RecreateWaiting tries every instance waiting to be recreated again (the
// periodic sweep behind the jobs the lost hosts queued). It returns how
// many were tried.
func (s *InstanceService) RecreateWaiting(ctx context.Context) (int, error) {
	var ids []string
	if err := s.env.DB().Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		ids, err = instancesAwaitingRecreate(ctx, tx)
		return err
	}); err != nil {
		return 0, err
	}
	var errs []error
	for _, id := range ids {
		errs = append(errs, s.Recreate(ctx, id))
	}
	return len(ids), errors.Join(errs...)
}

// recreateLocked books a new reservation, keeps (or re-leases) the
// address, leaves the lost host's volumes behind and sends instance.create
// to the new host, inside the pool's placer batch; in is locked.
func (s *InstanceService) recreateLocked(ctx context.Context, tx store.Tx, emit func(envelope.Event), in *Instance, now time.Time) error {
	f, err := FlavorGet(ctx, tx, in.TenantID, in.FlavorID, "")
	if errors.Is(err, store.ErrNotFound) {
		f, err = FlavorGet(ctx, tx, "", in.FlavorID, "")
	}
	if err != nil {
		return envelope.FromStore(err, "flavor")
	}
	// The booking Create makes (boot), from the flavor the instance has.
	memGiB := int((f.MemoryMiB + 1023) / 1024)
	ib := reservation.InstanceBooking{TenantID: in.TenantID, ProjectID: in.ProjectID, PoolID: in.PoolID, VCPU: int(f.VCPUs),
		GPUs: int(f.GPUs), Model: f.GPUModel, CreatedBy: Principal, Flavor: f.Name, Field: "flavor"}
	if in.NetworkPolicy != vmcmd.PolicyEgress {
		ib.Requires = []string{vmcmd.CapNetworkPolicy}
	}
	if f.Hugepages {
		ib.Hugepages1Gi = memGiB
	} else {
		ib.MemoryGiB = memGiB
	}
	r, evs, err := s.engine.BookInstance(ctx, tx, ib, now)
	if err != nil {
		return err
	}
	// Kept while it waited: the name of the host it lost.
	lostHost := in.NodeName
	var notes []string
	// IP pools are not bound to a host: the lease the instance holds
	// follows it. One that is gone is leased anew, and said.
	lease, ipp, err := LeaseAllocate(ctx, tx, now, in.IPPoolID, in.ID, in.MAC, "ip_pool")
	if err != nil {
		return err
	}
	if lease.Address != in.Address {
		notes = append(notes, fmt.Sprintf("its address %s was released; it has %s now", in.Address, lease.Address))
		prefix, err := netip.ParsePrefix(ipp.CIDR)
		if err != nil {
			return fmt.Errorf("ip pool %s: %w", ipp.ID, err)
		}
		in.Address, in.PrefixLen, in.Gateway, in.DNS = lease.Address, prefix.Bits(), ipp.Gateway, ipp.DNS
	}
	// A volume's disk is a file on the lost host: it cannot follow.
	vols, err := VolumesOfInstance(ctx, tx, in.ID)
	if err != nil {
		return err
	}
	var left []string
	for i := range vols {
		v := &vols[i]
		v.State, v.InstanceID, v.UpdateTime = VolumeFailed, "", now
		v.Message = "lost with host " + lostHost + " when instance " + in.Name + " was recreated elsewhere"
		if err := VolumeSave(ctx, tx, v); err != nil {
			return err
		}
		left = append(left, v.Name)
		emit(envelope.Event{Type: "volume.failed", TenantID: v.TenantID, ResourceType: "Volume", ResourceID: v.ID,
			Data: map[string]any{"name": v.Name, "state": v.State, "reason": "HostLost"}})
	}
	if len(left) > 0 {
		notes = append(notes, "volumes "+strings.Join(left, ", ")+" stayed on the lost host and were marked failed")
	}
	userData, err := OpenUserData(s.sealer, in)
	if err != nil {
		return err
	}
	in.ReservationID, in.NodeID, in.NodeName, in.State = r.ID, r.NodeID, r.Placement.NodeName, StateBooting
	in.CPUSet, in.Accel, in.SSHAddress, in.Message, in.UpdateTime = "", "", "", "", now
	if f.Pinned {
		in.CPUSet = r.Placement.CPUSet
	}
	cp := createParams(in, r, nil)
	cp.Seed.UserData = userData
	// A fresh host key and certificate: the old ones went with the host.
	if err := s.seedSSH(ctx, tx, &cp, in, now); err != nil {
		return err
	}
	if in.NetworkPolicy == vmcmd.PolicyPrivate {
		if cp.Network.Peers, err = PeerAddresses(ctx, tx, in.TenantID, in.IPPoolID, in.ID); err != nil {
			return err
		}
	}
	m, err := paramsMap(cp)
	if err != nil {
		return err
	}
	if err := s.sealSeed(in.TenantID, m); err != nil {
		return err
	}
	// Keyed by the new booking: a second recreate (after another lost
	// host) is a new command, a redelivery of this one is not.
	if _, err := s.send(ctx, tx, in, vmcmd.KindInstanceCreate, m, in.ID+"/recreate/"+r.ID, now); err != nil {
		return err
	}
	msg := fmt.Sprintf("host %s was lost; recreated on %s from image %s", lostHost, in.NodeName, in.Image)
	if len(notes) > 0 {
		msg += "; " + strings.Join(notes, "; ")
	}
	in.SetCondition(Condition{Type: CondRecreated, Status: "true", Reason: "HostLost", Message: msg, UpdateTime: now})
	ok, err := InstanceSave(ctx, tx, in, StatePlacing)
	if err != nil || !ok {
		return errors.Join(err, errMoved(ok))
	}
	for _, ev := range evs {
		emit(ev)
	}
	emit(instanceEvent("instance.recreated", in, map[string]any{"lost_node_name": lostHost, "reservation_id": r.ID,
		"address": in.Address, "volumes_left": left}))
	return nil
}
