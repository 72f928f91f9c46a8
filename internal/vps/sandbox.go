package vps

import (
	"context"
	"errors"
	"fmt"
	"time"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

// Boot is an instance create resolved for another module (sandboxes) that
// boots instances inside its own transaction, with instances.create's
// checks.
type Boot struct {
	msg *apiv1.CreateInstanceRequest
	t   createTarget
}

// ResolveBoot resolves what instances.create would for msg (its tenant,
// flavor, IP pool, capacity pool and project), reading q. Misses are
// reported by Check.
func (s *InstanceService) ResolveBoot(ctx context.Context, q store.Querier, msg *apiv1.CreateInstanceRequest) (*Boot, error) {
	b := &Boot{msg: msg}
	t := &b.t
	var err error
	if t.scope, err = tenancy.LookupScope(ctx, q, msg.GetTenant()); err != nil || !t.scope.Found {
		return b, err
	}
	if t.flavor, err = lookupFlavor(ctx, q, msg.GetTenant(), msg.GetFlavor(), true); err != nil {
		return b, err
	}
	if msg.GetIpPool() == "" {
		if t.ipPool, err = defaultIPPool(ctx, q, t.scope); err != nil {
			return b, err
		}
	} else if t.ipPool, err = lookupRef(ctx, q, msg.GetTenant(), msg.GetIpPool(), "ip pool", "IPPool", true, IPPoolGet, IPPoolResource); err != nil {
		return b, err
	}
	t.pool, t.poolOK, t.poolErr = reservation.ResolveInstancePool(ctx, q, t.scope.ID(), msg.GetPool())
	if msg.GetProject() != "" {
		t.project, t.projErr = tenancy.ProjectGet(ctx, q, t.scope.ID(), msg.GetProject())
		t.projOK = t.projErr == nil
		if errors.Is(t.projErr, store.ErrNotFound) {
			t.projErr = nil
		}
	}
	return b, t.projErr
}

// ProjectID is the project the boot books in ("" : the tenant's default).
func (b *Boot) ProjectID() string { return b.t.project.ID }

// Check refuses what instances.create would refuse before booking (an
// unknown flavor, IP pool, pool or image) and returns the image.
func (b *Boot) Check(s *InstanceService) (string, error) { return s.checkCreate(b.msg, &b.t) }

// FromSnapshot boots the guest from a snapshot's disk: booked on nodeID
// only, where the snapshot is, and created there from the snapshot of
// instanceID named snapshotID (control-plane ids).
func (b *Boot) FromSnapshot(nodeID, instanceID, snapshotID string) {
	b.t.seed = &seedSnapshot{nodeID: nodeID, ref: vmcmd.SnapshotParams{InstanceID: HostID(instanceID), SnapshotID: HostID(snapshotID)}}
}

// DiskGiB is the disk the boot's flavor gives the guest.
func (b *Boot) DiskGiB() int32 { return b.t.flavor.obj.DiskGiB }

// FlavorID, FlavorName, PoolID and IPPoolID are what the boot resolved.
func (b *Boot) FlavorID() string   { return b.t.flavor.obj.ID }
func (b *Boot) FlavorName() string { return b.t.flavor.obj.Name }
func (b *Boot) PoolID() string     { return b.t.pool.ID }
func (b *Boot) IPPoolID() string   { return b.t.ipPool.obj.ID }

// Placeable reports whether the boot resolved enough to go through the
// pool's placer.
func (b *Boot) Placeable() bool { return b.t.poolOK && b.t.flavor.found && b.t.ipPool.found }

func (b *Boot) booking() reservation.InstanceBooking {
	f := b.t.flavor.obj
	// As boot books it: a ballooning flavor of an overcommitting pool
	// books less than its memory.
	bookMiB, _ := balloonBooking(f, pool.MemoryOvercommit(b.t.pool))
	memGiB := int((bookMiB + 1023) / 1024)
	ib := reservation.InstanceBooking{TenantID: b.t.scope.ID(), PoolID: b.t.pool.ID, VCPU: int(f.VCPUs), GPUs: int(f.GPUs),
		Model: f.GPUModel, Flavor: f.Name, Field: "flavor"}
	if f.Hugepages {
		ib.Hugepages1Gi = memGiB
	} else {
		ib.MemoryGiB = memGiB
	}
	return ib
}

// CheckFits refuses, inside the pool's placer batch (Submit), a flavor no
// host of the pool could ever hold.
func (s *InstanceService) CheckFits(ctx context.Context, b *Boot) error {
	return s.engine.CheckInstanceFits(ctx, b.booking())
}

// Submit runs write in the pool's placer batch, as instance creates do.
func (s *InstanceService) Submit(ctx context.Context, poolID, tenantID string, write func(ctx context.Context, b *envelope.Batch) error) error {
	return s.engine.SubmitInstance(ctx, poolID, tenantID, write)
}

// BootIn books, leases and boots the instance in tx (a placer batch's
// transaction): paused leaves the guest paused once booted. Events go to
// emit; the instance's user data stays in its row and command, sealed.
func (s *InstanceService) BootIn(ctx context.Context, tx store.Tx, emit func(envelope.Event), now time.Time, by string, b *Boot, paused bool) (Instance, error) {
	t := b.t
	t.paused = paused
	in, _, err := s.boot(ctx, bootTx{Tx: tx, emit: emit, now: now, by: by}, b.msg, &t)
	return in, err
}

// SendIn sends an instance command (pause, resume, snapshot, restore) to
// its host in tx.
func (s *InstanceService) SendIn(ctx context.Context, tx store.Tx, in *Instance, kind string, params any, key string, now time.Time) (string, error) {
	return s.send(ctx, tx, in, kind, params, key, now)
}

// SendTo sends a host command that is about no live instance (a kept
// snapshot's delete) to nodeID in tx.
func (s *InstanceService) SendTo(ctx context.Context, tx store.Tx, tenantID, nodeID, kind string, params any, key string, now time.Time) (string, error) {
	return s.send(ctx, tx, &Instance{TenantID: tenantID, NodeID: nodeID}, kind, params, key, now)
}

// DeleteIn deletes an instance in tx as instances.delete does: a guest a
// host holds is asked to go (its booking, address and row follow bcd's
// answer), one no host holds is finished at once. Deleting twice changes
// nothing.
func (s *InstanceService) DeleteIn(ctx context.Context, tx store.Tx, emit func(envelope.Event), in *Instance, now time.Time) error {
	return s.DeleteKeeping(ctx, tx, emit, in, now, nil)
}

// DeleteKeeping is DeleteIn that asks the host to keep the instance's
// snapshots named keepSnapshots (control-plane ids): a sandbox's kept
// snapshots outlive it.
func (s *InstanceService) DeleteKeeping(ctx context.Context, tx store.Tx, emit func(envelope.Event), in *Instance, now time.Time, keepSnapshots []string) error {
	switch in.State {
	case StateDeleted, StateDeleting:
		return nil
	case StateLost, StateFailed, StatePlacing:
		return s.finishDelete(ctx, tx, emit, in, in.State, "Deleted", now)
	}
	from := in.State
	in.State, in.UpdateTime = StateDeleting, now
	if ok, err := InstanceSave(ctx, tx, in, from); err != nil || !ok {
		return errors.Join(err, errMoved(ok))
	}
	key := fmt.Sprintf("%s/delete/%d", in.ID, now.UnixNano())
	p := vmcmd.DeleteParams{InstanceID: HostID(in.ID)}
	for _, id := range keepSnapshots {
		p.KeepSnapshots = append(p.KeepSnapshots, HostID(id))
	}
	if _, err := s.send(ctx, tx, in, vmcmd.KindInstanceDelete, p, key, now); err != nil {
		return err
	}
	emit(instanceEvent("instance.deleting", in, nil))
	return nil
}

// SetOwner installs the lookup that names what drives an instance (a
// sandbox, or a sandbox template's warm pool): instances start, stop,
// reboot and delete then refuse such an instance, so it changes only
// through its owner. Call it before serving.
func (s *InstanceService) SetOwner(owner func(ctx context.Context, q store.Querier, instanceID string) (string, error)) {
	s.owner = owner
}

func (s *InstanceService) checkOwner(ctx context.Context, q store.Querier, in *Instance) error {
	if s.owner == nil {
		return nil
	}
	by, err := s.owner(ctx, q, in.ID)
	if err != nil || by == "" {
		return err
	}
	return envelope.Errorf(envelope.CodeFailedPrecondition, "instance %s belongs to %s: change it through that", in.Name, by)
}
