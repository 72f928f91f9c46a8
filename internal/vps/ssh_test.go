package vps_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/sshca"
	"github.com/better-compute/better-compute/internal/sshexec"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tunnel"
	"github.com/better-compute/better-compute/internal/vmcmd"
	"github.com/better-compute/better-compute/internal/vps"
)

// runningInstance creates instance name of acme's and waits for it to run.
func (h *hosts) runningInstance(t testing.TB, name string) *apiv1.Instance {
	t.Helper()
	_, err := h.acme.Instances.Create(context.Background(), connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: name,
		Flavor: "small", Image: "debian-12", IpPool: "dev"}))
	require.NoError(t, err)
	return waitState(t, h.acme, name, vps.StateRunning)
}

func sshTicket(t testing.TB, h *hosts, ref string) (*apiv1.SshTicket, *sshexec.Key) {
	t.Helper()
	key, err := sshexec.NewKey()
	require.NoError(t, err)
	res, err := h.acme.Instances.Ssh(context.Background(), connect.NewRequest(&apiv1.SshInstanceRequest{Tenant: "acme", Instance: ref,
		PublicKey: key.AuthorizedKey}))
	require.NoError(t, err)
	return res.Msg.GetTicket(), key
}

// TestInstanceSshThroughGateway: a ticket from the API opens a tunnel over
// the real mTLS gateway to the fake guest's sshd, which the CA's host
// certificate pins; the command runs in the guest's directory with its
// exit code; the ticket opens one tunnel only; the seed carries the CA,
// and nothing of the key material reaches the audit log or events.
func TestInstanceSshThroughGateway(t *testing.T) {
	t.Parallel()
	h := setupHosts(t, 1)
	ctx := context.Background()
	in := h.runningInstance(t, "vm1")

	p, _, ok := h.sim.Daemons[0].Hypervisor().Guest(vps.HostID(in.GetId()))
	require.True(t, ok)
	require.Len(t, p.Seed.TrustedUserCAKeys, 1, "the guest trusts the deployment's CA")
	require.NotEmpty(t, p.Seed.HostKey)
	require.Contains(t, p.Seed.HostCertificate, "ssh-ed25519-cert-v01@openssh.com")

	h.cp.Authz.Reset()
	before := h.cp.Clock.Now()
	tk, key := sshTicket(t, h, "vm1")
	require.EqualValues(t, 1, h.cp.Authz.CallsFor("instances.ssh"), "one decision")
	require.Equal(t, vps.GuestUser, tk.GetAccount())
	require.Equal(t, vps.HostID(in.GetId()), tk.GetHostName())
	require.Equal(t, p.Seed.TrustedUserCAKeys[0], tk.GetHostCaKey())
	require.LessOrEqual(t, tk.GetValidBefore().AsTime().Sub(before), sshca.MaxUserTTL+time.Second, "at most 15 minutes")
	require.LessOrEqual(t, tk.GetTicketExpireTime().AsTime().Sub(before), tunnel.TicketTTL+time.Second)
	require.NotEmpty(t, tk.GetTicket())

	var stdout, stderr strings.Builder
	res, err := sshexec.Run(ctx, sshexec.Params{APIURL: h.cp.URL, Ticket: tk, Key: key,
		Command: "echo hello; pwd; echo oops >&2; echo kept > note; exit 3", Stdout: &stdout, Stderr: &stderr})
	require.NoError(t, err)
	require.Equal(t, 3, res.ExitCode)
	require.Equal(t, sshca.HostCertValid, res.HostCert)
	guestDir := h.sim.Daemons[0].Hypervisor().GuestDir(vps.HostID(in.GetId()))
	resolved, err := filepath.EvalSymlinks(guestDir)
	require.NoError(t, err)
	require.Equal(t, "hello\n"+resolved+"\n", stdout.String())
	require.Equal(t, "oops\n", stderr.String())
	b, err := os.ReadFile(filepath.Join(guestDir, "note"))
	require.NoError(t, err)
	require.Equal(t, "kept\n", string(b), "the command ran in the guest's fs directory")

	// The ticket opened its tunnel; a second use is refused before any
	// node is asked.
	_, err = sshexec.Run(ctx, sshexec.Params{APIURL: h.cp.URL, Ticket: tk, Key: key, Command: "true"})
	var refused *tunnel.RefusedError
	require.ErrorAs(t, err, &refused)
	require.Equal(t, "UNAUTHENTICATED", refused.Code)
	require.Equal(t, 1, h.sim.Daemons[0].Hypervisor().CommandsRun(vps.HostID(in.GetId())))

	// A fresh ticket runs uname.
	tk, key = sshTicket(t, h, in.GetId())
	stdout.Reset()
	res, err = sshexec.Run(ctx, sshexec.Params{APIURL: h.cp.URL, Ticket: tk, Key: key, Command: "uname -a", Stdout: &stdout})
	require.NoError(t, err)
	require.Zero(t, res.ExitCode)
	require.NotEmpty(t, stdout.String())

	require.Equal(t, 2, h.audited(t, "instances.ssh", "OK"))
	require.Equal(t, 2, h.count(t, `SELECT COUNT(*) FROM events WHERE type = 'instance.ssh_granted'`))
	require.Zero(t, h.count(t, `SELECT COUNT(*) FROM events WHERE CAST(data AS TEXT) LIKE '%ssh-ed25519%' OR CAST(data AS TEXT) LIKE '%PRIVATE KEY%'`),
		"no key material in events")
	require.Equal(t, 1, h.count(t, `SELECT COUNT(*) FROM ssh_cas`))
}

// TestInstanceSshRefusals: a bad key names its field; another tenant's
// instance is not found; a stopped instance gets no certificate; nothing
// of a refused request is granted.
func TestInstanceSshRefusals(t *testing.T) {
	t.Parallel()
	h := setupHosts(t, 1)
	ctx := context.Background()
	in := h.runningInstance(t, "vm1")

	for _, bad := range []string{"", "not a key", "ssh-ed25519 AAAA", testKey + "\n" + testKey} {
		_, err := h.acme.Instances.Ssh(ctx, connect.NewRequest(&apiv1.SshInstanceRequest{Tenant: "acme", Instance: "vm1", PublicKey: bad}))
		refused(t, err, "INVALID_ARGUMENT", "public_key", "")
	}

	_, err := h.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "other"}))
	require.NoError(t, err)
	k, err := h.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "other", Role: "admin"}))
	require.NoError(t, err)
	other := h.cp.Client(k.Msg.GetSecret())
	_, err = other.Instances.Ssh(ctx, connect.NewRequest(&apiv1.SshInstanceRequest{Tenant: "other", Instance: in.GetId(), PublicKey: testKey}))
	refused(t, err, "NOT_FOUND", "", "instance")
	_, err = other.Instances.Ssh(ctx, connect.NewRequest(&apiv1.SshInstanceRequest{Tenant: "acme", Instance: in.GetId(), PublicKey: testKey}))
	require.Error(t, err)
	require.Contains(t, []string{"NOT_FOUND", "PERMISSION_DENIED"}, client.Code(err))

	_, err = h.acme.Instances.Stop(ctx, connect.NewRequest(&apiv1.StopInstanceRequest{Tenant: "acme", Instance: "vm1"}))
	require.NoError(t, err)
	waitState(t, h.acme, "vm1", vps.StateStopped)
	_, err = h.acme.Instances.Ssh(ctx, connect.NewRequest(&apiv1.SshInstanceRequest{Tenant: "acme", Instance: "vm1", PublicKey: testKey}))
	refused(t, err, "FAILED_PRECONDITION", "", "needs it running")
	require.Zero(t, h.count(t, `SELECT COUNT(*) FROM events WHERE type = 'instance.ssh_granted'`))
	require.Equal(t, 1, h.audited(t, "instances.ssh", "FAILED_PRECONDITION"), "the refusal is on record")
}

// TestInstanceSshUncertifiedHost: a guest presenting a host key the CA
// never certified is refused before any command runs.
func TestInstanceSshUncertifiedHost(t *testing.T) {
	t.Parallel()
	h := setupHosts(t, 1)
	hv := h.sim.Daemons[0].Hypervisor()
	hv.SetUncertifiedHostKeys(true)
	in := h.runningInstance(t, "vm1")
	tk, key := sshTicket(t, h, "vm1")
	res, err := sshexec.Run(context.Background(), sshexec.Params{APIURL: h.cp.URL, Ticket: tk, Key: key, Command: "touch ran"})
	require.ErrorIs(t, err, sshca.ErrHostNotPinned)
	require.Equal(t, sshca.HostCertNone, res.HostCert)
	require.Zero(t, hv.CommandsRun(vps.HostID(in.GetId())), "no command ran")
	_, err = os.Stat(filepath.Join(hv.GuestDir(vps.HostID(in.GetId())), "ran"))
	require.True(t, errors.Is(err, os.ErrNotExist))
}

// TestTunnelWrongNode: a tunnel id is only attached by the node it was
// issued for; another node presenting it is refused and the request keeps
// waiting for its own node.
func TestTunnelWrongNode(t *testing.T) {
	t.Parallel()
	h := setupHosts(t, 1)
	ctx := context.Background()
	in := h.runningInstance(t, "vm1")
	hub := h.cp.App.Instances.Tunnels()
	id, err := tunnel.NewID()
	require.NoError(t, err)
	p := hub.Expect(id, "nod_someoneelse")
	defer p.Close()
	var cmdID string
	require.NoError(t, h.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		cmdID, err = fleet.SendSystemCommand(ctx, tx, h.cp.App.Gateway, fleet.SystemCommand{TenantID: in.GetTenantId(), NodeID: in.GetNodeId(),
			Kind: vmcmd.KindInstanceTunnel, Params: map[string]any{"instance_id": vps.HostID(in.GetId()), "tunnel_id": id},
			IdempotencyKey: "t/" + id, CreatedBy: "test", TTL: time.Minute, Time: h.cp.Clock.Now(), Signer: h.cp.App.CommandSigner()})
		return err
	}))
	var c fleet.Command
	bctest.WaitFor(t, "the tunnel command ends", func() bool {
		require.NoError(t, h.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
			c, err = fleet.CommandGet(ctx, tx, "", cmdID)
			return err
		}))
		return c.State == fleet.CommandFailed || c.State == fleet.CommandSucceeded
	})
	require.Equal(t, fleet.CommandFailed, c.State)
	require.Contains(t, c.Message, "was not issued for node")
	require.Equal(t, 1, hub.Waiting(), "the request still waits for its own node")
	select {
	case o := <-p.Opened():
		t.Fatalf("a wrong node's stream was handed over: %+v", o)
	default:
	}
}

// TestTunnelCommandFailsFast: a tunnel command the host fails without
// opening a stream (here its deadline passed before it ran: the control
// plane's clock is an hour behind the host's) answers the waiting request
// at once with the reason, rather than after the open timeout.
func TestTunnelCommandFailsFast(t *testing.T) {
	t.Parallel()
	h := setupHosts(t, 1)
	h.runningInstance(t, "vm1")
	h.cp.Clock.Set(time.Now().Add(-time.Hour))
	tk, key := sshTicket(t, h, "vm1")
	_, err := sshexec.Run(context.Background(), sshexec.Params{APIURL: h.cp.URL, Ticket: tk, Key: key, Command: "true"})
	var refused *tunnel.RefusedError
	require.ErrorAs(t, err, &refused)
	// 502 with the command's reason; the open timeout would be a 504.
	require.Equal(t, 502, refused.Status, "%v", err)
	require.Contains(t, refused.Message, "deadline")
}

// TestInstanceSshCertificateOpensOnlyItsGuest: two tenants' guests trust
// the same CA, each for its own instance id only. Acme's certificate,
// obtained through the API for its own instance, opens that guest but is
// refused by the other tenant's guest when presented to its sshd directly
// (the guest pinned, so the refusal is the guest's); asking the API for a
// certificate for the other tenant's instance is NOT_FOUND.
func TestInstanceSshCertificateOpensOnlyItsGuest(t *testing.T) {
	t.Parallel()
	h := setupHosts(t, 1)
	ctx := context.Background()
	a := h.runningInstance(t, "vm-a")

	_, err := h.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "other"}))
	require.NoError(t, err)
	_, err = h.admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "other", Name: "default"}))
	require.NoError(t, err)
	k, err := h.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "other", Role: "admin"}))
	require.NoError(t, err)
	other := h.cp.Client(k.Msg.GetSecret())
	_, err = h.acme.Pools.Offer(ctx, connect.NewRequest(&apiv1.OfferPoolRequest{Tenant: "acme", Pool: "gpu", To: []string{"other"}}))
	require.NoError(t, err)
	c, err := other.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "other", Name: "vm-b",
		Flavor: "small", Image: "debian-12", IpPool: "dev"}))
	require.NoError(t, err)
	var b *apiv1.Instance
	bctest.WaitFor(t, "other's instance running", func() bool {
		g, err := other.Instances.Get(ctx, connect.NewRequest(&apiv1.GetInstanceRequest{Tenant: "other", Instance: c.Msg.GetInstance().GetId()}))
		require.NoError(t, err)
		b = g.Msg.GetInstance()
		return b.GetState() == vps.StateRunning
	})
	require.NotEqual(t, a.GetTenantId(), b.GetTenantId())

	hv := h.sim.Daemons[0].Hypervisor()
	for _, in := range []*apiv1.Instance{a, b} {
		p, _, ok := hv.Guest(vps.HostID(in.GetId()))
		require.True(t, ok)
		require.Equal(t, []string{in.GetId()}, p.Seed.AuthorizedPrincipals, "the guest accepts its own id only")
	}
	dial := func(in *apiv1.Instance) func(ctx context.Context, _, _ string) (net.Conn, error) {
		return func(ctx context.Context, _, _ string) (net.Conn, error) {
			return hv.DialGuest(ctx, vps.HostID(in.GetId()))
		}
	}

	tk, key := sshTicket(t, h, "vm-a")
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(tk.GetUserCertificate()))
	require.NoError(t, err)
	cert := pub.(*ssh.Certificate)
	require.Equal(t, []string{a.GetId()}, cert.ValidPrincipals, "signed for the ticket's instance only")
	require.Empty(t, cert.CriticalOptions)
	// A terminal is allowed (OpenSSH grants a pty only to a certificate
	// that says so); the validity bound stays.
	require.Contains(t, cert.Extensions, "permit-pty")
	require.LessOrEqual(t, time.Until(time.Unix(int64(cert.ValidBefore), 0)), sshca.MaxUserTTL)

	res, err := bctest.GuestPresent(ctx, tk, key, vps.HostID(b.GetId()), dial(b), "touch intruded")
	require.ErrorContains(t, err, "unable to authenticate")
	require.Equal(t, sshca.HostCertValid, res.HostCert, "the other guest was pinned: the refusal is its sshd's")
	require.Zero(t, hv.CommandsRun(vps.HostID(b.GetId())), "nothing ran in the other tenant's guest")
	_, err = os.Stat(filepath.Join(hv.GuestDir(vps.HostID(b.GetId())), "intruded"))
	require.True(t, errors.Is(err, os.ErrNotExist))

	// The same certificate presented the same way opens its own guest.
	res, err = bctest.GuestPresent(ctx, tk, key, vps.HostID(a.GetId()), dial(a), "exit 7")
	require.NoError(t, err)
	require.Equal(t, 7, res.ExitCode)

	// Acme cannot get a certificate for the other tenant's instance: in
	// its own tenant the instance is not found; in the other tenant its
	// key is denied whether the instance exists or not.
	_, err = h.acme.Instances.Ssh(ctx, connect.NewRequest(&apiv1.SshInstanceRequest{Tenant: "acme", Instance: b.GetId(), PublicKey: key.AuthorizedKey}))
	refused(t, err, "NOT_FOUND", "", "instance")
	for _, id := range []string{b.GetId(), "ins_01kbw6wq0n2r2ccxv6ty3x0p9h"} {
		_, err = h.acme.Instances.Ssh(ctx, connect.NewRequest(&apiv1.SshInstanceRequest{Tenant: "other", Instance: id, PublicKey: key.AuthorizedKey}))
		require.Equal(t, "PERMISSION_DENIED", client.Code(err), "%s: %v", id, err)
	}
	require.Equal(t, 1, h.count(t, `SELECT COUNT(*) FROM events WHERE type = 'instance.ssh_granted'`), "only acme's own grant")
}

// TestInstanceSshGuestSeededBefore: an instance whose guest was seeded
// before guests had their own principal (its row has none, as migration
// 0005 leaves it) gets no certificate: FAILED_PRECONDITION naming the
// remedy, on record, and no grant. (Its guest would refuse a certificate
// for an instance id anyway: bctest's fake sshd tests show how.)
func TestInstanceSshGuestSeededBefore(t *testing.T) {
	t.Parallel()
	h := setupHosts(t, 1)
	ctx := context.Background()
	in := h.runningInstance(t, "vm1")
	require.NoError(t, h.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE instances SET ssh_principal = '' WHERE id = $1`, in.GetId())
		return err
	}))
	_, err := h.acme.Instances.Ssh(ctx, connect.NewRequest(&apiv1.SshInstanceRequest{Tenant: "acme", Instance: "vm1", PublicKey: testKey}))
	refused(t, err, "FAILED_PRECONDITION", "", "without its own SSH principal")
	require.Contains(t, client.Detail(err).GetMessage(), "recreate it")
	require.Equal(t, 1, h.audited(t, "instances.ssh", "FAILED_PRECONDITION"))
	require.Zero(t, h.count(t, `SELECT COUNT(*) FROM events WHERE type = 'instance.ssh_granted'`))
}

// TestInstanceGuestIsConfined is issue 21's item 3: a simulated guest's
// command is not the host's root. It runs as a uid of the guest's own, in
// its fs directory, and reaches neither the node's state (its key) nor
// another guest's files.
func TestInstanceGuestIsConfined(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: guests' commands are confined only where the simulator runs as root")
	}
	if _, err := os.Stat("/proc/self/ns/user"); err != nil {
		t.Skip("this kernel has no user namespaces (no /proc/self/ns/user): guests cannot be confined")
	}
	t.Parallel()
	h := setupHosts(t, 1)
	ctx := context.Background()
	vm1 := h.runningInstance(t, "vm1")
	vm2 := h.runningInstance(t, "vm2")
	d := h.sim.Daemons[0]
	other := d.Hypervisor().GuestDir(vps.HostID(vm2.GetId()))
	require.NoError(t, os.WriteFile(filepath.Join(other, "secret"), []byte("vm2's"), 0o644))
	key := filepath.Join(d.StateDir(), "node.key")
	require.FileExists(t, key)

	tk, sshKey := sshTicket(t, h, "vm1")
	var stdout, stderr strings.Builder
	res, err := sshexec.Run(ctx, sshexec.Params{APIURL: h.cp.URL, Ticket: tk, Key: sshKey, Stdout: &stdout, Stderr: &stderr,
		Command: strings.Join([]string{
			"id -u",
			"cat " + key + " && echo LEAK: the node key",
			"cat " + filepath.Join(other, "secret") + " && echo LEAK: the other guest",
			"ls " + d.Hypervisor().Root(),
			"echo kept > note && echo wrote",
		}, "; ")})
	require.NoError(t, err)
	t.Logf("stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	require.Zero(t, res.ExitCode)
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	require.NotEqual(t, "0", lines[0], "not root")
	require.NotContains(t, stdout.String(), "LEAK")
	require.NotContains(t, stdout.String(), vps.HostID(vm2.GetId()), "the other guest's directory is not even listed")
	require.Contains(t, lines, "wrote")
	b, err := os.ReadFile(filepath.Join(d.Hypervisor().GuestDir(vps.HostID(vm1.GetId())), "note"))
	require.NoError(t, err)
	require.Equal(t, "kept\n", string(b), "the guest writes its own directory")
}
