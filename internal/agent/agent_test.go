package agent_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/better-compute/better-compute/bctest"
	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/agent/hw/fake"
)

type bundle struct {
	gw       *fakeGateway
	stateDir string
	cgRoot   string
}

func setup(t *testing.T) *bundle {
	t.Helper()
	return &bundle{gw: newGateway(t), stateDir: filepath.Join(t.TempDir(), "state"), cgRoot: filepath.Join(t.TempDir(), "bettercompute")}
}

func (b *bundle) newAgent(t *testing.T, opts ...func(*agent.Config)) *agent.Agent {
	t.Helper()
	hw, err := fake.New(fake.Options{Model: "dgxh100", Seed: t.Name()})
	require.NoError(t, err)
	cfg := agent.Config{
		Server: b.gw.addr, StateDir: b.stateDir, Hardware: hw,
		SysfsRoot: "sysfs/testdata/dgx2s", CgroupRoot: b.cgRoot, PlainCgroupDir: true,
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 200 * time.Millisecond,
		Version: "test",
	}
	for _, o := range opts {
		o(&cfg)
	}
	a, err := agent.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	return a
}

// run starts a.Run and returns a stop function that waits for it.
func run(t *testing.T, a *agent.Agent) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { require.NoError(t, a.Run(ctx)) })
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

func params(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	require.NoError(t, err)
	return s
}

func TestJoinSessionCommands(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.newAgent(t)
	require.ErrorIs(t, a.Run(context.Background()), agent.ErrNotJoined)
	ctx := context.Background()
	require.NoError(t, a.Join(ctx, b.gw.token))
	require.Equal(t, b.gw.nodeID, a.NodeID())
	require.ErrorIs(t, a.Join(ctx, b.gw.token), agent.ErrAlreadyJoined)

	// Key, certificate and trust bundle are private to the node.
	st, err := os.Stat(b.stateDir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), st.Mode().Perm())
	for _, f := range []string{"node.key", "node.crt", "trust.pem", "node.json"} {
		st, err := os.Stat(filepath.Join(b.stateDir, f))
		require.NoError(t, err, f)
		require.Equal(t, os.FileMode(0o600), st.Mode().Perm(), f)
	}

	stop := run(t, a)
	hello := b.gw.hello(t)
	require.Equal(t, "test", hello.GetAgentVersion())
	require.Equal(t, agentv1.AgentMode_AGENT_MODE_NODE, hello.GetMode())
	require.Contains(t, hello.GetCapabilities(), "inventory.sections")
	require.Contains(t, hello.GetCapabilities(), "devices.limits")
	require.Zero(t, hello.GetLastAppliedSeq())
	require.NotEmpty(t, hello.GetInventoryDigest())

	// A first session sends the whole inventory, verifiable section by section.
	sums := map[string]string{}
	var gpus agentv1.GpuInventory
	var cpus agentv1.CpuInventory
	for len(sums) < 4 {
		m := b.gw.await(t, "inventory", func(m *agentv1.AgentMessage) bool { return m.GetInventory() != nil })
		sec := m.GetInventory()
		h := sha256.Sum256(sec.GetData())
		require.Equal(t, hex.EncodeToString(h[:]), sec.GetSha256())
		require.Equal(t, hello.GetInventoryDigest(), sec.GetSnapshotDigest())
		require.EqualValues(t, 4, sec.GetSectionCount())
		sums[sec.GetName()] = sec.GetSha256()
		switch sec.GetName() {
		case agent.SectionGPUs:
			require.NoError(t, proto.Unmarshal(sec.GetData(), &gpus))
		case agent.SectionCPUs:
			require.NoError(t, proto.Unmarshal(sec.GetData(), &cpus))
		}
	}
	require.Equal(t, hello.GetInventoryDigest(), agent.SnapshotDigest(sums))
	require.Len(t, gpus.GetGpus(), 8)
	require.Len(t, gpus.GetNvlinks(), 56)
	require.Len(t, cpus.GetNumaNodes(), 2)

	b.gw.await(t, "status", func(m *agentv1.AgentMessage) bool { return m.GetStatus().GetHealth() == "ok" })
	b.gw.await(t, "heartbeat", func(m *agentv1.AgentMessage) bool { return m.GetHeartbeat() != nil })

	// inventory.refresh
	b.gw.command(&agentv1.Command{Id: "c1", Seq: 1, Kind: agent.KindInventoryRefresh})
	u, ran := b.gw.finalUpdate(t, 1)
	require.True(t, ran)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState())
	require.Equal(t, hello.GetInventoryDigest(), u.GetResult().GetFields()["inventory_digest"].GetStringValue())

	// allocation.bind writes the cgroup and reports it.
	b.gw.command(&agentv1.Command{Id: "c2", Seq: 2, Kind: agent.KindAllocationBind, Params: params(t, map[string]any{
		"allocationId": "alloc-1", "gpuUuids": []any{gpus.GetGpus()[0].GetUuid()}, "cpuQuotaUs": "400000", "cpuPeriodUs": 100000,
		"memoryMaxBytes": "8589934592", "cpusetCpus": "0-3", "cpusetMems": "0",
	})})
	u, _ = b.gw.finalUpdate(t, 2)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	bound := b.gw.await(t, "bound", func(m *agentv1.AgentMessage) bool { return m.GetAllocationBound() != nil }).GetAllocationBound()
	cg := filepath.Join(b.cgRoot, "alloc-1")
	require.Equal(t, cg, bound.GetCgroup())
	require.Equal(t, "c2", bound.GetCommandId())
	for f, want := range map[string]string{"cpu.max": "400000 100000", "memory.max": "8589934592", "cpuset.cpus": "0-3", "cpuset.mems": "0"} {
		got, err := os.ReadFile(filepath.Join(cg, f))
		require.NoError(t, err)
		require.Equal(t, want, string(got), f)
	}

	// Unknown kinds fail with a stable code.
	b.gw.command(&agentv1.Command{Id: "c3", Seq: 3, Kind: "gpu.overclock"})
	u, _ = b.gw.finalUpdate(t, 3)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_FAILED, u.GetState())
	require.Equal(t, agent.FailUnknownKind, u.GetFailureCode())

	// Redelivery: the final update again, without running.
	require.NoError(t, os.WriteFile(filepath.Join(cg, "cpu.max"), []byte("sentinel"), 0o644))
	b.gw.command(&agentv1.Command{Id: "c2", Seq: 2, Kind: agent.KindAllocationBind})
	u, ran = b.gw.finalUpdate(t, 2)
	require.False(t, ran)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState())
	got, _ := os.ReadFile(filepath.Join(cg, "cpu.max"))
	require.Equal(t, "sentinel", string(got), "redelivered command must not re-apply")

	// Injected failures and node.drain.
	a.FailCommands(agent.KindNodeDrain, "DRAIN_REFUSED")
	b.gw.command(&agentv1.Command{Id: "c4", Seq: 4, Kind: agent.KindNodeDrain})
	u, _ = b.gw.finalUpdate(t, 4)
	require.Equal(t, "DRAIN_REFUSED", u.GetFailureCode())
	a.FailCommands(agent.KindNodeDrain, "")
	b.gw.command(&agentv1.Command{Id: "c5", Seq: 5, Kind: agent.KindNodeDrain})
	u, _ = b.gw.finalUpdate(t, 5)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState())

	// Cancel before delivery, and an expired deadline.
	b.gw.send(&agentv1.GatewayMessage{Msg: &agentv1.GatewayMessage_Cancel{Cancel: &agentv1.CancelCommand{CommandId: "c6", Seq: 6}}})
	b.gw.command(&agentv1.Command{Id: "c6", Seq: 6, Kind: agent.KindNodeDrain})
	u, _ = b.gw.finalUpdate(t, 6)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_CANCELED, u.GetState())
	b.gw.command(&agentv1.Command{Id: "c7", Seq: 7, Kind: agent.KindNodeDrain, Deadline: timestampAgo(time.Minute)})
	u, _ = b.gw.finalUpdate(t, 7)
	require.Equal(t, agent.FailDeadlineExceeded, u.GetFailureCode())

	// allocation.release removes the cgroup.
	b.gw.command(&agentv1.Command{Id: "c8", Seq: 8, Kind: agent.KindAllocationRelease, Params: params(t, map[string]any{"allocation_id": "alloc-1"})})
	u, _ = b.gw.finalUpdate(t, 8)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	rel := b.gw.await(t, "released", func(m *agentv1.AgentMessage) bool { return m.GetAllocationReleased() != nil }).GetAllocationReleased()
	require.Equal(t, "alloc-1", rel.GetAllocationId())
	require.NoDirExists(t, cg)

	// Health events go out at once.
	a.ReportHealthEvent(&agentv1.HealthEvent{Kind: "gpu.xid", Device: gpus.GetGpus()[3].GetUuid(), Code: 79, Message: "GPU has fallen off the bus"})
	st2 := b.gw.await(t, "degraded", func(m *agentv1.AgentMessage) bool { return m.GetStatus().GetHealth() == "degraded" }).GetStatus()
	require.EqualValues(t, 79, st2.GetEvents()[0].GetCode())

	// The server drops the stream: bcd reconnects and says where it is.
	b.gw.dropSession()
	h2 := b.gw.hello(t)
	require.EqualValues(t, 8, h2.GetLastAppliedSeq())
	require.Equal(t, hello.GetInventoryDigest(), h2.GetInventoryDigest())
	// And the client side can drop it too.
	bctest.WaitFor(t, "the agent to connect", a.Connected)
	require.True(t, a.DropSession())
	b.gw.hello(t)

	// Metrics.
	mfs, err := a.Metrics().Gather()
	require.NoError(t, err)
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, n := range []string{"bcd_session_connected", "bcd_session_reconnects_total", "bcd_commands_applied_total", "bcd_heartbeat_rtt_seconds"} {
		require.True(t, names[n], n)
	}
	stop()
}

func TestAtMostOnceAcrossRestart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.newAgent(t)
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	stop := run(t, a)
	b.gw.hello(t)
	b.gw.command(&agentv1.Command{Id: "c1", Seq: 1, Kind: agent.KindAllocationBind, Params: params(t, map[string]any{"allocation_id": "a1", "memory_max_bytes": 1 << 30})})
	u, ran := b.gw.finalUpdate(t, 1)
	require.True(t, ran)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState(), u.GetMessage())
	stop()

	// A new process on the same state dir: same identity, no rejoin, and
	// the applied command is not applied again.
	require.NoError(t, os.RemoveAll(filepath.Join(b.cgRoot, "a1")))
	a2 := b.newAgent(t)
	require.Equal(t, a.NodeID(), a2.NodeID())
	require.Equal(t, a.Certificate().SerialNumber, a2.Certificate().SerialNumber)
	require.ErrorIs(t, a2.Join(context.Background(), b.gw.token), agent.ErrAlreadyJoined)
	run(t, a2)
	h := b.gw.hello(t)
	require.EqualValues(t, 1, h.GetLastAppliedSeq())
	b.gw.command(&agentv1.Command{Id: "c1", Seq: 1, Kind: agent.KindAllocationBind, Params: params(t, map[string]any{"allocation_id": "a1"})})
	u, ran = b.gw.finalUpdate(t, 1)
	require.False(t, ran)
	require.Equal(t, agentv1.CommandState_COMMAND_STATE_SUCCEEDED, u.GetState())
	require.NoDirExists(t, filepath.Join(b.cgRoot, "a1"))
	require.Len(t, b.gw.joinCSRs, 1)
}

func TestPendingJoinRetriesSameCSR(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.gw.pending = 1
	a := b.newAgent(t)
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	require.Len(t, b.gw.joinCSRs, 2)
	require.Equal(t, b.gw.joinCSRs[0], b.gw.joinCSRs[1])
	require.NoFileExists(t, filepath.Join(b.stateDir, "join.csr"))
}

func TestJoinRefusesWrongPin(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.newAgent(t)
	other := newCA(t, "impostor")
	err := a.Join(context.Background(), "bcjt_"+pinOf(other.cert)+".jwe")
	require.Error(t, err)
	require.False(t, a.Joined())
	require.ErrorIs(t, a.Join(context.Background(), "not-a-token"), agent.ErrBadToken)
}

func TestRenewal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.gw.certLife = 3 * time.Second
	a := b.newAgent(t)
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	first := a.Certificate()
	run(t, a)
	b.gw.hello(t)
	// Renewed at 2/3 of 3 s.
	bctest.WaitFor(t, "the certificate to be renewed", func() bool {
		return a.Certificate().SerialNumber.Cmp(first.SerialNumber) != 0
	})
	key1, err := os.ReadFile(filepath.Join(b.stateDir, "node.key"))
	require.NoError(t, err)
	require.NotEmpty(t, key1)
	// The next session presents the renewed certificate.
	b.gw.dropSession()
	b.gw.hello(t)
	b.gw.mu.Lock()
	require.GreaterOrEqual(t, b.gw.renewals, 1)
	b.gw.mu.Unlock()
}

func TestOneRunPerAgent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.newAgent(t)
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	run(t, a)
	b.gw.hello(t)
	require.ErrorIs(t, a.Run(context.Background()), agent.ErrAlreadyRunning)
}
