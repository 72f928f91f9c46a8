package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/store"
)

// stores are the backends the tests run on: SQLite, and PostgreSQL when
// BC_TEST_POSTGRES_URL names a server.
func stores() []string {
	if os.Getenv("BC_TEST_POSTGRES_URL") != "" {
		return []string{"sqlite", "postgres"}
	}
	return []string{"sqlite"}
}

// TestSmoke runs the harness at a tiny scale and checks the JSON line has
// every figure docs/benchmarks.md reports. It never asserts on speed.
func TestSmoke(t *testing.T) {
	t.Parallel()
	for _, st := range stores() {
		t.Run(st, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			err := execute(context.Background(), []string{"-nodes", "20", "-duration", "1s", "-clients", "4", "-store", st, "-json"}, &stdout, &stderr)
			require.NoError(t, err, "stderr: %s", stderr.String())
			lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
			var got map[string]any
			require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &got), "the last line is one JSON object")
			for _, k := range []string{"nodes", "store", "placements_per_s", "queued_placements_per_s", "lock_hold_p50_ms",
				"lock_hold_p90_ms", "lock_hold_p99_ms", "rss_mib", "heap_mib", "replans", "load_s"} {
				require.Contains(t, got, k)
			}
			require.EqualValues(t, 20, got["nodes"])
			require.Equal(t, st, got["store"])
			require.EqualValues(t, 20*(8+16), got["atoms"], "8 GPU and 16 CPU atoms per node")
			require.EqualValues(t, 0, got["inline_failed"], "first failure: %v", got["inline_error"])
			require.EqualValues(t, 80, got["pending"], "half the GPUs wait for the queued placer")
			require.EqualValues(t, 80, got["queued_placed"], "the queued placer places every pending reservation")
			require.Positive(t, got["rss_mib"])
		})
	}
}

func TestOptionsRejectNonsense(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-nodes", "0"},
		{"-store", "mysql"},
		{"-store", "postgres", "-postgres-url", "mysql://x"},
		{"-binding", "node"},
		{"-cpus-per-node", "7"},
	} {
		var stdout, stderr bytes.Buffer
		require.Error(t, execute(context.Background(), args, &stdout, &stderr), "%v", args)
	}
}

// TestDirectAtomsMatchReconciler: the rows the loader writes for pool
// membership, atoms, host resources and rollups are the ones the atoms
// reconciler derives from the same inventory.
func TestDirectAtomsMatchReconciler(t *testing.T) {
	t.Parallel()
	for _, st := range stores() {
		t.Run(st, func(t *testing.T) {
			t.Parallel()
			dump := func(reconcile bool) string {
				o := options{nodes: 3, store: st, postgresURL: os.Getenv("BC_TEST_POSTGRES_URL"), gpusPerNode: 8, cpusPerNode: 16, reconcile: reconcile}
				b, closeAll, err := prepare(context.Background(), o, t.TempDir(), &result{})
				require.NoError(t, err)
				defer func() { require.NoError(t, closeAll()) }()
				return dumpCapacityRows(t, b)
			}
			direct, reconciled := dump(false), dump(true)
			require.NotEmpty(t, direct)
			require.Equal(t, reconciled, direct)
		})
	}
}

// dumpCapacityRows renders the capacity rows with node and pool ids replaced
// by names, so two loads of the same fleet compare equal.
func dumpCapacityRows(t *testing.T, b *bench) string {
	t.Helper()
	var out strings.Builder
	err := b.app.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		ids := map[string]string{b.pool: "POOL"}
		rows, err := tx.Query(ctx, `SELECT id, name FROM nodes`)
		if err != nil {
			return err
		}
		for rows.Next() {
			var id, name string
			if err := rows.Scan(&id, &name); err != nil {
				return err
			}
			ids[id] = name
		}
		if err := rows.Close(); err != nil {
			return err
		}
		named := func(s string) string {
			for id, name := range ids {
				s = strings.ReplaceAll(s, id, name)
			}
			return s
		}
		rows, err = tx.Query(ctx, `SELECT node_id, id, kind, gpu_uuid, model, gpu_index, numa, island, memory_mib, profile,
			quarantined, partition_pending FROM atoms ORDER BY id`)
		if err != nil {
			return err
		}
		var lines []string
		for rows.Next() {
			var node, id, kind, uuid, model, profile string
			var idx, numa, island, mem int
			var quarantined, pending bool
			if err := rows.Scan(&node, &id, &kind, &uuid, &model, &idx, &numa, &island, &mem, &profile, &quarantined, &pending); err != nil {
				return err
			}
			lines = append(lines, named(fmt.Sprintln("atom", node, id, kind, uuid, model, idx, numa, island, mem, profile, quarantined, pending)))
		}
		if err := rows.Close(); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `SELECT node_id, vcpu, memory_gib, hugepages_2mi, hugepages_1gi, reserved_cpus, version FROM host_resources`)
		if err != nil {
			return err
		}
		for rows.Next() {
			var node, reserved string
			var vcpu, mem, hp2, hp1, version int
			if err := rows.Scan(&node, &vcpu, &mem, &hp2, &hp1, &reserved, &version); err != nil {
				return err
			}
			lines = append(lines, named(fmt.Sprintln("host", node, vcpu, mem, hp2, hp1, reserved, version)))
		}
		if err := rows.Close(); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `SELECT node_id, tenant_id, pool_id, conflict FROM node_pools`)
		if err != nil {
			return err
		}
		for rows.Next() {
			var node, tenant, pool, conflict string
			if err := rows.Scan(&node, &tenant, &pool, &conflict); err != nil {
				return err
			}
			lines = append(lines, named(fmt.Sprintln("member", node, tenant == b.tenant, pool, conflict)))
		}
		if err := rows.Close(); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `SELECT pool_id, model, kind, SUM(total), SUM(booked), SUM(quarantined) FROM capacity_deltas
			GROUP BY pool_id, model, kind`)
		if err != nil {
			return err
		}
		for rows.Next() {
			var pool, model, kind string
			var total, booked, quarantined int
			if err := rows.Scan(&pool, &model, &kind, &total, &booked, &quarantined); err != nil {
				return err
			}
			lines = append(lines, named(fmt.Sprintln("rollup", pool, model, kind, total, booked, quarantined)))
		}
		if err := rows.Close(); err != nil {
			return err
		}
		slices.Sort(lines)
		out.WriteString(strings.Join(lines, ""))
		return nil
	})
	require.NoError(t, err)
	return out.String()
}
