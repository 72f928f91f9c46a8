package gateway_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/gateway"
	"github.com/better-compute/better-compute/internal/gpuhealth"
)

// FuzzAgentFrame decodes a session frame as the gateway does and runs the
// gateway's validation on it; nothing may panic, and a message that passes
// must be one the gateway can act on.
func FuzzAgentFrame(f *testing.F) {
	for _, m := range []*agentv1.AgentMessage{
		{Msg: &agentv1.AgentMessage_Hello{Hello: &agentv1.Hello{AgentVersion: "0.1.0", Mode: agentv1.AgentMode_AGENT_MODE_NODE, Capabilities: []string{"cgroups.v2"}, LastAppliedSeq: 3}}},
		{Msg: &agentv1.AgentMessage_Hello{Hello: &agentv1.Hello{AgentVersion: "0.1.0", Mode: agentv1.AgentMode_AGENT_MODE_SITE,
			BmcDrivers: []*agentv1.BMCDriver{{Name: "ipmi", Reports: "ipmi", Version: "devel", BuiltIn: true, Capabilities: []string{"set_password"}},
				{Name: "acme-bmc", Reports: "acme", Version: "v1.2.0", Path: "/usr/lib/better-compute/drivers/acme-bmc"}}}}},
		{Msg: &agentv1.AgentMessage_Heartbeat{Heartbeat: &agentv1.Heartbeat{}}},
		{Msg: &agentv1.AgentMessage_CommandUpdate{CommandUpdate: &agentv1.CommandUpdate{CommandId: "cmd_01", Seq: 1, State: agentv1.CommandState_COMMAND_STATE_FAILED, FailureCode: "CGROUP_WRITE_FAILED"}}},
		{Msg: &agentv1.AgentMessage_Status{Status: &agentv1.StatusReport{Health: "degraded", Pressure: &agentv1.Pressure{Cpu: 12.5}}}},
		{Msg: &agentv1.AgentMessage_Status{Status: &agentv1.StatusReport{Health: "degraded", FindingsComplete: true,
			Events:   []*agentv1.HealthEvent{{Kind: "gpu.xid", Device: "GPU-1", Code: 79, GpuIndex: proto.Int32(3), Pid: 4242, ProcessName: "python3\x1b[2J"}},
			Findings: []*agentv1.HealthEvent{{Kind: "gpu.nvlink_down", Device: "GPU-1", Code: 2, Severity: "error", GpuIndex: proto.Int32(3), Message: "NVLink 2 went down"}}}}},
		{Msg: &agentv1.AgentMessage_AllocationBound{AllocationBound: &agentv1.AllocationBound{AllocationId: "alc_1", CommandId: "cmd_1", Cgroup: "/bc/alc_1"}}},
		{Msg: &agentv1.AgentMessage_AllocationBound{AllocationBound: &agentv1.AllocationBound{AllocationId: "alc_1", CommandId: "cmd_1", Cgroup: "/bc/alc_1",
			Enforced: []*agentv1.Enforcement{{Resource: "devices", State: agentv1.EnforcementState_ENFORCEMENT_STATE_APPLIED, Detail: "only /dev/nvidia0"}}}}},
		{Msg: &agentv1.AgentMessage_AllocationReleased{AllocationReleased: &agentv1.AllocationReleased{AllocationId: "alc_1", CommandId: "cmd_2", KilledProcesses: 3}}},
		{Msg: &agentv1.AgentMessage_Inventory{Inventory: inventorySeed()}},
		{Msg: &agentv1.AgentMessage_ProcessOutput{ProcessOutput: &agentv1.ProcessOutput{CommandId: "cmd_1", Seq: 2, Stream: "stdout", Data: []byte("0,1\n")}}},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, data []byte) {
		var m agentv1.AgentMessage
		if proto.Unmarshal(data, &m) != nil {
			return
		}
		if gateway.ValidateAgentMessage(&m) != nil {
			return
		}
		switch msg := m.GetMsg().(type) {
		case nil:
			t.Fatal("an empty message passed validation")
		case *agentv1.AgentMessage_CommandUpdate:
			if msg.CommandUpdate.GetSeq() == 0 || msg.CommandUpdate.GetProgress() > 100 {
				t.Fatalf("bad command update passed: %v", msg.CommandUpdate)
			}
		case *agentv1.AgentMessage_ProcessOutput:
			o := msg.ProcessOutput
			if o.GetSeq() == 0 || len(o.GetData()) > gateway.MaxProcessOutputBytes || (o.GetStream() != "stdout" && o.GetStream() != "stderr") {
				t.Fatalf("bad process output passed: %v", o)
			}
		case *agentv1.AgentMessage_Status:
			st := msg.Status
			if len(st.GetFindings()) > 64 || len(st.GetEvents()) > 64 {
				t.Fatalf("too many findings or events passed: %d, %d", len(st.GetFindings()), len(st.GetEvents()))
			}
			for _, e := range append(st.GetEvents(), st.GetFindings()...) {
				if e.GetPid() < 0 || e.GetGpuIndex() < 0 || e.GetGpuIndex() > 1023 || len(e.GetProcessName()) > 64 ||
					gpuhealth.SeverityRank(e.GetSeverity()) == 0 && e.GetSeverity() != "" {
					t.Fatalf("bad health event passed: %v", e)
				}
				if envelope.TextProblem(e.GetProcessName(), false) != "" || envelope.TextProblem(e.GetMessage(), false) != "" {
					t.Fatalf("health event text not defused: %q %q", e.GetProcessName(), e.GetMessage())
				}
			}
		case *agentv1.AgentMessage_Inventory:
			if s, err := gateway.DecodeSection(msg.Inventory); err == nil && len(s.Data) > gateway.MaxSectionBytes {
				t.Fatal("an oversize section decoded")
			}
		}
	})
}

// TestEnforcedValidation: an AllocationBound's enforcement report names
// each known resource once, with a known state and a bounded detail.
func TestEnforcedValidation(t *testing.T) {
	t.Parallel()
	applied := agentv1.EnforcementState_ENFORCEMENT_STATE_APPLIED
	tests := []struct {
		name     string
		enforced []*agentv1.Enforcement
		want     string
	}{
		{"ok", []*agentv1.Enforcement{{Resource: "devices", State: applied}, {Resource: "cpu", State: agentv1.EnforcementState_ENFORCEMENT_STATE_NOT_APPLIED, Detail: "no cpu controller"}}, ""},
		{"unknown resource", []*agentv1.Enforcement{{Resource: "gpu-clock", State: applied}}, "allocation_bound.enforced.resource: must be one of devices, cpu, memory, cpuset"},
		{"twice", []*agentv1.Enforcement{{Resource: "cpu", State: applied}, {Resource: "cpu", State: applied}}, "cpu reported twice"},
		{"no state", []*agentv1.Enforcement{{Resource: "memory"}}, "allocation_bound.enforced.state: required for memory"},
		{"unknown state", []*agentv1.Enforcement{{Resource: "memory", State: 42}}, "allocation_bound.enforced.state: unknown state 42"},
		{"long detail", []*agentv1.Enforcement{{Resource: "cpuset", State: applied, Detail: strings.Repeat("x", 5000)}}, "allocation_bound.enforced.detail: longer than"},
	}
	for _, tt := range tests {
		err := gateway.ValidateAgentMessage(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_AllocationBound{AllocationBound: &agentv1.AllocationBound{
			AllocationId: "rsv_1", CommandId: "cmd_1", Enforced: tt.enforced}}})
		if tt.want == "" {
			require.NoError(t, err, tt.name)
			continue
		}
		require.Equal(t, codes.InvalidArgument, status.Code(err), tt.name)
		require.ErrorContains(t, err, tt.want, tt.name)
	}
	require.Equal(t, "not_applied", gateway.EnforcementState(agentv1.EnforcementState_ENFORCEMENT_STATE_NOT_APPLIED))
	require.Equal(t, "unspecified", gateway.EnforcementState(99))
}

func TestValidateProcessOutput(t *testing.T) {
	t.Parallel()
	ok := func() *agentv1.ProcessOutput {
		return &agentv1.ProcessOutput{CommandId: "cmd_1", Seq: 2, Stream: "stderr", Data: make([]byte, gateway.MaxProcessOutputBytes)}
	}
	msg := func(o *agentv1.ProcessOutput) *agentv1.AgentMessage {
		return &agentv1.AgentMessage{Msg: &agentv1.AgentMessage_ProcessOutput{ProcessOutput: o}}
	}
	if err := gateway.ValidateAgentMessage(msg(ok())); err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(o *agentv1.ProcessOutput){
		"no command": func(o *agentv1.ProcessOutput) { o.CommandId = "" },
		"no seq":     func(o *agentv1.ProcessOutput) { o.Seq = 0 },
		"stream":     func(o *agentv1.ProcessOutput) { o.Stream = "stdin" },
		"too big":    func(o *agentv1.ProcessOutput) { o.Data = append(o.Data, 'x') },
	} {
		o := ok()
		mutate(o)
		if err := gateway.ValidateAgentMessage(msg(o)); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: got %v, want INVALID_ARGUMENT", name, err)
		}
	}
}

func inventorySeed() *agentv1.InventorySection {
	data, _ := proto.Marshal(&agentv1.GpuInventory{Gpus: []*agentv1.Gpu{{Uuid: "GPU-1", Model: "NVIDIA H100 80GB HBM3", MemoryMib: 81559, NumaNode: -1}}})
	sum := sha256.Sum256(data)
	sha := hex.EncodeToString(sum[:])
	return &agentv1.InventorySection{Name: "gpus", Data: data, Sha256: sha, SnapshotDigest: gateway.SnapshotDigest(map[string]string{"gpus": sha}), SectionCount: 1}
}

// FuzzInventorySection runs the gateway's section verifier and decoder on
// arbitrary sections; a section it accepts hashes to its sha256, fits the
// limit and decoded as its name's message.
func FuzzInventorySection(f *testing.F) {
	s := inventorySeed()
	f.Add(s.GetName(), s.GetData(), s.GetSha256(), s.GetSnapshotDigest(), s.GetSectionCount())
	mem, _ := proto.Marshal(&agentv1.MemoryInventory{TotalMib: 1024})
	sum := sha256.Sum256(mem)
	f.Add("memory", mem, hex.EncodeToString(sum[:]), s.GetSnapshotDigest(), int32(4))
	f.Add("system", []byte{0xff}, s.GetSha256(), s.GetSnapshotDigest(), int32(2))
	f.Add("bios", []byte{}, "", "", int32(0))
	labels, _ := proto.Marshal(&agentv1.NodeLabels{Labels: map[string]string{"bcd.dev/pool": "h100", "nvidia.com/gpu.present": ""}})
	lsum := sha256.Sum256(labels)
	f.Add("labels", labels, hex.EncodeToString(lsum[:]), s.GetSnapshotDigest(), int32(5))
	f.Fuzz(func(t *testing.T, name string, data []byte, sha, digest string, count int32) {
		sec, err := gateway.DecodeSection(&agentv1.InventorySection{Name: name, Data: data, Sha256: sha, SnapshotDigest: digest, SectionCount: count})
		if err != nil {
			return
		}
		sum := sha256.Sum256(data)
		if hex.EncodeToString(sum[:]) != sec.SHA256 || len(data) > gateway.MaxSectionBytes || sec.Message == nil {
			t.Fatalf("accepted a bad section: %q %x", name, data)
		}
	})
}

// TestValidateCommandUpdateTraceparent: an agent's traceparent is bounded;
// a W3C one passes.
func TestValidateCommandUpdateTraceparent(t *testing.T) {
	t.Parallel()
	msg := func(tp string) *agentv1.AgentMessage {
		return &agentv1.AgentMessage{Msg: &agentv1.AgentMessage_CommandUpdate{CommandUpdate: &agentv1.CommandUpdate{
			CommandId: "cmd_1", Seq: 1, State: agentv1.CommandState_COMMAND_STATE_SUCCEEDED, Traceparent: tp}}}
	}
	require.NoError(t, gateway.ValidateAgentMessage(msg("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")))
	err := gateway.ValidateAgentMessage(msg(strings.Repeat("0", 257)))
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	require.ErrorContains(t, err, "command_update.traceparent")
}

// TestLabelsSection: a node's reported labels must be Kubernetes labels;
// anything else is refused with the offending key.
func TestLabelsSection(t *testing.T) {
	t.Parallel()
	section := func(m *agentv1.NodeLabels) *agentv1.InventorySection {
		data, err := proto.Marshal(m)
		require.NoError(t, err)
		sum := sha256.Sum256(data)
		return &agentv1.InventorySection{Name: "labels", Data: data, Sha256: hex.EncodeToString(sum[:]),
			SnapshotDigest: strings.Repeat("a", 64), SectionCount: 5}
	}
	sec, err := gateway.DecodeSection(section(&agentv1.NodeLabels{Labels: map[string]string{
		"bcd.dev/pool": "h100", "feature.node.kubernetes.io/pci-10de.present": "true", "nvidia.com/gpu.deploy.dcgm": ""}}))
	require.NoError(t, err)
	require.Equal(t, "h100", sec.Message.(*agentv1.NodeLabels).GetLabels()["bcd.dev/pool"])
	many := map[string]string{}
	for i := range 257 {
		many[fmt.Sprintf("bcd.dev/l%d", i)] = "x"
	}
	for name, tc := range map[string]struct {
		labels map[string]string
		want   string
	}{
		"a key with a space":   {map[string]string{"bcd.dev/my pool": "x"}, "is not a label key"},
		"an upper-case prefix": {map[string]string{"BCD.dev/pool": "x"}, "is not a label key"},
		"a value with a slash": {map[string]string{"bcd.dev/pool": "a/b"}, "is not a label value"},
		"a value of 64 bytes":  {map[string]string{"bcd.dev/pool": strings.Repeat("a", 64)}, "is not a label value"},
		"a terminal escape":    {map[string]string{"bcd.dev/pool": "\x1b[31m"}, "is not a label value"},
		"more than 256 labels": {many, "more than 256 labels"},
	} {
		_, err := gateway.DecodeSection(section(&agentv1.NodeLabels{Labels: tc.labels}))
		require.Equal(t, codes.InvalidArgument, status.Code(err), name)
		require.ErrorContains(t, err, tc.want, name)
	}
}

// TestValidateHealthEvents: a status report's events and findings are
// bounded (count, severity, GPU index, pid, process name); a hostile
// process name is defused, not refused, so the XID it came with is kept.
func TestValidateHealthEvents(t *testing.T) {
	t.Parallel()
	ok := func() *agentv1.HealthEvent {
		return &agentv1.HealthEvent{Kind: "gpu.xid", Device: "GPU-1", Code: 79, Severity: "critical", GpuIndex: proto.Int32(7), Pid: 4242, ProcessName: "python3"}
	}
	msg := func(events, findings []*agentv1.HealthEvent) *agentv1.AgentMessage {
		return &agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Status{Status: &agentv1.StatusReport{Health: "degraded", Events: events, Findings: findings, FindingsComplete: true}}}
	}
	require.NoError(t, gateway.ValidateAgentMessage(msg([]*agentv1.HealthEvent{ok()}, []*agentv1.HealthEvent{ok()})))
	many := make([]*agentv1.HealthEvent, 65)
	for i := range many {
		many[i] = ok()
	}
	tests := []struct {
		name   string
		mutate func(e *agentv1.HealthEvent)
		want   string
	}{
		{"severity", func(e *agentv1.HealthEvent) { e.Severity = "fatal" }, ".severity: must be"},
		{"negative gpu", func(e *agentv1.HealthEvent) { e.GpuIndex = proto.Int32(-1) }, ".gpu_index: must be 0-1023"},
		{"gpu past the bound", func(e *agentv1.HealthEvent) { e.GpuIndex = proto.Int32(1024) }, ".gpu_index: must be 0-1023"},
		{"negative pid", func(e *agentv1.HealthEvent) { e.Pid = -1 }, ".pid: must be a process id"},
		{"huge pid", func(e *agentv1.HealthEvent) { e.Pid = 1 << 40 }, ".pid: must be a process id"},
		{"long process name", func(e *agentv1.HealthEvent) { e.ProcessName = strings.Repeat("p", 65) }, ".process_name: longer than 64"},
		{"kind", func(e *agentv1.HealthEvent) { e.Kind = "gpu xid" }, ".kind: only letters"},
	}
	for _, tt := range tests {
		for _, field := range []string{"status.events", "status.findings"} {
			e := ok()
			tt.mutate(e)
			m := msg([]*agentv1.HealthEvent{e}, nil)
			if field == "status.findings" {
				m = msg(nil, []*agentv1.HealthEvent{e})
			}
			err := gateway.ValidateAgentMessage(m)
			require.Equal(t, codes.InvalidArgument, status.Code(err), "%s %s", tt.name, field)
			require.ErrorContains(t, err, field+tt.want, tt.name)
		}
	}
	err := gateway.ValidateAgentMessage(msg(nil, many))
	require.ErrorContains(t, err, "status.findings: more than 64")

	hostile := ok()
	hostile.ProcessName = "\x1b[2J\x1b[32mok\u202e"
	m := msg([]*agentv1.HealthEvent{hostile}, nil)
	require.NoError(t, gateway.ValidateAgentMessage(m))
	got := m.GetStatus().GetEvents()[0].GetProcessName()
	require.Empty(t, envelope.TextProblem(got, false), "%q", got)
	require.Contains(t, got, "ok")
}

// TestValidateHelloBMCDrivers: a site agent's drivers are bounded and take
// the shape a machine's bmc_driver can hold; a path is never a name.
func TestValidateHelloBMCDrivers(t *testing.T) {
	t.Parallel()
	ok := func() *agentv1.BMCDriver {
		return &agentv1.BMCDriver{Name: "acme-bmc", Reports: "acme", Version: "v1.2.0+dirty", Path: "/usr/lib/better-compute/drivers/acme-bmc",
			Capabilities: []string{"set_password", "boot_override"}}
	}
	msg := func(ds ...*agentv1.BMCDriver) *agentv1.AgentMessage {
		return &agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Hello{Hello: &agentv1.Hello{AgentVersion: "0.1.0",
			Mode: agentv1.AgentMode_AGENT_MODE_SITE, BmcDrivers: ds}}}
	}
	require.NoError(t, gateway.ValidateAgentMessage(msg(ok())))
	many := make([]*agentv1.BMCDriver, 65)
	for i := range many {
		many[i] = ok()
	}
	err := gateway.ValidateAgentMessage(msg(many...))
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	require.Contains(t, err.Error(), "hello.bmc_drivers: more than 64")
	tests := []struct {
		name   string
		mutate func(d *agentv1.BMCDriver)
		want   string
	}{
		{"no name", func(d *agentv1.BMCDriver) { d.Name = "" }, "hello.bmc_drivers.name: required"},
		{"a plugin path", func(d *agentv1.BMCDriver) { d.Name = "plugin:/bin/sh" }, "hello.bmc_drivers.name: a registry name, not a path"},
		{"a space", func(d *agentv1.BMCDriver) { d.Name = "acme bmc" }, "hello.bmc_drivers.name: only letters"},
		{"version text", func(d *agentv1.BMCDriver) { d.Version = "1.0 beta" }, "hello.bmc_drivers.version: only letters"},
		{"control in path", func(d *agentv1.BMCDriver) { d.Path = "/x\x1b[2J" }, "hello.bmc_drivers.path"},
		{"long path", func(d *agentv1.BMCDriver) { d.Path = "/" + strings.Repeat("d", 4096) }, "hello.bmc_drivers.path"},
		{"capability", func(d *agentv1.BMCDriver) { d.Capabilities = []string{""} }, "hello.bmc_drivers.capabilities: required"},
	}
	for _, tt := range tests {
		d := ok()
		tt.mutate(d)
		err := gateway.ValidateAgentMessage(msg(d))
		require.Equal(t, codes.InvalidArgument, status.Code(err), tt.name)
		require.Contains(t, err.Error(), tt.want, tt.name)
	}
}
