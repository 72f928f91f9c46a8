package metal_test

import (
	"context"
	"io/fs"
	"os"
	"path"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/metal"
	"github.com/better-compute/better-compute/internal/store"
)

// migrationsUpTo is the metal module's migrations before version v, as a
// database last migrated by an older release has them.
func migrationsUpTo(t *testing.T, v string) store.Migrations {
	t.Helper()
	out := fstest.MapFS{}
	src := os.DirFS("migrations")
	require.NoError(t, fs.WalkDir(src, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || path.Base(p) >= v {
			return err
		}
		b, err := fs.ReadFile(src, p)
		out[p] = &fstest.MapFile{Data: b}
		return err
	}))
	return store.Migrations{Module: metal.Module, FS: out}
}

// TestMigrationSiteDriversKeepsMachines: 0008 lifts the ipmi/redfish check
// on a database that holds machines with rows referencing them (a
// discovery token, a lease): every row survives, the references still
// hold and are still enforced, and a machine may name an external driver.
func TestMigrationSiteDriversKeepsMachines(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := bctest.NewDB(t, nil)
	require.NoError(t, db.Migrate(ctx, migrationsUpTo(t, "0008")))
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	insertMachine := func(ctx context.Context, tx store.Tx, id, driver, mac string) error {
		_, err := tx.Exec(ctx, `INSERT INTO machines (id, tenant_id, site_id, name, bmc_driver, bmc_address, bmc_host, bmc_username,
			bmc_credential_ref, bmc_credential, mac, hardware_profile, state, workflow_id, operation, commissioned, image_id, image_name,
			failed_operation, failed_step, failure_reason, failure_logs, inventory, erase_record, create_time, update_time)
			VALUES ($1, 't1', 'site_1', $1, $2, $4, '10.0.0.1', 'admin', 'ref', $3, $4, '', 'enrolled', '', '', 0, '', '',
			'', '', '', '', '{}', '{}', $5, $5)`, id, driver, []byte{1}, mac, now)
		return err
	}
	require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO sites (id, tenant_id, name, networks, dhcp_mode, description, create_time, update_time)
			VALUES ('site_1', 't1', 'dc1', '["10.0.0.0/24"]', 'full', '', $1, $1)`, now); err != nil {
			return err
		}
		if err := insertMachine(ctx, tx, "mch_1", "ipmi", "52:54:00:00:00:01"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO machine_discovery_tokens (id, secret_sha256, machine_id, site_id, mac, workflow_id,
			create_time, expire_time) VALUES ('mdt_1', 'x', 'mch_1', 'site_1', '52:54:00:00:00:01', 'wf_1', $1, $1)`, now); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO machine_leases (id, machine_id, owner_tenant_id, lessee_tenant_id, state, image_id,
			image_name, image_sha256, ssh_key_fingerprint, created_by, create_time, update_time)
			VALUES ('mls_1', 'mch_1', 't1', 't1', 'active', '', '', '', '', 'test', $1, $1)`, now)
		return err
	}))
	require.Error(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return insertMachine(ctx, tx, "mch_x", "acme-bmc", "52:54:00:00:00:09")
	}), "before 0008 a machine names ipmi or redfish only")

	require.NoError(t, db.Migrate(ctx, metal.Migrations()))
	require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return insertMachine(ctx, tx, "mch_2", "acme-bmc", "52:54:00:00:00:02")
	}), "an external driver's name")
	require.NoError(t, db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		m, err := metal.MachineByID(ctx, tx, "mch_1", "")
		require.NoError(t, err)
		require.Equal(t, "ipmi", m.BMCDriver)
		require.Equal(t, "52:54:00:00:00:01", m.BMCAddress, "every column kept in place")
		var n int
		require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM machine_discovery_tokens WHERE machine_id = 'mch_1'`).Scan(&n))
		require.Equal(t, 1, n)
		require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM machine_leases WHERE machine_id = 'mch_1'`).Scan(&n))
		require.Equal(t, 1, n)
		return nil
	}))
	err := db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO machine_discovery_tokens (id, secret_sha256, machine_id, site_id, mac, workflow_id,
			create_time, expire_time) VALUES ('mdt_2', 'y', 'mch_gone', 'site_1', '52:54:00:00:00:03', 'wf_2', $1, $1)`, now)
		return err
	})
	require.Error(t, err, "the references into machines are still enforced")
	require.True(t, strings.Contains(strings.ToLower(err.Error()), "foreign key"), "%v", err)
	require.Error(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return insertMachine(ctx, tx, "mch_3", "", "52:54:00:00:00:04")
	}), "a driver is still required")
}
