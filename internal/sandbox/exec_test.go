package sandbox_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/sandbox"
	"github.com/better-compute/better-compute/internal/sshca"
	"github.com/better-compute/better-compute/internal/sshexec"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vps"
)

func (f *fixture) exec(t *testing.T, id string) (*apiv1.SshTicket, *sshexec.Key, error) {
	t.Helper()
	key, err := sshexec.NewKey()
	require.NoError(t, err)
	res, err := f.acme.Sandboxes.Exec(context.Background(), connect.NewRequest(&apiv1.ExecSandboxRequest{Tenant: "acme", Sandbox: id,
		PublicKey: key.AuthorizedKey}))
	if err != nil {
		return nil, nil, err
	}
	return res.Msg.GetTicket(), key, nil
}

// TestSandboxExec: a sandbox claimed from the warm pool and one booted
// cold both answer exec through the gateway (the guest trusts the CA from
// its seed, paused or not); the certificate never outlives the sandbox;
// after expiry and after delete exec is refused; another tenant finds
// nothing.
func TestSandboxExec(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	ctx := context.Background()
	warm, err := f.acme.SandboxTemplates.Create(ctx, connect.NewRequest(templateReq("warm", 1, 1)))
	require.NoError(t, err)
	require.NoError(t, f.cp.App.Sandboxes.ReconcileWarm(ctx))
	f.warmReady(t, warm.Msg.GetTemplate().GetId(), 1)
	_, err = f.acme.SandboxTemplates.Create(ctx, connect.NewRequest(templateReq("cold", 0, 0)))
	require.NoError(t, err)

	res, err := f.acme.Sandboxes.Create(ctx, connect.NewRequest(&apiv1.CreateSandboxRequest{Tenant: "acme", Template: "warm"}))
	require.NoError(t, err)
	require.Equal(t, "warm", res.Msg.GetSandbox().GetOrigin())
	sb := f.waitSandbox(t, res.Msg.GetSandbox().GetId(), "running")
	warmSB := sb
	f.cp.Authz.Reset()
	tk, key, err := f.exec(t, sb.GetId())
	require.NoError(t, err)
	require.EqualValues(t, 1, f.cp.Authz.CallsFor("sandboxes.exec"))
	var out strings.Builder
	r, err := sshexec.Run(ctx, sshexec.Params{APIURL: f.cp.URL, Ticket: tk, Key: key, Command: "echo warm; exit 7", Stdout: &out})
	require.NoError(t, err)
	require.Equal(t, 7, r.ExitCode)
	require.Equal(t, "warm\n", out.String())
	require.Equal(t, sshca.HostCertValid, r.HostCert)

	// A cold sandbox living 5 minutes: the certificate ends with it.
	res, err = f.acme.Sandboxes.Create(ctx, connect.NewRequest(&apiv1.CreateSandboxRequest{Tenant: "acme", Template: "cold",
		Ttl: durationpb.New(5 * time.Minute)}))
	require.NoError(t, err)
	sb = f.waitSandbox(t, res.Msg.GetSandbox().GetId(), "running")
	tk, key, err = f.exec(t, sb.GetId())
	require.NoError(t, err)
	exp := sb.GetExpireTime().AsTime()
	require.False(t, tk.GetValidBefore().AsTime().After(exp), "the certificate never outlives the sandbox")
	require.WithinDuration(t, exp, tk.GetValidBefore().AsTime(), 2*time.Second)
	require.Equal(t, vps.GuestUser, tk.GetAccount())
	out.Reset()
	r, err = sshexec.Run(ctx, sshexec.Params{APIURL: f.cp.URL, Ticket: tk, Key: key, Command: "uname -a", Stdout: &out})
	require.NoError(t, err)
	require.Zero(t, r.ExitCode)
	require.NotEmpty(t, out.String())

	// The certificate names the cold sandbox's instance only: presented
	// straight to the warm sandbox's guest, it is refused.
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(tk.GetUserCertificate()))
	require.NoError(t, err)
	require.Equal(t, []string{sb.GetInstanceId()}, pub.(*ssh.Certificate).ValidPrincipals)
	hv := f.sim.Daemons[0].Hypervisor()
	warmHost := vps.HostID(warmSB.GetInstanceId())
	ran := hv.CommandsRun(warmHost)
	_, err = bctest.GuestPresent(ctx, tk, key, warmHost, func(ctx context.Context, _, _ string) (net.Conn, error) {
		return hv.DialGuest(ctx, warmHost)
	}, "true")
	require.ErrorContains(t, err, "unable to authenticate")
	require.Equal(t, ran, hv.CommandsRun(warmHost), "nothing ran in the other guest")

	_, err = f.globex.Sandboxes.Exec(ctx, connect.NewRequest(&apiv1.ExecSandboxRequest{Tenant: "globex", Sandbox: sb.GetId(), PublicKey: key.AuthorizedKey}))
	refused(t, err, "NOT_FOUND", "", "sandbox")
	_, err = f.acme.Sandboxes.Exec(ctx, connect.NewRequest(&apiv1.ExecSandboxRequest{Tenant: "acme", Sandbox: sb.GetId(), PublicKey: "nope"}))
	refused(t, err, "INVALID_ARGUMENT", "public_key", "authorized_keys")

	// Past its expire time (before the sweep deletes it) and after.
	f.cp.Clock.Advance(6 * time.Minute)
	_, _, err = f.exec(t, sb.GetId())
	refused(t, err, "FAILED_PRECONDITION", "", "expired")
	// The periodic sweep (River, on wall time) may run first and expire it
	// itself: what matters is that the sandbox is deleted either way.
	n, err := f.cp.App.Sandboxes.ExpireDue(ctx)
	require.NoError(t, err)
	require.LessOrEqual(t, n, 1)
	require.Equal(t, "deleted", f.sandbox(t, sb.GetId()).GetState())
	_, _, err = f.exec(t, sb.GetId())
	refused(t, err, "FAILED_PRECONDITION", "", "deleted")
	require.Equal(t, 2, f.count(t, `SELECT COUNT(*) FROM events WHERE type = 'sandbox.exec_granted'`))
}

// TestWarmGuestSeededBeforeIsReplaced: a warm guest seeded before guests
// had their own SSH principal (its row has none, as migration vps 0005
// leaves it) would refuse every certificate exec gets: the warm sweep
// deletes it and boots a replacement that has one.
func TestWarmGuestSeededBeforeIsReplaced(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	ctx := context.Background()
	res, err := f.acme.SandboxTemplates.Create(ctx, connect.NewRequest(templateReq("warm", 1, 1)))
	require.NoError(t, err)
	tpl := res.Msg.GetTemplate().GetId()
	require.NoError(t, f.cp.App.Sandboxes.ReconcileWarm(ctx))
	f.warmReady(t, tpl, 1)
	var old string
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		ws, err := sandbox.WarmOfTemplate(ctx, tx, tpl)
		if err != nil {
			return err
		}
		require.Len(t, ws, 1)
		old = ws[0].InstanceID
		_, err = tx.Exec(ctx, `UPDATE instances SET ssh_principal = '' WHERE id = $1`, old)
		return err
	}))

	require.NoError(t, f.cp.App.Sandboxes.ReconcileWarm(ctx))
	require.Zero(t, f.count(t, `SELECT COUNT(*) FROM sandbox_warm WHERE instance_id = $1`, old), "out of the pool")
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM instances WHERE id = $1 AND state IN ('deleting', 'deleted')`, old))
	f.warmReady(t, tpl, 1)
	var fresh string
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT instance_id FROM sandbox_warm WHERE template_id = $1`, tpl).Scan(&fresh)
	}))
	p, _, ok := f.guest(fresh)
	require.True(t, ok)
	require.Equal(t, []string{fresh}, p.Seed.AuthorizedPrincipals)

	// A sandbox claims the replacement, and exec gets in.
	c, err := f.acme.Sandboxes.Create(ctx, connect.NewRequest(&apiv1.CreateSandboxRequest{Tenant: "acme", Template: "warm"}))
	require.NoError(t, err)
	require.Equal(t, fresh, c.Msg.GetSandbox().GetInstanceId())
	sb := f.waitSandbox(t, c.Msg.GetSandbox().GetId(), "running")
	tk, key, err := f.exec(t, sb.GetId())
	require.NoError(t, err)
	r, err := sshexec.Run(ctx, sshexec.Params{APIURL: f.cp.URL, Ticket: tk, Key: key, Command: "true"})
	require.NoError(t, err)
	require.Zero(t, r.ExitCode)
}
