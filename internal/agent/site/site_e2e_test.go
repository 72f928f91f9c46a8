package site_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/bctest/redfish"
	"github.com/better-compute/better-compute/client"
	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/agent/site"
	"github.com/better-compute/better-compute/internal/metal"
	"github.com/better-compute/better-compute/internal/metal/bmc"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/site/pxe"
	"github.com/better-compute/better-compute/internal/store"
)

// countingPower is a machine behind the Redfish emulator that counts its
// power changes and, when gated, holds each one until the gate opens.
type countingPower struct {
	redfish.MemoryPower
	mu      sync.Mutex
	calls   int
	gate    chan struct{}
	entered chan struct{}
}

func (p *countingPower) enter(ctx context.Context) error {
	p.mu.Lock()
	p.calls++
	gate, entered := p.gate, p.entered
	p.mu.Unlock()
	if entered != nil {
		select {
		case entered <- struct{}{}:
		default:
		}
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (p *countingPower) On(ctx context.Context, boot string) error {
	if err := p.enter(ctx); err != nil {
		return err
	}
	return p.MemoryPower.On(ctx, boot)
}

func (p *countingPower) Restart(ctx context.Context, boot string, cold bool) error {
	if err := p.enter(ctx); err != nil {
		return err
	}
	return p.MemoryPower.Restart(ctx, boot, cold)
}

func (p *countingPower) Calls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}

type fixture struct {
	cp    *bctest.ControlPlane
	admin *client.Client
	site  *apiv1.Site
}

// siteAgent is bcd in site mode, in process: the real agent (mTLS session
// through the control plane's gateway) with the site handler and its PXE
// HTTP server.
type siteAgent struct {
	ag     *agent.Agent
	site   *site.Agent
	pxe    *pxe.Server
	dir    string
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func startSiteAgent(t *testing.T, cp *bctest.ControlPlane, dir, token string) *siteAgent {
	t.Helper()
	return startSiteAgentDrivers(t, cp, dir, token, nil)
}

// startSiteAgentDrivers is startSiteAgent with a driver registry, as bcd
// builds it from --site-drivers-dir (nil: the built-ins).
func startSiteAgentDrivers(t *testing.T, cp *bctest.ControlPlane, dir, token string, drivers *bmc.Registry) *siteAgent {
	t.Helper()
	host := filepath.Join(dir, "host")
	require.NoError(t, bctest.WriteSimHost(host))
	// A site agent's host has no GPUs: its DMI identity tells it apart.
	var b [8]byte
	_, _ = rand.Read(b[:])
	for name, v := range map[string]string{"sys/class/dmi/id/product_uuid": fmt.Sprintf("%x-0000-4000-8000-000000000000", b[:4]),
		"sys/class/dmi/id/product_serial": "SITE-" + hex.EncodeToString(b[:]), "sys/class/dmi/id/board_serial": "BRD-" + hex.EncodeToString(b[:]), "proc/sys/kernel/hostname": "site-" + hex.EncodeToString(b[:3])} {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(host, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(host, name), []byte(v+"\n"), 0o644))
	}
	sa, err := site.New(site.Config{StateDir: dir, Logger: quiet(), Drivers: drivers, BMC: bmc.Options{Timeout: 5 * time.Second},
		Ramdisk: pxe.Ramdisk{Kernel: "ramdisk/vmlinuz", Initrd: "ramdisk/initrd.img", Cmdline: "console=ttyS0"}})
	require.NoError(t, err)
	ag, err := agent.New(agent.Config{Server: cp.GatewayAddr, StateDir: dir, SysfsRoot: host, CgroupRoot: filepath.Join(dir, "cgroup"),
		PlainCgroupDir: true, Mode: agentv1.AgentMode_AGENT_MODE_SITE, Commands: sa, BMCDrivers: sa.BMCDrivers(), Version: "test", Logger: quiet(),
		HeartbeatInterval: 50 * time.Millisecond, ReconnectMin: 20 * time.Millisecond, ReconnectMax: 500 * time.Millisecond})
	require.NoError(t, err)
	// As bcd wires it: images come over the agent's own mTLS session.
	sa.SetFetch(ag.FetchSiteImage)
	ctx, cancel := context.WithCancel(context.Background())
	if token != "" {
		require.NoError(t, ag.Join(ctx, token))
	}
	srv, err := pxe.New(pxe.Config{Mode: pxe.ModeProxy, ServerIP: netip.MustParseAddr("127.0.0.1"), DHCPAddr: "127.0.0.1:0",
		ProxyAddr: "127.0.0.1:0", TFTPAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", BootDir: t.TempDir(), FilesDir: t.TempDir(),
		Decider: sa, Logger: quiet()})
	require.NoError(t, err)
	require.NoError(t, srv.Start(ctx))
	s := &siteAgent{ag: ag, site: sa, pxe: srv, dir: dir, cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- ag.Run(ctx) }()
	t.Cleanup(s.stop)
	return s
}

// stop ends bcd as a kill would end its session: the command it applies is
// interrupted and the process's state stays in its directory.
func (s *siteAgent) stop() {
	s.once.Do(func() {
		s.cancel()
		<-s.done
		_ = s.pxe.Close()
		_ = s.ag.Close()
	})
}

func (s *siteAgent) script(t *testing.T, mac string) string {
	t.Helper()
	res, err := http.Get(s.pxe.BaseURL() + "/boot/" + mac + ".ipxe")
	require.NoError(t, err)
	defer func() { _ = res.Body.Close() }()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode, string(b))
	return string(b)
}

// setup starts a control plane with tenant acme and its site dc1.
func setup(t *testing.T) *fixture {
	t.Helper()
	cp := bctest.NewControlPlane(t)
	f := &fixture{cp: cp, admin: cp.Admin()}
	ctx := context.Background()
	_, err := f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	_, err = f.admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "infra"}))
	require.NoError(t, err)
	for _, name := range []string{"dc1", "dc2"} {
		s, err := f.admin.Sites.Create(ctx, connect.NewRequest(&apiv1.CreateSiteRequest{Tenant: "acme", Name: name,
			Networks: []string{"127.0.0.0/8"}}))
		require.NoError(t, err)
		if name == "dc1" {
			f.site = s.Msg.GetSite()
		}
	}
	return f
}

// siteToken mints a site token bound to a site.
func (f *fixture) siteToken(t *testing.T, site string) string {
	t.Helper()
	res, err := f.admin.JoinTokens.Create(context.Background(), connect.NewRequest(&apiv1.CreateJoinTokenRequest{
		Tenant: "acme", Project: "infra", Role: "site", Site: site}))
	require.NoError(t, err)
	return res.Msg.GetToken()
}

// machine starts a Redfish emulator BMC and enrolls its machine at site.
func (f *fixture) machine(t *testing.T, site, name, mac string, power *countingPower) {
	t.Helper()
	srv := httptest.NewServer(redfish.New(redfish.Config{Username: "admin", Password: "pw-" + name, Power: power}))
	t.Cleanup(srv.Close)
	_, err := f.admin.Machines.Enroll(context.Background(), connect.NewRequest(&apiv1.EnrollMachineRequest{Tenant: "acme",
		Site: site, Name: name, BmcDriver: "redfish", BmcAddress: srv.URL, BmcUsername: "admin", BmcPassword: "pw-" + name,
		Mac: mac, HardwareProfile: "test"}))
	require.NoError(t, err)
}

func (f *fixture) lease(t *testing.T) metal.BootLease {
	t.Helper()
	var l metal.BootLease
	err := f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) (err error) {
		l, err = metal.BootLeaseGet(ctx, tx, f.site.GetId(), "")
		return err
	})
	if errors.Is(err, store.ErrNotFound) {
		return metal.BootLease{}
	}
	require.NoError(t, err)
	return l
}

func (f *fixture) workflow(t *testing.T, machine string) provision.Workflow {
	t.Helper()
	m, err := f.admin.Machines.Get(context.Background(), connect.NewRequest(&apiv1.GetMachineRequest{Tenant: "acme", Machine: machine}))
	require.NoError(t, err)
	id := m.Msg.GetMachine().GetWorkflowId()
	var w provision.Workflow
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) (err error) {
		if id == "" {
			return tx.QueryRow(ctx, `SELECT id FROM provision_workflows WHERE target_id = $1 ORDER BY id DESC LIMIT 1`, m.Msg.GetMachine().GetId()).Scan(&id)
		}
		return nil
	}))
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) (err error) {
		w, err = provision.Get(ctx, tx, id)
		return err
	}))
	return w
}

func step(w provision.Workflow, name string) provision.WorkflowStep {
	for _, s := range w.Steps {
		if s.Name == name && s.Phase == provision.PhaseMain {
			return s
		}
	}
	return provision.WorkflowStep{}
}

func (f *fixture) commands(t *testing.T, kind string) (states []string) {
	t.Helper()
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		rows, err := tx.Query(ctx, `SELECT state || ':' || failure_code FROM commands WHERE kind = $1 ORDER BY seq`, kind)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				return err
			}
			states = append(states, s)
		}
		return rows.Err()
	}))
	return states
}

// TestSiteAgentPowerCycle: a site token joins bcd in site mode, which takes
// the site's boot lease; an inspection's power cycle goes control plane →
// gateway → site agent → Redfish emulator and its result comes back; the
// site agent's iPXE script boots the machine's ramdisk while the workflow
// needs it and its disk afterwards; the ramdisk's own step kinds are not
// the site agent's.
func TestSiteAgentPowerCycle(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	power := &countingPower{}
	f.machine(t, "dc1", "m1", "52:54:00:00:01:01", power)
	other := &countingPower{}
	f.machine(t, "dc2", "x1", "52:54:00:00:02:01", other)

	sa := startSiteAgent(t, f.cp, t.TempDir(), f.siteToken(t, "dc1"))
	bctest.WaitFor(t, "the site agent to hold the boot lease", func() bool { return f.lease(t).HolderNodeID == sa.ag.NodeID() })
	require.EqualValues(t, 1, f.lease(t).Epoch)
	bctest.WaitFor(t, "the machine list to reach the site agent", func() bool { return len(sa.site.Machines()) == 1 })
	require.Equal(t, "m1", sa.site.Machines()[0].Name, "only dc1's machines")
	require.Contains(t, sa.script(t, "52:54:00:00:01:01"), "exit", "an idle machine boots its local disk")

	_, err := f.admin.Machines.Inspect(ctx, connect.NewRequest(&apiv1.InspectMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	bctest.WaitFor(t, "the power cycle to succeed", func() bool {
		return step(f.workflow(t, "m1"), "boot-ramdisk").State == provision.StepSucceeded
	})
	require.Equal(t, 1, power.Calls(), "one power change reached the BMC")
	require.Equal(t, map[string]any{"power": "cycle", "boot": "ramdisk"}, step(f.workflow(t, "m1"), "boot-ramdisk").Output)
	// Power status is a read through the same agent: answered, and not a
	// power change.
	st, err := f.cp.App.Metal.PowerStatus(ctx, f.workflow(t, "m1").TargetID)
	require.NoError(t, err)
	require.Equal(t, bmc.PowerOn, st)
	require.Equal(t, 1, power.Calls(), "a status read changes nothing")
	script := sa.script(t, "52:54:00:00:01:01")
	require.Contains(t, script, "ramdisk/vmlinuz", "the workflow needs the ramdisk")
	require.Contains(t, script, "bc.machine=")
	require.Contains(t, script, "bc.token="+metal.DiscoveryTokenPrefix, "the boot's discovery token, for the ramdisk to join with")
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		var params string
		if err := tx.QueryRow(ctx, `SELECT params FROM commands WHERE kind = $1 ORDER BY seq LIMIT 1`, metal.CommandBMCPower).Scan(&params); err != nil {
			return err
		}
		require.NotContains(t, params, metal.DiscoveryTokenPrefix, "the token is sealed in the command row")
		require.Contains(t, params, "discovery_sealed")
		return nil
	}))

	// The ramdisk joins; its inventory is not the site agent's to run.
	require.NoError(t, f.cp.App.Metal.Joined(ctx, f.site.GetId(), f.workflow(t, "m1").TargetID))
	bctest.WaitFor(t, "the inventory step to be refused", func() bool { return step(f.workflow(t, "m1"), "inventory").Failures > 0 })
	require.Contains(t, step(f.workflow(t, "m1"), "inventory").Error, "carries BMC steps only")
	require.Zero(t, other.Calls(), "no machine of another site was touched")
	require.Equal(t, []string{"succeeded:", "succeeded:"}, f.commands(t, metal.CommandBMCPower), "the cycle and the status read")
}

// TestSiteAgentStandbyTakeover: a second site agent of the site waits as a
// standby while the first holds the boot lease, and takes it over under a
// new epoch only once it expired; BMC steps then go to it.
func TestSiteAgentStandbyTakeover(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	power := &countingPower{}
	f.machine(t, "dc1", "m1", "52:54:00:00:03:01", power)
	a := startSiteAgent(t, f.cp, t.TempDir(), f.siteToken(t, "dc1"))
	bctest.WaitFor(t, "the first agent to hold the lease", func() bool { return f.lease(t).HolderNodeID == a.ag.NodeID() })
	b := startSiteAgent(t, f.cp, t.TempDir(), f.siteToken(t, "dc1"))
	bctest.WaitFor(t, "the standby to connect", b.ag.Connected)
	l := f.lease(t)
	require.Equal(t, a.ag.NodeID(), l.HolderNodeID, "a live lease stays with its holder")
	require.EqualValues(t, 1, l.Epoch)
	require.Zero(t, b.site.Epoch(), "the standby was sent nothing")

	a.stop()
	require.Equal(t, a.ag.NodeID(), f.lease(t).HolderNodeID, "the lease outlives its holder's session until it expires")
	f.cp.Clock.Advance(metal.DefaultBootLeaseTTL + time.Second)
	bctest.WaitFor(t, "the standby to take the lease over", func() bool { return f.lease(t).HolderNodeID == b.ag.NodeID() })
	require.EqualValues(t, 2, f.lease(t).Epoch)
	bctest.WaitFor(t, "the new holder to get the machines under epoch 2", func() bool { return b.site.Epoch() == 2 && len(b.site.Machines()) == 1 })

	_, err := f.admin.Machines.Inspect(ctx, connect.NewRequest(&apiv1.InspectMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	bctest.WaitFor(t, "the power cycle to succeed through the new holder", func() bool {
		return step(f.workflow(t, "m1"), "boot-ramdisk").State == provision.StepSucceeded
	})
	require.Equal(t, 1, power.Calls())
}

// TestSiteAgentKilledMidStep: bcd stops while a power cycle is out to the
// BMC; restarted, it does not send it again, and the provision engine —
// which cannot tell whether it happened — fails the destructive step with
// an unknown outcome instead of dispatching it again.
func TestSiteAgentKilledMidStep(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	power := &countingPower{gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	f.machine(t, "dc1", "m1", "52:54:00:00:04:01", power)
	dir := t.TempDir()
	a := startSiteAgent(t, f.cp, dir, f.siteToken(t, "dc1"))
	bctest.WaitFor(t, "the machine list to reach the site agent", func() bool { return len(a.site.Machines()) == 1 })

	_, err := f.admin.Machines.Inspect(ctx, connect.NewRequest(&apiv1.InspectMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	bctest.Receive(t, "the power cycle to reach the BMC", power.entered)
	a.stop()
	close(power.gate)

	startSiteAgent(t, f.cp, dir, "") // the same bcd, restarted from its state directory
	bctest.WaitFor(t, "the interrupted command to be reported", func() bool {
		states := f.commands(t, metal.CommandBMCPower)
		return len(states) == 1 && states[0] == "failed:INTERRUPTED"
	})
	f.cp.Clock.Advance(6 * time.Minute) // past the step's deadline
	bctest.WaitFor(t, "the engine to give the step up", func() bool {
		_, err := f.cp.App.Metal.Engine.Sweep(ctx)
		require.NoError(t, err)
		return f.workflow(t, "m1").State != provision.WorkflowRunning
	})
	w := f.workflow(t, "m1")
	require.Equal(t, provision.WorkflowFailed, w.State)
	require.Equal(t, "boot-ramdisk", w.FailedStep)
	require.Len(t, f.commands(t, metal.CommandBMCPower), 1, "the destructive command was sent once")
	require.Equal(t, 1, power.Calls(), "and reached the BMC once")
}

// TestSiteTokens: a site token binds its site (shown on the token and on
// the joined node); a site on another role's token, or a site the tenant
// does not have, is refused with the field and why.
func TestSiteTokens(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	create := func(role, site string) (*apiv1.CreateJoinTokenResponse, error) {
		res, err := f.admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "infra", Role: role, Site: site}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	_, err := create("node", "dc1")
	require.ErrorContains(t, err, "site: only a site token (role site) is bound to a site")
	_, err = create("site", "nowhere")
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	_, err = create("site", "Bad Name!")
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))

	tok, err := create("site", f.site.GetId())
	require.NoError(t, err)
	require.Equal(t, f.site.GetId(), tok.GetJoinToken().GetSiteId())
	sa := startSiteAgent(t, f.cp, t.TempDir(), tok.GetToken())
	var siteID string
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT site_id FROM nodes WHERE id = $1`, sa.ag.NodeID()).Scan(&siteID)
	}))
	require.Equal(t, f.site.GetId(), siteID, "the joined node acts for the token's site")
}

// TestSiteAgentFetchesImageOverItsSession: a site image capability opens
// on the mTLS session of the site agent it was minted for, once: another
// site's agent presenting it is refused, and so is a second use.
func TestSiteAgentFetchesImageOverItsSession(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	blob := bytes.Repeat([]byte("disk image "), 300_000)
	sum := sha256.Sum256(blob)
	sha := hex.EncodeToString(sum[:])
	_, err := f.admin.PushImage(ctx, &apiv1.PushImageHeader{Tenant: "acme", Name: "img", Kind: "raw", Sha256: sha,
		SizeBytes: int64(len(blob))}, bytes.NewReader(blob), "")
	require.NoError(t, err)

	a := startSiteAgent(t, f.cp, t.TempDir(), f.siteToken(t, "dc1"))
	b := startSiteAgent(t, f.cp, t.TempDir(), f.siteToken(t, "dc2"))
	bctest.WaitFor(t, "the site agent to hold the boot lease", func() bool { return f.lease(t).HolderNodeID == a.ag.NodeID() })
	tok, err := f.cp.App.Metal.ImageFetchToken(f.site.GetId(), a.ag.NodeID(), sha)
	require.NoError(t, err)

	// dc2's agent, on its own session, presents dc1's capability.
	var refused error
	bctest.WaitFor(t, "dc2's agent to have a session", func() bool {
		_, refused = b.ag.FetchSiteImage(ctx, sha, tok)
		return refused != nil && !strings.Contains(refused.Error(), "no gateway session")
	})
	require.Equal(t, codes.PermissionDenied, status.Code(refused), "%v", refused)

	rc, err := a.ag.FetchSiteImage(ctx, sha, tok)
	require.NoError(t, err)
	got, err := io.ReadAll(rc)
	require.NoError(t, err)
	require.NoError(t, rc.Close())
	require.Equal(t, blob, got)

	_, err = a.ag.FetchSiteImage(ctx, sha, tok)
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	require.ErrorContains(t, err, "used already")
}
