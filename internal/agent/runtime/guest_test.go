package runtime_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/agent/hypervisor"
	"github.com/better-compute/better-compute/internal/agent/runtime"
	"github.com/better-compute/better-compute/internal/netns"
	"github.com/better-compute/better-compute/internal/sshca"
)

// The guest tests boot the real guest image (make guest-image) on QEMU,
// on TCG here, in a network namespace with a private bridge, and log in
// over SSH with a CA-signed user certificate, pinning the guest by its
// CA-signed host certificate.

const (
	guestNet  = "10.213.91."
	guestUser = "bc"
)

func guestImage(t *testing.T) runtime.Image {
	t.Helper()
	if os.Getenv("BC_GUEST") == "" {
		t.Skip("set BC_GUEST=1 to boot real QEMU guests from the guest image (make guest-image); .ci/run does")
	}
	if os.Geteuid() != 0 {
		t.Fatal("BC_GUEST needs root: network namespaces, taps and a bridge")
	}
	dir := os.Getenv("BC_GUEST_IMAGE")
	if dir == "" {
		wd, err := os.Getwd()
		require.NoError(t, err)
		dir = filepath.Join(wd, "..", "..", "..", "bin", "guest-image")
	}
	dir, err := filepath.Abs(dir)
	require.NoError(t, err)
	cmdline, err := os.ReadFile(filepath.Join(dir, "cmdline"))
	require.NoError(t, err, "no guest image in %s: run make guest-image (or set BC_GUEST_IMAGE)", dir)
	return runtime.Image{
		Disk: filepath.Join(dir, "rootfs.qcow2"), Kernel: filepath.Join(dir, "vmlinuz"),
		Initrd: filepath.Join(dir, "initrd.img"), Cmdline: strings.TrimSpace(string(cmdline)),
	}
}

type guestRig struct {
	rt    *runtime.Runtime
	state string
	ns    string
	ca    *sshca.CA
	spec  runtime.Spec
	dial  func(ctx context.Context, network, addr string) (net.Conn, error)
}

func (g *guestRig) exec(ctx context.Context, cmd string) (*sshca.ExecResult, error) {
	u, err := g.ca.NewUser(g.spec.Seed.AuthorizedPrincipals[0], 5*time.Minute)
	if err != nil {
		return nil, err
	}
	return sshca.Exec(ctx, sshca.ExecParams{
		Addr: guestNet + "2:22", User: guestUser, Auth: u.Signer, HostCA: g.ca.PublicKey(),
		Command: cmd, Dial: g.dial,
	})
}

// must runs cmd and requires exit 0.
func (g *guestRig) must(t *testing.T, cmd string) string {
	t.Helper()
	res, err := g.exec(context.Background(), cmd)
	require.NoError(t, err, cmd)
	require.Equal(t, 0, res.ExitCode, "%s: %s", cmd, res.Stderr)
	require.Equal(t, sshca.HostCertValid, res.HostCert)
	return string(res.Stdout)
}

// waitSSH waits until a login works: the guest booted, cloud-init wrote
// the keys and sshd listens.
func (g *guestRig) waitSSH(t *testing.T, what string) {
	t.Helper()
	bctest.WaitFor(t, what, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := g.exec(ctx, "true")
		return err == nil && res.ExitCode == 0
	})
}

func setupGuest(t *testing.T) *guestRig {
	t.Helper()
	img := guestImage(t)
	need(t, "qemu-system-x86_64", "qemu-img", "ip", "mkfs.vfat", "mcopy")
	ns := fmt.Sprintf("bcguest%d", os.Getpid())
	out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput()
	require.NoError(t, err, string(out))
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	require.NoError(t, exec.Command("ip", "-n", ns, "link", "set", "lo", "up").Run())

	ca, err := sshca.New(nil)
	require.NoError(t, err)
	hk, err := sshca.NewHostKey()
	require.NoError(t, err)
	hostCert, err := ca.SignHost(hk.Signer.PublicKey(), []string{guestNet + "2"}, 24*time.Hour)
	require.NoError(t, err)

	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	t.Cleanup(func() {
		if t.Failed() {
			con, _ := os.ReadFile(filepath.Join(state, "guest-1", "console.log"))
			t.Logf("guest console (last 6 KiB):\n%s", con[max(0, len(con)-6<<10):])
		}
	})
	rt, err := runtime.New(runtime.Config{StateDir: state, ProbeKernel: img.Kernel, StopTimeout: 2 * time.Minute})
	require.NoError(t, err)
	vol := filepath.Join(dir, "data.qcow2")
	require.NoError(t, rt.CreateVolume(context.Background(), vol, "qcow2", 64))

	// Pin vCPU i to host CPU (n-1-i): a pinning that differs from the
	// default shows it took.
	n := goruntime.NumCPU()
	spec := runtime.Spec{
		ID: "guest-1", VCPUs: 2, MemoryMiB: 512, Image: img, DiskMiB: 2048,
		Volumes:  []runtime.Volume{{ID: "data", Path: vol, Format: "qcow2"}},
		HostCPUs: []int{(n - 1) % n, (n - 2 + n) % n},
		MAC:      "52:54:00:bc:91:02",
		Network:  &runtime.Network{Bridge: "bcgbr0", BridgeAddress: guestNet + "1/24", NetNS: ns},
		Seed: &runtime.Seed{
			Hostname: "guest-one", User: guestUser,
			TrustedUserCAKeys: []string{ca.AuthorizedKey()}, AuthorizedPrincipals: []string{"guest-1"},
			HostKey: string(hk.PrivatePEM), HostCertificate: sshca.MarshalCert(hostCert),
			Address: guestNet + "2/24", Gateway: guestNet + "1", DNS: []string{guestNet + "53"},
		},
	}
	return &guestRig{rt: rt, state: state, ns: ns, ca: ca, spec: spec, dial: netns.Dialer(ns)}
}

func TestGuestLifecycle(t *testing.T) {
	g := setupGuest(t)
	ctx := context.Background()
	rt := g.rt
	t.Cleanup(func() { _ = rt.Kill(context.Background(), g.spec.ID) })

	caps := rt.Capabilities(ctx)
	t.Logf("accel %s (%s); hugepages %v (%s)", caps.Accel, caps.AccelReason, caps.HugePages, caps.HugePagesReason)

	require.NoError(t, rt.Create(ctx, g.spec))
	start := time.Now()
	require.NoError(t, rt.Start(ctx, g.spec.ID))
	g.waitSSH(t, "the guest's sshd to accept a CA-signed login")
	t.Logf("figure: cold boot → SSH ready on %s: %s", caps.Accel, time.Since(start).Round(100*time.Millisecond))

	info, err := rt.Get(ctx, g.spec.ID)
	require.NoError(t, err)
	require.Equal(t, runtime.StateRunning, info.State)
	require.Equal(t, caps.Accel, info.Accel)

	// What the seed said.
	require.Equal(t, "guest-one\n", g.must(t, "hostname"))
	require.Contains(t, g.must(t, "ip -4 addr show dev eth0"), "inet "+guestNet+"2/24")
	require.Contains(t, g.must(t, "ip route"), "default via "+guestNet+"1")
	require.Contains(t, g.must(t, "cat /etc/resolv.conf"), "nameserver "+guestNet+"53")
	require.Contains(t, g.must(t, "lsblk -dn -o NAME,SERIAL"), "data")

	// vCPU threads are pinned where the spec said.
	aff, err := rt.VCPUAffinity(ctx, g.spec.ID)
	require.NoError(t, err)
	require.Equal(t, map[int][]int{0: {g.spec.HostCPUs[0]}, 1: {g.spec.HostCPUs[1]}}, aff)

	// Hot-plugged volume, seen by the guest, then released.
	hot := filepath.Join(t.TempDir(), "hot.raw")
	require.NoError(t, rt.CreateVolume(ctx, hot, "raw", 16))
	require.NoError(t, rt.AttachVolume(ctx, g.spec.ID, runtime.Volume{ID: "hot", Path: hot, Format: "raw"}))
	bctest.WaitFor(t, "the guest to see the hot-plugged volume", func() bool {
		return strings.Contains(g.must(t, "lsblk -dn -o NAME,SERIAL"), "hot")
	})
	require.NoError(t, rt.DetachVolume(ctx, g.spec.ID, "hot"))
	require.NotContains(t, g.must(t, "lsblk -dn -o NAME,SERIAL"), "hot")
	require.NoError(t, rt.DeleteVolume(ctx, hot))

	// Balloon.
	require.NoError(t, rt.SetBalloon(ctx, g.spec.ID, 384))
	bctest.WaitFor(t, "the balloon to reach 384 MiB", func() bool {
		mib, err := rt.Balloon(ctx, g.spec.ID)
		return err == nil && mib == 384
	})
	var se *runtime.SpecError
	require.ErrorAs(t, rt.SetBalloon(ctx, g.spec.ID, 4096), &se)
	balloonController(ctx, t, rt, g.spec.ID, g.spec.MemoryMiB)

	// Pause and resume: the vCPUs stop, the guest answers again after.
	require.NoError(t, rt.Pause(ctx, g.spec.ID))
	info, err = rt.Get(ctx, g.spec.ID)
	require.NoError(t, err)
	require.Equal(t, runtime.StatePaused, info.State)
	short, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = g.exec(short, "true")
	cancel()
	require.Error(t, err, "a paused guest runs nothing")
	require.NoError(t, rt.Resume(ctx, g.spec.ID))
	require.Equal(t, "resumed\n", g.must(t, "echo resumed"))

	// Snapshot, change the disk, restore: the change is gone.
	g.must(t, "echo before > ~/marker; sync")
	snap := filepath.Join(t.TempDir(), "snap")
	start = time.Now()
	require.NoError(t, rt.Snapshot(ctx, g.spec.ID, snap))
	t.Logf("figure: snapshot of a %d MiB guest: %s", g.spec.MemoryMiB, time.Since(start).Round(10*time.Millisecond))
	g.must(t, "echo after > ~/marker; touch ~/later; sync")
	start = time.Now()
	require.NoError(t, rt.Restore(ctx, g.spec.ID, snap))
	g.waitSSH(t, "the restored guest to accept a login")
	t.Logf("figure: restore → exec ready: %s", time.Since(start).Round(10*time.Millisecond))
	require.Equal(t, "before\n", g.must(t, "cat ~/marker"))
	require.Equal(t, "gone\n", g.must(t, "test -e ~/later && echo there || echo gone"))

	// A new runtime on the same state directory (bcd restarted) adopts the
	// running guest and can stop it.
	rt2, err := runtime.New(runtime.Config{StateDir: g.state, Accel: "tcg", StopTimeout: 2 * time.Minute})
	require.NoError(t, err)
	list, err := rt2.Adopt(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, runtime.StateRunning, list[0].State)
	pid := list[0].PID
	require.Positive(t, pid)
	start = time.Now()
	require.NoError(t, rt2.Stop(ctx, g.spec.ID))
	t.Logf("figure: ACPI stop: %s", time.Since(start).Round(10*time.Millisecond))
	info, err = rt2.Get(ctx, g.spec.ID)
	require.NoError(t, err)
	require.Equal(t, runtime.StateStopped, info.State)

	// Delete leaves no QEMU, no tap, no files.
	require.NoError(t, rt2.Delete(ctx, g.spec.ID))
	// Gone, or a zombie waiting for whichever process reaps orphans here
	// (QEMU daemonized, so it is not our child): either way it runs no more.
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	require.Empty(t, cmdline, "qemu pid %d still runs", pid)
	require.Error(t, exec.Command("ip", "-n", g.ns, "link", "show", "dev", runtime.TapName(&g.spec)).Run(), "tap still exists")
	require.NoDirExists(t, filepath.Join(g.state, g.spec.ID))
	entries, err := os.ReadDir(g.state)
	require.NoError(t, err)
	require.Empty(t, entries)
}

// balloonController drives the hypervisor's balloon controller over this
// real guest with a simulated host: short of memory, the controller
// inflates the guest's balloon over QMP down to its floor (query-balloon's
// actual drops) and bcd.instance.memory.balloon.reclaimed reports the
// bytes; with memory plentiful again it deflates it back.
func balloonController(ctx context.Context, t *testing.T, rt *runtime.Runtime, id string, memMiB int) {
	t.Helper()
	const floor = 384
	require.NoError(t, rt.SetBalloon(ctx, id, memMiB))
	bctest.WaitFor(t, "the balloon back at the guest's memory", func() bool {
		mib, err := rt.Balloon(ctx, id)
		return err == nil && mib == memMiB
	})
	var availMiB atomic.Int64
	availMiB.Store(1024) // of 64 GiB: under the 10% mark
	c, err := hypervisor.NewBalloonController(hypervisor.BalloonConfig{
		MemInfo:  func() (uint64, uint64, error) { return 64 << 30, uint64(availMiB.Load()) << 20, nil },
		Balloons: rt,
		Guests: func(context.Context) []hypervisor.BalloonGuest {
			return []hypervisor.BalloonGuest{{ID: id, MemoryMiB: memMiB, FloorMiB: floor}}
		},
	})
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(c.Collector()))
	require.NoError(t, c.Tick(ctx))
	bctest.WaitFor(t, "the controller to shrink the guest to its floor", func() bool {
		mib, err := rt.Balloon(ctx, id)
		return err == nil && mib == floor
	})
	availMiB.Store(8 << 10) // between the marks: the tick measures only
	require.NoError(t, c.Tick(ctx))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	require.Len(t, mfs, 1)
	require.Equal(t, hypervisor.BalloonMetric, mfs[0].GetName())
	require.Equal(t, float64(int64(memMiB-floor)<<20), mfs[0].GetMetric()[0].GetGauge().GetValue())
	availMiB.Store(32 << 10)
	require.NoError(t, c.Tick(ctx))
	bctest.WaitFor(t, "the controller to give the guest its memory back", func() bool {
		mib, err := rt.Balloon(ctx, id)
		return err == nil && mib == memMiB
	})
}
