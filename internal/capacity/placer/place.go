package placer

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/booking"
	"github.com/better-compute/better-compute/internal/capacity/capmodel"
	"github.com/better-compute/better-compute/internal/capacity/gpumodel"
	"github.com/better-compute/better-compute/internal/capacity/placement"
	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

// MaxReplans is how many times one placement is retried after losing a race
// for its atoms before the reservation waits in the queue.
const MaxReplans = 3

// Placers runs the placers of the pools this replica owns and elects the
// owner of each pool across replicas. A pool has one index, its placer's:
// bookings mark it, the placer alone loads it (by the pool's version,
// between batches), and previews and releases read it.
type Placers struct {
	// DB is where the placers load their indexes and commit their
	// batches.
	DB    *store.DB
	Clock clock.Clock

	// BatchObserved observes each placer transaction: how many mutations
	// it carried and how long it held the writer, from BEGIN to COMMIT
	// (benchmarks read it); nil skips it.
	BatchObserved func(size int, hold time.Duration)
	// SubmitObserved observes each mutation submitted to a placer on this
	// replica: how long from submission to its answer (the wait in the
	// queue and the batch's commit) and the answer; nil skips it.
	SubmitObserved func(wait time.Duration, err error)
	// Env stages placer batches' audit rows, events and idempotency
	// records; the reservation service sets it.
	Env *envelope.Envelope

	// Tracing records a span per batch and per placement, linked to the
	// callers' spans; nil records none.
	Tracing trace.TracerProvider

	// PendingEvery, when set (several replicas on PostgreSQL), is how often
	// a pool's placer runs PendingPass for its pool.
	PendingEvery time.Duration
	PendingPass  func(poolID string)

	// ItemByItem runs every batch the way the fallback after a failed
	// batch does, each item under its own savepoint writing as it goes: a
	// test knob, so that path is exercised on purpose and not only when a
	// busy machine happens to fail a batch.
	ItemByItem bool

	// Linger is the longest a placer waits for more work when it has
	// fewer than LingerBatch mutations to commit: more mutations a commit
	// is less commit each (a commit is most of a small batch's hold). It
	// waits at most as long as its recent commits held the writer, so a
	// wait never costs more than the commit it shares. 0 never waits.
	Linger time.Duration

	plMu    sync.Mutex
	placers map[string]*placer
	// claimMu orders claims on the replica's lock session (one
	// connection); taken before plMu, never while holding it.
	claimMu sync.Mutex
	cluster *cluster
	stopped bool

	replans   atomic.Int64
	lost      atomic.Int64
	deltas    atomic.Int64
	submitted atomic.Int64
	seed      atomic.Uint64
}

// Replans counts placements retried after a lost race (for benchmarks).
func (e *Placers) Replans() int64 { return e.replans.Load() }

// errHostFull: the node's host memory is taken by a booking placement did not
// see; like an overlap, it means replan.
var errHostFull = errors.New("host resources taken concurrently")

// CapDevices is the agent capability of a node whose bcd confines an
// allocation to its GPUs (a cgroup v2 device program).
const CapDevices = "devices.limits"

// CapKubernetes is the agent capability of a node whose bcd hands booked
// GPUs to the kubelet (its device plugin or DRA driver is registered).
const CapKubernetes = "binding.kubernetes"

// Request is the placement request of a reservation. A reservation that
// bcd binds on the node (binding "node") needs its GPUs isolated there, so
// it places only on nodes that advertise devices.limits; one the kubelet
// binds (binding "kubernetes") only where bcd can hand its GPUs to the
// kubelet (binding.kubernetes), else it would go active with nothing
// bound; an instance's only on nodes that run instances
// (vmcmd.CapInstances), plus what it Requires; on its PinNodeID only when
// it has one.
func Request(r *capmodel.Reservation) placement.Request {
	req := placement.Request{
		GPUs: r.GPUs, Model: r.Model, MIGProfile: r.MIGProfile, Slots: r.Slots, VCPU: r.VCPU, MemoryGiB: r.MemoryGiB,
		Hugepages1Gi: r.Hugepages1Gi, Tenant: r.TenantID, SingleTenant: r.SingleTenant,
		Tolerations: []string{"dedicated=" + r.TenantID}, Node: r.PinNodeID,
	}
	switch r.Binding {
	case capmodel.BindingNode:
		req.Capabilities = []string{CapDevices}
	case capmodel.BindingKubernetes:
		req.Capabilities = []string{CapKubernetes}
	case capmodel.BindingInstance:
		// A guest goes only where bcd runs a hypervisor.
		req.Capabilities = []string{vmcmd.CapInstances}
	case capmodel.BindingMachine:
		// A whole machine, alone: a node a machine's deploy joined as,
		// every GPU of it, no one else's atoms.
		req.SingleTenant, req.WholeNode = true, true
		req.Selector = append(req.Selector, placement.LabelRequirement{Key: capmodel.MachineLabel, Op: placement.OpExists})
	}
	req.Capabilities = append(req.Capabilities, r.Requires...)
	return req
}

// Place finds a plan and books it in the batch. It looks at the fullest
// candidate nodes first and scans the whole pool only when none fits. In a
// placer batch the index is the truth (the placer is the pool's only
// writer), so the first plan is booked; a plan the database refuses — which
// only the per-item fallback can see — is followed by the next plan, and
// after a round of such refusals the index re-reads the contested nodes and
// places again, up to MaxReplans times. It reports whether the reservation
// was placed and, when not, why.
func (e *Placers) Place(ctx context.Context, b *Batch, r *capmodel.Reservation, now time.Time) (bool, placement.Explanation, error) {
	ix := b.ix
	req := Request(r)
	need := r.GPUs + r.Slots
	var ex placement.Explanation
	for attempt := 0; attempt < MaxReplans; attempt++ {
		var res placement.Result
		var err error
		shape := ShapeOf(r.MIGProfile, r.Slots)
		snap := b.shared.take(r, shape, need)
		if snap != nil {
			if res, err = placement.Place(snap.Snap, req, placement.Options{Limit: 4}); err != nil {
				return false, ex, err
			}
		}
		if len(res.Plans) == 0 {
			snap = ix.Snapshot(r.StartsAt, r.EndsAt, ShapeOf(r.MIGProfile, r.Slots), need, CandidateLimit, e.Rng())
			if res, err = placement.Place(snap.Snap, req, placement.Options{Limit: 4}); err != nil {
				return false, ex, err
			}
		}
		if len(res.Plans) == 0 {
			snap = ix.Snapshot(r.StartsAt, r.EndsAt, "", 0, 0, nil)
			if res, err = placement.Place(snap.Snap, req, placement.Options{Limit: 4}); err != nil {
				return false, ex, err
			}
		}
		ex = res.Explanation
		if len(res.Plans) == 0 {
			return false, ex, nil
		}
		var contested []string
		for k := range res.Plans {
			plan := &res.Plans[k]
			m := b.Mark()
			var err error
			if b.immediate {
				// Written at once: a refusal (an overlap, a lost node)
				// must leave the transaction usable for the next plan —
				// PostgreSQL aborts it on any error otherwise.
				err = Savepoint(ctx, b.tx, "place", func() error { return e.book(ctx, b, r, plan, snap.Nodes[plan.NodeID]) })
			} else {
				err = e.book(ctx, b, r, plan, snap.Nodes[plan.NodeID])
			}
			if err != nil {
				// Nothing of a refused plan stays staged or marked.
				b.Rewind(m)
			}
			switch {
			case errors.Is(err, errNodeGone):
				// Out of this batch's placements; the placer reads the
				// node again before its next batch, so one that comes
				// back is not kept out.
				ix.markUnschedulable(plan.NodeID)
				b.gone = append(b.gone, plan.NodeID)
				continue
			case errors.Is(err, errStaleIndex):
				// The node changed under the index and no delta told it
				// yet (written at once, so this transaction reads what
				// is committed and its own rows): read the node again
				// and place once more.
				if err := ix.reread(ctx, b.tx, []string{plan.NodeID}, now); err != nil {
					return false, ex, err
				}
				contested = append(contested, plan.NodeID)
				continue
			case errors.Is(err, booking.ErrOverlap) || errors.Is(err, errHostFull):
				contested = append(contested, plan.NodeID)
				continue
			case err != nil:
				return false, ex, err
			}
			b.shared.keep(ix, snap, plan.NodeID, shape, need)
			return true, ex, nil
		}
		if len(contested) == 0 {
			continue
		}
		e.replans.Add(1)
		if err := ix.sync(ctx, b.tx, contested, now); err != nil {
			return false, ex, err
		}
	}
	return false, ex, nil
}

// sharedSnap is the candidate snapshot the members of an array (and any
// item of the batch asking for the same span and size) place against in
// turn: after a member books a node only that node is read again, where a
// fresh snapshot copied every candidate for every member (14% of an
// array's CPU in the profile). It is used only while the index has not
// changed otherwise since (Index.refreshed), and a member it has no room
// for takes a fresh snapshot as before.
type sharedSnap struct {
	ix     *Index
	snap   *Snapshot
	nodeID string // booked from snap, to be read again
	shape  string
	need   int
}

// take returns the shared snapshot if it serves r (need units of shape),
// else nil. The booked node is read again only now, when it is wanted: a
// batch of single creates (each its own span) never wants it.
func (s *sharedSnap) take(r *capmodel.Reservation, shape string, need int) *Snapshot {
	if s.snap == nil || s.shape != shape || s.need != need || !s.snap.start.Equal(r.StartsAt) || !s.snap.end.Equal(r.EndsAt) {
		return nil
	}
	if s.nodeID != "" {
		s.snap, s.nodeID = s.ix.refreshed(s.snap, s.nodeID), ""
	}
	return s.snap
}

// keep makes snap, with nodeID (just booked from it) to be read again, the
// shared snapshot; full snapshots (the fallback scan) are not kept.
func (s *sharedSnap) keep(ix *Index, snap *Snapshot, nodeID, shape string, need int) {
	*s = sharedSnap{}
	if snap.picked == nil || len(snap.picked) > CandidateLimit {
		return
	}
	*s = sharedSnap{ix: ix, snap: snap, nodeID: nodeID, shape: shape, need: need}
}

// Rng is a fresh random source for a snapshot's sample of candidates.
func (e *Placers) Rng() *rand.Rand {
	return rand.New(rand.NewPCG(e.seed.Add(1), 0x9e3779b97f4a7c15))
}

// errNodeGone: the chosen node is no longer active and ready.
var errNodeGone = errors.New("node left placement")

// errStaleIndex: the chosen atoms are no longer in the pool or usable.
var errStaleIndex = errors.New("pool index is stale")

// book books the plan for r in the batch and marks the index (undone if
// the batch, or in the fallback the item, rolls back).
func (e *Placers) book(ctx context.Context, b *Batch, r *capmodel.Reservation, plan *placement.Plan, n *placement.Node) error {
	bs := make([]booking.Booking, 0, len(plan.Atoms))
	for _, a := range plan.Atoms {
		bs = append(bs, booking.Booking{ReservationID: r.ID, Atom: a, StartsAt: r.StartsAt, EndsAt: r.EndsAt})
	}
	// CPUs are booked as ranges, one row per contiguous run.
	runs := booking.CPURanges(plan.CPUs)
	cpus := make([]booking.CPURange, len(runs))
	for i, run := range runs {
		cpus[i] = booking.CPURange{ReservationID: r.ID, NodeID: plan.NodeID, Lo: run[0], Hi: run[1], StartsAt: r.StartsAt, EndsAt: r.EndsAt}
	}
	// The node must still take bookings (FOR SHARE on PostgreSQL: a
	// liveness sweep marking it lost waits for this batch to commit, and
	// its NodesLost hook then sees the booking).
	if err := b.checkNode(ctx, plan.NodeID); err != nil {
		return err
	}
	b.atoms = append(b.atoms, plan.Atoms...)
	b.noteHost(r, plan.NodeID, len(plan.Atoms))
	if b.immediate {
		// Written at once: verified first, with the checks a staged
		// batch makes at its flush, so an atom gone from the pool is a
		// stale index, not a failed insert.
		if err := b.verify(ctx); err != nil {
			return err
		}
	}
	if err := b.stageBookings(ctx, bs, cpus); err != nil {
		return err
	}
	if err := e.RecordPlan(r, plan, n); err != nil {
		return err
	}
	if ix := b.ix; ix != nil {
		ix.mark(r, plan, b.now)
		nodeID, id, start := plan.NodeID, r.ID, r.StartsAt
		b.undo = append(b.undo, func() { ix.Released(nodeID, id, start, b.now) })
	}
	return nil
}

// RecordPlan records a plan's placement on r.
func (e *Placers) RecordPlan(r *capmodel.Reservation, plan *placement.Plan, n *placement.Node) error {
	rec := capmodel.PlacementRecord{NodeName: plan.NodeName, Atoms: plan.Atoms, CPUs: plan.CPUs, CPUSet: plan.CPUSet, NUMA: plan.NUMA,
		Island: -1, Kinds: map[string]int{},
		Score: [5]float64{plan.Score.Binpack, plan.Score.Topology, plan.Score.Fragmentation, plan.Score.Spread, plan.Score.Total}}
	islands := map[int]bool{}
	model := ""
	for _, a := range plan.Atoms {
		uuid, kind := a, capmodel.KindGPU
		if i := strings.Index(a, "/mig/"); i >= 0 {
			uuid, kind = a[:i], capmodel.KindMIG
		} else if i := strings.LastIndex(a, "/s"); i >= 0 {
			uuid, kind = a[:i], capmodel.KindSlot
		}
		rec.Kinds[kind]++
		if !slices.Contains(rec.GPUUUIDs, uuid) {
			rec.GPUUUIDs = append(rec.GPUUUIDs, uuid)
		}
		if n != nil {
			for _, g := range n.GPUs {
				if g.UUID == uuid {
					islands[g.Island] = true
					model = g.Model
				}
			}
		}
	}
	if len(islands) == 1 {
		for i := range islands {
			rec.Island = i
		}
	}
	rec.AtomModel = model
	r.NodeID, r.GPUModel, r.Placement = plan.NodeID, gpumodel.Short(model), rec
	return nil
}

// ExplanationProto converts a placement explanation for the API.
func ExplanationProto(ex placement.Explanation) *apiv1.Explanation {
	out := &apiv1.Explanation{Evaluated: int32(ex.Evaluated), Feasible: int32(ex.Feasible), Summary: ex.String()}
	for _, l := range ex.Lines() {
		out.Lines = append(out.Lines, &apiv1.ExplanationLine{Class: l.Class.String(), Reason: l.Reason, Nodes: int32(l.Nodes)})
	}
	return out
}
