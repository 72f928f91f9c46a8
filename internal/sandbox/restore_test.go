package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/sandbox"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vps"
)

// readySnapshot snapshots a running sandbox and waits until its host
// answered.
func (f *fixture) readySnapshot(t *testing.T, sandboxID string) string {
	t.Helper()
	s, err := f.acme.Sandboxes.Snapshot(context.Background(), connect.NewRequest(&apiv1.SnapshotSandboxRequest{Tenant: "acme", Sandbox: sandboxID}))
	require.NoError(t, err)
	id := s.Msg.GetSnapshot().GetId()
	bctest.WaitFor(t, "snapshot "+id+" ready", func() bool {
		return f.count(t, `SELECT COUNT(*) FROM sandbox_snapshots WHERE id = $1 AND state = 'ready'`, id) == 1
	})
	return id
}

// insertSnapshot writes a snapshot row as Snapshot would, for states and
// tenants a request cannot make on these hosts.
func (f *fixture) insertSnapshot(t *testing.T, snap sandbox.Snapshot) {
	t.Helper()
	require.NoError(t, f.cp.App.DB.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return sandbox.SnapshotInsert(ctx, tx, &snap)
	}))
}

func (f *fixture) restore(sandboxID, snapID string) (*apiv1.Sandbox, error) {
	r, err := f.acme.Sandboxes.Restore(context.Background(), connect.NewRequest(&apiv1.RestoreSandboxRequest{Tenant: "acme", Sandbox: sandboxID, Snapshot: snapID}))
	if err != nil {
		return nil, err
	}
	return r.Msg.GetSandbox(), nil
}

// TestRestore: a file written in the guest before a snapshot is back, as
// written, after the sandbox is restored in place; the sandbox reads
// restoring until its host answers instance.restore.
func TestRestore(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	ctx := context.Background()
	_, err := f.acme.SandboxTemplates.Create(ctx, connect.NewRequest(templateReq("t1", 0, 0)))
	require.NoError(t, err)
	c, err := f.acme.Sandboxes.Create(ctx, connect.NewRequest(&apiv1.CreateSandboxRequest{Tenant: "acme", Template: "t1"}))
	require.NoError(t, err)
	sb := f.waitSandbox(t, c.Msg.GetSandbox().GetId(), "running")

	dir := f.sim.Daemons[0].Hypervisor().GuestDir(vps.HostID(sb.GetInstanceId()))
	require.NoError(t, os.MkdirAll(dir, 0o700))
	note := filepath.Join(dir, "note.txt")
	require.NoError(t, os.WriteFile(note, []byte("written before the snapshot\n"), 0o600))
	snap := f.readySnapshot(t, sb.GetId())

	require.NoError(t, os.WriteFile(note, []byte("changed after\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "later.txt"), []byte("x"), 0o600))

	got, err := f.restore(sb.GetId(), snap)
	require.NoError(t, err)
	require.Contains(t, []string{"restoring", "running"}, got.GetState(), "the host may answer before the response is read")
	f.waitSandbox(t, sb.GetId(), "running")
	b, err := os.ReadFile(note)
	require.NoError(t, err)
	require.Equal(t, "written before the snapshot\n", string(b))
	require.NoFileExists(t, filepath.Join(dir, "later.txt"))

	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM events WHERE type = 'sandbox.restore_requested' AND resource_id = $1`, sb.GetId()))
	bctest.WaitFor(t, "sandbox.restored", func() bool {
		return f.count(t, `SELECT COUNT(*) FROM events WHERE type = 'sandbox.restored' AND resource_id = $1`, sb.GetId()) == 1
	})
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM audit_log WHERE action = 'sandboxes.restore' AND resource_id = $1`, sb.GetId()))
	require.Equal(t, 0, f.count(t, `SELECT COUNT(*) FROM sandboxes WHERE id = $1 AND restoring <> ''`, sb.GetId()))

	// The sandbox outlives its template: with the template deleted and
	// drained, it still snapshots, and the same snapshot restores again
	// (each restore is its own command).
	_, err = f.acme.SandboxTemplates.Delete(ctx, connect.NewRequest(&apiv1.DeleteSandboxTemplateRequest{Tenant: "acme", Template: "t1"}))
	require.NoError(t, err)
	require.NoError(t, f.cp.App.Sandboxes.ReconcileWarm(ctx))
	require.Zero(t, f.count(t, `SELECT COUNT(*) FROM sandbox_templates`))
	f.readySnapshot(t, sb.GetId())
	require.NoError(t, os.WriteFile(note, []byte("changed again\n"), 0o600))
	_, err = f.restore(sb.GetId(), snap)
	require.NoError(t, err)
	bctest.WaitFor(t, "the second restore", func() bool {
		return f.count(t, `SELECT COUNT(*) FROM events WHERE type = 'sandbox.restored' AND resource_id = $1`, sb.GetId()) == 2
	})
	b, err = os.ReadFile(note)
	require.NoError(t, err)
	require.Equal(t, "written before the snapshot\n", string(b))

	// The snapshots live in the instance's directory on the host, which
	// the delete removes: their rows go with the sandbox, in its
	// transaction, so none is offered after its files are gone.
	require.Equal(t, 2, f.count(t, `SELECT COUNT(*) FROM sandbox_snapshots WHERE sandbox_id = $1`, sb.GetId()))
	_, err = f.acme.Sandboxes.Delete(ctx, connect.NewRequest(&apiv1.DeleteSandboxRequest{Tenant: "acme", Sandbox: sb.GetId()}))
	require.NoError(t, err)
	require.Zero(t, f.count(t, `SELECT COUNT(*) FROM sandbox_snapshots WHERE sandbox_id = $1`, sb.GetId()))
}

// TestRestoreRefusals: each refusal names its field, reason and code and
// writes nothing but its audit row.
func TestRestoreRefusals(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	ctx := context.Background()
	_, err := f.acme.SandboxTemplates.Create(ctx, connect.NewRequest(templateReq("t1", 0, 0)))
	require.NoError(t, err)
	var sbs []*apiv1.Sandbox
	for range 3 {
		c, err := f.acme.Sandboxes.Create(ctx, connect.NewRequest(&apiv1.CreateSandboxRequest{Tenant: "acme", Template: "t1"}))
		require.NoError(t, err)
		sbs = append(sbs, f.waitSandbox(t, c.Msg.GetSandbox().GetId(), "running"))
	}
	sb, other, doomed := sbs[0], sbs[1], sbs[2]
	snapOther := f.readySnapshot(t, other.GetId())
	snapDoomed := f.readySnapshot(t, doomed.GetId())
	now := f.cp.Clock.Now()
	saving := envelope.NewID(sandbox.SnapshotIDPrefix, now)
	f.insertSnapshot(t, sandbox.Snapshot{ID: saving, TenantID: tenantID(t, f, "acme"), SandboxID: sb.GetId(), TemplateID: sb.GetTemplateId(),
		NodeID: sb.GetNodeId(), Shape: "s", State: "saving", CreateTime: now})
	// Another tenant's snapshot, even one naming acme's sandbox, is not
	// acme's to restore.
	foreign := envelope.NewID(sandbox.SnapshotIDPrefix, now.Add(time.Millisecond))
	f.insertSnapshot(t, sandbox.Snapshot{ID: foreign, TenantID: tenantID(t, f, "globex"), SandboxID: sb.GetId(), TemplateID: sb.GetTemplateId(),
		NodeID: sb.GetNodeId(), Shape: "s", State: "ready", CreateTime: now})
	_, err = f.acme.Sandboxes.Delete(ctx, connect.NewRequest(&apiv1.DeleteSandboxRequest{Tenant: "acme", Sandbox: doomed.GetId()}))
	require.NoError(t, err)
	f.waitSandbox(t, doomed.GetId(), "deleted")
	bctest.WaitFor(t, "the deleted sandbox's instance gone", func() bool {
		return f.count(t, `SELECT COUNT(*) FROM instances WHERE id = $1 AND state = 'deleted'`, doomed.GetInstanceId()) == 1
	})

	before := f.rows(t)
	restores := func() int {
		return f.count(t, `SELECT COUNT(*) FROM commands WHERE kind = 'instance.restore'`)
	}
	require.Equal(t, 0, restores())

	for _, tc := range []struct {
		name, sandbox, snap, code, field, reason string
	}{
		{"no snapshot id", sb.GetId(), "", "INVALID_ARGUMENT", "snapshot", ""},
		{"not a snapshot id", sb.GetId(), "sbx_123", "INVALID_ARGUMENT", "snapshot", ""},
		{"unknown snapshot", sb.GetId(), envelope.NewID(sandbox.SnapshotIDPrefix, now.Add(time.Second)), "NOT_FOUND", "", "not found"},
		{"another tenant's snapshot", sb.GetId(), foreign, "NOT_FOUND", "", "not found"},
		{"a snapshot of another sandbox", sb.GetId(), snapOther, "FAILED_PRECONDITION", "snapshot", "restores only into the sandbox it was taken of"},
		{"a snapshot not ready", sb.GetId(), saving, "FAILED_PRECONDITION", "snapshot", "only a ready snapshot restores"},
		{"a deleted sandbox", doomed.GetId(), snapDoomed, "FAILED_PRECONDITION", "sandbox", "is deleted"},
	} {
		_, err := f.restore(tc.sandbox, tc.snap)
		refused(t, err, tc.code, tc.field, tc.reason)
	}
	// Another tenant asking for acme's sandbox learns nothing.
	_, err = f.globex.Sandboxes.Restore(ctx, connect.NewRequest(&apiv1.RestoreSandboxRequest{Tenant: "acme", Sandbox: other.GetId(), Snapshot: snapOther}))
	require.Error(t, err)
	_, err = f.globex.Sandboxes.Restore(ctx, connect.NewRequest(&apiv1.RestoreSandboxRequest{Tenant: "globex", Sandbox: other.GetId(), Snapshot: snapOther}))
	refused(t, err, "NOT_FOUND", "", "not found")

	require.Equal(t, before, f.rows(t), "a refusal writes nothing but its audit row")

	// An expired sandbox (the sweep not yet run) is not restored.
	f.cp.Clock.Advance(11 * time.Minute)
	_, err = f.restore(other.GetId(), snapOther)
	refused(t, err, "FAILED_PRECONDITION", "sandbox", "expired")
	require.Equal(t, 0, restores())
	require.Equal(t, 0, f.count(t, `SELECT COUNT(*) FROM sandboxes WHERE restoring <> ''`))
}

func tenantID(t *testing.T, f *fixture, name string) string {
	t.Helper()
	g, err := f.admin.Tenants.Get(context.Background(), connect.NewRequest(&apiv1.GetTenantRequest{Tenant: name}))
	require.NoError(t, err)
	return g.Msg.GetTenant().GetId()
}

// TestRestoreExpired: a restore whose command expires before its host
// answers ends the restoring mark (sandbox.restore_failed), so the sandbox
// does not read restoring forever.
func TestRestoreExpired(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	ctx := context.Background()
	_, err := f.acme.SandboxTemplates.Create(ctx, connect.NewRequest(templateReq("t1", 0, 0)))
	require.NoError(t, err)
	c, err := f.acme.Sandboxes.Create(ctx, connect.NewRequest(&apiv1.CreateSandboxRequest{Tenant: "acme", Template: "t1"}))
	require.NoError(t, err)
	sb := f.waitSandbox(t, c.Msg.GetSandbox().GetId(), "running")
	snap := f.readySnapshot(t, sb.GetId())

	// The host goes away: the restore is never answered.
	require.NoError(t, f.sim.Daemons[0].Stop())
	got, err := f.restore(sb.GetId(), snap)
	require.NoError(t, err)
	require.Equal(t, "restoring", got.GetState())
	_, err = f.acme.Sandboxes.Snapshot(ctx, connect.NewRequest(&apiv1.SnapshotSandboxRequest{Tenant: "acme", Sandbox: sb.GetId()}))
	refused(t, err, "FAILED_PRECONDITION", "", "a snapshot needs it running")
	_, err = f.restore(sb.GetId(), snap)
	refused(t, err, "FAILED_PRECONDITION", "sandbox", "is restoring")

	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		var id string
		if err := tx.QueryRow(ctx, `SELECT id FROM commands WHERE kind = 'instance.restore'`).Scan(&id); err != nil {
			return err
		}
		cmd, err := fleet.CommandGet(ctx, tx, "", id)
		if err != nil {
			return err
		}
		return f.cp.App.Sandboxes.CommandsExpired(ctx, tx, []fleet.Command{cmd})
	}))
	require.Equal(t, "running", f.sandbox(t, sb.GetId()).GetState())
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM events WHERE type = 'sandbox.restore_failed' AND resource_id = $1`, sb.GetId()))
}
