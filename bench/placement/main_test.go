package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/store/storeopen"
)

// stores are the backends the tests run on: SQLite, and PostgreSQL when
// BC_TEST_POSTGRES_URL names a server.
func stores() []string {
	if os.Getenv("BC_TEST_POSTGRES_URL") != "" {
		return []string{"sqlite", "postgres"}
	}
	return []string{"sqlite"}
}

// storeArgs are the flags that select st: PostgreSQL is the test server,
// not a throw-away cluster (TestThrowawayCluster covers that).
func storeArgs(st string) []string {
	if st == "postgres" {
		return []string{"-store", st, "-postgres-url", os.Getenv("BC_TEST_POSTGRES_URL")}
	}
	return []string{"-store", st}
}

// TestSmoke runs the harness at a tiny scale, with a history, and checks the
// JSON line has every figure docs/benchmarks.md reports. It never asserts on
// speed.
func TestSmoke(t *testing.T) {
	t.Parallel()
	for _, st := range stores() {
		t.Run(st, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			args := append([]string{"-nodes", "20", "-duration", "1s", "-clients", "4", "-history", "500", "-json"}, storeArgs(st)...)
			err := execute(context.Background(), args, &stdout, &stderr)
			require.NoError(t, err, "stderr: %s", stderr.String())
			lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
			var got map[string]any
			require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &got), "the last line is one JSON object")
			for _, k := range []string{"nodes", "store", "placements_per_s", "queued_placements_per_s", "lock_hold_p50_ms",
				"lock_hold_p90_ms", "lock_hold_p99_ms", "rss_mib", "heap_mib", "replans", "load_s",
				"batch_p50", "txn_hold_p50_ms", "txn_hold_p99_ms", "queued_txn_hold_p50_ms", "queued_txn_hold_p99_ms",
				"history_bookings"} {
				require.Contains(t, got, k)
			}
			require.EqualValues(t, 20, got["nodes"])
			require.Equal(t, st, got["store"])
			require.EqualValues(t, 20*(8+16), got["atoms"], "8 GPU and 16 CPU atoms per node")
			require.EqualValues(t, 0, got["inline_failed"], "first failure: %v", got["inline_error"])
			require.EqualValues(t, 80, got["pending"], "half the GPUs wait for the queued placer")
			require.EqualValues(t, 80, got["queued_placed"], "the queued placer places every pending reservation")
			require.EqualValues(t, 500, got["history_bookings"], "the preloaded bookings had ended when measuring began")
			require.Positive(t, got["rss_mib"])
			// Every create went through a placer transaction: at least one
			// each, never more creates in one than there were clients.
			require.Positive(t, got["lock_holds"])
			require.GreaterOrEqual(t, got["batch_p50"], 1.0)
			require.LessOrEqual(t, got["batch_max"], 4.0, "4 clients have at most 4 creates in flight")
			require.Equal(t, got["lock_hold_p99_ms"], got["txn_hold_p99_ms"], "one set of BEGIN…COMMIT samples")
			require.Positive(t, got["queued_txn_hold_p50_ms"])
			if st == "postgres" {
				require.Equal(t, "url", got["postgres_server"])
				require.Contains(t, got, "postgres_fsync")
			} else {
				require.NotContains(t, got, "postgres_server")
			}
		})
	}
}

// TestSmokeArrays: with -count the inline clients book arrays
// (CreateReservations), reported in the same fields, counted in
// reservations.
func TestSmokeArrays(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	args := []string{"-nodes", "10", "-duration", "1s", "-clients", "2", "-count", "4", "-json"}
	require.NoError(t, execute(context.Background(), args, &stdout, &stderr), "stderr: %s", stderr.String())
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &got))
	require.EqualValues(t, 4, got["count"])
	require.EqualValues(t, 0, got["inline_failed"], "first failure: %v", got["inline_error"])
	require.EqualValues(t, 0, got["inline_pending"], "an array never queues")
	placed, ok := got["inline_placed"].(float64)
	require.True(t, ok)
	require.Positive(t, placed)
	require.Zero(t, int(placed)%4, "whole arrays only: %v", placed)
	require.LessOrEqual(t, got["batch_max"], 2.0, "2 clients have at most 2 arrays in flight, one work item each")
}

func TestOptionsRejectNonsense(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-nodes", "0"},
		{"-store", "mysql"},
		{"-store", "postgres", "-postgres-url", "mysql://x"},
		{"-store", "sqlite", "-postgres-url", "postgres://x"},
		{"-history", "-1"},
		{"-binding", "node"},
		{"-cpus-per-node", "7"},
		{"-count", "0"},
		{"-count", "1001"},
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

// TestHistoryPreload: the preloaded bookings are n rows on the fleet's GPU
// atoms, spread evenly, never overlapping on an atom, all over by the end
// given, with times each store compares correctly; written across several
// transactions, the last one partial.
func TestHistoryPreload(t *testing.T) {
	t.Parallel()
	for _, st := range stores() {
		t.Run(st, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			o := options{nodes: 3, store: st, postgresURL: os.Getenv("BC_TEST_POSTGRES_URL"), gpusPerNode: 8, cpusPerNode: 16}
			b, closeAll, err := prepare(ctx, o, t.TempDir(), &result{})
			require.NoError(t, err)
			defer func() { require.NoError(t, closeAll()) }()
			end := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
			// 24 GPU atoms, 16 with 42 bookings and 8 with 41; 5 atoms a
			// transaction: 5 transactions, the last with 4 atoms, the
			// fourth across the 42/41 boundary.
			require.NoError(t, preloadHistory(ctx, b.app.DB, 1000, end, 250))

			ended := func(at time.Time) int64 {
				n, err := countEndedBookings(ctx, b.app.DB, at)
				require.NoError(t, err)
				return n
			}
			require.EqualValues(t, 1000, ended(end))
			require.EqualValues(t, 1000-24, ended(end.Add(-time.Second)), "round 0 ends exactly at end, on every atom")
			require.EqualValues(t, 16, ended(end.Add(-41*time.Hour)), "16 atoms have a 42nd booking")
			require.EqualValues(t, 0, ended(end.Add(-41*time.Hour-time.Second)))

			type span struct{ start, end time.Time }
			perAtom := map[string][]span{}
			err = b.app.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
				rows, err := tx.Query(ctx, `SELECT a.kind, b.atom, b.starts_at, b.ends_at FROM bookings b JOIN atoms a ON a.id = b.atom`)
				if err != nil {
					return err
				}
				defer func() { _ = rows.Close() }()
				for rows.Next() {
					var kind, atom string
					var s span
					if err := rows.Scan(&kind, &atom, &s.start, &s.end); err != nil {
						return err
					}
					require.Equal(t, reservation.KindGPU, kind)
					perAtom[atom] = append(perAtom[atom], s)
				}
				return rows.Err()
			})
			require.NoError(t, err)
			require.Len(t, perAtom, 24, "every GPU atom of the fleet")
			total := 0
			for atom, spans := range perAtom {
				require.Contains(t, []int{41, 42}, len(spans), atom)
				total += len(spans)
				slices.SortFunc(spans, func(a, b span) int { return a.start.Compare(b.start) })
				for i, s := range spans {
					require.Equal(t, time.Hour, s.end.Sub(s.start), atom)
					require.False(t, s.end.After(end), atom)
					if i > 0 {
						require.False(t, s.start.Before(spans[i-1].end), "%s: bookings overlap", atom)
					}
				}
			}
			require.Equal(t, 1000, total)
		})
	}
}

// TestThrowawayCluster: the harness's own PostgreSQL runs with durable
// commits and the connections asked for, and is gone after stop, also when
// the run's context was cancelled first (Ctrl-C). It needs the server
// binaries, as `.ci/run` installs them.
func TestThrowawayCluster(t *testing.T) {
	t.Parallel()
	if _, err := pgBinDir(); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := startCluster(ctx, 40, t.Logf)
	require.NoError(t, err)
	dir := c.dir
	defer func() { require.NoError(t, c.stop()) }()

	db, err := storeopen.Open(ctx, store.Config{URL: c.URL})
	require.NoError(t, err)
	var fsync, syncCommit string
	var conns int
	err = db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT current_setting('fsync'), current_setting('synchronous_commit'),
			current_setting('max_connections')::int`).Scan(&fsync, &syncCommit, &conns)
	})
	require.NoError(t, err)
	require.NoError(t, db.Close())
	require.Equal(t, "on", fsync)
	require.Equal(t, "on", syncCommit)
	require.Equal(t, 40, conns)

	cancel() // as Ctrl-C does, before the harness stops the server
	require.NoError(t, c.stop())
	_, err = os.Stat(dir)
	require.True(t, os.IsNotExist(err), "the cluster's directory is removed: %v", err)
	conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", c.port))
	if err == nil {
		_ = conn.Close()
	}
	require.Error(t, err, "nothing listens on the cluster's port any more")
	require.NoError(t, c.stop(), "stopping twice is harmless")
}
