package hypervisor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/agent/hw/fake"
	"github.com/better-compute/better-compute/internal/agent/hypervisor"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/netns"
	"github.com/better-compute/better-compute/internal/sshca"
	"github.com/better-compute/better-compute/internal/sshexec"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

// The guest test runs a real bcd (the agent library with the hypervisor)
// joined to a real control plane over the mTLS gateway, sends it instance
// commands through the fleet command path, and boots the real guest image
// (make guest-image) on QEMU under TCG, in a network namespace of its own
// so the host's network is untouched.

const (
	agNet  = "10.213.92."
	agUser = "bc"
	// agPrincipal is the guest's own certificate principal (the control
	// plane seeds an instance's id).
	agPrincipal = "ins_web1"
)

// guestImageDir is the image make guest-image built; the test's image
// directory names it debian-12.
func guestImageDir(t *testing.T) string {
	t.Helper()
	if os.Getenv("BC_GUEST") == "" {
		t.Skip("set BC_GUEST=1 to boot real QEMU guests from the guest image (make guest-image); .ci/run does")
	}
	if os.Geteuid() != 0 {
		t.Fatal("BC_GUEST needs root: network namespaces, taps and a bridge")
	}
	for _, tool := range []string{"qemu-system-x86_64", "qemu-img", "ip", "mkfs.vfat", "mcopy"} {
		_, err := exec.LookPath(tool)
		require.NoError(t, err, "BC_GUEST needs %s", tool)
	}
	dir := os.Getenv("BC_GUEST_IMAGE")
	if dir == "" {
		wd, err := os.Getwd()
		require.NoError(t, err)
		dir = filepath.Join(wd, "..", "..", "..", "bin", "guest-image")
	}
	dir, err := filepath.Abs(dir)
	require.NoError(t, err)
	require.FileExists(t, filepath.Join(dir, "SHA256SUMS"), "no guest image in %s: run make guest-image (or set BC_GUEST_IMAGE)", dir)
	return dir
}

// bcd is one run of the node agent with its hypervisor, on state that
// outlives it (a restart is a new bcd on the same directories).
type bcd struct {
	a    *agent.Agent
	stop func()
}

type agentRig struct {
	cp        *bctest.ControlPlane
	tenantID  string
	agentDir  string
	hvDir     string
	imagesDir string
	ns        string
	ca        *sshca.CA
	dial      func(ctx context.Context, network, addr string) (net.Conn, error)
	sent      atomic.Int64
}

func (g *agentRig) startBCD(t *testing.T, token string) *bcd {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	hv, err := hypervisor.New(hypervisor.Config{StateDir: g.hvDir, Images: g.imagesDir, Bridge: "bchvbr0",
		BridgeAddress: agNet + "1/24", NetNS: g.ns, Accel: "tcg", StopTimeout: 2 * time.Minute, Logger: log})
	require.NoError(t, err)
	require.NoError(t, hv.Start(context.Background()))
	sysfs := filepath.Join(g.agentDir, "host")
	require.NoError(t, bctest.WriteSimHost(sysfs))
	// The fake GPU backend gives the machine a DMI identity the gateway
	// admits without an operator's approval.
	hw, err := fake.New(fake.Options{Model: "dgxh100", Seed: g.agentDir})
	require.NoError(t, err)
	a, err := agent.New(agent.Config{Server: g.cp.GatewayAddr, StateDir: g.agentDir, SysfsRoot: sysfs, Hardware: hw,
		CgroupRoot: filepath.Join(g.agentDir, "cgroup"), PlainCgroupDir: true, Logger: log, Version: "guest-test",
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second, Instances: hv})
	require.NoError(t, err)
	if token != "" {
		require.NoError(t, a.Join(context.Background(), token))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	b := &bcd{a: a}
	stopped := false
	b.stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
			_ = a.Close()
		}
	}
	t.Cleanup(b.stop)
	return b
}

// send enqueues a command for the node the way the capacity engine does
// (fleet.SendSystemCommand in a transaction, the gateway notified) and
// waits for its end: its state, failure code, message and result.
func (g *agentRig) send(t *testing.T, nodeID, kind string, params any) (state, code, message string, result map[string]any) {
	t.Helper()
	b, err := json.Marshal(params)
	require.NoError(t, err)
	var p map[string]any
	require.NoError(t, json.Unmarshal(b, &p))
	ctx := context.Background()
	var id string
	require.NoError(t, g.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		now := g.cp.Clock.Now()
		id, err = fleet.SendSystemCommand(ctx, tx, g.cp.App.Gateway, fleet.SystemCommand{TenantID: g.tenantID, NodeID: nodeID,
			Kind: kind, Params: p, IdempotencyKey: fmt.Sprintf("%s-%d", kind, g.sent.Add(1)), CreatedBy: "guest-test",
			TTL: time.Hour, Time: now, Signer: g.cp.App.CommandSigner()})
		return err
	}))
	var raw string
	bctest.WaitFor(t, kind+" to end", func() bool {
		_ = g.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT state, failure_code, message, result FROM commands WHERE id = $1`, id).Scan(&state, &code, &message, &raw)
		})
		return state == "succeeded" || state == "failed" || state == "canceled" || state == "expired"
	})
	require.NoError(t, json.Unmarshal([]byte(raw), &result))
	return state, code, message, result
}

func (g *agentRig) must(t *testing.T, nodeID, kind string, params any) map[string]any {
	t.Helper()
	state, code, msg, res := g.send(t, nodeID, kind, params)
	require.Equal(t, "succeeded", state, "%s: %s %s", kind, code, msg)
	return res
}

func (g *agentRig) exec(ctx context.Context, cmd string) (*sshca.ExecResult, error) {
	u, err := g.ca.NewUser(agPrincipal, 5*time.Minute)
	if err != nil {
		return nil, err
	}
	return sshca.Exec(ctx, sshca.ExecParams{Addr: agNet + "5:22", User: agUser, Auth: u.Signer, HostCA: g.ca.PublicKey(),
		Command: cmd, Dial: g.dial})
}

// run runs cmd in the guest and requires exit 0 and the pinned host
// certificate.
func (g *agentRig) run(t *testing.T, cmd string) string {
	t.Helper()
	// A TCG guest beside other TCG guests on a busy CI machine can stall
	// an SSH session until its transport times out; every command here is
	// idempotent, so a failed transport is tried again (bounded by the
	// test's deadline), while a command that ran is judged as it ran.
	var res *sshca.ExecResult
	bctest.WaitFor(t, "ssh "+cmd, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var err error
		if res, err = g.exec(ctx, cmd); err != nil {
			t.Logf("ssh %q: %v (trying again)", cmd, err)
			return false
		}
		return true
	})
	require.Equal(t, 0, res.ExitCode, "%s: %s", cmd, res.Stderr)
	require.Equal(t, sshca.HostCertValid, res.HostCert)
	return string(res.Stdout)
}

func (g *agentRig) waitSSH(t *testing.T, what string) {
	t.Helper()
	bctest.WaitFor(t, what, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := g.exec(ctx, "true")
		return err == nil && res.ExitCode == 0
	})
}

// TestGuestAgentRunsInstances: instance.create through the fleet command
// path boots the real guest image; the guest answers SSH with a user
// certificate and the pinned host certificate, with the address, gateway
// and DNS the seed gave; bcd restarts and re-adopts the running guest;
// a snapshot and restore through the commands keep a file written before
// the snapshot; instance.delete leaves no QEMU, tap or files.
func TestGuestAgentRunsInstances(t *testing.T) {
	img := guestImageDir(t)
	dir := t.TempDir()
	g := &agentRig{cp: bctest.NewControlPlane(t), agentDir: filepath.Join(dir, "bcd"), hvDir: filepath.Join(dir, "instances"),
		imagesDir: filepath.Join(dir, "images"), ns: fmt.Sprintf("bchv%d", os.Getpid())}
	require.NoError(t, os.MkdirAll(g.imagesDir, 0o755))
	require.NoError(t, os.Symlink(img, filepath.Join(g.imagesDir, "debian-12")))
	out, err := exec.Command("ip", "netns", "add", g.ns).CombinedOutput()
	require.NoError(t, err, string(out))
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", g.ns).Run() })
	require.NoError(t, exec.Command("ip", "-n", g.ns, "link", "set", "lo", "up").Run())
	g.dial = netns.Dialer(g.ns)
	t.Cleanup(func() {
		if t.Failed() {
			con, _ := os.ReadFile(filepath.Join(g.hvDir, "instances", "web-1", "console.log"))
			t.Logf("guest console (last 6 KiB):\n%s", con[max(0, len(con)-6<<10):])
		}
		// QEMU is daemonized: a failed test must not leave it running.
		pids, _ := filepath.Glob(filepath.Join(g.hvDir, "instances", "*", "qemu.pid"))
		for _, p := range pids {
			b, _ := os.ReadFile(p)
			var pid int
			if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &pid); err == nil && pid > 0 {
				if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.Contains(string(cmd), "guest=") {
					_ = unix.Kill(pid, unix.SIGKILL)
				}
			}
		}
	})

	ctx := context.Background()
	admin := g.cp.Admin()
	ten, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	g.tenantID = ten.Msg.GetTenant().GetId()
	_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "vms"}))
	require.NoError(t, err)
	tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "vms"}))
	require.NoError(t, err)

	g.ca, err = sshca.New(nil)
	require.NoError(t, err)
	hk, err := sshca.NewHostKey()
	require.NoError(t, err)
	hostCert, err := g.ca.SignHost(hk.Signer.PublicKey(), []string{agNet + "5"}, 24*time.Hour)
	require.NoError(t, err)

	node := g.startBCD(t, tok.Msg.GetToken())
	nodeID := node.a.NodeID()
	var caps string
	bctest.WaitFor(t, "the node to connect and advertise instance.run", func() bool {
		_ = g.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT capabilities FROM nodes WHERE id = $1`, nodeID).Scan(&caps)
		})
		return strings.Contains(caps, vmcmd.CapInstances)
	})
	require.Contains(t, caps, vmcmd.CapSnapshot)
	require.NotContains(t, caps, vmcmd.CapNetworkPolicy, "no policy enforcement configured")

	create := vmcmd.CreateParams{
		InstanceID: "web-1", VCPUs: 1, MemoryMiB: 512, DiskMiB: 2048,
		Image: vmcmd.Image{Name: "debian-12", Sha256: imageDigest(t, img)},
		Network: vmcmd.Network{MAC: "52:54:00:bc:92:05", Address: agNet + "5/24", Gateway: agNet + "1",
			DNS: []string{agNet + "53"}, Policy: vmcmd.PolicyEgress},
		Volumes: []vmcmd.VolumeRef{{VolumeID: "data", Format: "qcow2", SizeMiB: 64}},
		Seed: vmcmd.Seed{Hostname: "web-one", User: agUser, TrustedUserCAKeys: []string{g.ca.AuthorizedKey()},
			AuthorizedPrincipals: []string{agPrincipal}, HostKey: string(hk.PrivatePEM), HostCertificate: sshca.MarshalCert(hostCert)},
	}
	start := time.Now()
	st := g.must(t, nodeID, vmcmd.KindInstanceCreate, create)
	require.Equal(t, "running", st["state"])
	require.Equal(t, "tcg", st["accel"])
	require.Equal(t, agNet+"5:22", st["ssh_address"])
	tap := st["tap"].(string)
	g.waitSSH(t, "the guest's sshd to accept a CA-signed login")
	t.Logf("figure: instance.create → SSH ready (TCG, through the fleet): %s", time.Since(start).Round(100*time.Millisecond))

	// What the seed said.
	require.Equal(t, "web-one\n", g.run(t, "hostname"))
	require.Contains(t, g.run(t, "ip -4 addr show dev eth0"), "inet "+agNet+"5/24")
	require.Contains(t, g.run(t, "ip route"), "default via "+agNet+"1")
	require.Contains(t, g.run(t, "cat /etc/resolv.conf"), "nameserver "+agNet+"53")
	require.Contains(t, g.run(t, "lsblk -dn -o NAME,SERIAL"), "data")

	// A volume hot-attached through volume.attach is a disk in the
	// running guest; volume.detach takes it out once the guest released
	// it. Both converge when repeated; an attached volume is not deleted.
	hot := vmcmd.AttachParams{InstanceID: "web-1", VolumeID: "hot", Format: "raw"}
	g.must(t, nodeID, vmcmd.KindVolumeCreate, vmcmd.VolumeParams{VolumeID: "hot", Format: "raw", SizeMiB: 16})
	start = time.Now()
	require.Equal(t, "running", g.must(t, nodeID, vmcmd.KindVolumeAttach, hot)["state"])
	bctest.WaitFor(t, "the guest to see the hot-attached volume", func() bool {
		return strings.Contains(g.run(t, "lsblk -dn -o NAME,SERIAL"), "hot")
	})
	t.Logf("figure: volume.attach until the guest lists the disk (TCG, through the fleet): %s", time.Since(start).Round(10*time.Millisecond))
	g.must(t, nodeID, vmcmd.KindVolumeAttach, hot)
	state, code, msg, _ := g.send(t, nodeID, vmcmd.KindVolumeDelete, vmcmd.VolumeParams{VolumeID: "hot"})
	require.Equal(t, "failed", state)
	require.Equal(t, vmcmd.FailBusy, code, msg)
	start = time.Now()
	g.must(t, nodeID, vmcmd.KindVolumeDetach, vmcmd.AttachParams{InstanceID: "web-1", VolumeID: "hot"})
	t.Logf("figure: volume.detach until the guest released the disk (TCG): %s", time.Since(start).Round(10*time.Millisecond))
	require.NotContains(t, g.run(t, "lsblk -dn -o NAME,SERIAL"), "hot")
	g.must(t, nodeID, vmcmd.KindVolumeDetach, vmcmd.AttachParams{InstanceID: "web-1", VolumeID: "hot"})
	g.must(t, nodeID, vmcmd.KindVolumeDelete, vmcmd.VolumeParams{VolumeID: "hot"})

	// A redelivered create (another command, same spec) is the same
	// instance; another spec for its id is refused.
	require.Equal(t, st, g.must(t, nodeID, vmcmd.KindInstanceCreate, create))
	other := create
	other.MemoryMiB = 1024
	state, code, msg, _ = g.send(t, nodeID, vmcmd.KindInstanceCreate, other)
	require.Equal(t, "failed", state)
	require.Equal(t, vmcmd.FailExists, code, msg)

	// bcd restarts; the guest keeps running and is adopted.
	pid := qemuPID(t, g.hvDir, "web-1")
	node.stop()
	g.startBCD(t, "") // stopped at cleanup
	list := g.must(t, nodeID, vmcmd.KindInstanceList, struct{}{})["instances"].([]any)
	require.Len(t, list, 1)
	require.Equal(t, "web-1", list[0].(map[string]any)["instance_id"])
	require.Equal(t, "running", list[0].(map[string]any)["state"])
	require.Equal(t, pid, qemuPID(t, g.hvDir, "web-1"), "the same QEMU, adopted, not restarted")
	require.Equal(t, "still here\n", g.run(t, "echo still here"))

	// Snapshot and restore through the commands: the file written
	// before the snapshot is there after, the one written after is not.
	g.run(t, "echo before > ~/marker; sync")
	snap := vmcmd.SnapshotParams{InstanceID: "web-1", SnapshotID: "snap-1"}
	start = time.Now()
	g.must(t, nodeID, vmcmd.KindInstanceSnapshot, snap)
	t.Logf("figure: instance.snapshot of a 512 MiB guest (TCG, through the fleet): %s", time.Since(start).Round(10*time.Millisecond))
	g.run(t, "echo after > ~/marker; touch ~/later; sync")
	g.must(t, nodeID, vmcmd.KindInstanceRestore, snap)
	g.waitSSH(t, "the restored guest to accept a login")
	require.Equal(t, "before\n", g.run(t, "cat ~/marker"))
	require.Equal(t, "gone\n", g.run(t, "test -e ~/later && echo there || echo gone"))

	// Delete leaves no QEMU, no tap, no files but the volume, which
	// volume.delete then removes.
	pid = qemuPID(t, g.hvDir, "web-1")
	require.Equal(t, map[string]any{"instance_id": "web-1", "state": "deleted"}, g.must(t, nodeID, vmcmd.KindInstanceDelete, vmcmd.InstanceRef{InstanceID: "web-1"}))
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	require.Empty(t, cmdline, "qemu pid %d still runs", pid)
	require.Error(t, exec.Command("ip", "-n", g.ns, "link", "show", "dev", tap).Run(), "tap %s still exists", tap)
	for _, d := range []string{"instances", "meta", "snapshots"} {
		entries, err := os.ReadDir(filepath.Join(g.hvDir, d))
		require.NoError(t, err)
		require.Empty(t, entries, d)
	}
	g.must(t, nodeID, vmcmd.KindVolumeDelete, vmcmd.VolumeParams{VolumeID: "data"})
	entries, err := os.ReadDir(filepath.Join(g.hvDir, "volumes"))
	require.NoError(t, err)
	require.Empty(t, entries)
	// Deleting again converges.
	g.must(t, nodeID, vmcmd.KindInstanceDelete, vmcmd.InstanceRef{InstanceID: "web-1"})
}

func imageDigest(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[1] == "rootfs.qcow2" {
			return f[0]
		}
	}
	t.Fatalf("%s/SHA256SUMS lists no rootfs.qcow2", dir)
	return ""
}

func qemuPID(t *testing.T, hvDir, id string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(hvDir, "instances", id, "qemu.pid"))
	require.NoError(t, err)
	var pid int
	_, err = fmt.Sscan(strings.TrimSpace(string(b)), &pid)
	require.NoError(t, err)
	return pid
}

// TestGuestExecThroughGateway: an instance created through the API boots
// the real guest image with the deployment's SSH CA in its seed; a ticket
// from InstanceService.Ssh opens a tunnel through the API, the gateway and
// bcd (which dials the guest inside the bridge's network namespace), and
// the guest's OpenSSH accepts the CA-signed user certificate while the
// client pins it by its CA-signed host certificate.
func TestGuestExecThroughGateway(t *testing.T) {
	img := guestImageDir(t)
	dir := t.TempDir()
	g := &agentRig{cp: bctest.NewControlPlane(t), agentDir: filepath.Join(dir, "bcd"), hvDir: filepath.Join(dir, "instances"),
		imagesDir: filepath.Join(dir, "images"), ns: fmt.Sprintf("bcx%d", os.Getpid())}
	require.NoError(t, os.MkdirAll(g.imagesDir, 0o755))
	require.NoError(t, os.Symlink(img, filepath.Join(g.imagesDir, "debian-12")))
	out, err := exec.Command("ip", "netns", "add", g.ns).CombinedOutput()
	require.NoError(t, err, string(out))
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", g.ns).Run() })
	require.NoError(t, exec.Command("ip", "-n", g.ns, "link", "set", "lo", "up").Run())
	t.Cleanup(func() {
		pids, _ := filepath.Glob(filepath.Join(g.hvDir, "instances", "*", "qemu.pid"))
		if t.Failed() {
			for _, p := range pids {
				con, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "console.log"))
				t.Logf("guest console (last 6 KiB):\n%s", con[max(0, len(con)-6<<10):])
			}
		}
		// QEMU is daemonized: a failed test must not leave it running.
		for _, p := range pids {
			b, _ := os.ReadFile(p)
			var pid int
			if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &pid); err == nil && pid > 0 {
				if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.Contains(string(cmd), "guest=") {
					_ = unix.Kill(pid, unix.SIGKILL)
				}
			}
		}
	})

	ctx := context.Background()
	admin := g.cp.Admin()
	ten, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	g.tenantID = ten.Msg.GetTenant().GetId()
	_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "vms"}))
	require.NoError(t, err)
	tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "vms"}))
	require.NoError(t, err)
	node := g.startBCD(t, tok.Msg.GetToken())
	bctest.WaitFor(t, "the node's GPUs", func() bool {
		var n int
		_ = g.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT COUNT(*) FROM gpus WHERE node_id = $1`, node.a.NodeID()).Scan(&n)
		})
		return n == 8
	})
	_, err = admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "gpu",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}}}))
	require.NoError(t, err)
	_, err = admin.Flavors.Create(ctx, connect.NewRequest(&apiv1.CreateFlavorRequest{Name: "tiny", Vcpus: 1, MemoryMib: 512, DiskGib: 2}))
	require.NoError(t, err)
	_, err = admin.IPPools.Create(ctx, connect.NewRequest(&apiv1.CreateIPPoolRequest{Name: "lan", Cidr: agNet + "0/24",
		Gateway: agNet + "1", Dns: []string{agNet + "53"}}))
	require.NoError(t, err)

	start := time.Now()
	res, err := admin.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: "web", Flavor: "tiny",
		Image: "debian-12", IpPool: "lan", Pool: "gpu", Project: "vms"}))
	require.NoError(t, err)
	id := res.Msg.GetInstance().GetId()
	t.Cleanup(func() {
		_, _ = admin.Instances.Delete(context.Background(), connect.NewRequest(&apiv1.DeleteInstanceRequest{Tenant: "acme", Instance: id}))
	})
	bctest.WaitFor(t, "the instance to run", func() bool {
		r, err := admin.Instances.Get(ctx, connect.NewRequest(&apiv1.GetInstanceRequest{Tenant: "acme", Instance: id}))
		require.NoError(t, err)
		require.NotEqual(t, "failed", r.Msg.GetInstance().GetState(), r.Msg.GetInstance().GetMessage())
		return r.Msg.GetInstance().GetState() == "running"
	})

	// Each attempt is a fresh ticket (single use) until the guest's sshd
	// is up and accepts the certificate.
	var (
		result *sshca.ExecResult
		stdout strings.Builder
	)
	bctest.WaitFor(t, "uname -a through the gateway", func() bool {
		// The control plane's clock is the test's: keep it at real time,
		// which bcd checks the tunnel command's deadline against.
		g.cp.Clock.Set(time.Now())
		key, err := sshexec.NewKey()
		require.NoError(t, err)
		r, err := admin.Instances.Ssh(ctx, connect.NewRequest(&apiv1.SshInstanceRequest{Tenant: "acme", Instance: id, PublicKey: key.AuthorizedKey}))
		require.NoError(t, err)
		actx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		stdout.Reset()
		result, err = sshexec.Run(actx, sshexec.Params{APIURL: g.cp.URL, Ticket: r.Msg.GetTicket(), Key: key, Command: "uname -a", Stdout: &stdout})
		if err != nil {
			t.Logf("exec: %v (trying again)", err)
			return false
		}
		return true
	})
	t.Logf("figure: create through the API → exec through the gateway (TCG): %s", time.Since(start).Round(100*time.Millisecond))
	require.Zero(t, result.ExitCode)
	require.Equal(t, sshca.HostCertValid, result.HostCert)
	require.Contains(t, stdout.String(), "Linux")
}

// TestGuestFromSnapshot: a real guest writes a file and is snapshotted;
// instance.delete keeping the snapshot removes the guest but not the
// snapshot; a new instance created from it, with another id, hostname,
// address, host key and a larger disk, boots cold from the snapshot's disk:
// it has the file, and its own hostname, address, certified host key and
// disk size (cloud-init re-ran its first-boot modules for the new instance
// id). snapshot.delete then empties the store.
func TestGuestFromSnapshot(t *testing.T) {
	img := guestImageDir(t)
	dir := t.TempDir()
	hvDir, imagesDir, ns := filepath.Join(dir, "hv"), filepath.Join(dir, "images"), fmt.Sprintf("bcfs%d", os.Getpid())
	require.NoError(t, os.MkdirAll(imagesDir, 0o755))
	require.NoError(t, os.Symlink(img, filepath.Join(imagesDir, "debian-12")))
	out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput()
	require.NoError(t, err, string(out))
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	require.NoError(t, exec.Command("ip", "-n", ns, "link", "set", "lo", "up").Run())
	t.Cleanup(func() {
		pids, _ := filepath.Glob(filepath.Join(hvDir, "instances", "*", "qemu.pid"))
		if t.Failed() {
			for _, p := range pids {
				con, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "console.log"))
				t.Logf("%s console (last 6 KiB):\n%s", filepath.Base(filepath.Dir(p)), con[max(0, len(con)-6<<10):])
			}
		}
		// QEMU is daemonized: a failed test must not leave it running.
		for _, p := range pids {
			b, _ := os.ReadFile(p)
			var pid int
			if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &pid); err == nil && pid > 0 {
				if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.Contains(string(cmd), "guest=") {
					_ = unix.Kill(pid, unix.SIGKILL)
				}
			}
		}
	})
	hv, err := hypervisor.New(hypervisor.Config{StateDir: hvDir, Images: imagesDir, Bridge: "bcfsbr0", BridgeAddress: agNet + "1/24",
		NetNS: ns, Accel: "tcg", StopTimeout: 2 * time.Minute, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, hv.Start(ctx))
	apply := func(kind string, params any) map[string]any {
		t.Helper()
		b, err := json.Marshal(params)
		require.NoError(t, err)
		res, err := hv.Apply(ctx, kind, b)
		require.NoError(t, err, kind)
		b, err = json.Marshal(res)
		require.NoError(t, err)
		var m map[string]any
		require.NoError(t, json.Unmarshal(b, &m))
		return m
	}
	ca, err := sshca.New(nil)
	require.NoError(t, err)
	dial := netns.Dialer(ns)
	// guest is one instance's create params (its own host key, certified
	// for its address) and a way to run commands in it over SSH.
	guest := func(id, host, mac, octet string) (vmcmd.CreateParams, func(cmd string) string) {
		hk, err := sshca.NewHostKey()
		require.NoError(t, err)
		cert, err := ca.SignHost(hk.Signer.PublicKey(), []string{agNet + octet}, 24*time.Hour)
		require.NoError(t, err)
		principal := "ins_" + strings.ReplaceAll(id, "-", "")
		p := vmcmd.CreateParams{
			InstanceID: id, VCPUs: 1, MemoryMiB: 512, DiskMiB: 2048,
			Image: vmcmd.Image{Name: "debian-12", Sha256: imageDigest(t, img)},
			Network: vmcmd.Network{MAC: mac, Address: agNet + octet + "/24", Gateway: agNet + "1",
				DNS: []string{agNet + "53"}, Policy: vmcmd.PolicyEgress},
			Seed: vmcmd.Seed{Hostname: host, User: agUser, TrustedUserCAKeys: []string{ca.AuthorizedKey()},
				AuthorizedPrincipals: []string{principal}, HostKey: string(hk.PrivatePEM), HostCertificate: sshca.MarshalCert(cert)},
		}
		run := func(cmd string) string {
			t.Helper()
			var res *sshca.ExecResult
			// Retried while the guest boots or a loaded TCG guest stalls
			// a session; every command here is idempotent.
			bctest.WaitFor(t, host+": ssh "+cmd, func() bool {
				u, err := ca.NewUser(principal, 5*time.Minute)
				require.NoError(t, err)
				cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
				defer cancel()
				if res, err = sshca.Exec(cctx, sshca.ExecParams{Addr: agNet + octet + ":22", User: agUser, Auth: u.Signer,
					HostCA: ca.PublicKey(), Command: cmd, Dial: dial}); err != nil {
					t.Logf("%s: ssh %q: %v (trying again)", host, cmd, err)
					return false
				}
				return true
			})
			require.Equal(t, 0, res.ExitCode, "%s: %s", cmd, res.Stderr)
			require.Equal(t, sshca.HostCertValid, res.HostCert, "the guest shows its own certified host key")
			return string(res.Stdout)
		}
		return p, run
	}

	a, runA := guest("web-a", "web-a", "52:54:00:bc:f5:05", "5")
	start := time.Now()
	require.Equal(t, "running", apply(vmcmd.KindInstanceCreate, a)["state"])
	require.Equal(t, "web-a\n", runA("hostname"))
	t.Logf("figure: A: instance.create → SSH ready (TCG): %s", time.Since(start).Round(100*time.Millisecond))
	runA("echo written-in-a > ~/marker; sync")

	snap := vmcmd.SnapshotParams{InstanceID: "web-a", SnapshotID: "keep-1"}
	start = time.Now()
	apply(vmcmd.KindInstanceSnapshot, snap)
	t.Logf("figure: instance.snapshot of a 512 MiB guest (TCG): %s", time.Since(start).Round(10*time.Millisecond))
	apply(vmcmd.KindInstanceSnapshot, vmcmd.SnapshotParams{InstanceID: "web-a", SnapshotID: "drop-1"})
	require.Equal(t, "deleted", apply(vmcmd.KindInstanceDelete, vmcmd.DeleteParams{InstanceID: "web-a", KeepSnapshots: []string{"keep-1"}})["state"])
	require.NoDirExists(t, filepath.Join(hvDir, "instances", "web-a"))
	require.NoDirExists(t, filepath.Join(hvDir, "snapshots", "web-a", "drop-1"))
	require.FileExists(t, filepath.Join(hvDir, "snapshots", "web-a", "keep-1", "disk.qcow2"))

	b, runB := guest("web-b", "web-b", "52:54:00:bc:f5:06", "6")
	b.DiskMiB = 3072
	b.FromSnapshot = &snap
	start = time.Now()
	require.Equal(t, "running", apply(vmcmd.KindInstanceCreate, b)["state"])
	require.Equal(t, "web-b\n", runB("hostname"), "the new instance's hostname, not the snapshot's")
	t.Logf("figure: B: instance.create from a snapshot → SSH ready (TCG): %s", time.Since(start).Round(100*time.Millisecond))
	require.Equal(t, "written-in-a\n", runB("cat ~/marker"), "the snapshot's disk")
	addr := runB("ip -4 -o addr show dev eth0")
	require.Contains(t, addr, "inet "+agNet+"6/24")
	require.NotContains(t, addr, agNet+"5/")
	require.Equal(t, strconv.Itoa(3072<<20)+"\n", runB("lsblk -bdn -o SIZE /dev/vda"), "the disk grown to disk_mib")

	// The snapshot outlives its use; snapshot.delete empties the store.
	require.Equal(t, map[string]any{"instance_id": "web-a", "snapshot_id": "keep-1"}, apply(vmcmd.KindSnapshotDelete, snap))
	apply(vmcmd.KindSnapshotDelete, snap)
	apply(vmcmd.KindInstanceDelete, vmcmd.DeleteParams{InstanceID: "web-b"})
	for _, d := range []string{"instances", "meta", "snapshots"} {
		entries, err := os.ReadDir(filepath.Join(hvDir, d))
		require.NoError(t, err)
		require.Empty(t, entries, d)
	}
}
