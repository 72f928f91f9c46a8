package sandbox_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/sandbox"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vmcmd"
	"github.com/better-compute/better-compute/internal/vps"
)

func (f *fixture) keptSnapshot(t *testing.T, sandboxID string) string {
	t.Helper()
	s, err := f.acme.Sandboxes.Snapshot(context.Background(), connect.NewRequest(&apiv1.SnapshotSandboxRequest{Tenant: "acme", Sandbox: sandboxID, Keep: true}))
	require.NoError(t, err)
	require.True(t, s.Msg.GetSnapshot().GetKeep())
	id := s.Msg.GetSnapshot().GetId()
	bctest.WaitFor(t, "snapshot "+id+" ready", func() bool {
		return f.count(t, `SELECT COUNT(*) FROM sandbox_snapshots WHERE id = $1 AND state = 'ready'`, id) == 1
	})
	return id
}

func (f *fixture) createFrom(tenant string, c interface {
	Create(context.Context, *connect.Request[apiv1.CreateSandboxRequest]) (*connect.Response[apiv1.CreateSandboxResponse], error)
}, template, snap string) (*apiv1.Sandbox, error) {
	r, err := c.Create(context.Background(), connect.NewRequest(&apiv1.CreateSandboxRequest{Tenant: tenant, Template: template, FromSnapshot: snap}))
	if err != nil {
		return nil, err
	}
	return r.Msg.GetSandbox(), nil
}

// TestSandboxFromKeptSnapshot: a kept snapshot outlives its sandbox, and a
// new sandbox starts from its disk, on its node, as a guest of its own (its
// own instance, address and name); the host keeps the kept snapshot's
// files and removes the others with the instance. Deleting the snapshot
// removes its row and, on the host, its files.
func TestSandboxFromKeptSnapshot(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	ctx := context.Background()
	_, err := f.acme.SandboxTemplates.Create(ctx, connect.NewRequest(templateReq("t1", 0, 0)))
	require.NoError(t, err)
	c, err := f.acme.Sandboxes.Create(ctx, connect.NewRequest(&apiv1.CreateSandboxRequest{Tenant: "acme", Template: "t1"}))
	require.NoError(t, err)
	a := f.waitSandbox(t, c.Msg.GetSandbox().GetId(), "running")
	hv := f.sim.Daemons[0].Hypervisor()
	dirA := hv.GuestDir(vps.HostID(a.GetInstanceId()))
	require.NoError(t, os.MkdirAll(dirA, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dirA, "note.txt"), []byte("written in a\n"), 0o600))
	kept := f.keptSnapshot(t, a.GetId())
	plain := f.readySnapshot(t, a.GetId())
	snapsOfA := filepath.Join(filepath.Dir(filepath.Dir(dirA)), "snapshots", vps.HostID(a.GetInstanceId()))
	require.DirExists(t, filepath.Join(snapsOfA, vps.HostID(plain)))

	// Delete a: the kept snapshot stays (row and files), the other goes.
	_, err = f.acme.Sandboxes.Delete(ctx, connect.NewRequest(&apiv1.DeleteSandboxRequest{Tenant: "acme", Sandbox: a.GetId()}))
	require.NoError(t, err)
	f.waitSandbox(t, a.GetId(), "deleted")
	bctest.WaitFor(t, "a's instance gone", func() bool {
		return f.count(t, `SELECT COUNT(*) FROM instances WHERE id = $1 AND state = 'deleted'`, a.GetInstanceId()) == 1
	})
	require.Zero(t, f.count(t, `SELECT COUNT(*) FROM sandbox_snapshots WHERE id = $1`, plain))
	require.NoDirExists(t, filepath.Join(snapsOfA, vps.HostID(plain)))
	require.DirExists(t, filepath.Join(snapsOfA, vps.HostID(kept)))
	var keep []string
	require.NoError(t, json.Unmarshal([]byte(f.str(t, `SELECT params FROM commands WHERE kind = 'instance.delete' AND node_id = $1`, a.GetNodeId())), &struct {
		Keep *[]string `json:"keep_snapshots"`
	}{&keep}))
	require.Equal(t, []string{vps.HostID(kept)}, keep)

	list, err := f.acme.Sandboxes.ListSnapshots(ctx, connect.NewRequest(&apiv1.ListSandboxSnapshotsRequest{Tenant: "acme", Sandbox: a.GetId()}))
	require.NoError(t, err)
	require.Len(t, list.Msg.GetSnapshots(), 1)
	got := list.Msg.GetSnapshots()[0]
	require.Equal(t, kept, got.GetId())
	require.True(t, got.GetKeep())
	require.Equal(t, "debian-12", got.GetImage())
	require.EqualValues(t, 20, got.GetDiskGib())

	// b starts from it: its own guest, with a's file.
	b, err := f.createFrom("acme", f.acme.Sandboxes, "t1", kept)
	require.NoError(t, err)
	require.Equal(t, "cold", b.GetOrigin())
	b = f.waitSandbox(t, b.GetId(), "running")
	require.Equal(t, a.GetNodeId(), b.GetNodeId(), "on the snapshot's node")
	require.NotEqual(t, a.GetInstanceId(), b.GetInstanceId())
	p, _, ok := f.guest(b.GetInstanceId())
	require.True(t, ok)
	require.Equal(t, &vmcmd.SnapshotParams{InstanceID: vps.HostID(a.GetInstanceId()), SnapshotID: vps.HostID(kept)}, p.FromSnapshot)
	require.NotEqual(t, vps.HostID(a.GetInstanceId()), p.Seed.Hostname)
	note, err := os.ReadFile(filepath.Join(hv.GuestDir(vps.HostID(b.GetInstanceId())), "note.txt"))
	require.NoError(t, err)
	require.Equal(t, "written in a\n", string(note))
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM events WHERE type = 'sandbox.created' AND resource_id = $1 AND CAST(data AS TEXT) LIKE '%`+kept+`%'`, b.GetId()))

	// Deleting the snapshot removes its row and its files; again is NOT_FOUND.
	d, err := f.acme.Sandboxes.DeleteSnapshot(ctx, connect.NewRequest(&apiv1.DeleteSandboxSnapshotRequest{Tenant: "acme", Snapshot: kept}))
	require.NoError(t, err)
	require.Equal(t, kept, d.Msg.GetSnapshot().GetId())
	require.Zero(t, f.count(t, `SELECT COUNT(*) FROM sandbox_snapshots WHERE id = $1`, kept))
	bctest.WaitFor(t, "the kept snapshot's files removed", func() bool {
		_, err := os.Stat(filepath.Join(snapsOfA, vps.HostID(kept)))
		return os.IsNotExist(err)
	})
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM audit_log WHERE action = 'sandboxes.deleteSnapshot' AND resource_id = $1`, a.GetId()))
	_, err = f.acme.Sandboxes.DeleteSnapshot(ctx, connect.NewRequest(&apiv1.DeleteSandboxSnapshotRequest{Tenant: "acme", Snapshot: kept}))
	refused(t, err, "NOT_FOUND", "", "not found")
	// b, deleted with no kept snapshot, keeps nothing.
	_, err = f.acme.Sandboxes.Delete(ctx, connect.NewRequest(&apiv1.DeleteSandboxRequest{Tenant: "acme", Sandbox: b.GetId()}))
	require.NoError(t, err)
	f.waitSandbox(t, b.GetId(), "deleted")
}

// TestSandboxFromSnapshotRefusals: each refusal names its field, reason
// and code, and writes nothing but its audit row.
func TestSandboxFromSnapshotRefusals(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	ctx := context.Background()
	_, err := f.acme.SandboxTemplates.Create(ctx, connect.NewRequest(templateReq("t1", 0, 0)))
	require.NoError(t, err)
	_, err = f.admin.Flavors.Create(ctx, connect.NewRequest(&apiv1.CreateFlavorRequest{Name: "tiny", Vcpus: 1, MemoryMib: 1024, DiskGib: 10}))
	require.NoError(t, err)
	tiny := templateReq("t-tiny", 0, 0)
	tiny.Flavor = "tiny"
	_, err = f.acme.SandboxTemplates.Create(ctx, connect.NewRequest(tiny))
	require.NoError(t, err)
	c, err := f.acme.Sandboxes.Create(ctx, connect.NewRequest(&apiv1.CreateSandboxRequest{Tenant: "acme", Template: "t1"}))
	require.NoError(t, err)
	sb := f.waitSandbox(t, c.Msg.GetSandbox().GetId(), "running")
	kept := f.keptSnapshot(t, sb.GetId())

	acme, globex := tenantID(t, f, "acme"), tenantID(t, f, "globex")
	now := f.cp.Clock.Now()
	row := func(i int, mod func(*sandbox.Snapshot)) string {
		s := sandbox.Snapshot{ID: envelope.NewID(sandbox.SnapshotIDPrefix, now.Add(time.Duration(i)*time.Millisecond)), TenantID: acme,
			SandboxID: sb.GetId(), TemplateID: sb.GetTemplateId(), NodeID: sb.GetNodeId(), Shape: "s", State: "ready", CreateTime: now,
			InstanceID: sb.GetInstanceId(), Image: "debian-12", DiskGiB: 20, Keep: true}
		mod(&s)
		f.insertSnapshot(t, s)
		return s.ID
	}
	saving := row(1, func(s *sandbox.Snapshot) { s.State = "saving" })
	old := row(2, func(s *sandbox.Snapshot) { s.Image, s.InstanceID = "", "" })
	otherImage := row(3, func(s *sandbox.Snapshot) { s.Image = "ubuntu-24" })
	foreign := row(4, func(s *sandbox.Snapshot) { s.TenantID = globex })
	nowhere := row(5, func(s *sandbox.Snapshot) { s.NodeID = "nod_01JAAAAAAAAAAAAAAAAAAAAAAA" })

	before := f.rows(t)
	for _, tc := range []struct {
		name, template, snap, code, field, reason string
	}{
		{"not a snapshot id", "t1", "sbx_123", "INVALID_ARGUMENT", "from_snapshot", "not a valid sbs id"},
		{"unknown snapshot", "t1", envelope.NewID(sandbox.SnapshotIDPrefix, now.Add(time.Second)), "NOT_FOUND", "", "not found"},
		{"another tenant's snapshot", "t1", foreign, "NOT_FOUND", "", "not found"},
		{"a snapshot not ready", "t1", saving, "FAILED_PRECONDITION", "from_snapshot", "only a ready snapshot seeds a sandbox"},
		{"a snapshot that records no image", "t1", old, "FAILED_PRECONDITION", "from_snapshot", "restores in place only"},
		{"another image", "t1", otherImage, "FAILED_PRECONDITION", "from_snapshot", "is of image ubuntu-24; template t1 boots debian-12"},
		{"a smaller disk", "t-tiny", kept, "FAILED_PRECONDITION", "from_snapshot", "has a 20 GiB disk; template t-tiny's flavor tiny gives 10 GiB"},
		{"a node that cannot hold it", "t1", nowhere, "", "", "nod_01JAAAAAAAAAAAAAAAAAAAAAAA"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.createFrom("acme", f.acme.Sandboxes, tc.template, tc.snap)
			if tc.code == "" {
				require.Error(t, err)
				require.Contains(t, err.Error(), tc.reason)
				return
			}
			refused(t, err, tc.code, tc.field, tc.reason)
		})
	}
	// Another tenant learns nothing of acme's snapshot, with its own
	// template or acme's name.
	_, err = f.createFrom("acme", f.globex.Sandboxes, "t1", kept)
	require.Error(t, err)
	_, err = f.globex.Sandboxes.DeleteSnapshot(ctx, connect.NewRequest(&apiv1.DeleteSandboxSnapshotRequest{Tenant: "globex", Snapshot: kept}))
	refused(t, err, "NOT_FOUND", "", "not found")
	_, err = f.globex.Sandboxes.DeleteSnapshot(ctx, connect.NewRequest(&apiv1.DeleteSandboxSnapshotRequest{Tenant: "acme", Snapshot: kept}))
	require.Error(t, err)
	l, err := f.globex.Sandboxes.ListSnapshots(ctx, connect.NewRequest(&apiv1.ListSandboxSnapshotsRequest{Tenant: "globex", Sandbox: sb.GetId()}))
	require.NoError(t, err)
	require.Len(t, l.Msg.GetSnapshots(), 1, "globex sees only its own row")
	require.Equal(t, foreign, l.Msg.GetSnapshots()[0].GetId())
	_, err = f.acme.Sandboxes.DeleteSnapshot(ctx, connect.NewRequest(&apiv1.DeleteSandboxSnapshotRequest{Tenant: "acme", Snapshot: saving}))
	refused(t, err, "FAILED_PRECONDITION", "snapshot", "still saving")
	_, err = f.acme.Sandboxes.ListSnapshots(ctx, connect.NewRequest(&apiv1.ListSandboxSnapshotsRequest{Tenant: "acme", Sandbox: "sbs_1"}))
	refused(t, err, "INVALID_ARGUMENT", "sandbox", "not a valid sbx id")
	require.Equal(t, before, f.rows(t), "a refusal writes nothing but its audit row")

	// A snapshot not kept seeds sandboxes while its sandbox lives; deleted
	// with it, it is gone.
	plain := f.readySnapshot(t, sb.GetId())
	_, err = f.acme.Sandboxes.Delete(ctx, connect.NewRequest(&apiv1.DeleteSandboxRequest{Tenant: "acme", Sandbox: sb.GetId()}))
	require.NoError(t, err)
	_, err = f.createFrom("acme", f.acme.Sandboxes, "t1", plain)
	refused(t, err, "NOT_FOUND", "", "not found")
}

func (f *fixture) str(t testing.TB, query string, args ...any) string {
	t.Helper()
	var s string
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, query, args...).Scan(&s)
	}))
	return s
}
