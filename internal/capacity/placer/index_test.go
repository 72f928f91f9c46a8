package placer

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/capacity/capmodel"
	"github.com/better-compute/better-compute/internal/capacity/placement"
)

// TestSnapshotDetailFromArena: a snapshot's nodes show what is booked over
// its window (GPUs, CPUs, host share, tenants), the nodes built in one arena
// do not share memory, and nothing of the index's static detail changes.
func TestSnapshotDetailFromArena(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	ix := benchIndex(3, now) // each node: GPUs 0–2 and CPUs 0–23 booked for [now-1h, now+1h)
	before := slices.Clone(ix.byID["n00001"].base.NUMA[0].FreeCPUs)

	r := &capmodel.Reservation{ID: "rx", TenantID: "globex", StartsAt: now, EndsAt: now.Add(2 * time.Hour), MemoryGiB: 32}
	ix.mark(r, &placement.Plan{NodeID: "n00001", Atoms: []string{"n00001-gpu5"}, CPUs: []int{60, 61}}, now)

	during := ix.Snapshot(now, now.Add(time.Minute), "", 0, 0, nil)
	n1 := during.Nodes["n00001"]
	require.Equal(t, 24+2, n1.HostBooked.VCPU)
	require.Equal(t, 3*64+32, n1.HostBooked.MemoryGiB)
	require.Equal(t, map[string]int{"acme": 3, "globex": 0}, n1.TenantAtoms)
	require.NotContains(t, n1.NUMA[0].FreeCPUs, 0)
	require.NotContains(t, n1.NUMA[1].FreeCPUs, 60)
	require.Contains(t, n1.NUMA[1].FreeCPUs, 62)
	require.True(t, n1.GPUs[5].Booked)
	require.False(t, n1.GPUs[4].Booked)
	n0 := during.Nodes["n00000"]
	require.Equal(t, 24, n0.HostBooked.VCPU)
	require.False(t, n0.GPUs[5].Booked)

	// Appending to one node's CPU list must not write into another's.
	_ = append(n0.NUMA[0].FreeCPUs, -1)
	_ = append(n0.NUMA[1].FreeCPUs, -1)
	require.Equal(t, 24, n1.NUMA[0].FreeCPUs[0], "n00001's list was overwritten through n00000's")
	require.Equal(t, before, ix.byID["n00001"].base.NUMA[0].FreeCPUs, "the index's static detail changed")

	// After the first hour only the new reservation is booked.
	later := ix.Snapshot(now.Add(90*time.Minute), now.Add(100*time.Minute), "", 0, 0, nil)
	require.Equal(t, 2, later.Nodes["n00001"].HostBooked.VCPU)
	require.Nil(t, later.Nodes["n00000"].TenantAtoms)
	require.Equal(t, 56, len(later.Nodes["n00000"].NUMA[0].FreeCPUs))

	// Released: its CPUs and GPU are free again at once.
	ix.Released("n00001", "rx", now, now)
	after := ix.Snapshot(now.Add(90*time.Minute), now.Add(100*time.Minute), "", 0, 0, nil)
	require.Zero(t, after.Nodes["n00001"].HostBooked.VCPU)
	require.False(t, after.Nodes["n00001"].GPUs[5].Booked)
}

// TestSharedSnapshotFollowsOnlyItsOwnMark: after a member books a node,
// the shared snapshot is the old one with that node read again (its GPU
// booked, the other candidates as they were, the old snapshot unchanged);
// any other change to the index (a release elsewhere, a second mark) makes
// it unusable, so the next member takes a fresh snapshot.
func TestSharedSnapshotFollowsOnlyItsOwnMark(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	ix := benchIndex(3, now)
	start, end := now.Add(2*time.Hour), now.Add(3*time.Hour)
	snap := ix.Snapshot(start, end, "", 1, CandidateLimit, nil)
	require.Len(t, snap.picked, 3)

	r := &capmodel.Reservation{ID: "r1", TenantID: "globex", StartsAt: start, EndsAt: end, GPUs: 1}
	ix.mark(r, &placement.Plan{NodeID: "n00001", Atoms: []string{"n00001-gpu5"}, CPUs: []int{60}}, now)
	var shared sharedSnap
	shared.keep(ix, snap, "n00001", "", 1)
	next := shared.take(r, "", 1)
	require.NotNil(t, next, "only the member's own mark happened since")
	require.True(t, next.Nodes["n00001"].GPUs[5].Booked)
	require.NotContains(t, next.Nodes["n00001"].NUMA[1].FreeCPUs, 60)
	require.False(t, snap.Nodes["n00001"].GPUs[5].Booked, "the old snapshot is not written")
	require.Equal(t, snap.Nodes["n00000"].GPUs, next.Nodes["n00000"].GPUs)
	require.Nil(t, shared.take(&capmodel.Reservation{StartsAt: start, EndsAt: end.Add(time.Minute)}, "", 1), "another span")
	require.Nil(t, shared.take(r, "slot", 1), "another shape")
	require.Nil(t, shared.take(r, "", 2), "another size")

	// Booked against the shared one, then kept again: still one step.
	r2 := &capmodel.Reservation{ID: "r2", TenantID: "globex", StartsAt: start, EndsAt: end, GPUs: 1}
	ix.mark(r2, &placement.Plan{NodeID: "n00001", Atoms: []string{"n00001-gpu6"}}, now)
	shared.keep(ix, next, "n00001", "", 1)
	require.NotNil(t, shared.take(r2, "", 1))

	// Something else changed the index (another reservation released):
	// the shared snapshot is dropped.
	r3 := &capmodel.Reservation{ID: "r3", TenantID: "globex", StartsAt: start, EndsAt: end, GPUs: 1}
	cur := shared.take(r2, "", 1)
	ix.Released("n00000", "rsv-any", now, now)
	ix.mark(r3, &placement.Plan{NodeID: "n00002", Atoms: []string{"n00002-gpu7"}}, now)
	shared.keep(ix, cur, "n00002", "", 1)
	require.Nil(t, shared.take(r3, "", 1))
}

// TestShelvesByShape: candidates come from the shelf of the request's
// shape. Thirty whole-GPU nodes with five GPUs free each do not crowd a
// MIG node out of a MIG request's candidates (by units alone it would come
// after all of them and past CandidateLimit), a slot request finds only
// shared GPUs, and a node moves along its shelves as its units are booked.
func TestShelvesByShape(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	ix := benchIndex(30, now)
	rng := rand.New(rand.NewPCG(1, 2))
	add := func(base placement.Node) *ixNode {
		n := newIxNode(base)
		ix.nodes = append(ix.nodes, n)
		ix.byID[base.ID] = n
		n.free = n.freeAt(now)
		ix.place(n)
		return n
	}
	mig := placement.Node{ID: "mig", Name: "mig", Pool: "p", Schedulable: true, Healthy: true}
	g := placement.GPU{UUID: "mig-gpu0", Model: "H100 80GB", Mode: placement.ModeMIG}
	for k := range 7 {
		g.MIG = append(g.MIG, placement.MIGInstance{Profile: "1g.10gb", N: k})
	}
	mig.GPUs = []placement.GPU{g}
	m := add(mig)
	shared := placement.Node{ID: "shared", Name: "shared", Pool: "p", Schedulable: true, Healthy: true,
		GPUs: []placement.GPU{{UUID: "shared-gpu0", Model: "H100 80GB", Mode: placement.ModeShared,
			Slots: []placement.Slot{{K: 0}, {K: 1}}}}}
	add(shared)
	require.Equal(t, map[string]int{"": 0, "mig/1g.10gb": 7}, m.free)

	ids := func(s *Snapshot) []string {
		var out []string
		for _, n := range s.picked {
			out = append(out, n.base.ID)
		}
		slices.Sort(out)
		return out
	}
	start, end := now.Add(2*time.Hour), now.Add(3*time.Hour)
	require.Equal(t, []string{"mig"}, ids(ix.Snapshot(start, end, ShapeOf("1g.10gb", 0), 1, CandidateLimit, rng)))
	require.Equal(t, []string{"shared"}, ids(ix.Snapshot(start, end, ShapeOf("", 1), 1, CandidateLimit, rng)))
	require.Len(t, ix.Snapshot(start, end, ShapeOf("", 0), 1, CandidateLimit, rng).picked, CandidateLimit)
	require.Empty(t, ix.Snapshot(start, end, ShapeOf("2g.20gb", 0), 1, CandidateLimit, rng).picked, "no node has that profile")
	// No GPU at all: every node is a candidate, MIG and shared ones too.
	all := ix.Snapshot(start, end, ShapeOf("", 0), 0, 100, rng)
	require.Len(t, all.picked, 32)

	// Six of the seven instances booked now: the MIG node needs 1 and
	// still has it, but not 2.
	r := &capmodel.Reservation{ID: "rm", TenantID: "acme", StartsAt: now, EndsAt: end, GPUs: 6, MIGProfile: "1g.10gb"}
	ix.mark(r, &placement.Plan{NodeID: "mig", Atoms: m.parts[0][:6]}, now)
	require.Equal(t, 1, m.free["mig/1g.10gb"])
	require.Equal(t, []string{"mig"}, ids(ix.Snapshot(start, end, "mig/1g.10gb", 1, CandidateLimit, rng)))
	require.Empty(t, ix.Snapshot(start, end, "mig/1g.10gb", 2, CandidateLimit, rng).picked)
	ix.Released("mig", "rm", now, now)
	require.Equal(t, 7, m.free["mig/1g.10gb"])
}
