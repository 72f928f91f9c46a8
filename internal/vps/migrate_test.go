package vps_test

import (
	"context"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vps"
)

// upTo is a module's migrations up to and including version n.
func upTo(t *testing.T, m store.Migrations, n string) store.Migrations {
	t.Helper()
	out := fstest.MapFS{}
	require.NoError(t, fs.WalkDir(m.FS, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		base := p[strings.LastIndex(p, "/")+1:]
		if base[:4] <= n {
			b, err := fs.ReadFile(m.FS, p)
			out[p] = &fstest.MapFile{Data: b}
			return err
		}
		return nil
	}))
	return store.Migrations{Module: m.Module, FS: out}
}

// TestMigrationSealsUserData: migration 0003 leaves no plaintext user
// data of rows written before it — the instance column goes, an ended
// instance.create command loses its seed secrets — and keeps an open
// command as it was, for its delivery.
func TestMigrationSealsUserData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := bctest.NewDB(t, nil)
	var before []store.Migrations
	for _, m := range app.Modules() {
		if m.Module == vps.Module {
			m = upTo(t, m, "0002")
		}
		before = append(before, m)
	}
	require.NoError(t, db.Migrate(ctx, before...))
	const marker = "MARKER-old-user-data"
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	seed := `{"instance_id":"ins-%s","seed":{"hostname":"vm","user":"bc","user_data":"` + marker + `","host_key":"KEY-` + marker + `"}}`
	require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO instances (id, tenant_id, project_id, name, state, flavor_id, flavor_name, vcpus,
			memory_mib, disk_gib, image, image_sha256, ip_pool_id, ip_pool_name, address, prefix_len, gateway, dns, mac, network_policy,
			ssh_keys, user_data, pool_id, reservation_id, node_id, node_name, cpuset, created_by, create_time, update_time)
			VALUES ('ins_old', 'tnt_a', '', 'old', 'running', 'flv_a', 'small', 1, 512, 1, 'debian-12', '', 'ipp_a', 'dev',
			'10.0.0.2', 24, '10.0.0.1', '[]', '52:54:00:00:00:01', 'egress', '[]', $1, 'pool_a', 'rsv_a', 'nod_a', 'n', '', 'u', $2, $2)`,
			marker, now); err != nil {
			return err
		}
		if err := fleet.NodeInsert(ctx, tx, &fleet.NodeInsertParams{ID: "nod_a", Name: "n", TenantID: "tnt_a", HardwareKey: "hw",
			State: "active", Liveness: fleet.LivenessReady, CreateTime: now}); err != nil {
			return err
		}
		for _, id := range []string{"ended", "open"} {
			c, _, err := fleet.CommandInsert(ctx, tx, &fleet.CommandInsertParams{ID: "cmd_" + id, TenantID: "tnt_a", NodeID: "nod_a",
				Kind: "instance.create", Params: strings.Replace(seed, "%s", id, 1), Deadline: now.Add(time.Hour), CreateTime: now})
			if err != nil {
				return err
			}
			if id == "ended" {
				if _, err := fleet.CommandUpdate(ctx, tx, &fleet.CommandUpdateParams{ID: c.ID, FromState: c.State, State: fleet.CommandSucceeded}); err != nil {
					return err
				}
			}
		}
		return nil
	}))

	require.NoError(t, db.Migrate(ctx, app.Modules()...))
	require.NoError(t, db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		var sealed []byte
		if err := tx.QueryRow(ctx, `SELECT user_data_sealed FROM instances WHERE id = 'ins_old'`).Scan(&sealed); err != nil {
			return err
		}
		require.Empty(t, sealed)
		ended, err := fleet.CommandGet(ctx, tx, "", "cmd_ended")
		require.NoError(t, err)
		require.NotContains(t, ended.Params, marker)
		require.Contains(t, ended.Params, `"hostname"`, "the rest of the seed stays")
		open, err := fleet.CommandGet(ctx, tx, "", "cmd_open")
		require.NoError(t, err)
		require.Contains(t, open.Params, marker, "an open command is delivered as it was stored")
		return nil
	}))
	err := db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		var n int
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM instances WHERE user_data <> ''`).Scan(&n)
	})
	require.ErrorContains(t, err, "user_data", "the plaintext column is gone")
}
