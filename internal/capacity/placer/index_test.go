package placer

import (
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

	during := ix.Snapshot(now, now.Add(time.Minute), 0, 0, nil)
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
	later := ix.Snapshot(now.Add(90*time.Minute), now.Add(100*time.Minute), 0, 0, nil)
	require.Equal(t, 2, later.Nodes["n00001"].HostBooked.VCPU)
	require.Nil(t, later.Nodes["n00000"].TenantAtoms)
	require.Equal(t, 56, len(later.Nodes["n00000"].NUMA[0].FreeCPUs))

	// Released: its CPUs and GPU are free again at once.
	ix.Released("n00001", "rx", now, now)
	after := ix.Snapshot(now.Add(90*time.Minute), now.Add(100*time.Minute), 0, 0, nil)
	require.Zero(t, after.Nodes["n00001"].HostBooked.VCPU)
	require.False(t, after.Nodes["n00001"].GPUs[5].Booked)
}
