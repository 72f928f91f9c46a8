package sandbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/sshca"
	"github.com/better-compute/better-compute/internal/sshexec"
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

	_, err = f.globex.Sandboxes.Exec(ctx, connect.NewRequest(&apiv1.ExecSandboxRequest{Tenant: "globex", Sandbox: sb.GetId(), PublicKey: key.AuthorizedKey}))
	refused(t, err, "NOT_FOUND", "", "sandbox")
	_, err = f.acme.Sandboxes.Exec(ctx, connect.NewRequest(&apiv1.ExecSandboxRequest{Tenant: "acme", Sandbox: sb.GetId(), PublicKey: "nope"}))
	refused(t, err, "INVALID_ARGUMENT", "public_key", "authorized_keys")

	// Past its expire time (before the sweep deletes it) and after.
	f.cp.Clock.Advance(6 * time.Minute)
	_, _, err = f.exec(t, sb.GetId())
	refused(t, err, "FAILED_PRECONDITION", "", "expired")
	n, err := f.cp.App.Sandboxes.ExpireDue(ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, 1)
	_, _, err = f.exec(t, sb.GetId())
	refused(t, err, "FAILED_PRECONDITION", "", "deleted")
	require.Equal(t, 2, f.count(t, `SELECT COUNT(*) FROM events WHERE type = 'sandbox.exec_granted'`))
}
