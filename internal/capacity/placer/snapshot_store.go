package placer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/capacity/atoms"
	"github.com/better-compute/better-compute/internal/capacity/capmodel"
	"github.com/better-compute/better-compute/internal/capacity/placement"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// Snapshot is a pool's fleet as placement sees it over one window, with what
// booking needs besides (the CPUs behind each node's free vCPUs).
type Snapshot struct {
	Snap  *placement.Snapshot
	Nodes map[string]*placement.Node
	// share is the smallest host's per-GPU share (vcpu, memoryGiB), the
	// default when the pool sets none.
	shareVCPU, shareMemGiB int
	// A snapshot of an index's candidates: the nodes, their details over
	// [start, end), and the index's generation (see Index.refreshed).
	picked     []*ixNode
	start, end time.Time
	gen        uint64
}

// loadSnapshot reads a pool's nodes and atoms with nothing booked: the
// static part of the pool index, which adds the bookings itself.
func loadSnapshot(ctx context.Context, q store.Querier, poolID string, only ...string) (*Snapshot, error) {
	// only, when given, confines the read to those nodes (a delta).
	var onlyArgs []any
	inNodes := func(col string) string { return "" }
	if len(only) > 0 {
		ph := make([]string, len(only))
		for i, id := range only {
			ph[i] = fmt.Sprintf("$%d", i+2)
			onlyArgs = append(onlyArgs, id)
		}
		list := strings.Join(ph, ", ")
		inNodes = func(col string) string { return " AND " + col + " IN (" + list + ")" }
	}
	nodes := map[string]*placement.Node{}
	var order []string
	// Explanations name the pool as operators do.
	poolName := poolID
	if err := q.QueryRow(ctx, `SELECT name FROM pools WHERE id = $1`, poolID).Scan(&poolName); err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	// The pool's members from node_pools, then their rows from the fleet's
	// store: two statements however large the pool.
	ids, err := store.Strings(q.Query(ctx, `SELECT node_id FROM node_pools WHERE pool_id = $1`+inNodes("node_id")+` ORDER BY node_id`,
		append([]any{poolID}, onlyArgs...)...))
	if err != nil {
		return nil, err
	}
	members, err := fleet.NodeStatusList(ctx, q, ids)
	if err != nil {
		return nil, err
	}
	for _, m := range members {
		id := m.ID
		n := &placement.Node{ID: id, Name: m.Name, Pool: poolName, Schedulable: m.State == "active", Healthy: m.Liveness == "ready",
			Labels: map[string]string{}, TenantAtoms: map[string]int{}}
		_ = json.Unmarshal([]byte(m.Labels), &n.Labels)
		_ = json.Unmarshal([]byte(m.Capabilities), &n.Capabilities)
		for k, v := range n.Labels {
			if t, ok := strings.CutPrefix(k, "taint."); ok {
				n.Taints = append(n.Taints, placement.Taint{Key: t, Value: v})
			}
		}
		sort.Slice(n.Taints, func(i, j int) bool { return n.Taints[i].Key < n.Taints[j].Key })
		if v, ok := n.Labels["shape"]; ok {
			n.Shape = v
		}
		nodes[id] = n
		order = append(order, id)
	}
	// Operators name the tenant of a dedicated taint; placement compares
	// ids. (Resolved after the scan: pgx runs one query at a time.)
	names := map[string]string{}
	for _, n := range nodes {
		for i, t := range n.Taints {
			if t.Key != "dedicated" || strings.HasPrefix(t.Value, "tnt_") {
				continue
			}
			id, ok := names[t.Value]
			if !ok {
				id = t.Value
				// Not "tnt_…", so TenantGet looks the name up.
				tn, err := tenancy.TenantGet(ctx, q, t.Value)
				switch {
				case err == nil:
					id = tn.ID
				case !errors.Is(err, store.ErrNotFound):
					return nil, err
				}
				names[t.Value] = id
			}
			n.Taints[i].Value = id
		}
	}

	rows, err := q.Query(ctx, `SELECT a.id, a.node_id, a.kind, a.gpu_uuid, a.model, a.gpu_index, a.numa, a.island, a.memory_mib, a.profile,
			a.quarantined, a.partition_pending
		FROM atoms a JOIN node_pools np ON np.node_id = a.node_id WHERE np.pool_id = $1`+inNodes("a.node_id")+` ORDER BY a.node_id, a.gpu_index, a.id`, append([]any{poolID}, onlyArgs...)...)
	if err != nil {
		return nil, err
	}
	gpuAt := map[string]int{} // gpu uuid -> index into its node's GPUs
	numaAt := map[string]map[int]int{}
	for rows.Next() {
		var a atoms.Row
		if err := rows.Scan(&a.ID, &a.NodeID, &a.Kind, &a.GPUUUID, &a.Model, &a.GPUIndex, &a.NUMA, &a.Island, &a.MemMiB, &a.Profile,
			&a.Quarantined, &a.PartitionPending); err != nil {
			rows.Close()
			return nil, err
		}
		n := nodes[a.NodeID]
		if n == nil {
			continue
		}
		if a.Kind == capmodel.KindCPU {
			if numaAt[n.ID] == nil {
				numaAt[n.ID] = map[int]int{}
			}
			i, ok := numaAt[n.ID][a.NUMA]
			if !ok {
				i = len(n.NUMA)
				numaAt[n.ID][a.NUMA] = i
				n.NUMA = append(n.NUMA, placement.NUMANode{ID: a.NUMA})
			}
			n.Host.VCPU++
			n.NUMA[i].FreeCPUs = append(n.NUMA[i].FreeCPUs, a.GPUIndex)
			continue
		}
		i, ok := gpuAt[a.GPUUUID]
		if !ok {
			i = len(n.GPUs)
			gpuAt[a.GPUUUID] = i
			n.GPUs = append(n.GPUs, placement.GPU{UUID: a.GPUUUID, Model: a.Model, Index: a.GPUIndex, NUMA: a.NUMA,
				Island: a.Island, MemoryMiB: a.MemMiB})
		}
		g := &n.GPUs[i]
		g.Quarantined = g.Quarantined || a.Quarantined
		g.PartitionPending = g.PartitionPending || a.PartitionPending
		switch a.Kind {
		case capmodel.KindGPU:
			g.Mode = placement.ModeWhole
		case capmodel.KindMIG:
			g.Mode = placement.ModeMIG
			g.MIG = append(g.MIG, placement.MIGInstance{Profile: a.Profile, N: migN(a.ID)})
		case capmodel.KindSlot:
			g.Mode = placement.ModeShared
			g.Slots = append(g.Slots, placement.Slot{K: slotK(a.ID)})
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}

	rows, err = q.Query(ctx, `SELECT h.node_id, h.memory_gib, h.hugepages_2mi, h.hugepages_1gi FROM host_resources h
		JOIN node_pools np ON np.node_id = h.node_id WHERE np.pool_id = $1`+inNodes("h.node_id"), append([]any{poolID}, onlyArgs...)...)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var id string
		var mem, hp2, hp1 int
		if err := rows.Scan(&id, &mem, &hp2, &hp1); err != nil {
			rows.Close()
			return nil, err
		}
		if n := nodes[id]; n != nil {
			n.Host.MemoryGiB, n.Host.Hugepages2Mi, n.Host.Hugepages1Gi = mem, hp2, hp1
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}

	s := &Snapshot{Nodes: nodes}
	list := make([]placement.Node, 0, len(order))
	for _, id := range order {
		n := nodes[id]
		for i := range n.NUMA {
			sort.Ints(n.NUMA[i].FreeCPUs)
		}
		sort.Slice(n.NUMA, func(i, j int) bool { return n.NUMA[i].ID < n.NUMA[j].ID })
		if len(n.NUMA) > 0 {
			per := n.Host.MemoryGiB / len(n.NUMA)
			for i := range n.NUMA {
				n.NUMA[i].FreeMemoryGiB = per
			}
		}
		if len(n.GPUs) > 0 {
			v, m := n.Host.VCPU/len(n.GPUs), n.Host.MemoryGiB/len(n.GPUs)
			if s.shareVCPU == 0 || v < s.shareVCPU {
				s.shareVCPU = v
			}
			if s.shareMemGiB == 0 || m < s.shareMemGiB {
				s.shareMemGiB = m
			}
		}
		list = append(list, *n)
	}
	s.Snap = placement.NewSnapshot(list)
	// NewSnapshot keeps its own copies; point nodes at them for booking.
	for i := range list {
		s.Nodes[list[i].ID] = &list[i]
	}
	return s, nil
}

func migN(id string) int {
	i := strings.LastIndexByte(id, '/')
	n := 0
	for _, c := range id[i+1:] {
		n = n*10 + int(c-'0')
	}
	return n
}

func slotK(id string) int {
	i := strings.LastIndex(id, "/s")
	n := 0
	for _, c := range id[i+2:] {
		n = n*10 + int(c-'0')
	}
	return n
}
