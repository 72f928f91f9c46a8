package app_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/agent/ramdisk"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/metal"
	"github.com/better-compute/better-compute/internal/metal/bmc"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/store"
)

// ramdiskSite is a site agent for these tests: it "power-cycles" a machine
// by handing the discovery token of the boot to a channel (where a test
// boots a real bcd in ramdisk mode with it), and carries out the power,
// burn-in and configure steps itself. The ramdisk's own steps never come
// here: the lifecycle sends them to the joined ramdisk node.
type ramdiskSite struct {
	rt     *metal.Runtime
	boots  chan string
	mu     sync.Mutex
	keys   map[string]provision.Outcome
	ramKey []string // ramdisk step kinds that wrongly came here
}

func (s *ramdiskSite) Dispatch(ctx context.Context, t metal.Target, run provision.StepRun) (provision.Dispatched, error) {
	s.mu.Lock()
	if _, ok := s.keys[run.IdempotencyKey]; ok {
		s.mu.Unlock()
		return provision.Dispatched{Handle: run.IdempotencyKey}, nil
	}
	if run.Kind == metal.KindInventory || run.Kind == metal.KindDiskWipe {
		s.ramKey = append(s.ramKey, run.Kind)
	}
	res := provision.Result{Output: map[string]any{"ok": true}}
	s.keys[run.IdempotencyKey] = provision.Outcome{Status: provision.OutcomeSucceeded, Handle: run.IdempotencyKey, Result: res}
	s.mu.Unlock()
	if boot, _ := run.Params["boot"].(string); run.Kind == metal.KindPowerCycle && boot == metal.BootRamdisk {
		s.boots <- t.DiscoveryToken
	}
	go func() { _ = s.rt.Complete(context.Background(), run.IdempotencyKey, res) }()
	return provision.Dispatched{Handle: run.IdempotencyKey}, nil
}

func (s *ramdiskSite) Lookup(_ context.Context, _ metal.Target, run provision.StepRun) (provision.Outcome, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if o, ok := s.keys[run.IdempotencyKey]; ok {
		return o, nil
	}
	s.keys[run.IdempotencyKey] = provision.Outcome{Status: provision.OutcomeNotDispatched}
	return provision.Outcome{Status: provision.OutcomeNotDispatched}, nil
}

// PowerStatus: a machine of these tests is on once it has been cycled.
func (s *ramdiskSite) PowerStatus(context.Context, metal.Target) (bmc.PowerState, error) {
	return bmc.PowerOn, nil
}

type ramdiskFixture struct {
	cp    *bctest.ControlPlane
	admin *client.Client
	site  *ramdiskSite
	mac   string
}

func newRamdiskFixture(t *testing.T) *ramdiskFixture {
	t.Helper()
	cp := bctest.NewControlPlane(t)
	f := &ramdiskFixture{cp: cp, admin: cp.Admin(), mac: "52:54:00:aa:bb:01"}
	ctx := context.Background()
	_, err := f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	site, err := f.admin.Sites.Create(ctx, connect.NewRequest(&apiv1.CreateSiteRequest{Tenant: "acme", Name: "dc1",
		Networks: []string{"127.0.0.0/8"}}))
	require.NoError(t, err)
	f.site = &ramdiskSite{rt: cp.App.Metal, boots: make(chan string, 4), keys: map[string]provision.Outcome{}}
	t.Cleanup(cp.App.Metal.Agents.Register(site.Msg.GetSite().GetId(), f.site))
	_, err = f.admin.Machines.Enroll(ctx, connect.NewRequest(&apiv1.EnrollMachineRequest{Tenant: "acme", Site: "dc1", Name: "m1",
		BmcDriver: "redfish", BmcAddress: "http://127.0.0.1:1", BmcUsername: "admin", BmcPassword: "pw", Mac: f.mac}))
	require.NoError(t, err)
	return f
}

// machineTree writes the sysfs a ramdisk sees: one NIC with mac, one
// 4 MiB disk vda, 2 CPUs; the disk is a file full of 0xa5 under dev/.
func machineTree(t *testing.T, mac string) (root, dev, disk string) {
	t.Helper()
	root, dev = t.TempDir(), t.TempDir()
	write := func(rel, text string) {
		p := filepath.Join(root, rel)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(text+"\n"), 0o644))
	}
	write("sys/class/net/eth0/address", mac)
	write("sys/block/vda/size", "8192")
	write("sys/block/vda/removable", "0")
	write("proc/meminfo", "MemTotal: 1048576 kB")
	for _, c := range []string{"cpu0", "cpu1"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, "sys/devices/system/cpu", c), 0o755))
	}
	disk = filepath.Join(dev, "vda")
	require.NoError(t, os.WriteFile(disk, bytes.Repeat([]byte{0xa5}, 4<<20), 0o600))
	return root, dev, disk
}

// bootRamdisk starts bcd in ramdisk mode for a machine tree; it is not
// joined yet.
func bootRamdisk(t *testing.T, cp *bctest.ControlPlane, root, dev string, mode agentv1.AgentMode) *agent.Agent {
	t.Helper()
	state := t.TempDir()
	a, err := agent.New(agent.Config{
		Server: cp.GatewayAddr, StateDir: state, SysfsRoot: root, CgroupRoot: filepath.Join(state, "cgroup"), PlainCgroupDir: true,
		Mode: mode, Version: "ramdisk-test", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second,
		Ramdisk: ramdisk.New(ramdisk.Config{SysfsRoot: root, DevRoot: dev, AllowFileDisks: true, Samples: 16}),
	})
	require.NoError(t, err)
	return a
}

func (f *ramdiskFixture) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, query, args...).Scan(&n)
	}))
	return n
}

func (f *ramdiskFixture) machine(t *testing.T) *apiv1.Machine {
	t.Helper()
	res, err := f.admin.Machines.Get(context.Background(), connect.NewRequest(&apiv1.GetMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	return res.Msg.GetMachine()
}

// TestRamdiskCommission: the machine boots the ramdisk with a discovery
// token, a real bcd --mode ramdisk joins the real gateway over mTLS with
// it, runs the inventory and the wipe as fleet commands, wipes a real
// file-backed disk to zeros and signs the record; the control plane
// verifies it and the machine is ready with an attested erase record.
func TestRamdiskCommission(t *testing.T) {
	t.Parallel()
	f := newRamdiskFixture(t)
	ctx := context.Background()
	root, dev, disk := machineTree(t, f.mac)

	_, err := f.admin.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	token := <-f.site.boots
	require.Regexp(t, `^bcdt_[0-9a-f]{64}\.[A-Za-z0-9_-]{43}$`, token, "a short token for the kernel command line")

	rd := bootRamdisk(t, f.cp, root, dev, agentv1.AgentMode_AGENT_MODE_RAMDISK)
	require.NoError(t, rd.Join(ctx, token))
	leaf := rd.Certificate()
	require.Contains(t, leaf.Subject.OrganizationalUnit, "bc-role:ramdisk")
	require.LessOrEqual(t, time.Until(leaf.NotAfter), 2*time.Hour+time.Minute, "a ramdisk certificate lives at most 2 h")
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rd.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })

	var m *apiv1.Machine
	bctest.WaitFor(t, "the commissioning to end", func() bool {
		m = f.machine(t)
		return m.GetWorkflowId() == ""
	})
	require.Equal(t, "ready", m.GetState(), "failure: %s %s %s", m.GetFailedStep(), m.GetFailureReason(), m.GetFailureLogs())
	f.site.mu.Lock()
	require.Empty(t, f.site.ramKey, "ramdisk steps went to the ramdisk node, not the site agent")
	f.site.mu.Unlock()

	got, err := os.ReadFile(disk)
	require.NoError(t, err)
	require.Equal(t, make([]byte, 4<<20), got, "the disk reads zeros")
	rec := m.GetEraseRecord().GetFields()
	require.True(t, rec["attested"].GetBoolValue())
	require.Equal(t, rd.NodeID(), rec["node_id"].GetStringValue())
	drive := rec["drives"].GetListValue().GetValues()[0].GetStructValue().GetFields()
	require.Equal(t, disk, drive["device"].GetStringValue())
	require.Equal(t, "overwrite", drive["method"].GetStringValue())
	require.EqualValues(t, 4<<20, drive["bytes"].GetNumberValue())
	require.True(t, drive["verification"].GetStructValue().GetFields()["zero"].GetBoolValue())
	require.EqualValues(t, 2, m.GetInventory().GetFields()["cpus"].GetNumberValue())

	// The signature rides with the command's result; the node is a ramdisk
	// node linked to the machine, retired with the boot; the boot's token
	// is gone.
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM commands WHERE node_id = $1 AND kind = 'disk.wipe' AND state = 'succeeded'
		AND result LIKE '%signature%'`, rd.NodeID()))
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM nodes WHERE id = $1 AND mode = 'ramdisk' AND labels LIKE $2
		AND state = 'retired'`, rd.NodeID(), "%"+m.GetId()+"%"), "a ramdisk node lives for one boot")
	require.Zero(t, f.count(t, `SELECT COUNT(*) FROM machine_discovery_tokens`))
}

// TestRamdiskRefusals: a discovery token from another MAC, replayed by
// another key, or presented by a node; a node command for a ramdisk; each
// refused with a clear error and audited, nothing half-written.
func TestRamdiskRefusals(t *testing.T) {
	t.Parallel()
	f := newRamdiskFixture(t)
	ctx := context.Background()
	_, err := f.admin.Machines.Inspect(ctx, connect.NewRequest(&apiv1.InspectMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	token := <-f.site.boots
	refusals := func() int {
		return f.count(t, `SELECT COUNT(*) FROM audit_log WHERE action = 'nodes.join' AND decision = 'deny'`)
	}

	// Another MAC: refused, audited, no node.
	root, dev, _ := machineTree(t, "52:54:00:ff:ff:ff")
	err = bootRamdisk(t, f.cp, root, dev, agentv1.AgentMode_AGENT_MODE_RAMDISK).Join(ctx, token)
	require.ErrorContains(t, err, "PermissionDenied")
	require.ErrorContains(t, err, "bound to machine m1's MAC")
	require.Equal(t, 1, refusals())
	require.Zero(t, f.count(t, `SELECT COUNT(*) FROM nodes`))

	// A node (not a ramdisk) with the token: refused.
	root, dev, _ = machineTree(t, f.mac)
	err = bootRamdisk(t, f.cp, root, dev, agentv1.AgentMode_AGENT_MODE_NODE).Join(ctx, token)
	require.ErrorContains(t, err, "admits only a commissioning ramdisk")
	require.Equal(t, 2, refusals())

	// The machine's ramdisk joins; a retry of the same join is the same node.
	rd := bootRamdisk(t, f.cp, root, dev, agentv1.AgentMode_AGENT_MODE_RAMDISK)
	require.NoError(t, rd.Join(ctx, token))
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM nodes WHERE mode = 'ramdisk'`))

	// Replayed by another key: refused, audited, still one node.
	root2, dev2, _ := machineTree(t, f.mac)
	err = bootRamdisk(t, f.cp, root2, dev2, agentv1.AgentMode_AGENT_MODE_RAMDISK).Join(ctx, token)
	require.ErrorContains(t, err, "already used")
	require.Equal(t, 3, refusals())
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM nodes`))

	// A node-only command for the ramdisk: the API refuses it...
	_, err = f.admin.Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{Tenant: "acme", Node: rd.NodeID(), Kind: "node.drain"}))
	require.Equal(t, "FAILED_PRECONDITION", client.Code(err))
	require.ErrorContains(t, err, "not a ramdisk command")
	// ...and one that reached its queue anyway is failed at delivery, audited.
	var cmdID string
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		now := f.cp.Clock.Now()
		c, _, err := fleet.CommandInsert(ctx, tx, &fleet.CommandInsertParams{ID: envelope.NewID(fleet.CommandIDPrefix, now),
			TenantID: "platform", NodeID: rd.NodeID(), Kind: "allocation.bind", Params: `{"allocation_id":"alc_x"}`,
			CreatedBy: "test", Deadline: now.Add(time.Hour), CreateTime: now})
		cmdID = c.ID
		f.cp.App.Gateway.NotifyCommand(tx, rd.NodeID())
		return err
	}))
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rd.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	bctest.WaitFor(t, "the node command to fail at delivery", func() bool {
		return f.count(t, `SELECT COUNT(*) FROM commands WHERE id = $1 AND state = 'failed' AND failure_code = 'WRONG_ROLE'`, cmdID) == 1
	})
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM audit_log WHERE action = 'commands.deliver' AND resource_id = $1 AND decision = 'deny'`, cmdID))
}
