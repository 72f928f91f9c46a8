package fleet

// SQL over a node's inventory: gpus, mig_instances, nvlinks, numa_nodes,
// node_resources, inventory_sections and inventory_snapshots.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

// Inventory is what a node's agent last reported about its hardware.
type Inventory struct {
	NodeID     string
	Digest     string
	GPUs       []GPU
	NvLinks    []NvLink
	NumaNodes  []NumaNode
	Resources  *NodeResources
	Conditions []NodeCondition
}

// GPU is a row of gpus with its MIG instances.
type GPU struct {
	UUID         string
	Index        int
	Model        string
	MemoryMiB    int64
	PCIBusID     string
	NumaNode     int
	MigMode      string // "" means disabled
	UpdateTime   time.Time
	MigInstances []MigInstance
}

// MigInstance is a row of mig_instances.
type MigInstance struct {
	UUID          string
	GPUUUID       string
	Profile       string
	GPUInstanceID int
	MemoryMiB     int64
}

// NvLink is a row of nvlinks.
type NvLink struct {
	GPUUUID  string
	PeerUUID string
	Link     int
}

// NumaNode is a row of numa_nodes.
type NumaNode struct {
	ID           int
	CPUs         string
	MemoryMiB    int64
	Hugepages2Mi int64
	Hugepages1Gi int64
}

// NodeResources is a row of node_resources.
type NodeResources struct {
	CPUModel          string
	Sockets           int
	Cores             int
	Threads           int
	MemoryMiB         int64
	Hugepages2MiTotal int64
	Hugepages1GiTotal int64
	UpdateTime        time.Time
}

// InventoryGet reads a node's devices, NUMA layout, resources and
// conditions.
func InventoryGet(ctx context.Context, q store.Querier, nodeID string) (Inventory, error) {
	inv := Inventory{NodeID: nodeID}
	if err := q.QueryRow(ctx, `SELECT inventory_digest FROM nodes WHERE id = $1`, nodeID).Scan(&inv.Digest); err != nil {
		return Inventory{}, err
	}
	var err error
	if inv.GPUs, err = GPUList(ctx, q, nodeID); err != nil {
		return Inventory{}, err
	}
	byGPU := map[string]*GPU{}
	for i := range inv.GPUs {
		byGPU[inv.GPUs[i].UUID] = &inv.GPUs[i]
	}
	if err := queryEach(ctx, q, `SELECT m.uuid, m.gpu_uuid, m.profile, m.gpu_instance_id, m.memory_mib
		FROM mig_instances m JOIN gpus g ON g.uuid = m.gpu_uuid WHERE g.node_id = $1
		ORDER BY m.gpu_uuid, m.gpu_instance_id, m.uuid`, []any{nodeID}, func(r store.Rows) error {
		var m MigInstance
		if err := r.Scan(&m.UUID, &m.GPUUUID, &m.Profile, &m.GPUInstanceID, &m.MemoryMiB); err != nil {
			return err
		}
		if g := byGPU[m.GPUUUID]; g != nil {
			g.MigInstances = append(g.MigInstances, m)
		}
		return nil
	}); err != nil {
		return Inventory{}, err
	}
	rows, err := q.Query(ctx, `SELECT gpu_uuid, peer_uuid, link FROM nvlinks WHERE node_id = $1
		ORDER BY gpu_uuid, link`, nodeID)
	if inv.NvLinks, err = collect(rows, err, func(r scanner) (NvLink, error) {
		var l NvLink
		err := r.Scan(&l.GPUUUID, &l.PeerUUID, &l.Link)
		return l, err
	}); err != nil {
		return Inventory{}, err
	}
	rows, err = q.Query(ctx, `SELECT numa_id, cpus, memory_mib, hugepages_2mi, hugepages_1gi FROM numa_nodes
		WHERE node_id = $1 ORDER BY numa_id`, nodeID)
	if inv.NumaNodes, err = collect(rows, err, func(r scanner) (NumaNode, error) {
		var n NumaNode
		err := r.Scan(&n.ID, &n.CPUs, &n.MemoryMiB, &n.Hugepages2Mi, &n.Hugepages1Gi)
		return n, err
	}); err != nil {
		return Inventory{}, err
	}
	var res NodeResources
	err = q.QueryRow(ctx, `SELECT cpu_model, sockets, cores, threads, memory_mib, hugepages_2mi_total,
		hugepages_1gi_total, update_time FROM node_resources WHERE node_id = $1`, nodeID).
		Scan(&res.CPUModel, &res.Sockets, &res.Cores, &res.Threads, &res.MemoryMiB, &res.Hugepages2MiTotal,
			&res.Hugepages1GiTotal, &res.UpdateTime)
	switch {
	case err == nil:
		inv.Resources = &res
	case !errors.Is(err, store.ErrNotFound):
		return Inventory{}, err
	}
	conds, err := NodeConditionList(ctx, q, nodeID)
	if err != nil {
		return Inventory{}, err
	}
	inv.Conditions = conds[nodeID]
	return inv, nil
}

// GPUList lists a node's GPUs by index, without their MIG instances.
func GPUList(ctx context.Context, q store.Querier, nodeID string) ([]GPU, error) {
	rows, err := q.Query(ctx, `SELECT uuid, idx, model, memory_mib, pci_bus_id, numa_node, mig_mode, update_time
		FROM gpus WHERE node_id = $1 ORDER BY idx, uuid`, nodeID)
	return collect(rows, err, func(r scanner) (GPU, error) {
		var g GPU
		err := r.Scan(&g.UUID, &g.Index, &g.Model, &g.MemoryMiB, &g.PCIBusID, &g.NumaNode, &g.MigMode, &g.UpdateTime)
		return g, err
	})
}

// MigInstanceList lists the MIG instances of a node's GPUs, by GPU,
// profile and GPU instance id.
func MigInstanceList(ctx context.Context, q store.Querier, nodeID string) ([]MigInstance, error) {
	rows, err := q.Query(ctx, `SELECT m.uuid, m.gpu_uuid, m.profile, m.gpu_instance_id, m.memory_mib
		FROM mig_instances m JOIN gpus g ON g.uuid = m.gpu_uuid WHERE g.node_id = $1
		ORDER BY m.gpu_uuid, m.profile, m.gpu_instance_id`, nodeID)
	return collect(rows, err, func(r scanner) (MigInstance, error) {
		var m MigInstance
		err := r.Scan(&m.UUID, &m.GPUUUID, &m.Profile, &m.GPUInstanceID, &m.MemoryMiB)
		return m, err
	})
}

// NvLinkList lists a node's NVLinks, by GPU and link.
func NvLinkList(ctx context.Context, q store.Querier, nodeID string) ([]NvLink, error) {
	rows, err := q.Query(ctx, `SELECT gpu_uuid, peer_uuid, link FROM nvlinks WHERE node_id = $1 ORDER BY gpu_uuid, link`, nodeID)
	return collect(rows, err, func(r scanner) (NvLink, error) {
		var l NvLink
		err := r.Scan(&l.GPUUUID, &l.PeerUUID, &l.Link)
		return l, err
	})
}

// NumaNodeList lists a node's NUMA nodes, by id.
func NumaNodeList(ctx context.Context, q store.Querier, nodeID string) ([]NumaNode, error) {
	rows, err := q.Query(ctx, `SELECT numa_id, cpus, memory_mib, hugepages_2mi, hugepages_1gi FROM numa_nodes
		WHERE node_id = $1 ORDER BY numa_id`, nodeID)
	return collect(rows, err, func(r scanner) (NumaNode, error) {
		var n NumaNode
		err := r.Scan(&n.ID, &n.CPUs, &n.MemoryMiB, &n.Hugepages2Mi, &n.Hugepages1Gi)
		return n, err
	})
}

// GPUListOwners returns, of the given GPU UUIDs, those a node other than
// nodeID holds, mapped to that node.
func GPUListOwners(ctx context.Context, q store.Querier, nodeID string, uuids []string) (map[string]string, error) {
	out := map[string]string{}
	for _, chunk := range chunks(uuids) {
		args := []any{nodeID}
		in := placeholders(&args, chunk)
		if err := queryEach(ctx, q, `SELECT uuid, node_id FROM gpus WHERE node_id <> $1 AND uuid IN (`+in+`)`, args,
			func(r store.Rows) error {
				var u, n string
				if err := r.Scan(&u, &n); err != nil {
					return err
				}
				out[u] = n
				return nil
			}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// InventoryReplace rebuilds a node's devices and NUMA layout from a complete
// snapshot, upserts its resources (when inv has them), records the
// snapshot's digest with its diff (a JSON object) and sets the node's
// inventory digest. Conditions are kept: they have their own upsert.
func InventoryReplace(ctx context.Context, tx store.Tx, inv *Inventory, diff string) error {
	id := inv.NodeID
	for _, stmt := range []string{
		`DELETE FROM gpus WHERE node_id = $1`, // mig_instances cascade
		`DELETE FROM nvlinks WHERE node_id = $1`,
		`DELETE FROM numa_nodes WHERE node_id = $1`,
	} {
		if _, err := tx.Exec(ctx, stmt, id); err != nil {
			return err
		}
	}
	for _, g := range inv.GPUs {
		if _, err := tx.Exec(ctx, `INSERT INTO gpus (uuid, node_id, idx, model, memory_mib, pci_bus_id, numa_node, mig_mode, update_time)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, compute_now())`,
			g.UUID, id, g.Index, g.Model, g.MemoryMiB, g.PCIBusID, g.NumaNode, cmp.Or(g.MigMode, "disabled")); err != nil {
			return fmt.Errorf("gpu %s: %w", g.UUID, err)
		}
	}
	// MIG instances after every GPU: an instance names its GPU by UUID.
	for _, g := range inv.GPUs {
		for _, m := range g.MigInstances {
			if _, err := tx.Exec(ctx, `INSERT INTO mig_instances (uuid, gpu_uuid, profile, gpu_instance_id, memory_mib) VALUES ($1, $2, $3, $4, $5)`,
				m.UUID, cmp.Or(m.GPUUUID, g.UUID), m.Profile, m.GPUInstanceID, m.MemoryMiB); err != nil {
				return fmt.Errorf("mig instance %s: %w", m.UUID, err)
			}
		}
	}
	for _, l := range inv.NvLinks {
		if _, err := tx.Exec(ctx, `INSERT INTO nvlinks (node_id, gpu_uuid, peer_uuid, link) VALUES ($1, $2, $3, $4)`,
			id, l.GPUUUID, l.PeerUUID, l.Link); err != nil {
			return fmt.Errorf("nvlink %s/%d: %w", l.GPUUUID, l.Link, err)
		}
	}
	for _, n := range inv.NumaNodes {
		if _, err := tx.Exec(ctx, `INSERT INTO numa_nodes (node_id, numa_id, cpus, memory_mib, hugepages_2mi, hugepages_1gi) VALUES ($1, $2, $3, $4, $5, $6)`,
			id, n.ID, n.CPUs, n.MemoryMiB, n.Hugepages2Mi, n.Hugepages1Gi); err != nil {
			return fmt.Errorf("numa node %d: %w", n.ID, err)
		}
	}
	if r := inv.Resources; r != nil {
		if _, err := tx.Exec(ctx, `INSERT INTO node_resources (node_id, cpu_model, sockets, cores, threads, memory_mib, hugepages_2mi_total, hugepages_1gi_total, update_time)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, compute_now())
			ON CONFLICT (node_id) DO UPDATE SET cpu_model = excluded.cpu_model, sockets = excluded.sockets, cores = excluded.cores,
				threads = excluded.threads, memory_mib = excluded.memory_mib, hugepages_2mi_total = excluded.hugepages_2mi_total,
				hugepages_1gi_total = excluded.hugepages_1gi_total, update_time = excluded.update_time`,
			id, r.CPUModel, r.Sockets, r.Cores, r.Threads, r.MemoryMiB, r.Hugepages2MiTotal, r.Hugepages1GiTotal); err != nil {
			return err
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO inventory_snapshots (node_id, digest, diff, create_time) VALUES ($1, $2, $3, compute_now())
		ON CONFLICT (node_id, digest) DO UPDATE SET diff = excluded.diff, create_time = excluded.create_time`,
		id, inv.Digest, cmp.Or(diff, "{}")); err != nil {
		return err
	}
	n, err := tx.Exec(ctx, `UPDATE nodes SET inventory_digest = $2, update_time = compute_now() WHERE id = $1`, id, inv.Digest)
	if err == nil && n == 0 {
		err = store.ErrNotFound
	}
	return err
}

// InventorySectionPut stores one verified inventory section.
func InventorySectionPut(ctx context.Context, tx store.Tx, nodeID, name, sha256 string, data []byte) error {
	if data == nil {
		// An empty section (a host with no disks, no GPUs) arrives as nil,
		// which the drivers write as NULL; the column holds bytes.
		data = []byte{}
	}
	_, err := tx.Exec(ctx, `INSERT INTO inventory_sections (node_id, name, sha256, data, update_time) VALUES ($1, $2, $3, $4, compute_now())
		ON CONFLICT (node_id, name) DO UPDATE SET sha256 = excluded.sha256, data = excluded.data, update_time = excluded.update_time`,
		nodeID, name, sha256, data)
	return err
}

// GPUNode is a GPU as the fleet knows it by UUID: its node, index and
// model.
type GPUNode struct {
	UUID, NodeID string
	Index        int
	Model        string
}

// GPUByUUID reads a GPU by UUID; store.ErrNotFound when no node reports it.
func GPUByUUID(ctx context.Context, q store.Querier, uuid string) (GPUNode, error) {
	g := GPUNode{UUID: uuid}
	err := q.QueryRow(ctx, `SELECT node_id, idx, model FROM gpus WHERE uuid = $1`, uuid).Scan(&g.NodeID, &g.Index, &g.Model)
	return g, err
}
