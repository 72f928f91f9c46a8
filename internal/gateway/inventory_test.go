package gateway_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/gateway"
	"github.com/better-compute/better-compute/internal/store"
)

func gpuSections(a *agent, gpus []*agentv1.Gpu) []*agentv1.InventorySection {
	return []*agentv1.InventorySection{
		section("system", &agentv1.SystemInventory{Identity: a.identity, Kernel: "6.8.0", Os: "Debian 13", Architecture: "amd64", CgroupVersion: "2"}),
		section("gpus", &agentv1.GpuInventory{Gpus: gpus, DriverVersion: "570.1", Nvlinks: []*agentv1.NvLink{
			{GpuUuid: gpus[0].GetUuid(), PeerUuid: gpus[len(gpus)-1].GetUuid(), Link: 0},
		}}),
		section("cpus", &agentv1.CpuInventory{Model: "EPYC 9654", Sockets: 2, Cores: 192, Threads: 384, NumaNodes: []*agentv1.NumaNode{
			{Id: 0, Cpus: "0-95,192-287", MemoryMib: 786432, Hugepages_1Gi: 16},
			{Id: 1, Cpus: "96-191,288-383", MemoryMib: 786432},
		}}),
		section("memory", &agentv1.MemoryInventory{TotalMib: 1572864, Hugepages_1GiTotal: 16}),
	}
}

func conditions(t *testing.T, f fixture, nodeID string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		cs, err := fleet.NodeConditionList(ctx, tx, nodeID)
		for _, c := range cs[nodeID] {
			out[c.Type] = c.Status + "/" + c.Reason
		}
		return err
	}))
	return out
}

func TestInventory(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, tok := f.token(t, map[string]string{"gpu.count": "2"})
	a := newAgent(t, f, "inv-01")
	a.join(tok)
	st := a.session(0, "")
	require.NotNil(t, st.next().GetInventoryRequest())

	gpus := []*agentv1.Gpu{
		{Index: 0, Uuid: a.identity.GpuUuids[0], Model: "NVIDIA H100 80GB HBM3", MemoryMib: 81559, PciBusId: "0000:18:00.0", NumaNode: 0, MigMode: "enabled",
			MigInstances: []*agentv1.MigInstance{{Profile: "1g.10gb", GpuInstanceId: 9, Uuid: "MIG-" + a.identity.GpuUuids[0], MemoryMib: 9856}}},
		{Index: 1, Uuid: a.identity.GpuUuids[1], Model: "NVIDIA H100 80GB HBM3", MemoryMib: 81559, PciBusId: "0000:2a:00.0", NumaNode: 1},
	}
	digest, msgs := snapshot(gpuSections(a, gpus)...)
	for _, m := range msgs {
		st.send(m)
	}
	eventually(t, func() bool {
		var d string
		query(t, f.cp.App.DB, `SELECT inventory_digest FROM nodes WHERE id = $1`, []any{a.nodeID}, &d)
		return d == digest
	}, "snapshot committed")
	require.Equal(t, 2, count(t, f, `SELECT count(*) FROM gpus WHERE node_id = $1`, a.nodeID))
	require.Equal(t, 1, count(t, f, `SELECT count(*) FROM mig_instances WHERE gpu_uuid = $1`, gpus[0].GetUuid()))
	require.Equal(t, 1, count(t, f, `SELECT count(*) FROM nvlinks WHERE node_id = $1`, a.nodeID))
	require.Equal(t, 2, count(t, f, `SELECT count(*) FROM numa_nodes WHERE node_id = $1`, a.nodeID))
	require.Equal(t, 4, count(t, f, `SELECT count(*) FROM inventory_sections WHERE node_id = $1`, a.nodeID))
	var threads, mem int
	query(t, f.cp.App.DB, `SELECT threads, memory_mib FROM node_resources WHERE node_id = $1`, []any{a.nodeID}, &threads, &mem)
	require.Equal(t, []int{384, 1572864}, []int{threads, mem})
	require.Equal(t, map[string]string{
		gateway.ConditionGpuCountMismatch: "false/AsExpected", gateway.ConditionGpuModelUnknown: "false/KnownModels",
	}, conditions(t, f, a.nodeID))
	var diff string
	query(t, f.cp.App.DB, `SELECT diff FROM inventory_snapshots WHERE node_id = $1 AND digest = $2`, []any{a.nodeID, digest}, &diff)
	var d gateway.InventoryDiff
	require.NoError(t, json.Unmarshal([]byte(diff), &d))
	require.ElementsMatch(t, a.identity.GpuUuids, d.GPUsAdded)

	// One GPU gone, the other now an unknown model.
	gpus2 := []*agentv1.Gpu{{Index: 0, Uuid: gpus[0].GetUuid(), Model: "Tesla T4", MemoryMib: 15360, NumaNode: -1}}
	digest2, msgs := snapshot(gpuSections(a, gpus2)...)
	for _, m := range msgs {
		st.send(m)
	}
	eventually(t, func() bool {
		var d string
		query(t, f.cp.App.DB, `SELECT inventory_digest FROM nodes WHERE id = $1`, []any{a.nodeID}, &d)
		return d == digest2
	}, "second snapshot committed")
	query(t, f.cp.App.DB, `SELECT diff FROM inventory_snapshots WHERE node_id = $1 AND digest = $2`, []any{a.nodeID, digest2}, &diff)
	d = gateway.InventoryDiff{}
	require.NoError(t, json.Unmarshal([]byte(diff), &d))
	require.Equal(t, []string{gpus[1].GetUuid()}, d.GPUsRemoved)
	require.Equal(t, []gateway.ModelChange{{UUID: gpus[0].GetUuid(), From: "NVIDIA H100 80GB HBM3", To: "Tesla T4"}}, d.ModelsChanged)
	require.Equal(t, map[string]string{
		gateway.ConditionGpuCountMismatch: "true/LabelMismatch", gateway.ConditionGpuModelUnknown: "true/UnknownModel",
	}, conditions(t, f, a.nodeID))
	require.Equal(t, 0, count(t, f, `SELECT count(*) FROM mig_instances WHERE gpu_uuid = $1`, gpus[0].GetUuid()))
	require.Equal(t, 2, count(t, f, `SELECT count(*) FROM events WHERE type = 'node.inventory_changed' AND resource_id = $1`, a.nodeID))

	// A snapshot whose digest does not cover its sections is refused.
	_, msgs = snapshot(section("memory", &agentv1.MemoryInventory{TotalMib: 1}))
	msgs[0].GetInventory().SnapshotDigest = digest
	st.send(msgs[0])
	s := st.closed()
	require.Equal(t, "InvalidArgument", s.Code().String())
	require.Contains(t, s.Message(), "digest")
}

func TestHardwareKeyAndPlaceholders(t *testing.T) {
	t.Parallel()
	id := &agentv1.HardwareIdentity{DmiProductUuid: "A-B", DmiProductSerial: "S1", DmiBoardSerial: "B1", GpuUuids: []string{"GPU-2", "GPU-1"}}
	same := &agentv1.HardwareIdentity{DmiProductUuid: " a-b ", DmiProductSerial: "S1", DmiBoardSerial: "B1", GpuUuids: []string{"gpu-1", "GPU-2"}, Hostname: "other"}
	require.Equal(t, gateway.HardwareKey(id), gateway.HardwareKey(same))
	require.Len(t, gateway.HardwareKey(id), 64)
	other := &agentv1.HardwareIdentity{DmiProductUuid: "A-B", DmiProductSerial: "S1", DmiBoardSerial: "B1", GpuUuids: []string{"GPU-1"}}
	require.NotEqual(t, gateway.HardwareKey(id), gateway.HardwareKey(other))

	for _, v := range []string{"", " ", "To Be Filled By O.E.M.", "Default string", "Not Specified", "System Serial Number", "0", "None",
		"00000000-0000-0000-0000-000000000000", "03000200-0400-0500-0006-000700080009", "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF"} {
		require.True(t, gateway.IsPlaceholder(v), v)
	}
	for _, v := range []string{"4c4c4544-0042-3510-8051-b4c04f4e3432", "SN12345", "10"} {
		require.False(t, gateway.IsPlaceholder(v), v)
	}
	require.Empty(t, gateway.PlaceholderReason(id))
	require.Equal(t, "placeholder DMI product serial", gateway.PlaceholderReason(&agentv1.HardwareIdentity{
		DmiProductUuid: "A-B", DmiProductSerial: "Default string", DmiBoardSerial: "B1",
	}))
	for in, want := range map[string]string{"gpu-01.example.com": "gpu-01", "GPU_01": "gpu-01", "": "node", "--": "node", "a..b": "a"} {
		require.Equal(t, want, gateway.NodeName(in), in)
	}
}
