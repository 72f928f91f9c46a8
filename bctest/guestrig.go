package bctest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/agent/hw/fake"
	"github.com/better-compute/better-compute/internal/agent/hypervisor"
	"github.com/better-compute/better-compute/internal/netns"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

// GuestRig is a control plane with one real bcd (the agent with the QEMU
// hypervisor, TCG) joined to it over the mTLS gateway, its guests on a
// bridge inside a network namespace of their own so the host's network is
// untouched. Tenant acme (project default) owns the host in pool "vms";
// the platform has flavor "small" and IP pool "vms" on the bridge's
// network. Tests and benchmarks that boot real guests (BC_GUEST=1) drive
// it through the public API only.
type GuestRig struct {
	CP       *ControlPlane
	Admin    *client.Client
	Acme     *client.Client
	TenantID string
	NodeID   string
	// NS is the guests' network namespace; Dial dials from inside it.
	NS    string
	Dial  func(ctx context.Context, network, addr string) (net.Conn, error)
	HVDir string
	// Net is the bridge's /24 ("10.213.93."), gateway Net+"1".
	Net string
}

// GuestRigConfig sizes a GuestRig.
type GuestRigConfig struct {
	// Net is the first three octets with a trailing dot; each rig in one
	// process needs its own (default "10.213.93.").
	Net string
	// VCPUs and MemoryMiB size flavor "small" (default 1 and 512).
	VCPUs     int32
	MemoryMiB int64
}

// GuestImageDir returns the guest image (make guest-image) for BC_GUEST=1
// runs: BC_GUEST_IMAGE, or bin/guest-image of the module. Without
// BC_GUEST it skips tb.
func GuestImageDir(tb testing.TB) string {
	tb.Helper()
	if os.Getenv("BC_GUEST") == "" {
		tb.Skip("set BC_GUEST=1 to boot real QEMU guests from the guest image (make guest-image); .ci/run does")
	}
	if os.Geteuid() != 0 {
		tb.Fatal("BC_GUEST needs root: network namespaces, taps and a bridge")
	}
	for _, tool := range []string{"qemu-system-x86_64", "qemu-img", "ip", "mkfs.vfat", "mcopy"} {
		if _, err := exec.LookPath(tool); err != nil {
			tb.Fatalf("BC_GUEST needs %s: %v", tool, err)
		}
	}
	dir := os.Getenv("BC_GUEST_IMAGE")
	if dir == "" {
		root, err := moduleRoot()
		if err != nil {
			tb.Fatal(err)
		}
		dir = filepath.Join(root, "bin", "guest-image")
	}
	if _, err := os.Stat(filepath.Join(dir, "SHA256SUMS")); err != nil {
		tb.Fatalf("no guest image in %s: run make guest-image (or set BC_GUEST_IMAGE): %v", dir, err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		tb.Fatal(err)
	}
	return abs
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("bctest: no go.mod above the working directory")
		}
		dir = up
	}
}

// NSDialer dials from inside the named network namespace.
func NSDialer(ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return netns.Dialer(ns)
}

// StartGuestRig builds the rig; everything it made goes at tb's cleanup
// (a QEMU left by a failed test is killed).
func StartGuestRig(tb testing.TB, cfg GuestRigConfig) *GuestRig {
	tb.Helper()
	img := GuestImageDir(tb)
	cfg.Net = cmpOr(cfg.Net, "10.213.93.")
	if cfg.VCPUs == 0 {
		cfg.VCPUs = 1
	}
	if cfg.MemoryMiB == 0 {
		cfg.MemoryMiB = 512
	}
	dir := tb.TempDir()
	g := &GuestRig{CP: NewControlPlane(tb), HVDir: filepath.Join(dir, "hv"), Net: cfg.Net,
		// An interface-name-sized namespace name (≤ 15), one per process
		// and network.
		NS: fmt.Sprintf("bcr%d-%s", os.Getpid()%100000, cfg.Net[strings.LastIndex(strings.TrimSuffix(cfg.Net, "."), ".")+1:len(cfg.Net)-1])}
	g.Admin = g.CP.Admin()
	images := filepath.Join(dir, "images")
	must(tb, os.MkdirAll(images, 0o755))
	must(tb, os.Symlink(img, filepath.Join(images, "debian-12")))
	if out, err := exec.Command("ip", "netns", "add", g.NS).CombinedOutput(); err != nil {
		tb.Fatalf("ip netns add %s: %v: %s", g.NS, err, out)
	}
	tb.Cleanup(func() { _ = exec.Command("ip", "netns", "del", g.NS).Run() })
	must(tb, exec.Command("ip", "-n", g.NS, "link", "set", "lo", "up").Run())
	g.Dial = NSDialer(g.NS)
	tb.Cleanup(func() { g.killQEMU(tb) })

	// Certificates and host certificates are signed on the control
	// plane's clock and checked by guests against real time.
	g.CP.Clock.Set(time.Now())

	ctx := context.Background()
	ten, err := g.Admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	must(tb, err)
	g.TenantID = ten.Msg.GetTenant().GetId()
	_, err = g.Admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "default"}))
	must(tb, err)
	k, err := g.Admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "admin"}))
	must(tb, err)
	g.Acme = g.CP.Client(k.Msg.GetSecret())
	tok, err := g.Admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "default"}))
	must(tb, err)

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	hv, err := hypervisor.New(hypervisor.Config{StateDir: g.HVDir, Images: images, Bridge: "bcrigbr0",
		BridgeAddress: cfg.Net + "1/24", NetNS: g.NS, Accel: "tcg", StopTimeout: 2 * time.Minute, Logger: log})
	must(tb, err)
	must(tb, hv.Start(ctx))
	agentDir := filepath.Join(dir, "bcd")
	sysfs := filepath.Join(agentDir, "host")
	must(tb, WriteSimHost(sysfs))
	// The fake GPU backend gives the machine a DMI identity the gateway
	// admits without an operator's approval.
	hw, err := fake.New(fake.Options{Model: "dgxh100", Seed: agentDir})
	must(tb, err)
	a, err := agent.New(agent.Config{Server: g.CP.GatewayAddr, StateDir: agentDir, SysfsRoot: sysfs, Hardware: hw,
		CgroupRoot: filepath.Join(agentDir, "cgroup"), PlainCgroupDir: true, Logger: log, Version: "guest-rig",
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second, Instances: hv})
	must(tb, err)
	must(tb, a.Join(ctx, tok.Msg.GetToken()))
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			tb.Logf("bcd: %v", err)
		}
		_ = a.Close()
	})
	g.NodeID = a.NodeID()
	WaitFor(tb, "the node to advertise instances", func() bool {
		var caps string
		_ = g.CP.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT capabilities FROM nodes WHERE id = $1`, g.NodeID).Scan(&caps)
		})
		return strings.Contains(caps, vmcmd.CapInstances) && strings.Contains(caps, vmcmd.CapSnapshot)
	})
	WaitFor(tb, "the host's GPUs", func() bool {
		var n int
		_ = g.CP.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT COUNT(*) FROM gpus WHERE node_id = $1`, g.NodeID).Scan(&n)
		})
		return n > 0
	})
	_, err = g.Admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "vms",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}}}))
	must(tb, err)
	_, err = g.Admin.Flavors.Create(ctx, connect.NewRequest(&apiv1.CreateFlavorRequest{Name: "small", Vcpus: cfg.VCPUs,
		MemoryMib: cfg.MemoryMiB, DiskGib: 2}))
	must(tb, err)
	_, err = g.Admin.IPPools.Create(ctx, connect.NewRequest(&apiv1.CreateIPPoolRequest{Name: "vms", Cidr: cfg.Net + "0/24",
		Gateway: cfg.Net + "1", Dns: []string{cfg.Net + "53"}, RangeStart: cfg.Net + "10", RangeEnd: cfg.Net + "200"}))
	must(tb, err)
	return g
}

// killQEMU kills the QEMU processes the rig's hypervisor started and left
// (QEMU is daemonized: a failed test must not leave it running).
func (g *GuestRig) killQEMU(tb testing.TB) {
	pids, _ := filepath.Glob(filepath.Join(g.HVDir, "instances", "*", "qemu.pid"))
	for _, p := range pids {
		if pid := readPID(p); pid > 0 {
			if tb.Failed() {
				con, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "console.log"))
				tb.Logf("guest %s console (last 4 KiB):\n%s", filepath.Base(filepath.Dir(p)), con[max(0, len(con)-4<<10):])
			}
			if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.Contains(string(cmd), "guest=") {
				_ = unix.Kill(pid, unix.SIGKILL)
			}
		}
	}
}

func readPID(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	var pid int
	if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &pid); err != nil {
		return 0
	}
	return pid
}

// QEMUPIDs lists the guests' QEMU processes still alive, by host instance
// id.
func (g *GuestRig) QEMUPIDs() map[string]int {
	out := map[string]int{}
	pids, _ := filepath.Glob(filepath.Join(g.HVDir, "instances", "*", "qemu.pid"))
	for _, p := range pids {
		if pid := readPID(p); pid > 0 {
			if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); len(cmd) > 0 {
				out[filepath.Base(filepath.Dir(p))] = pid
			}
		}
	}
	return out
}

// Exec runs cmd in an instance's or a sandbox's guest of tenant acme
// through the API, the host's gateway tunnel and SSH with a CA-signed
// certificate (GuestExec). The control plane's clock is moved up to real
// time first: the guest checks certificates, and bcd the tunnel command's
// deadline, against real time.
func (g *GuestRig) Exec(ctx context.Context, t GuestTarget, cmd string) (*GuestExecResult, error) {
	if now := time.Now(); g.CP.Clock.Now().Before(now) {
		g.CP.Clock.Set(now)
	}
	t.Tenant = cmpOr(t.Tenant, "acme")
	return GuestExec(ctx, g.Acme, g.CP.URL, t, cmd)
}

// Run runs an idempotent cmd in the guest, trying a failed transport again
// (a TCG guest on a busy machine can stall a session) until tb's
// deadline; it fails tb on a non-zero exit.
func (g *GuestRig) Run(tb testing.TB, t GuestTarget, cmd string) string {
	tb.Helper()
	var res *GuestExecResult
	WaitFor(tb, "exec "+cmd, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var err error
		if res, err = g.Exec(ctx, t, cmd); err != nil {
			tb.Logf("exec %+v %q: %v (trying again)", t, cmd, err)
			return false
		}
		return true
	})
	if res.ExitCode != 0 {
		tb.Fatalf("exec %+v %q: exit %d: %s", t, cmd, res.ExitCode, res.Stderr)
	}
	return res.Stdout
}

// WaitExec waits until the guest runs a command through the gateway.
func (g *GuestRig) WaitExec(tb testing.TB, t GuestTarget) {
	tb.Helper()
	WaitFor(tb, fmt.Sprintf("exec in %+v", t), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := g.Exec(ctx, t, "true")
		return err == nil && res.ExitCode == 0
	})
}

// TapExists reports whether the tap device exists in the rig's namespace.
func (g *GuestRig) TapExists(tap string) bool {
	return exec.Command("ip", "-n", g.NS, "link", "show", "dev", tap).Run() == nil
}

func must(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
