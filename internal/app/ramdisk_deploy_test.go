package app_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/agent/ramdisk"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/metal"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/store"
)

// TestRamdiskDeploy is the deploy path without QEMU: real bcd ramdisks
// (in process, a file as the disk) join the real gateway for each boot;
// the deploy's ramdisk fetches the signed image from a stand-in for the
// site's cache, verifies and writes it, and machine.configure writes the
// node join token (sealed to that ramdisk's key) into the image's config
// slot. A node agent that reads the token off the disk joins, reports its
// inventory, and the machine is deployed; the release wipes the disk and
// retires that node.
func TestRamdiskDeploy(t *testing.T) {
	t.Parallel()
	f := newRamdiskFixture(t)
	f.dumpSteps(t)
	ctx := context.Background()
	root, dev, disk := machineTree(t, f.mac)

	// The image: 1 MiB with the empty config slot at sector 100.
	img := bytes.Repeat([]byte{0x3c}, 1<<20)
	copy(img[100*512:], ramdisk.EmptySlot())
	image := pushSigned(t, f.admin, "acme", "os", img)
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/"+image.GetSha256() {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(img)
	}))
	t.Cleanup(site.Close)

	// boot runs a ramdisk for the next boot the site is asked for.
	boot := func() func() {
		token := bctest.Receive(t, "a ramdisk boot", f.site.boots)
		state := t.TempDir()
		rd, err := agent.New(agent.Config{
			Server: f.cp.GatewayAddr, StateDir: state, SysfsRoot: root, CgroupRoot: filepath.Join(state, "cgroup"), PlainCgroupDir: true,
			Mode: agentv1.AgentMode_AGENT_MODE_RAMDISK, Version: "ramdisk-test", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second,
			Ramdisk: ramdisk.New(ramdisk.Config{SysfsRoot: root, DevRoot: dev, AllowFileDisks: true, Samples: 16, SpoolDir: t.TempDir(),
				ImagesURL: site.URL, Server: f.cp.GatewayAddr}),
		})
		require.NoError(t, err)
		// The gateway answers "retry later" while the boot's step is still
		// being recorded (or SQLite is busy): bcd retries, so does this.
		bctest.WaitFor(t, "the ramdisk to join", func() bool { return rd.Join(ctx, token) == nil })
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- rd.Run(runCtx) }()
		return func() { stop(); <-done }
	}
	wait := func(what, want string) *apiv1.Machine {
		t.Helper()
		var m *apiv1.Machine
		bctest.WaitFor(t, what, func() bool {
			m = f.machine(t)
			return m.GetWorkflowId() == ""
		})
		require.Equal(t, want, m.GetState(), "failure: %s %s %s", m.GetFailedStep(), m.GetFailureReason(), m.GetFailureLogs())
		return m
	}

	_, err := f.admin.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	stop := boot()
	wait("the commissioning", "ready")
	stop()

	_, err = f.admin.Machines.Deploy(ctx, connect.NewRequest(&apiv1.DeployMachineRequest{Tenant: "acme", Machine: "m1", Image: "os"}))
	require.NoError(t, err)
	stop = boot()
	// The deploy waits for the OS: the image and the slot are on the disk.
	var slot []byte
	bctest.WaitFor(t, "the image and its configuration on the disk", func() bool {
		b, err := os.ReadFile(disk)
		if err != nil || !bytes.Equal(b[:100*512], img[:100*512]) {
			return false
		}
		slot = b[100*512 : 100*512+ramdisk.SlotSize]
		return bytes.Contains(slot, []byte("BCD_JOIN_TOKEN="))
	})
	tok := regexp.MustCompile(`BCD_JOIN_TOKEN='([^']+)'`).FindSubmatch(slot)
	require.NotNil(t, tok, "%s", slot)
	require.Contains(t, string(slot), "BCD_SERVER='"+f.cp.GatewayAddr+"'")
	m := f.machine(t)
	require.Contains(t, string(slot), "BCD_MACHINE='"+m.GetId()+"'")
	// The token rests nowhere in the clear: not in the command row that
	// carried it (sealed to the ramdisk's key), not in an event.
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM commands WHERE kind = 'machine.configure' AND CAST(params AS TEXT) LIKE '%join_token_sealed%'`))
	require.Zero(t, f.count(t, `SELECT COUNT(*) FROM commands WHERE CAST(params AS TEXT) LIKE $1 OR CAST(result AS TEXT) LIKE $1`, "%"+string(tok[1])+"%"))
	require.Zero(t, f.count(t, `SELECT COUNT(*) FROM events WHERE CAST(data AS TEXT) LIKE $1`, "%"+string(tok[1])+"%"))

	// The deployed OS: a node agent joining with the token from the disk,
	// once the deploy awaits it (this test's in-process site completes the
	// boot-disk step itself; with a real site agent an OS that reported
	// first is found when that step's result arrives).
	bctest.WaitFor(t, "the deploy to await the OS", func() bool {
		return f.count(t, `SELECT COUNT(*) FROM provision_steps WHERE name = 'os-joined' AND state = 'awaiting'`) == 1
	})
	stop() // the ramdisk reported its last command: the machine reboots
	osRoot := t.TempDir()
	for rel, v := range map[string]string{"sys/class/dmi/id/product_uuid": "0c1d2e3f-0000-4000-8000-000000000001",
		"sys/class/dmi/id/product_serial": "DEPLOYED-1", "sys/class/dmi/id/board_serial": "DEPLOYEDBOARD-1", "proc/sys/kernel/hostname": "m1",
		"proc/cpuinfo": "processor\t: 0\nmodel name\t: rig cpu\n", "proc/meminfo": "MemTotal: 1048576 kB\nMemAvailable: 524288 kB"} {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(osRoot, rel)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(osRoot, rel), []byte(v+"\n"), 0o644))
	}
	state := t.TempDir()
	node, err := agent.New(agent.Config{Server: f.cp.GatewayAddr, StateDir: state, SysfsRoot: osRoot, CgroupRoot: filepath.Join(state, "cgroup"),
		PlainCgroupDir: true, Version: "os-test", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second})
	require.NoError(t, err)
	bctest.WaitFor(t, "the deployed OS to join", func() bool { return node.Join(ctx, string(tok[1])) == nil })
	runCtx, stopNode := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- node.Run(runCtx) }()
	m = wait("the deploy", "deployed")
	stopNode()
	<-done
	require.Equal(t, "os", m.GetImageName())
	n, err := f.admin.Nodes.Get(ctx, connect.NewRequest(&apiv1.GetNodeRequest{Tenant: "acme", Node: node.NodeID()}))
	require.NoError(t, err)
	require.Equal(t, m.GetId(), n.Msg.GetNode().GetLabels()[metal.MachineLabel])
	require.Equal(t, "node", n.Msg.GetNode().GetMode())

	// The token was single-use: a second join with it is refused.
	again, err := agent.New(agent.Config{Server: f.cp.GatewayAddr, StateDir: t.TempDir(), SysfsRoot: osRoot, CgroupRoot: filepath.Join(t.TempDir(), "cgroup"),
		PlainCgroupDir: true, Version: "os-test", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	require.Error(t, again.Join(ctx, string(tok[1])))

	_, err = f.admin.Machines.Release(ctx, connect.NewRequest(&apiv1.ReleaseMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	stop = boot()
	m = wait("the release", "ready")
	stop()
	require.True(t, m.GetEraseRecord().GetFields()["attested"].GetBoolValue())
	got, err := os.ReadFile(disk)
	require.NoError(t, err)
	require.Equal(t, make([]byte, len(got)), got, "the release wiped the deployed disk")
	n, err = f.admin.Nodes.Get(ctx, connect.NewRequest(&apiv1.GetNodeRequest{Tenant: "acme", Node: node.NodeID()}))
	require.NoError(t, err)
	require.Equal(t, "retired", n.Msg.GetNode().GetState(), "the deployed OS's node goes with the wipe")
}

// TestRamdiskDeployRefusesAnImageWithoutASlot: an image that cannot be
// configured to join fails the deploy at its configure step, with the
// reason, and the machine shows it.
func TestRamdiskDeployRefusesAnImageWithoutASlot(t *testing.T) {
	t.Parallel()
	f := newRamdiskFixture(t)
	f.dumpSteps(t)
	ctx := context.Background()
	root, dev, _ := machineTree(t, f.mac)
	img := bytes.Repeat([]byte{0x3c}, 1<<20)
	image := pushSigned(t, f.admin, "acme", "plain", img)
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(img) }))
	t.Cleanup(site.Close)
	_ = image
	run := func() func() {
		token := bctest.Receive(t, "a ramdisk boot", f.site.boots)
		state := t.TempDir()
		rd, err := agent.New(agent.Config{
			Server: f.cp.GatewayAddr, StateDir: state, SysfsRoot: root, CgroupRoot: filepath.Join(state, "cgroup"), PlainCgroupDir: true,
			Mode: agentv1.AgentMode_AGENT_MODE_RAMDISK, Version: "ramdisk-test", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second,
			Ramdisk: ramdisk.New(ramdisk.Config{SysfsRoot: root, DevRoot: dev, AllowFileDisks: true, Samples: 16, SpoolDir: t.TempDir(),
				ImagesURL: site.URL, Server: f.cp.GatewayAddr}),
		})
		require.NoError(t, err)
		// The gateway answers "retry later" while the boot's step is still
		// being recorded (or SQLite is busy): bcd retries, so does this.
		bctest.WaitFor(t, "the ramdisk to join", func() bool { return rd.Join(ctx, token) == nil })
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- rd.Run(runCtx) }()
		return func() { stop(); <-done }
	}
	_, err := f.admin.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	stop := run()
	bctest.WaitFor(t, "the commissioning", func() bool { return f.machine(t).GetState() == "ready" })
	stop()
	_, err = f.admin.Machines.Deploy(ctx, connect.NewRequest(&apiv1.DeployMachineRequest{Tenant: "acme", Machine: "m1", Image: "plain"}))
	require.NoError(t, err)
	stop = run()
	defer stop()
	var m *apiv1.Machine
	bctest.WaitFor(t, "the deploy to fail", func() bool {
		// The configure step's retries wait out their backoff on the
		// simulated clock; each fails the same way. The clock moves only
		// while the step waits for its backoff: moved while an attempt
		// runs, a loaded machine's runner could be overtaken by the step's
		// own deadline ("the runner never ran it").
		if countRows(t, f.cp, `SELECT COUNT(*) FROM provision_steps WHERE name = 'configure' AND state = 'pending' AND failures > 0`) > 0 {
			f.cp.Clock.Advance(time.Minute)
		}
		m = f.machine(t)
		return m.GetWorkflowId() == ""
	})
	require.Equal(t, "failed", m.GetState())
	require.Equal(t, "configure", m.GetFailedStep())
	require.Contains(t, m.GetFailureReason()+m.GetFailureLogs(), "no config slot")
}

// dumpSteps logs every workflow step and ramdisk command when a test
// failed: where a lifecycle stopped.
func (f *ramdiskFixture) dumpSteps(t *testing.T) { dumpSteps(t, f.cp) }

func dumpSteps(t *testing.T, cp *bctest.ControlPlane) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		_ = cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
			rows, err := tx.Query(ctx, `SELECT w.profile, s.idx, s.name, s.state, s.attempt, s.error FROM provision_steps s
				JOIN provision_workflows w ON w.id = s.workflow_id ORDER BY w.create_time, s.idx`)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var prof, name, state, errText string
				var idx, attempt int
				if err := rows.Scan(&prof, &idx, &name, &state, &attempt, &errText); err == nil {
					t.Logf("step %s/%d %s: %s (attempt %d) %s", prof, idx, name, state, attempt, errText)
				}
			}
			crows, err := tx.Query(ctx, `SELECT kind, state, failure_code, message FROM commands ORDER BY create_time`)
			if err != nil {
				return err
			}
			defer crows.Close()
			for crows.Next() {
				var kind, state, code, msg string
				if err := crows.Scan(&kind, &state, &code, &msg); err == nil {
					t.Logf("command %s: %s %s %s", kind, state, code, msg)
				}
			}
			return nil
		})
	})
}

// TestRamdiskLookupOfAFencedKeyStaysNotDispatched: two sweeps may ask
// about one orphaned claim at once. The first fences its key; the second
// must hear "never dispatched" too, not "failed", or the step fails with
// the fence as its reason instead of being claimed anew (CI saw a deploy
// fail at write-image with "fenced: the step's dispatch was never
// recorded"). A late dispatch of the fenced key is refused.
func TestRamdiskLookupOfAFencedKeyStaysNotDispatched(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	acme, err := cp.Admin().Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	now := cp.Clock.Now()
	node := &fleet.NodeInsertParams{ID: envelope.NewID(fleet.NodeIDPrefix, now), Name: "rd-1", TenantID: acme.Msg.GetTenant().GetId(),
		HardwareKey: "hw-rd-1", State: fleet.NodeActive, Liveness: fleet.LivenessReady, Mode: "ramdisk", CreateTime: now}
	require.NoError(t, cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error { return fleet.NodeInsert(ctx, tx, node) }))
	run := provision.StepRun{WorkflowID: "wf_x", Kind: metal.KindImageWrite, Name: "write-image", Attempt: 1, IdempotencyKey: "wf_x:2:1"}
	for i := range 2 {
		out, err := cp.App.Metal.Ramdisk.Lookup(ctx, metal.Target{}, node.ID, run)
		require.NoError(t, err)
		require.Equal(t, provision.OutcomeNotDispatched, out.Status, "lookup %d of a key never dispatched", i+1)
	}
	_, err = cp.App.Metal.Ramdisk.Dispatch(ctx, metal.Target{}, node.ID, run)
	require.ErrorIs(t, err, provision.ErrNotDispatched, "a late dispatch of a fenced key")
}
