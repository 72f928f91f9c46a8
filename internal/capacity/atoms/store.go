package atoms

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/internal/capacity/capmodel"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/store"
)

// reconcileLock serializes the reconciles of one tenant until the
// transaction ends (PostgreSQL; SQLite has one writer). Without it a
// reconcile that read the pools before another transaction created or
// changed one writes its stale memberships over the newer ones.
func reconcileLock(ctx context.Context, tx store.Tx, tenantID string) error {
	if tx.Dialect() != store.Postgres {
		return nil
	}
	_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('capacity.reconcile'), hashtext($1))`, tenantID)
	return err
}

// BumpPoolVersion tells every process's index that a pool's nodes or atoms
// changed.
func BumpPoolVersion(ctx context.Context, tx store.Tx, poolID string) error {
	_, err := bumpPoolVersion(ctx, tx, poolID)
	return err
}

// BumpPoolVersionOf bumps a pool's version and returns the new one, for a
// caller that tells the pool's placer which node changed (a delta).
func BumpPoolVersionOf(ctx context.Context, tx store.Tx, poolID string) (int64, error) {
	return bumpPoolVersion(ctx, tx, poolID)
}

// bumpPoolVersion bumps a pool's version and returns the new one.
func bumpPoolVersion(ctx context.Context, tx store.Tx, poolID string) (int64, error) {
	if poolID == "" {
		return 0, nil
	}
	var v int64
	err := tx.QueryRow(ctx, `INSERT INTO pool_versions (pool_id, version) VALUES ($1, 1)
		ON CONFLICT (pool_id) DO UPDATE SET version = pool_versions.version + 1 RETURNING version`, poolID).Scan(&v)
	return v, err
}

// RollupAdd records a change of the capacity rollup of (pool, model, kind).
// Rows are insert-only, so concurrent bookings never wait on one counter.
func RollupAdd(ctx context.Context, tx store.Tx, poolID, model, kind string, total, booked, quarantined int) error {
	if poolID == "" || (total == 0 && booked == 0 && quarantined == 0) {
		return nil
	}
	_, err := tx.Exec(ctx, `INSERT INTO capacity_deltas (pool_id, model, kind, total, booked, quarantined) VALUES ($1, $2, $3, $4, $5, $6)`,
		poolID, model, kind, total, booked, quarantined)
	return err
}

// readGPUs reads a node's GPUs by index from the fleet's store.
func readGPUs(ctx context.Context, q store.Querier, nodeID string) ([]gpuFacts, error) {
	gpus, err := fleet.GPUList(ctx, q, nodeID)
	if err != nil {
		return nil, err
	}
	var out []gpuFacts
	for _, g := range gpus {
		out = append(out, gpuFacts{UUID: g.UUID, Index: g.Index, Model: g.Model, MemMiB: int(g.MemoryMiB), NUMA: g.NumaNode, MigMode: g.MigMode})
	}
	return out, nil
}

// lockNode takes the node's row lock for the rest of the reconcile
// (PostgreSQL; SQLite has one writer). A placer batch reads the node FOR
// SHARE before it books there, so a batch and a reconcile of that node
// (a GPU quarantined, the node moved between pools) take turns: the batch
// commits first and the reconcile sees its bookings, or the reconcile
// commits first and the batch's last check sees the atoms it changed.
func lockNode(ctx context.Context, tx store.Tx, nodeID string) error {
	return fleet.NodeLock(ctx, tx, nodeID)
}

func readNode(ctx context.Context, q store.Querier, nodeID string) (nodeFacts, error) {
	row, err := fleet.NodeStatusGet(ctx, q, nodeID)
	if err != nil {
		return nodeFacts{}, err
	}
	n := nodeFacts{ID: row.ID, TenantID: row.TenantID, PoolName: row.Pool, State: row.State}
	if err := json.Unmarshal([]byte(row.Labels), &n.Labels); err != nil || n.Labels == nil {
		n.Labels = map[string]string{}
	}
	// The labels the node reports (its Kubernetes Node's) count too, under
	// its join token's: a node cannot relabel itself out of what its
	// operator set.
	var reported map[string]string
	_ = json.Unmarshal([]byte(row.ReportedLabels), &reported)
	for k, v := range reported {
		if _, set := n.Labels[k]; !set {
			n.Labels[k] = v
		}
	}
	return n, nil
}

func readMIG(ctx context.Context, q store.Querier, nodeID string) (map[string][]migFacts, error) {
	mig, err := fleet.MigInstanceList(ctx, q, nodeID)
	if err != nil {
		return nil, err
	}
	out := map[string][]migFacts{}
	for _, m := range mig {
		out[m.GPUUUID] = append(out[m.GPUUUID], migFacts{Profile: m.Profile, GIID: m.GPUInstanceID})
	}
	return out, nil
}

func readNUMA(ctx context.Context, q store.Querier, nodeID string) ([]numaFacts, error) {
	numas, err := fleet.NumaNodeList(ctx, q, nodeID)
	if err != nil {
		return nil, err
	}
	var out []numaFacts
	for _, r := range numas {
		n := numaFacts{ID: r.ID, MemMiB: int(r.MemoryMiB), HP2Mi: int(r.Hugepages2Mi), HP1Gi: int(r.Hugepages1Gi)}
		if n.CPUs, err = capmodel.ParseCPUList(r.CPUs); err != nil {
			n.CPUs = nil // a bad list offers no CPUs rather than wrong ones
		}
		out = append(out, n)
	}
	return out, nil
}

func readAtoms(ctx context.Context, q store.Querier, nodeID string) (map[string]Row, error) {
	rows, err := q.Query(ctx, `SELECT id, node_id, kind, gpu_uuid, model, gpu_index, numa, island, memory_mib, profile, quarantined, partition_pending
		FROM atoms WHERE node_id = $1`, nodeID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]Row{}
	for rows.Next() {
		var a Row
		if err := rows.Scan(&a.ID, &a.NodeID, &a.Kind, &a.GPUUUID, &a.Model, &a.GPUIndex, &a.NUMA, &a.Island, &a.MemMiB, &a.Profile,
			&a.Quarantined, &a.PartitionPending); err != nil {
			return nil, err
		}
		out[a.ID] = a
	}
	return out, rows.Err()
}

// heldAtoms is the set of the node's atoms live reservations hold.
func heldAtoms(ctx context.Context, q store.Querier, nodeID string) (map[string]bool, error) {
	// FOR UPDATE as reservation's own reads of a node's holders: an
	// Extend or a tick of these reservations waits for the reconcile.
	lock := ""
	if tx, ok := q.(store.Tx); ok {
		lock = store.ForUpdate(tx)
	}
	rows, err := q.Query(ctx, `SELECT placement FROM reservations WHERE node_id = $1 AND state IN ($2, $3, $4, $5) ORDER BY id`+lock,
		nodeID, capmodel.StatePlaced, capmodel.StateBinding, capmodel.StateActive, capmodel.StateReleasing)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var text string
		if err := rows.Scan(&text); err != nil {
			return nil, err
		}
		var p capmodel.PlacementRecord
		if err := json.Unmarshal([]byte(text), &p); err != nil {
			return nil, fmt.Errorf("reservation placement on node %s: %w", nodeID, err)
		}
		for _, a := range p.Atoms {
			out[a] = true
		}
	}
	return out, rows.Err()
}

func setPoolCondition(ctx context.Context, tx store.Tx, nodeID, conflict string) error {
	// node_conditions is the fleet's table; capacity owns this one type.
	c := &fleet.NodeCondition{NodeID: nodeID, Type: ConditionPoolConflict, Status: "false", Reason: "OnePool",
		Message: "the node belongs to at most one pool"}
	if conflict == "" {
		// Only a node that once had a conflict carries the condition.
		return fleet.NodeConditionUpdate(ctx, tx, c)
	}
	c.Status, c.Reason, c.Message = "true", "SelectorsOverlap", conflict
	return fleet.NodeConditionSet(ctx, tx, c)
}

// tenantNodes lists a tenant's nodes that are not retired, by id.
func tenantNodes(ctx context.Context, q store.Querier, tenantID string) ([]string, error) {
	return fleet.NodeIDsOfTenant(ctx, q, tenantID)
}

// nodePool reads a node's membership row (store.ErrNotFound: none yet).
func nodePool(ctx context.Context, q store.Querier, nodeID string) (poolID, conflict, labels string, err error) {
	err = q.QueryRow(ctx, `SELECT pool_id, conflict, labels FROM node_pools WHERE node_id = $1`, nodeID).Scan(&poolID, &conflict, &labels)
	return poolID, conflict, labels, err
}

// saveNodePool writes a node's membership, keeping its update time when
// nothing changed.
func saveNodePool(ctx context.Context, tx store.Tx, nodeID, tenantID, poolID, conflict, labels string) error {
	_, err := tx.Exec(ctx, `INSERT INTO node_pools (node_id, tenant_id, pool_id, conflict, labels, update_time) VALUES ($1, $2, $3, $4, $5, compute_now())
		ON CONFLICT (node_id) DO UPDATE SET tenant_id = excluded.tenant_id, pool_id = excluded.pool_id, conflict = excluded.conflict,
			labels = excluded.labels,
			update_time = CASE WHEN node_pools.pool_id = excluded.pool_id AND node_pools.conflict = excluded.conflict
				THEN node_pools.update_time ELSE excluded.update_time END`,
		nodeID, tenantID, poolID, conflict, labels)
	return err
}

// saveAtom inserts or replaces one atom.
func saveAtom(ctx context.Context, tx store.Tx, a Row) error {
	_, err := tx.Exec(ctx, `INSERT INTO atoms (id, node_id, kind, gpu_uuid, model, gpu_index, numa, island, memory_mib, profile,
				quarantined, partition_pending, update_time)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, compute_now())
			ON CONFLICT (id) DO UPDATE SET node_id = excluded.node_id, kind = excluded.kind, gpu_uuid = excluded.gpu_uuid,
				model = excluded.model, gpu_index = excluded.gpu_index, numa = excluded.numa, island = excluded.island,
				memory_mib = excluded.memory_mib, profile = excluded.profile, quarantined = excluded.quarantined,
				partition_pending = excluded.partition_pending, update_time = excluded.update_time`,
		a.ID, a.NodeID, a.Kind, a.GPUUUID, a.Model, a.GPUIndex, a.NUMA, a.Island, a.MemMiB, a.Profile,
		a.Quarantined, a.PartitionPending)
	return err
}

// deleteAtom deletes one atom.
func deleteAtom(ctx context.Context, tx store.Tx, id string) error {
	_, err := tx.Exec(ctx, `DELETE FROM atoms WHERE id = $1`, id)
	return err
}

// nvlinks lists a node's NVLink pairs (GPU UUID, peer UUID).
func nvlinks(ctx context.Context, q store.Querier, nodeID string) ([][2]string, error) {
	links, err := fleet.NvLinkList(ctx, q, nodeID)
	if err != nil {
		return nil, err
	}
	var out [][2]string
	for _, l := range links {
		out = append(out, [2]string{l.GPUUUID, l.PeerUUID})
	}
	return out, nil
}

// saveHost writes a node's allocatable host resources.
func saveHost(ctx context.Context, tx store.Tx, nodeID string, vcpu, memGiB, hp2, hp1 int, reservedCPUs string) error {
	_, err := tx.Exec(ctx, `INSERT INTO host_resources (node_id, vcpu, memory_gib, hugepages_2mi, hugepages_1gi, reserved_cpus, version, update_time)
		VALUES ($1, $2, $3, $4, $5, $6, 0, compute_now())
		ON CONFLICT (node_id) DO UPDATE SET vcpu = excluded.vcpu, memory_gib = excluded.memory_gib, hugepages_2mi = excluded.hugepages_2mi,
			hugepages_1gi = excluded.hugepages_1gi, reserved_cpus = excluded.reserved_cpus, update_time = excluded.update_time`,
		nodeID, vcpu, memGiB, hp2, hp1, reservedCPUs)
	return err
}

// poolNodes lists the nodes a pool holds, by id.
func poolNodes(ctx context.Context, q store.Querier, poolID string) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT node_id FROM node_pools WHERE pool_id = $1 ORDER BY node_id`, poolID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// GPUCountOfPool counts the GPUs of a pool's nodes (by UUID: a GPU split
// into MIG instances counts once).
func GPUCountOfPool(ctx context.Context, q store.Querier, poolID string) (int, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT COUNT(DISTINCT a.gpu_uuid) FROM atoms a JOIN node_pools np ON np.node_id = a.node_id
		WHERE np.pool_id = $1 AND a.gpu_uuid <> ''`, poolID).Scan(&n)
	return n, err
}

// BookedNow counts the bookings in effect at now on a node's atoms (on one
// GPU's when gpuUUID is set).
func BookedNow(ctx context.Context, q store.Querier, nodeID, gpuUUID string, now time.Time) (int, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT COUNT(*) FROM bookings b JOIN atoms a ON a.id = b.atom
		WHERE a.node_id = $1 AND ($2 = '' OR a.gpu_uuid = $2) AND b.starts_at <= $3 AND b.ends_at > $3`, nodeID, gpuUUID, now).Scan(&n)
	return n, err
}

// ReservationsPerGPU counts, by GPU UUID, the reservations holding a
// node's GPUs at now.
func ReservationsPerGPU(ctx context.Context, q store.Querier, nodeID string, now time.Time) (map[string]int, error) {
	rows, err := q.Query(ctx, `SELECT a.gpu_uuid, COUNT(DISTINCT b.reservation_id) FROM bookings b JOIN atoms a ON a.id = b.atom
		WHERE a.node_id = $1 AND a.gpu_uuid <> '' AND b.starts_at <= $2 AND b.ends_at > $2 GROUP BY a.gpu_uuid`, nodeID, now)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var u string
		var n int
		if err := rows.Scan(&u, &n); err != nil {
			return nil, err
		}
		out[u] = n
	}
	return out, rows.Err()
}
