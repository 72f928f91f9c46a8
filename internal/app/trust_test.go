package app_test

import (
	"context"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/cmdsig"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/store"
)

// trustFixture is a control plane with one real bcd (fake hardware) joined
// and ready.
type trustFixture struct {
	cp     *bctest.ControlPlane
	d      *bctest.FakeDaemon
	nodeID string
}

func newTrustFixture(t *testing.T) *trustFixture {
	t.Helper()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "gpu"}))
	require.NoError(t, err)
	tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "gpu"}))
	require.NoError(t, err)
	d, err := bctest.NewFakeDaemon(bctest.FakeDaemonConfig{Gateway: cp.GatewayAddr, StateDir: t.TempDir()})
	require.NoError(t, err)
	require.NoError(t, d.Join(ctx, tok.Msg.GetToken()))
	d.Start()
	t.Cleanup(func() { _ = d.Stop() })
	eventually(t, "the node ready", func() bool { n := readNode(t, cp); return n.state == "active" && n.liveness == "ready" })
	return &trustFixture{cp: cp, d: d, nodeID: d.NodeID()}
}

// command reads a command row.
func (f *trustFixture) command(t *testing.T, id string) fleet.Command {
	t.Helper()
	var c fleet.Command
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) (err error) {
		c, err = fleet.CommandGet(ctx, tx, "", id)
		return err
	}))
	return c
}

// waitEnded waits for a command to reach a final state and returns it.
func (f *trustFixture) waitEnded(t *testing.T, id string) fleet.Command {
	t.Helper()
	var c fleet.Command
	eventually(t, "command "+id+" ended", func() bool {
		c = f.command(t, id)
		return c.State == fleet.CommandSucceeded || c.State == fleet.CommandFailed
	})
	return c
}

// forge writes a command row the way an attacker with only the database
// would: the next sequence number, a row, and a NOTIFY (which any
// PostgreSQL client may send) so the node's session delivers it now.
func (f *trustFixture) forge(t *testing.T, id, kind, params string, signer string, version int64, sig []byte) {
	t.Helper()
	now := f.cp.Clock.Now()
	require.NoError(t, f.cp.App.DB.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		var seq int64
		if err := tx.QueryRow(ctx, `UPDATE nodes SET next_seq = next_seq + 1 WHERE id = $1 RETURNING next_seq`, f.nodeID).Scan(&seq); err != nil {
			return err
		}
		if sig == nil {
			sig = []byte{}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO commands (id, tenant_id, node_id, seq, kind, params, idempotency_key, state,
			traceparent, created_by, deadline, create_time, update_time, signer, trust_version, signature)
			SELECT $1, tenant_id, id, $2, $3, $4, $1, 'pending', '', 'attacker', $5, $6, $6, $7, $8, $9 FROM nodes WHERE id = $10`,
			id, seq, kind, params, now.Add(time.Hour), now, signer, version, sig, f.nodeID); err != nil {
			return err
		}
		f.cp.App.Gateway.NotifyCommand(tx, f.nodeID)
		return nil
	}))
}

// cgroupsNamed lists the node's cgroup directories whose name holds s.
func (f *trustFixture) cgroupsNamed(t *testing.T, s string) []string {
	t.Helper()
	var found []string
	_ = filepath.WalkDir(f.d.CgroupRoot(), func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.IsDir() && strings.Contains(e.Name(), s) {
			found = append(found, p)
		}
		return nil
	})
	return found
}

// TestForgedCommandRowRefusedByBcd: whoever holds only the database can
// write a command row, but a real bcd that pinned the command-signing
// roots at join applies nothing it did not verify: an unsigned row, and a
// row carrying a real signature lifted from another command, both fail
// with the reason recorded on the command, and the bind they asked for
// left no cgroup. A command the control plane made runs as before.
func TestForgedCommandRowRefusedByBcd(t *testing.T) {
	t.Parallel()
	f := newTrustFixture(t)
	ctx := context.Background()

	// The node pinned the bundle at join and reports its version.
	eventually(t, "the node's trust version recorded", func() bool {
		var v int64
		_ = f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT trust_version FROM nodes WHERE id = $1`, f.nodeID).Scan(&v)
		})
		return v == 1
	})

	run, err := f.cp.Admin().Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{Tenant: "acme", Node: f.nodeID, Kind: "inventory.refresh"}))
	require.NoError(t, err)
	legit := f.waitEnded(t, run.Msg.GetCommand().GetId())
	require.Equal(t, fleet.CommandSucceeded, legit.State, "a signed command runs: %s %s", legit.FailureCode, legit.Message)
	require.NotEmpty(t, legit.Signature)
	require.NotEmpty(t, legit.Signer)
	require.Equal(t, int64(1), legit.TrustVersion)

	bind := `{"allocationId":"alc_forged","cpuQuotaUs":"0","memoryMaxBytes":"0"}`
	f.forge(t, "cmd_forged1", "allocation.bind", bind, "", 0, nil)
	c := f.waitEnded(t, "cmd_forged1")
	require.Equal(t, fleet.CommandFailed, c.State)
	require.Equal(t, cmdsig.FailUnsigned, c.FailureCode, c.Message)

	// A genuine signature and signer, lifted from the command above, do
	// not cover another command.
	f.forge(t, "cmd_forged2", "allocation.bind", bind, legit.Signer, legit.TrustVersion, legit.Signature)
	c = f.waitEnded(t, "cmd_forged2")
	require.Equal(t, fleet.CommandFailed, c.State)
	require.Equal(t, cmdsig.FailBadSignature, c.FailureCode, c.Message)

	require.Empty(t, f.cgroupsNamed(t, "alc_forged"), "a refused bind leaves nothing on the node")

	// The node goes on applying signed commands after the refusals.
	run, err = f.cp.Admin().Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{Tenant: "acme", Node: f.nodeID, Kind: "inventory.refresh"}))
	require.NoError(t, err)
	require.Equal(t, fleet.CommandSucceeded, f.waitEnded(t, run.Msg.GetCommand().GetId()).State)
}

// TestReplayedCommandRefusedByBcd: a signed command that already ran,
// written again by a database-only attacker under a new sequence number
// (with or without a new id), is refused; the same row put back pending
// is answered from the node's log, not run again.
func TestReplayedCommandRefusedByBcd(t *testing.T) {
	t.Parallel()
	f := newTrustFixture(t)
	ctx := context.Background()
	run, err := f.cp.Admin().Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{Tenant: "acme", Node: f.nodeID, Kind: "inventory.refresh"}))
	require.NoError(t, err)
	orig := f.waitEnded(t, run.Msg.GetCommand().GetId())
	require.Equal(t, fleet.CommandSucceeded, orig.State)
	applied := func() float64 {
		return metricValue(t, f.d, "bcd_commands_applied_total", map[string]string{"kind": "inventory.refresh", "state": "succeeded"})
	}
	before := applied()

	// A copy under a new id and the next sequence number.
	f.forge(t, "cmd_replay1", orig.Kind, orig.Params, orig.Signer, orig.TrustVersion, orig.Signature)
	c := f.waitEnded(t, "cmd_replay1")
	require.Equal(t, fleet.CommandFailed, c.State)
	require.Equal(t, cmdsig.FailBadSignature, c.FailureCode, c.Message)

	// The same id under the next sequence number: the attacker deletes
	// the original row first.
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `DELETE FROM commands WHERE id = $1`, orig.ID)
		return err
	}))
	f.forge(t, orig.ID, orig.Kind, orig.Params, orig.Signer, orig.TrustVersion, orig.Signature)
	c = f.waitEnded(t, orig.ID)
	require.Equal(t, fleet.CommandFailed, c.State)
	require.Equal(t, cmdsig.FailBadSignature, c.FailureCode, c.Message)
	require.Equal(t, before, applied(), "nothing ran again")
}

// metricValue sums a counter of a node's registry over the series whose
// labels include want.
func metricValue(t *testing.T, d *bctest.FakeDaemon, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := d.Metrics().Gather()
	require.NoError(t, err)
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue series
				}
			}
			total += m.GetCounter().GetValue()
		}
	}
	return total
}
