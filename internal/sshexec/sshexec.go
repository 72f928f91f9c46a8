// Package sshexec is the client side of exec into guests: an ephemeral key
// for one ticket request, and a command run over SSH through the API's
// tunnel (GET /v1/ssh/tunnel), pinning the guest by the ticket's host CA
// and host name. The CLI and the tests use it.
package sshexec

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"golang.org/x/crypto/ssh"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/sshca"
	"github.com/better-compute/better-compute/internal/tunnel"
)

// Key is an ephemeral key pair for one ticket.
type Key struct {
	Signer ssh.Signer
	// AuthorizedKey is the public key in authorized_keys form, what the
	// ticket APIs take.
	AuthorizedKey string
}

// NewKey generates an Ed25519 key that lives only in memory.
func NewKey() (*Key, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("sshexec: generate key: %w", err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, fmt.Errorf("sshexec: signer: %w", err)
	}
	return &Key{Signer: s, AuthorizedKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.PublicKey())))}, nil
}

// Params is one command through one ticket.
type Params struct {
	// APIURL is the API's base URL (the CLI's --api).
	APIURL string
	// TLS is the client configuration for an https API (nil: defaults).
	TLS    *tls.Config
	Ticket *apiv1.SshTicket
	Key    *Key
	// Command runs in the guest; empty starts the login shell.
	Command string
	// Stdin is forwarded when set; Pty asks for a terminal.
	Stdin io.Reader
	Pty   *sshca.Pty
	// Stdout and Stderr stream the output when set.
	Stdout, Stderr io.Writer
}

// Run opens the ticket's tunnel and runs the command in the guest. The
// result carries the exit code and what the guest presented as its host
// certificate; a guest not pinned by the ticket's CA is refused with
// sshca.ErrHostNotPinned before any command is sent.
func Run(ctx context.Context, p Params) (*sshca.ExecResult, error) {
	t := p.Ticket
	if t == nil || t.GetTicket() == "" || p.Key == nil {
		return nil, errors.New("sshexec: a ticket and its key are required")
	}
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(t.GetUserCertificate()))
	if err != nil {
		return nil, fmt.Errorf("sshexec: user certificate: %w", err)
	}
	cert, ok := pub.(*ssh.Certificate)
	if !ok {
		return nil, errors.New("sshexec: user_certificate is not a certificate")
	}
	auth, err := ssh.NewCertSigner(cert, p.Key.Signer)
	if err != nil {
		return nil, fmt.Errorf("sshexec: the certificate is not for this key: %w", err)
	}
	ca, _, _, _, err := ssh.ParseAuthorizedKey([]byte(t.GetHostCaKey()))
	if err != nil {
		return nil, fmt.Errorf("sshexec: host CA key: %w", err)
	}
	return sshca.Exec(ctx, sshca.ExecParams{
		Addr: net.JoinHostPort(t.GetHostName(), "22"), HostName: t.GetHostName(), User: t.GetAccount(), Auth: auth, HostCA: ca,
		Command: p.Command, Stdin: p.Stdin, Pty: p.Pty, Stdout: p.Stdout, Stderr: p.Stderr,
		Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return tunnel.Dial(ctx, p.APIURL, t.GetTicket(), p.TLS)
		},
	})
}
