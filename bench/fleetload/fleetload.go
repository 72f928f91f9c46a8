// Package fleetload writes a synthetic fleet straight to the database: the
// rows a fleet of thousands of HGX boards leaves after joining, for
// benchmarks and simulations that need the fleet's size, not its agents.
package fleetload

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/internal/capacity/atoms"
	"github.com/better-compute/better-compute/internal/capacity/gpumodel"
	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/store"
)

// The synthetic machine: an HGX H100 board. GPUs form NVLink islands of
// islandSize, the first half of the GPUs (and of the CPUs) sit on NUMA node
// 0, the second half on node 1; 1 TiB of memory, no hugepages.
const (
	gpuName      = "NVIDIA H100 80GB HBM3"
	gpuMemoryMiB = 81559
	islandSize   = 4
	numaNodes    = 2
	numaMemMiB   = 512 * 1024
	// nodesPerTx is how many nodes one load transaction writes.
	nodesPerTx = 2000
)

// SyntheticMemoryGiB is a synthetic node's memory.
const SyntheticMemoryGiB = numaNodes * numaMemMiB / 1024

// SyntheticFleet is what LoadSyntheticFleet writes.
type SyntheticFleet struct {
	Nodes, GPUsPerNode, CPUsPerNode int
	TenantID, ProjectID, PoolID     string
	// Direct writes node_pools, atoms, host_resources and capacity_deltas
	// itself; otherwise the reconciler derives them from the inventory.
	Direct bool
	Now    time.Time
	// NamePrefix names the nodes (<prefix>-000001); default "bench".
	NamePrefix string
}

// SyntheticAtomModel is the atoms' model, as the reconciler names it ("H100 80GB").
func SyntheticAtomModel() string { return gpumodel.Canonical(gpuName, gpuMemoryMiB) }

// SyntheticGPUUUID is GPU idx of node i of a synthetic fleet.
func SyntheticGPUUUID(node, idx int) string {
	return fmt.Sprintf("GPU-%08x-%04x-4000-8000-%012x", node, idx, node*64+idx)
}

// island is the NVLink island of GPU idx as the reconciler numbers it: the
// lowest GPU index of its connected component, -1 for a GPU without peers.
func island(idx, gpus int) int {
	base := idx / islandSize * islandSize
	if min(base+islandSize, gpus)-base < 2 {
		return -1
	}
	return base
}

func gpuNUMA(idx, gpus int) int { return idx * numaNodes / gpus }

// cpusOf is the range of CPUs [lo, hi] on NUMA node n.
func cpusOf(n, cpus int) (lo, hi int) {
	per := cpus / numaNodes
	return n * per, (n+1)*per - 1
}

// LoadSyntheticFleet writes the fleet in transactions of nodesPerTx nodes
// and, unless Direct, runs the reconciler over the tenant.
func LoadSyntheticFleet(ctx context.Context, db *store.DB, s SyntheticFleet) error {
	for first := 0; first < s.Nodes; first += nodesPerTx {
		last := min(first+nodesPerTx, s.Nodes)
		if err := db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			return writeNodes(ctx, tx, s, first, last)
		}); err != nil {
			return err
		}
	}
	return db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		if !s.Direct {
			return (&atoms.Reconciler{}).ReconcileTenant(ctx, tx, s.TenantID)
		}
		// One rollup delta for the whole pool: the reconciler writes one
		// per node, which the compactor folds into the same sum.
		if err := BulkInsert(ctx, tx, "capacity_deltas", []string{"pool_id", "model", "kind", "total", "booked", "quarantined"},
			[][]any{{s.PoolID, SyntheticAtomModel(), reservation.KindGPU, s.Nodes * s.GPUsPerNode, 0, 0}}); err != nil {
			return err
		}
		// The pool's nodes changed: as the reconciler does, bump its
		// version so an index loaded before now is reloaded.
		_, err := tx.Exec(ctx, `INSERT INTO pool_versions (pool_id, version) VALUES ($1, 1)
			ON CONFLICT (pool_id) DO UPDATE SET version = pool_versions.version + 1`, s.PoolID)
		return err
	})
}

// writeNodes writes nodes [first, last): inventory always, and the
// reconciler's rows when direct.
func writeNodes(ctx context.Context, tx store.Tx, s SyntheticFleet, first, last int) error {
	var nodes, gpus, links, numas, resources, atoms, hosts, pools [][]any
	now := s.Now
	memGiB := numaNodes * numaMemMiB / 1024
	for i := first; i < last; i++ {
		id := envelope.NewID(fleet.NodeIDPrefix, now)
		prefix := s.NamePrefix
		if prefix == "" {
			prefix = "bench"
		}
		name := fmt.Sprintf("%s-%06d", prefix, i)
		labels, err := json.Marshal(map[string]string{"topology.rack": fmt.Sprintf("r%03d", i/32), "zone": fmt.Sprintf("z%d", i%4)})
		if err != nil {
			return err
		}
		nodes = append(nodes, []any{id, name, s.TenantID, s.ProjectID, string(labels), "hw-" + name, "active", fleet.LivenessReady,
			"0.1.0", `["nvml","cgroups","binding.kubernetes"]`, now, now, now})
		for g := range s.GPUsPerNode {
			uuid := SyntheticGPUUUID(i, g)
			gpus = append(gpus, []any{uuid, id, g, gpuName, gpuMemoryMiB, fmt.Sprintf("0000:%02x:00.0", 0x18+g), gpuNUMA(g, s.GPUsPerNode), "disabled", now})
			base := g / islandSize * islandSize
			link := 0
			for p := base; p < min(base+islandSize, s.GPUsPerNode); p++ {
				if p != g {
					links = append(links, []any{id, uuid, SyntheticGPUUUID(i, p), link})
					link++
				}
			}
			if s.Direct {
				atoms = append(atoms, []any{uuid, id, reservation.KindGPU, uuid, SyntheticAtomModel(), g, gpuNUMA(g, s.GPUsPerNode),
					island(g, s.GPUsPerNode), gpuMemoryMiB, "", false, false, now})
			}
		}
		for n := range numaNodes {
			lo, hi := cpusOf(n, s.CPUsPerNode)
			numas = append(numas, []any{id, n, fmt.Sprintf("%d-%d", lo, hi), numaMemMiB, 0, 0})
			if s.Direct {
				for c := lo; c <= hi; c++ {
					aid := fmt.Sprintf("%s/cpu/%d", id, c)
					atoms = append(atoms, []any{aid, id, reservation.KindCPU, "", "", c, n, -1, 0, "", false, false, now})
				}
			}
		}
		resources = append(resources, []any{id, "Intel(R) Xeon(R) Platinum 8480C", numaNodes, s.CPUsPerNode / 2, s.CPUsPerNode,
			numaNodes * numaMemMiB, 0, 0, now})
		if s.Direct {
			hosts = append(hosts, []any{id, s.CPUsPerNode, memGiB, 0, 0, "", 0, now})
			pools = append(pools, []any{id, s.TenantID, s.PoolID, "", now})
		}
	}
	for _, t := range []struct {
		table string
		cols  []string
		rows  [][]any
	}{
		{"nodes", []string{"id", "name", "tenant_id", "project_id", "labels", "hardware_key", "state", "liveness",
			"agent_version", "capabilities", "last_heartbeat", "create_time", "update_time"}, nodes},
		{"gpus", []string{"uuid", "node_id", "idx", "model", "memory_mib", "pci_bus_id", "numa_node", "mig_mode", "update_time"}, gpus},
		{"nvlinks", []string{"node_id", "gpu_uuid", "peer_uuid", "link"}, links},
		{"numa_nodes", []string{"node_id", "numa_id", "cpus", "memory_mib", "hugepages_2mi", "hugepages_1gi"}, numas},
		{"node_resources", []string{"node_id", "cpu_model", "sockets", "cores", "threads", "memory_mib", "hugepages_2mi_total",
			"hugepages_1gi_total", "update_time"}, resources},
		{"node_pools", []string{"node_id", "tenant_id", "pool_id", "conflict", "update_time"}, pools},
		{"atoms", []string{"id", "node_id", "kind", "gpu_uuid", "model", "gpu_index", "numa", "island", "memory_mib", "profile",
			"quarantined", "partition_pending", "update_time"}, atoms},
		{"host_resources", []string{"node_id", "vcpu", "memory_gib", "hugepages_2mi", "hugepages_1gi", "reserved_cpus", "version",
			"update_time"}, hosts},
	} {
		if err := BulkInsert(ctx, tx, t.table, t.cols, t.rows); err != nil {
			return err
		}
	}
	return nil
}

// BulkInsert writes rows into table: COPY on PostgreSQL, multi-row INSERTs
// on SQLite.
func BulkInsert(ctx context.Context, tx store.Tx, table string, cols []string, rows [][]any) error {
	if len(rows) == 0 {
		return nil
	}
	if pg, ok := tx.Raw().(pgx.Tx); ok {
		if _, err := pg.CopyFrom(ctx, pgx.Identifier{table}, cols, pgx.CopyFromRows(rows)); err != nil {
			return fmt.Errorf("copy into %s: %w", table, err)
		}
		return nil
	}
	// SQLite binds at most 32766 parameters per statement; anonymous ones
	// are bound by position (a "$n" is looked up by name, which costs more
	// the more a statement has).
	per := max(1, min(1000, 32000/len(cols)))
	head := "INSERT INTO " + table + " (" + strings.Join(cols, ", ") + ") VALUES "
	for lo := 0; lo < len(rows); lo += per {
		chunk := rows[lo:min(lo+per, len(rows))]
		var b strings.Builder
		b.WriteString(head)
		args := make([]any, 0, len(chunk)*len(cols))
		for i, r := range chunk {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteByte('(')
			for j, v := range r {
				if j > 0 {
					b.WriteString(", ")
				}
				args = append(args, v)
				b.WriteByte('?')
			}
			b.WriteByte(')')
		}
		if _, err := tx.Exec(ctx, b.String(), args...); err != nil {
			return fmt.Errorf("insert into %s: %w", table, err)
		}
	}
	return nil
}
