package atoms

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/better-compute/better-compute/internal/capacity/capmodel"
	"slices"
	"sort"
	"strconv"
	"strings"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/gpumodel"
	"github.com/better-compute/better-compute/internal/capacity/placement"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

// ConditionPoolConflict is the node condition that shows a node two pools
// claim (status true: it is in none until the selectors are fixed).
const ConditionPoolConflict = "PoolConflict"

// conditionGPUQuarantined starts the node condition that quarantines one GPU
// (set by the gateway on a fatal XID).
const conditionGPUQuarantined = "GpuQuarantined/"

// Row is one row of atoms.
type Row struct {
	ID, NodeID, Kind, GPUUUID, Model string
	GPUIndex, NUMA, Island, MemMiB   int
	Profile                          string
	Quarantined, PartitionPending    bool
}

func (a Row) same(b Row) bool { return a == b }

// nodeFacts is what reconciling a node reads.
type nodeFacts struct {
	ID, TenantID, PoolName, State string
	Labels                        map[string]string
}

// EffectiveLabels are a node's labels plus the ones derived from its
// inventory, which pool selectors and requests can match: gpu.model (the
// product name, "H100"), gpu.count and gpu.memory ("80GB"). Labels the
// operator set win over derived ones.
func EffectiveLabels(labels map[string]string, gpuNames []string, gpuMemMiB []int) map[string]string {
	out := make(map[string]string, len(labels)+3)
	if len(gpuNames) > 0 {
		mem := 0
		if len(gpuMemMiB) > 0 {
			mem = gpuMemMiB[0]
		}
		out = gpumodel.Labels(gpuNames[0], len(gpuNames), mem)
	}
	for k, v := range labels {
		out[k] = v
	}
	return out
}

type gpuFacts struct {
	UUID, Model, MigMode string
	Index, NUMA, MemMiB  int
}

// activePools is a tenant's active pools, decoded.
type activePool struct {
	pool.Pool
	api *apiv1.Pool
	sel []placement.LabelRequirement
}

func readPools(ctx context.Context, q store.Querier, tenantID string) ([]activePool, error) {
	var out []activePool
	after := ""
	for {
		ps, err := pool.List(ctx, q, &pool.ListParams{TenantID: tenantID, After: after, Limit: 500})
		if err != nil {
			return nil, err
		}
		for _, p := range ps {
			api := pool.Proto(p)
			ap := activePool{Pool: p, api: api}
			for _, r := range api.GetSelector() {
				ap.sel = append(ap.sel, placement.LabelRequirement{Key: r.GetKey(), Op: placement.LabelOp(r.GetOperator()), Values: r.GetValues()})
			}
			out = append(out, ap)
		}
		if len(ps) < 500 {
			return out, nil
		}
		after = ps[len(ps)-1].ID
	}
}

func (p *activePool) matches(n *nodeFacts, labels map[string]string) bool {
	if n.PoolName != "" && (n.PoolName == p.Name || n.PoolName == p.ID) {
		return true // adopted explicitly by its join token
	}
	if len(p.sel) == 0 {
		// An empty selector takes no node by labels: a pool that silently
		// claimed every node would collide with every other pool.
		return false
	}
	for _, r := range p.sel {
		if !r.Matches(labels) {
			return false
		}
	}
	return true
}

// Reconciler keeps membership, atoms and host resources in step with
// inventory and pools. It is level-triggered: it reads the world, writes the
// difference, and running it twice changes nothing more.
type Reconciler struct {
	// Wake is called (in the transaction) with the pools that gained
	// capacity, so the queued placer looks at them; may be nil.
	Wake func(ctx context.Context, tx store.Tx, poolIDs []string) error
	// NodeChanged, when set, is told (in the transaction) that a node of a
	// pool changed and the pool's version became version.
	NodeChanged func(tx store.Tx, poolID, nodeID string, version int64)
}

// ReconcileTenant reconciles every node of a tenant (a pool changed).
func (rc *Reconciler) ReconcileTenant(ctx context.Context, tx store.Tx, tenantID string) error {
	return rc.reconcileTenant(ctx, tx, tenantID, nil, true)
}

// Sweep reconciles every node of a tenant as the periodic safety net does:
// like ReconcileTenant, except that no pool's policy changed, so only the
// nodes that change tell the pools' indexes (a delta each), and an index
// with nothing changed is not reloaded.
func (rc *Reconciler) Sweep(ctx context.Context, tx store.Tx, tenantID string) error {
	return rc.reconcileTenant(ctx, tx, tenantID, nil, false)
}

// ReconcilePool reconciles every node of a tenant after one of its pools
// was created or updated, and refuses the change (FAILED_PRECONDITION,
// naming the other pools and how many nodes each would share) when it would
// put nodes that are in no conflict now into one: two pools claiming a node
// leave it in neither, which silently empties the older pool. The refusal
// comes from the same pass that recomputes membership, so the caller's
// transaction rolls back whatever the pass wrote.
func (rc *Reconciler) ReconcilePool(ctx context.Context, tx store.Tx, tenantID, poolID string) error {
	g := &conflictGuard{poolID: poolID, overlaps: map[string]int{}}
	if err := rc.reconcileTenant(ctx, tx, tenantID, g, true); err != nil {
		return err
	}
	return g.err()
}

// conflictGuard counts, for one changed pool, the nodes it would newly
// share with each other pool.
type conflictGuard struct {
	poolID   string
	name     string
	overlaps map[string]int // other pool's name -> nodes
}

// saw records a node's claimants when the node was in no conflict before.
func (g *conflictGuard) saw(claimants []*activePool) {
	if g == nil || len(claimants) < 2 {
		return
	}
	mine := false
	for _, p := range claimants {
		if p.ID == g.poolID {
			mine, g.name = true, p.Name
		}
	}
	if !mine {
		return
	}
	for _, p := range claimants {
		if p.ID != g.poolID {
			g.overlaps[p.Name]++
		}
	}
}

func (g *conflictGuard) err() error {
	if len(g.overlaps) == 0 {
		return nil
	}
	names := make([]string, 0, len(g.overlaps))
	for n := range g.overlaps {
		names = append(names, n)
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, n := range names {
		noun := "nodes"
		if g.overlaps[n] == 1 {
			noun = "node"
		}
		parts[i] = fmt.Sprintf("%d %s with pool %s", g.overlaps[n], noun, n)
	}
	return envelope.Errorf(envelope.CodeFailedPrecondition,
		"pool %s would share %s; a node two pools select is in neither, so narrow the selector (see the nodes' labels: nodes list --show-labels)",
		g.name, strings.Join(parts, ", "))
}

func (rc *Reconciler) reconcileTenant(ctx context.Context, tx store.Tx, tenantID string, guard *conflictGuard, policyChanged bool) error {
	if err := reconcileLock(ctx, tx, tenantID); err != nil {
		return err
	}
	pools, err := readPools(ctx, tx, tenantID)
	if err != nil {
		return err
	}
	ids, err := tenantNodes(ctx, tx, tenantID)
	if err != nil {
		return err
	}
	var woken []string
	for _, id := range ids {
		w, err := rc.reconcile(ctx, tx, id, pools, guard)
		if err != nil {
			return err
		}
		woken = append(woken, w...)
	}
	// A policy change (host reserve, sharing) reshapes what every member
	// offers: every process reloads its index of the tenant's pools.
	for _, p := range pools {
		if !policyChanged {
			break
		}
		if err := BumpPoolVersion(ctx, tx, p.ID); err != nil {
			return err
		}
	}
	return rc.wake(ctx, tx, woken)
}

// ReconcileNode reconciles one node (its inventory or health changed).
func (rc *Reconciler) ReconcileNode(ctx context.Context, tx store.Tx, nodeID string) error {
	n, err := readNode(ctx, tx, nodeID)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := reconcileLock(ctx, tx, n.TenantID); err != nil {
		return err
	}
	pools, err := readPools(ctx, tx, n.TenantID)
	if err != nil {
		return err
	}
	woken, err := rc.reconcile(ctx, tx, nodeID, pools, nil)
	if err != nil {
		return err
	}
	return rc.wake(ctx, tx, woken)
}

func (rc *Reconciler) wake(ctx context.Context, tx store.Tx, pools []string) error {
	slices.Sort(pools)
	pools = slices.Compact(pools)
	if rc.Wake == nil || len(pools) == 0 {
		return nil
	}
	return rc.Wake(ctx, tx, pools)
}

// reconcile brings one node's membership, atoms and host resources in step.
// It returns the pools that may now fit more. A non-nil guard counts the
// conflicts its pool would newly cause.
func (rc *Reconciler) reconcile(ctx context.Context, tx store.Tx, nodeID string, pools []activePool, guard *conflictGuard) ([]string, error) {
	if err := lockNode(ctx, tx, nodeID); err != nil {
		return nil, err
	}
	n, err := readNode(ctx, tx, nodeID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	gpus, err := readGPUs(ctx, tx, nodeID)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(gpus))
	mems := make([]int, len(gpus))
	for i, g := range gpus {
		names[i], mems[i] = g.Model, g.MemMiB
	}
	labels := EffectiveLabels(n.Labels, names, mems)

	// Membership.
	var member *activePool
	var claimants []string
	var claiming []*activePool
	if n.State != "retired" {
		for i := range pools {
			if pools[i].matches(&n, labels) {
				claimants = append(claimants, pools[i].Name)
				claiming = append(claiming, &pools[i])
				if member == nil {
					member = &pools[i]
				}
			}
		}
	}
	poolID, conflict := "", ""
	switch {
	case len(claimants) > 1:
		member = nil
		conflict = "matches pools " + strings.Join(claimants, ", ") + "; a node belongs to one pool"
	case member != nil:
		poolID = member.ID
	}
	oldPool, oldConflict, oldLabels := "", "", ""
	oldPool, oldConflict, oldLabels, err = nodePool(ctx, tx, nodeID)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	if oldConflict == "" {
		guard.saw(claiming)
	}
	// Map keys marshal sorted: equal labels give equal text.
	labelText, err := json.Marshal(n.Labels)
	if err != nil {
		return nil, err
	}
	if err := saveNodePool(ctx, tx, nodeID, n.TenantID, poolID, conflict, string(labelText)); err != nil {
		return nil, err
	}
	if err := setPoolCondition(ctx, tx, nodeID, conflict); err != nil {
		return nil, err
	}

	var policy *apiv1.PoolPolicy
	if member != nil {
		policy = member.api.GetPolicy()
	}
	flags, err := gpuConditions(ctx, tx, nodeID)
	if err != nil {
		return nil, err
	}
	frozen, err := landedPartitions(ctx, tx, nodeID, gpus, flags)
	if err != nil {
		return nil, err
	}
	want, err := desiredAtoms(ctx, tx, nodeID, gpus, policy, flags.quarantined, frozen)
	if err != nil {
		return nil, err
	}
	have, err := readAtoms(ctx, tx, nodeID)
	if err != nil {
		return nil, err
	}
	held, err := heldAtoms(ctx, tx, nodeID)
	if err != nil {
		return nil, err
	}
	// An atom a live reservation holds is never deleted under it: it stays,
	// quarantined, until the reservation ends and the next pass drops it.
	for id, a := range have {
		if _, ok := want[id]; !ok && held[id] {
			a.Quarantined = true
			want[id] = a
		}
	}

	// Rollups: take the node's old contribution out, put the new one in.
	if err := rollupNode(ctx, tx, oldPool, have, -1); err != nil {
		return nil, err
	}
	if err := rollupNode(ctx, tx, poolID, want, +1); err != nil {
		return nil, err
	}

	gained := poolID != "" && (poolID != oldPool || freeCount(want) > freeCount(have))
	// A label change that keeps the node in its pool (a taint, a shape)
	// changes what the placer may do with it all the same.
	changed := poolID != oldPool || len(want) != len(have) || oldLabels != string(labelText)
	for id, a := range want {
		if old, ok := have[id]; !ok || !old.same(a) {
			changed = true
			break
		}
	}
	if changed {
		bumped := []string{oldPool}
		if poolID != oldPool {
			bumped = append(bumped, poolID)
		}
		for _, p := range bumped {
			v, err := bumpPoolVersion(ctx, tx, p)
			if err != nil {
				return nil, err
			}
			// The pool's placer reads this node again, not the pool.
			if p != "" && rc.NodeChanged != nil {
				rc.NodeChanged(tx, p, nodeID, v)
			}
		}
	}
	for id, a := range want {
		if old, ok := have[id]; ok && old.same(a) {
			continue
		}
		if err := saveAtom(ctx, tx, a); err != nil {
			return nil, err
		}
	}
	for id := range have {
		if _, ok := want[id]; !ok {
			if err := deleteAtom(ctx, tx, id); err != nil {
				return nil, err
			}
		}
	}
	if err := reconcileHost(ctx, tx, nodeID, policy); err != nil {
		return nil, err
	}
	if gained {
		return []string{poolID}, nil
	}
	return nil, nil
}

func freeCount(atoms map[string]Row) int {
	n := 0
	for _, a := range atoms {
		if a.Kind != capmodel.KindCPU && !a.Quarantined && !a.PartitionPending {
			n++
		}
	}
	return n
}

// islands groups a node's GPUs into NVLink islands: connected components of
// the NVLink graph, named by their lowest GPU index; a GPU without peers has
// island -1.
func islands(ctx context.Context, q store.Querier, nodeID string, gpus []gpuFacts) (map[string]int, error) {
	links, err := nvlinks(ctx, q, nodeID)
	if err != nil {
		return nil, err
	}
	parent := map[string]string{}
	find := func(x string) string {
		for parent[x] != x {
			parent[x] = parent[parent[x]]
			x = parent[x]
		}
		return x
	}
	index := map[string]int{}
	for _, g := range gpus {
		parent[g.UUID] = g.UUID
		index[g.UUID] = g.Index
	}
	linked := map[string]bool{}
	for _, l := range links {
		a, b := l[0], l[1]
		if _, ok := parent[a]; !ok {
			continue
		}
		if _, ok := parent[b]; !ok {
			continue
		}
		linked[a], linked[b] = true, true
		ra, rb := find(a), find(b)
		if ra != rb {
			parent[ra] = rb
		}
	}
	low := map[string]int{}
	for _, g := range gpus {
		r := find(g.UUID)
		if v, ok := low[r]; !ok || g.Index < v {
			low[r] = g.Index
		}
	}
	out := map[string]int{}
	for _, g := range gpus {
		if !linked[g.UUID] {
			out[g.UUID] = -1
			continue
		}
		out[g.UUID] = low[find(g.UUID)]
	}
	return out, nil
}

type migFacts struct {
	Profile string
	GIID    int
}

// desiredAtoms derives a node's atoms from its inventory and its pool's
// sharing mode: whole GPUs, the MIG instances the GPU model's layout allows,
// or shared slots; and one atom per CPU the host does not keep.
func desiredAtoms(ctx context.Context, q store.Querier, nodeID string, gpus []gpuFacts, policy *apiv1.PoolPolicy, quarantined, frozen map[string]bool) (map[string]Row, error) {
	isl, err := islands(ctx, q, nodeID, gpus)
	if err != nil {
		return nil, err
	}
	mig, err := readMIG(ctx, q, nodeID)
	if err != nil {
		return nil, err
	}
	sharing := policy.GetGpuSharing()
	out := map[string]Row{}
	for _, g := range gpus {
		base := Row{NodeID: nodeID, GPUUUID: g.UUID, Model: gpumodel.Canonical(g.Model, g.MemMiB), GPUIndex: g.Index,
			NUMA: g.NUMA, Island: isl[g.UUID], MemMiB: g.MemMiB, Quarantined: quarantined[g.UUID],
			PartitionPending: g.MigMode == "pending" || frozen[g.UUID]}
		switch sharing {
		case pool.GPUSharingMIG:
			layout := placement.MIGProfiles(base.Model)
			count := map[string]int{}
			for _, m := range mig[g.UUID] {
				if !slices.ContainsFunc(layout, func(p placement.MIGProfile) bool { return p.Name == m.Profile }) {
					continue // the layout gate: a profile the model does not support is never booked
				}
				a := base
				a.Kind, a.Profile = capmodel.KindMIG, m.Profile
				a.ID = fmt.Sprintf("%s/mig/%s/%d", g.UUID, m.Profile, count[m.Profile])
				count[m.Profile]++
				out[a.ID] = a
			}
		case pool.GPUSharingTimeslice, pool.GPUSharingMPS:
			for k := range int(policy.GetSlotsPerGpu()) {
				a := base
				a.Kind, a.ID = capmodel.KindSlot, g.UUID+"/s"+strconv.Itoa(k)
				out[a.ID] = a
			}
		default:
			a := base
			a.Kind, a.ID = capmodel.KindGPU, g.UUID
			out[a.ID] = a
		}
	}
	numas, err := readNUMA(ctx, q, nodeID)
	if err != nil {
		return nil, err
	}
	reserved := reservedCPUs(numas, int(policy.GetHostReserve().GetVcpu()))
	for _, nn := range numas {
		for _, c := range nn.CPUs {
			if reserved[c] {
				continue
			}
			out[capmodel.CPUAtom(nodeID, c)] = Row{ID: capmodel.CPUAtom(nodeID, c), NodeID: nodeID, Kind: capmodel.KindCPU, NUMA: nn.ID, Island: -1, GPUIndex: c}
		}
	}
	return out, nil
}

type numaFacts struct {
	ID                   int
	CPUs                 []int
	MemMiB, HP2Mi, HP1Gi int
}

// reservedCPUs picks the CPUs the host keeps: the lowest of each NUMA node in
// turn, so the reserve does not drain one node's local CPUs.
func reservedCPUs(numas []numaFacts, n int) map[int]bool {
	out := map[int]bool{}
	for round := 0; len(out) < n; round++ {
		took := false
		for _, nn := range numas {
			if len(out) >= n {
				break
			}
			if round < len(nn.CPUs) {
				out[nn.CPUs[round]] = true
				took = true
			}
		}
		if !took {
			break
		}
	}
	return out
}

type rollupKey struct{ model, kind string }

func rollupNode(ctx context.Context, tx store.Tx, poolID string, atoms map[string]Row, sign int) error {
	if poolID == "" {
		return nil
	}
	type counts struct{ total, quarantined int }
	by := map[rollupKey]*counts{}
	for _, a := range atoms {
		if a.Kind == capmodel.KindCPU {
			continue
		}
		k := rollupKey{a.Model, a.Kind}
		c := by[k]
		if c == nil {
			c = &counts{}
			by[k] = c
		}
		c.total++
		if a.Quarantined || a.PartitionPending {
			c.quarantined++
		}
	}
	keys := make([]rollupKey, 0, len(by))
	for k := range by {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].model+keys[i].kind < keys[j].model+keys[j].kind })
	for _, k := range keys {
		c := by[k]
		if err := RollupAdd(ctx, tx, poolID, k.model, k.kind, sign*c.total, 0, sign*c.quarantined); err != nil {
			return err
		}
	}
	return nil
}

// reconcileHost writes the node's allocatable host resources: memory minus
// hugepage pools minus the host reserve, and the CPUs left after the reserve.
func reconcileHost(ctx context.Context, tx store.Tx, nodeID string, policy *apiv1.PoolPolicy) error {
	numas, err := readNUMA(ctx, tx, nodeID)
	if err != nil {
		return err
	}
	var memMiB, hp2, hp1, cpus int
	for _, n := range numas {
		memMiB += n.MemMiB - n.HP2Mi*2 - n.HP1Gi*1024
		hp2 += n.HP2Mi
		hp1 += n.HP1Gi
		cpus += len(n.CPUs)
	}
	reserve := policy.GetHostReserve()
	reserved := reservedCPUs(numas, int(reserve.GetVcpu()))
	memGiB := max(0, memMiB/1024-int(reserve.GetMemoryGib()))
	keys := make([]int, 0, len(reserved))
	for c := range reserved {
		keys = append(keys, c)
	}
	return saveHost(ctx, tx, nodeID, cpus-len(reserved), memGiB, hp2, hp1, capmodel.FormatCPUList(keys))
}
