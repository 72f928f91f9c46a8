package hypervisor_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/sshca"
	"github.com/better-compute/better-compute/internal/sshexec"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vps"
)

// The control-plane guest tests boot the real guest image through the
// public API (InstanceService, VolumeService, SandboxService…) on a
// control plane whose only host is a real bcd with the QEMU hypervisor
// (TCG), joined over the mTLS gateway (bctest.GuestRig). They log
// "figure:" lines; docs/benchmarks.md has the benchmarks.

func guestInstance(t *testing.T, g *bctest.GuestRig, id string) *apiv1.Instance {
	t.Helper()
	r, err := g.Acme.Instances.Get(context.Background(), connect.NewRequest(&apiv1.GetInstanceRequest{Tenant: "acme", Instance: id}))
	require.NoError(t, err)
	return r.Msg.GetInstance()
}

func waitInstance(t *testing.T, g *bctest.GuestRig, id, state string) *apiv1.Instance {
	t.Helper()
	var in *apiv1.Instance
	bctest.WaitFor(t, "instance "+id+" "+state, func() bool {
		in = guestInstance(t, g, id)
		if in.GetState() == "failed" && state != "failed" {
			t.Fatalf("instance %s failed: %s", id, in.GetMessage())
		}
		return in.GetState() == state
	})
	return in
}

func (gs guestState) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, gs.g.CP.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, query, args...).Scan(&n)
	}))
	return n
}

type guestState struct{ g *bctest.GuestRig }

// links lists the guests' network devices (taps) in the rig's namespace.
func links(t *testing.T, g *bctest.GuestRig) string {
	t.Helper()
	out, err := exec.Command("ip", "-n", g.NS, "-o", "link", "show").CombinedOutput()
	require.NoError(t, err, string(out))
	var names []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); len(f) > 1 {
			// The bridge stays for the host's next guest; taps go with theirs.
			if name := strings.TrimSuffix(strings.SplitN(f[1], "@", 2)[0], ":"); name != "lo" && name != "bcrigbr0" {
				names = append(names, name)
			}
		}
	}
	return strings.Join(names, " ")
}

// requireNothingLeft: no QEMU, tap, lease, live booking, or file of the
// instance is left on the host or in the control plane.
func requireNothingLeft(t *testing.T, g *bctest.GuestRig, in *apiv1.Instance, linksBefore string, pid int) {
	t.Helper()
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	require.Empty(t, cmdline, "qemu pid %d still runs", pid)
	require.Empty(t, g.QEMUPIDs())
	require.Equal(t, linksBefore, links(t, g), "a tap device is left")
	l, err := g.Admin.IPPools.ListLeases(context.Background(), connect.NewRequest(&apiv1.ListIPLeasesRequest{IpPool: "vms"}))
	require.NoError(t, err)
	for _, lease := range l.Msg.GetLeases() {
		require.NotEqual(t, in.GetId(), lease.GetHolder(), "lease %s left", lease.GetAddress())
	}
	gs := guestState{g}
	require.Zero(t, gs.count(t, `SELECT COUNT(*) FROM bookings WHERE reservation_id = $1 AND ends_at > compute_now()`, in.GetReservationId()),
		"a live booking is left")
	_, err = os.Stat(filepath.Join(g.HVDir, "instances", vps.HostID(in.GetId())))
	require.True(t, os.IsNotExist(err), "the instance's directory is left: %v", err)
	snaps, _ := os.ReadDir(filepath.Join(g.HVDir, "snapshots"))
	require.Empty(t, snaps, "snapshots are left")
}

// TestGuestInstance: an instance with a flavor and a volume attached at
// create boots the real image through the API; inside it the address,
// gateway and DNS are the IP pool's and the volume is a block device;
// delete (and the volume's) leaves no QEMU, tap, lease, booking or volume
// file.
func TestGuestInstance(t *testing.T) {
	g := bctest.StartGuestRig(t, bctest.GuestRigConfig{Net: "10.213.93."})
	ctx := context.Background()
	linksBefore := links(t, g)

	start := time.Now()
	c, err := g.Acme.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: "vm1", Flavor: "small",
		Image: "debian-12", IpPool: "vms",
		Volumes: []*apiv1.InstanceVolumeSpec{{Name: "data", SizeGib: 1}}}))
	require.NoError(t, err)
	in := waitInstance(t, g, c.Msg.GetInstance().GetId(), "running")
	require.Equal(t, "tcg", in.GetAccel())
	require.Len(t, in.GetVolumeIds(), 1)
	require.True(t, strings.HasPrefix(in.GetAddress(), g.Net), in.GetAddress())
	require.Equal(t, g.Net+"1", in.GetGateway())
	require.Equal(t, []string{g.Net + "53"}, in.GetDns())
	// In through the API and the host's gateway tunnel, with a certificate
	// from the control plane's SSH CA, the guest pinned by its host
	// certificate.
	target := bctest.GuestTarget{Instance: in.GetId()}
	g.WaitExec(t, target)
	t.Logf("figure: instances create → exec ready through the gateway (TCG, through the API): %s", time.Since(start).Round(100*time.Millisecond))

	run := func(cmd string) string { return g.Run(t, target, cmd) }
	require.Equal(t, "vm1\n", run("hostname"))
	require.Contains(t, run("ip -4 addr show dev eth0"), "inet "+in.GetAddress()+"/24")
	require.Contains(t, run("ip route"), "default via "+in.GetGateway())
	require.Contains(t, run("cat /etc/resolv.conf"), "nameserver "+in.GetDns()[0])
	// The volume: a second virtio disk of 1 GiB.
	require.Contains(t, run("lsblk -dnb -o NAME,SIZE"), " 1073741824")
	vols, err := os.ReadDir(filepath.Join(g.HVDir, "volumes"))
	require.NoError(t, err)
	require.Len(t, vols, 1)

	pid := g.QEMUPIDs()[vps.HostID(in.GetId())]
	require.NotZero(t, pid)
	_, err = g.Acme.Instances.Delete(ctx, connect.NewRequest(&apiv1.DeleteInstanceRequest{Tenant: "acme", Instance: in.GetId()}))
	require.NoError(t, err)
	waitInstance(t, g, in.GetId(), "deleted")
	volID := in.GetVolumeIds()[0]
	bctest.WaitFor(t, "the volume detached", func() bool {
		v, err := g.Acme.Volumes.Get(ctx, connect.NewRequest(&apiv1.GetVolumeRequest{Tenant: "acme", Volume: volID}))
		require.NoError(t, err)
		return v.Msg.GetVolume().GetState() == "available" || v.Msg.GetVolume().GetState() == "deleted"
	})
	_, err = g.Acme.Volumes.Delete(ctx, connect.NewRequest(&apiv1.DeleteVolumeRequest{Tenant: "acme", Volume: volID}))
	require.NoError(t, err)
	bctest.WaitFor(t, "the volume deleted", func() bool {
		v, err := g.Acme.Volumes.Get(ctx, connect.NewRequest(&apiv1.GetVolumeRequest{Tenant: "acme", Volume: volID}))
		require.NoError(t, err)
		return v.Msg.GetVolume().GetState() == "deleted"
	})
	vols, err = os.ReadDir(filepath.Join(g.HVDir, "volumes"))
	require.NoError(t, err)
	require.Empty(t, vols, "the volume's file is left")
	requireNothingLeft(t, g, in, linksBefore, pid)
}

// TestGuestSandbox: a template's warm guest boots paused; a create claims
// it (origin warm) and it runs commands; a file written before a snapshot
// is back as written after restore; TTL expiry deletes the sandbox and its
// guest, leaving nothing.
func TestGuestSandbox(t *testing.T) {
	g := bctest.StartGuestRig(t, bctest.GuestRigConfig{Net: "10.213.94."})
	ctx := context.Background()
	linksBefore := links(t, g)

	_, err := g.Acme.SandboxTemplates.Create(ctx, connect.NewRequest(&apiv1.CreateSandboxTemplateRequest{Tenant: "acme", Name: "py",
		Image: "debian-12", Flavor: "small", Pool: "vms", IpPool: "vms", DefaultTtl: durationpb.New(30 * time.Minute),
		MaxTtl: durationpb.New(time.Hour), WarmMin: 1, WarmMax: 1}))
	require.NoError(t, err)
	gs := guestState{g}
	start := time.Now()
	// The periodic sweep would do it within 15 s; the test does not wait.
	require.NoError(t, g.CP.App.Sandboxes.ReconcileWarm(ctx))
	bctest.WaitFor(t, "the warm guest booted (paused)", func() bool {
		return gs.count(t, `SELECT COUNT(*) FROM sandbox_warm w JOIN instances i ON i.id = w.instance_id WHERE i.state = 'running'`) == 1
	})
	t.Logf("figure: warm pool refill → warm guest booted and paused (TCG): %s", time.Since(start).Round(100*time.Millisecond))
	start = time.Now()
	c, err := g.Acme.Sandboxes.Create(ctx, connect.NewRequest(&apiv1.CreateSandboxRequest{Tenant: "acme", Template: "py"}))
	require.NoError(t, err)
	sb := c.Msg.GetSandbox()
	require.Equal(t, "warm", sb.GetOrigin())
	// The pool would refill now; on two cores a second TCG guest booting
	// beside this one would only slow it. Sandboxes outlive their template.
	_, err = g.Acme.SandboxTemplates.Delete(ctx, connect.NewRequest(&apiv1.DeleteSandboxTemplateRequest{Tenant: "acme", Template: "py"}))
	require.NoError(t, err)
	bctest.WaitFor(t, "sandbox running", func() bool {
		r, err := g.Acme.Sandboxes.Get(ctx, connect.NewRequest(&apiv1.GetSandboxRequest{Tenant: "acme", Sandbox: sb.GetId()}))
		require.NoError(t, err)
		sb = r.Msg.GetSandbox()
		return sb.GetState() == "running"
	})
	// Where a warm claim's time goes: the control plane and QMP cont (the
	// sandbox reads running once bcd answered instance.resume), then the
	// guest until its sshd answers, then one exec's SSH handshake.
	resumed := time.Since(start)
	target := bctest.GuestTarget{Sandbox: sb.GetId()}
	g.WaitExec(t, target)
	ready := time.Since(start)
	one := time.Now()
	res, err := g.Exec(ctx, target, "true")
	require.NoError(t, err)
	require.Zero(t, res.ExitCode)
	t.Logf("figure: sandboxes create (warm claim) → running (API + gateway + instance.resume): %s; → exec ready: %s; one exec (ticket + tunnel + SSH handshake + session) on the ready guest: %s",
		resumed.Round(time.Millisecond), ready.Round(100*time.Millisecond), time.Since(one).Round(time.Millisecond))

	run := func(cmd string) string { return g.Run(t, target, cmd) }
	require.Contains(t, run("uname -a"), "Linux")
	run("echo written-before > ~/marker; sync")

	s, err := g.Acme.Sandboxes.Snapshot(ctx, connect.NewRequest(&apiv1.SnapshotSandboxRequest{Tenant: "acme", Sandbox: sb.GetId()}))
	require.NoError(t, err)
	snap := s.Msg.GetSnapshot().GetId()
	start = time.Now()
	bctest.WaitFor(t, "the snapshot ready", func() bool {
		return gs.count(t, `SELECT COUNT(*) FROM sandbox_snapshots WHERE id = $1 AND state = 'ready'`, snap) == 1
	})
	t.Logf("figure: sandboxes snapshot (512 MiB guest, TCG): %s", time.Since(start).Round(10*time.Millisecond))
	run("echo changed-after > ~/marker; touch ~/later; sync")

	start = time.Now()
	r, err := g.Acme.Sandboxes.Restore(ctx, connect.NewRequest(&apiv1.RestoreSandboxRequest{Tenant: "acme", Sandbox: sb.GetId(), Snapshot: snap}))
	require.NoError(t, err)
	require.Equal(t, "restoring", r.Msg.GetSandbox().GetState())
	bctest.WaitFor(t, "sandbox running again", func() bool {
		r, err := g.Acme.Sandboxes.Get(ctx, connect.NewRequest(&apiv1.GetSandboxRequest{Tenant: "acme", Sandbox: sb.GetId()}))
		require.NoError(t, err)
		return r.Msg.GetSandbox().GetState() == "running"
	})
	g.WaitExec(t, target)
	t.Logf("figure: sandboxes restore → exec ready (TCG): %s", time.Since(start).Round(100*time.Millisecond))
	require.Equal(t, "written-before\n", run("cat ~/marker"))
	require.Equal(t, "gone\n", run("test -e ~/later && echo there || echo gone"))

	// TTL expiry deletes the sandbox and its guest.
	in := guestInstance(t, g, sb.GetInstanceId())
	pid := g.QEMUPIDs()[vps.HostID(in.GetId())]
	require.NotZero(t, pid)
	g.CP.Clock.Advance(31 * time.Minute)
	n, err := g.CP.App.Sandboxes.ExpireDue(ctx)
	require.NoError(t, err)
	require.LessOrEqual(t, n, 1, "the periodic sweep may have run first")
	bctest.WaitFor(t, "sandbox deleted", func() bool {
		r, err := g.Acme.Sandboxes.Get(ctx, connect.NewRequest(&apiv1.GetSandboxRequest{Tenant: "acme", Sandbox: sb.GetId()}))
		require.NoError(t, err)
		return r.Msg.GetSandbox().GetState() == "deleted"
	})
	require.Equal(t, 1, gs.count(t, `SELECT COUNT(*) FROM events WHERE type = 'sandbox.expired' AND resource_id = $1`, sb.GetId()))
	waitInstance(t, g, in.GetId(), "deleted")
	bctest.WaitFor(t, "the warm pool drained", func() bool {
		return len(g.QEMUPIDs()) == 0 && gs.count(t, `SELECT COUNT(*) FROM sandbox_templates`) == 0
	})
	requireNothingLeft(t, g, in, linksBefore, pid)
}

// TestGuestSshCrossTenant: two tenants' real guests on one host trust the
// control plane's one SSH CA, each for its own instance id (sshd's
// AuthorizedPrincipalsFile, from the seed). Acme's certificate for its own
// instance, presented straight to the other tenant's guest's sshd (the
// guest pinned by its host certificate), is refused and nothing runs
// there; the same certificate opens acme's own guest; the API gives acme
// no certificate for the other's instance.
func TestGuestSshCrossTenant(t *testing.T) {
	g := bctest.StartGuestRig(t, bctest.GuestRigConfig{Net: "10.213.96."})
	ctx := context.Background()
	_, err := g.Admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "beta"}))
	require.NoError(t, err)
	_, err = g.Admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "beta", Name: "default"}))
	require.NoError(t, err)
	k, err := g.Admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "beta", Role: "admin"}))
	require.NoError(t, err)
	beta := g.CP.Client(k.Msg.GetSecret())
	_, err = g.Acme.Pools.Offer(ctx, connect.NewRequest(&apiv1.OfferPoolRequest{Tenant: "acme", Pool: "vms", To: []string{"beta"}}))
	require.NoError(t, err)

	createA, err := g.Acme.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: "vm-a", Flavor: "small",
		Image: "debian-12", IpPool: "vms"}))
	require.NoError(t, err)
	createB, err := beta.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "beta", Name: "vm-b", Flavor: "small",
		Image: "debian-12", IpPool: "vms"}))
	require.NoError(t, err)
	a := waitInstance(t, g, createA.Msg.GetInstance().GetId(), "running")
	var b *apiv1.Instance
	bctest.WaitFor(t, "beta's instance running", func() bool {
		r, err := beta.Instances.Get(ctx, connect.NewRequest(&apiv1.GetInstanceRequest{Tenant: "beta", Instance: createB.Msg.GetInstance().GetId()}))
		require.NoError(t, err)
		b = r.Msg.GetInstance()
		require.NotEqual(t, "failed", b.GetState(), b.GetMessage())
		return b.GetState() == "running"
	})
	// Both guests answer their own tenant's certificates through the API.
	g.WaitExec(t, bctest.GuestTarget{Instance: a.GetId()})
	betaExec := func(cmd string) (*bctest.GuestExecResult, error) {
		if now := time.Now(); g.CP.Clock.Now().Before(now) {
			g.CP.Clock.Set(now)
		}
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return bctest.GuestExec(ctx, beta, g.CP.URL, bctest.GuestTarget{Tenant: "beta", Instance: b.GetId()}, cmd)
	}
	var res *bctest.GuestExecResult
	bctest.WaitFor(t, "exec in beta's guest", func() bool {
		res, err = betaExec("cat /etc/ssh/better_compute_principals/bc")
		return err == nil && res.ExitCode == 0
	})
	require.Equal(t, b.GetId()+"\n", res.Stdout, "the seed wrote the guest's own principal")

	// Acme's certificate for vm-a, straight to each guest's sshd.
	g.CP.Clock.Set(time.Now())
	key, err := sshexec.NewKey()
	require.NoError(t, err)
	tk, err := g.Acme.Instances.Ssh(ctx, connect.NewRequest(&apiv1.SshInstanceRequest{Tenant: "acme", Instance: a.GetId(), PublicKey: key.AuthorizedKey}))
	require.NoError(t, err)
	direct := func(in *apiv1.Instance) func(ctx context.Context, network, _ string) (net.Conn, error) {
		return func(ctx context.Context, network, _ string) (net.Conn, error) {
			return g.Dial(ctx, network, net.JoinHostPort(in.GetAddress(), "22"))
		}
	}
	present := func(in *apiv1.Instance, cmd string) (*sshca.ExecResult, error) {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		return bctest.GuestPresent(ctx, tk.Msg.GetTicket(), key, vps.HostID(in.GetId()), direct(in), cmd)
	}
	intruded, err := present(b, "touch /tmp/intruded")
	require.ErrorContains(t, err, "unable to authenticate")
	require.Equal(t, sshca.HostCertValid, intruded.HostCert, "beta's guest was pinned: the refusal is its sshd's")
	own, err := present(a, "hostname")
	require.NoError(t, err)
	require.Zero(t, own.ExitCode)
	require.Equal(t, "vm-a\n", string(own.Stdout))
	res, err = betaExec("test -e /tmp/intruded && echo there || echo absent")
	require.NoError(t, err)
	require.Equal(t, "absent\n", res.Stdout, "nothing ran in beta's guest")

	_, err = g.Acme.Instances.Ssh(ctx, connect.NewRequest(&apiv1.SshInstanceRequest{Tenant: "acme", Instance: b.GetId(), PublicKey: key.AuthorizedKey}))
	require.Equal(t, "NOT_FOUND", client.Code(err), "%v", err)
}
