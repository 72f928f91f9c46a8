package bctest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	"connectrpc.com/connect"
	"golang.org/x/crypto/ssh"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/sshca"
	"github.com/better-compute/better-compute/internal/sshexec"
)

// GuestTarget names the guest to run a command in: an instance or a
// sandbox of a tenant.
type GuestTarget struct {
	Tenant   string
	Instance string
	Sandbox  string
}

// GuestExecResult is one command's outcome in a guest.
type GuestExecResult struct {
	Stdout, Stderr string
	ExitCode       int
	HostCert       sshca.HostCertStatus
}

// GuestExec runs cmd in the target's guest as `better-compute instances
// ssh` and `sandboxes exec` do: an ephemeral key signed by the control
// plane's SSH CA through the API (InstanceService.Ssh or
// SandboxService.Exec), the single-use tunnel through apiURL and the
// host's gateway connection, and the guest pinned by its CA-signed host
// certificate. A guest that is not pinned is an error.
func GuestExec(ctx context.Context, c *client.Client, apiURL string, t GuestTarget, cmd string) (*GuestExecResult, error) {
	key, err := sshexec.NewKey()
	if err != nil {
		return nil, err
	}
	var ticket *apiv1.SshTicket
	switch {
	case t.Sandbox != "":
		r, err := c.Sandboxes.Exec(ctx, connect.NewRequest(&apiv1.ExecSandboxRequest{Tenant: t.Tenant, Sandbox: t.Sandbox, PublicKey: key.AuthorizedKey}))
		if err != nil {
			return nil, err
		}
		ticket = r.Msg.GetTicket()
	case t.Instance != "":
		r, err := c.Instances.Ssh(ctx, connect.NewRequest(&apiv1.SshInstanceRequest{Tenant: t.Tenant, Instance: t.Instance, PublicKey: key.AuthorizedKey}))
		if err != nil {
			return nil, err
		}
		ticket = r.Msg.GetTicket()
	default:
		return nil, errors.New("bctest: a guest target names an instance or a sandbox")
	}
	var stdout, stderr strings.Builder
	res, err := sshexec.Run(ctx, sshexec.Params{APIURL: apiURL, Ticket: ticket, Key: key, Command: cmd, Stdout: &stdout, Stderr: &stderr})
	if err != nil {
		return nil, err
	}
	if res.HostCert != sshca.HostCertValid {
		return nil, fmt.Errorf("bctest: the guest's host certificate is %s", res.HostCert)
	}
	return &GuestExecResult{Stdout: stdout.String(), Stderr: stderr.String(), ExitCode: res.ExitCode, HostCert: res.HostCert}, nil
}

// GuestPresent presents a ticket's user certificate (with its key) straight
// to a guest's sshd, without the ticket's tunnel: what a tenant that can
// reach a guest on the network could try. dial reaches the guest's sshd;
// hostName is the name its host certificate carries (vps.HostID of the
// instance), so the guest is pinned and a refusal is the guest's own.
func GuestPresent(ctx context.Context, tk *apiv1.SshTicket, key *sshexec.Key, hostName string,
	dial func(ctx context.Context, network, addr string) (net.Conn, error), cmd string) (*sshca.ExecResult, error) {
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(tk.GetUserCertificate()))
	if err != nil {
		return nil, fmt.Errorf("bctest: user certificate: %w", err)
	}
	cert, ok := pub.(*ssh.Certificate)
	if !ok {
		return nil, errors.New("bctest: user_certificate is not a certificate")
	}
	auth, err := ssh.NewCertSigner(cert, key.Signer)
	if err != nil {
		return nil, fmt.Errorf("bctest: certificate signer: %w", err)
	}
	ca, _, _, _, err := ssh.ParseAuthorizedKey([]byte(tk.GetHostCaKey()))
	if err != nil {
		return nil, fmt.Errorf("bctest: host CA key: %w", err)
	}
	return sshca.Exec(ctx, sshca.ExecParams{Addr: net.JoinHostPort(hostName, "22"), HostName: hostName, User: tk.GetAccount(),
		Auth: auth, HostCA: ca, Command: cmd, Dial: dial})
}
