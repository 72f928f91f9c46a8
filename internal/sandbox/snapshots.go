package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
	"github.com/better-compute/better-compute/internal/vmcmd"
	"github.com/better-compute/better-compute/internal/vps"
)

// snapshotOf is a snapshot with the sandbox it was taken of: decisions on
// a snapshot are made on that sandbox (live or deleted), so a policy that
// governs a tenant's sandboxes governs their snapshots.
type snapshotOf struct {
	snap Snapshot
	sb   Sandbox
}

var snapshotKind = tenancy.ItemKind[snapshotOf]{Type: "Sandbox", Noun: "snapshot",
	Resource: func(s snapshotOf) iam.Resource { return Resource(s.sb) },
	Get: func(ctx context.Context, q store.Querier, tenantID, id string) (snapshotOf, error) {
		snap, err := SnapshotGet(ctx, q, tenantID, id, "")
		if err != nil {
			return snapshotOf{}, err
		}
		sb, err := SandboxGet(ctx, q, tenantID, snap.SandboxID, "")
		if err != nil {
			return snapshotOf{}, fmt.Errorf("snapshot %s: sandbox %s: %w", id, snap.SandboxID, err)
		}
		return snapshotOf{snap: snap, sb: sb}, nil
	}}

// ListSnapshots lists a tenant's snapshots by id, of one sandbox (live or
// deleted) when the request names one.
func (s *Service) ListSnapshots(ctx context.Context, req *connect.Request[apiv1.ListSandboxSnapshotsRequest]) (*connect.Response[apiv1.ListSandboxSnapshotsResponse], error) {
	msg := req.Msg
	if sbx := msg.GetSandbox(); sbx != "" {
		var vs envelope.Violations
		vs.ID("sandbox", sbx, SandboxIDPrefix)
		if err := vs.Err(); err != nil {
			return nil, s.env.Fail(ctx, err)
		}
	}
	snaps, next, err := tenancy.ListPage(ctx, s.env, msg, "sandbox snapshots",
		func(ctx context.Context, q store.Querier, sc tenancy.Scope, after string, limit int) ([]Snapshot, error) {
			return SnapshotList(ctx, q, sc.ID(), msg.GetSandbox(), after, limit)
		}, func(s Snapshot) string { return s.ID })
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListSandboxSnapshotsResponse{NextPageToken: next}
	for _, snap := range snaps {
		out.Snapshots = append(out.Snapshots, SnapshotProto(snap))
	}
	return connect.NewResponse(out), nil
}

// DeleteSnapshot deletes a snapshot's row and asks its node to remove its
// files (snapshot.delete), in one transaction. A snapshot still saving is
// refused: its files are not all there yet.
func (s *Service) DeleteSnapshot(ctx context.Context, req *connect.Request[apiv1.DeleteSandboxSnapshotRequest]) (*connect.Response[apiv1.DeleteSandboxSnapshotResponse], error) {
	msg := req.Msg
	var r tenancy.Item[snapshotOf]
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.DeleteSandboxSnapshotResponse]{
		AuditRefusals: true,
		Validate: func() error {
			var vs envelope.Violations
			vs.Ref("tenant", msg.GetTenant(), "tnt")
			vs.ID("snapshot", msg.GetSnapshot(), SnapshotIDPrefix)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			r, err = snapshotKind.Lookup(ctx, q, msg.GetTenant(), msg.GetSnapshot())
			return r.Resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.DeleteSandboxSnapshotResponse, error) {
			if err := r.NotFound(msg.GetSnapshot()); err != nil {
				return nil, err
			}
			snap, err := SnapshotGet(ctx, tx.Tx, r.Obj.snap.TenantID, r.Obj.snap.ID, store.ForUpdate(tx.Tx))
			if err != nil {
				return nil, envelope.FromStore(err, "snapshot")
			}
			if snap.State == "saving" {
				return nil, precondition("snapshot", "snapshot %s is still saving; delete it once it is ready or failed", snap.ID)
			}
			if err := SnapshotDelete(ctx, tx.Tx, snap.ID); err != nil {
				return nil, err
			}
			if err := s.removeFiles(ctx, tx.Tx, snap.TenantID, snap, tx.Now()); err != nil {
				return nil, err
			}
			sb := r.Obj.sb
			tx.SetResource(sb.ID, "")
			tx.Emit(sandboxEvent("sandbox.snapshot_deleted", &sb, map[string]any{"snapshot_id": snap.ID, "node_id": snap.NodeID}))
			return &apiv1.DeleteSandboxSnapshotResponse{Snapshot: SnapshotProto(snap)}, nil
		},
	})
}

// seedFrom checks that a sandbox of template t may start from the
// tenant's snapshot id, and locks the snapshot's row for the transaction
// that boots it (a delete waits).
func seedFrom(ctx context.Context, tx store.Tx, t Template, id string) (Snapshot, error) {
	snap, err := SnapshotGet(ctx, tx, t.TenantID, id, store.ForUpdate(tx))
	if errors.Is(err, store.ErrNotFound) {
		return snap, envelope.NotFound("from_snapshot", id)
	}
	if err != nil {
		return snap, fmt.Errorf("snapshot %s: %w", id, err)
	}
	switch {
	case snap.State != "ready":
		return snap, precondition("from_snapshot", "snapshot %s is %s; only a ready snapshot seeds a sandbox", snap.ID, snap.State)
	case snap.Image == "" || snap.InstanceID == "":
		return snap, precondition("from_snapshot", "snapshot %s was taken before snapshots recorded their image: it restores in place only; take a new one", snap.ID)
	case !snap.Keep:
		sb, err := SandboxGet(ctx, tx, snap.TenantID, snap.SandboxID, "")
		if err != nil {
			return snap, fmt.Errorf("snapshot %s: sandbox: %w", snap.ID, err)
		}
		if sb.State != SandboxActive {
			return snap, precondition("from_snapshot", "snapshot %s was not kept and its sandbox %s is deleted", snap.ID, sb.ID)
		}
	}
	return snap, nil
}

// checkSeed refuses a boot the snapshot's disk cannot start: another
// image, or a smaller disk than the snapshot's.
func (s *Service) checkSeed(t Template, boot *vps.Boot, snap Snapshot) error {
	img, err := boot.Check(s.inst)
	if err != nil {
		return err
	}
	if img != snap.Image {
		return precondition("from_snapshot", "snapshot %s is of image %s; template %s boots %s", snap.ID, snap.Image, t.Name, img)
	}
	if d := boot.DiskGiB(); d < snap.DiskGiB {
		return precondition("from_snapshot", "snapshot %s has a %d GiB disk; template %s's flavor %s gives %d GiB",
			snap.ID, snap.DiskGiB, t.Name, boot.FlavorName(), d)
	}
	return nil
}

// snapshotIDs are the ids of snaps.
func snapshotIDs(snaps []Snapshot) []string {
	ids := make([]string, len(snaps))
	for i, s := range snaps {
		ids[i] = s.ID
	}
	return ids
}

// removeFiles asks the snapshot's node to remove its files (snapshot.delete),
// in tx; the command is the tenant's, or the platform's (tenantID "") when
// the tenant itself goes. A failed snapshot left nothing to remove; a
// node that is gone took the files with it.
func (s *Service) removeFiles(ctx context.Context, tx store.Tx, tenantID string, snap Snapshot, now time.Time) error {
	if snap.InstanceID == "" || snap.State == "failed" {
		return nil
	}
	if _, err := fleet.NodeSiteID(ctx, tx, snap.NodeID); errors.Is(err, store.ErrNotFound) {
		return nil
	} else if err != nil {
		return fmt.Errorf("snapshot %s: node %s: %w", snap.ID, snap.NodeID, err)
	}
	_, err := s.inst.SendTo(ctx, tx, tenantID, snap.NodeID, vmcmd.KindSnapshotDelete,
		vmcmd.SnapshotParams{InstanceID: vps.HostID(snap.InstanceID), SnapshotID: vps.HostID(snap.ID)}, snap.ID+"/delete", now)
	return err
}

// removeTenantSnapshots asks each node holding a tenant's snapshots to
// remove their files, inside the tenant delete's transaction (which then
// removes the rows). The commands are the platform's: the cascade deletes
// the tenant's own commands.
func (s *Service) removeTenantSnapshots(ctx context.Context, tx store.Tx, tenantID string) error {
	snaps, err := SnapshotsOfTenant(ctx, tx, tenantID)
	if err != nil {
		return err
	}
	now := s.env.Clock().Now()
	for _, snap := range snaps {
		if err := s.removeFiles(ctx, tx, "", snap, now); err != nil {
			return err
		}
	}
	return nil
}

// TenantRowsDelete deletes the tenant's rows of this module (as the
// package's TenantRowsDelete) after asking the nodes to remove the files
// of its snapshots: a kept one outlives its sandbox, so a tenant delete
// is the last thing that removes it.
func (s *Service) TenantRowsDelete(ctx context.Context, tx store.Tx, tenantID string) error {
	if err := s.removeTenantSnapshots(ctx, tx, tenantID); err != nil {
		return err
	}
	return TenantRowsDelete(ctx, tx, tenantID)
}
