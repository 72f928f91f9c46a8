package sshca_test

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/sshca"
)

func nextEvent(t *testing.T, d *bctest.TermSSHD) bctest.TermEvent {
	t.Helper()
	return bctest.Receive(t, "a session request at the guest", d.Events)
}

// readLine reads up to \n from r (the session's output), failing the test
// if the session ends first.
func readLine(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	line, err := r.ReadString('\n')
	require.NoError(t, err)
	return line
}

// TestExecTerminal: a pty request carries the terminal's type and size,
// a resize becomes a window-change, no command is a shell, stdin reaches
// the guest and its exit status comes back.
func TestExecTerminal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := bctest.StartTermSSHD(t, b.ca.PublicKey(), "ins_1", b.hostSig)
	u, err := b.ca.NewUser("ins_1", time.Minute)
	require.NoError(t, err)

	for _, c := range []struct{ name, command, want string }{{"shell", "", "shell"}, {"command", "top -b", "exec"}} {
		t.Run(c.name, func(t *testing.T) {
			inR, inW := io.Pipe()
			outR, outW := io.Pipe()
			resize := make(chan sshca.WindowSize)
			type result struct {
				res *sshca.ExecResult
				err error
			}
			done := make(chan result, 1)
			go func() {
				res, err := sshca.Exec(context.Background(), sshca.ExecParams{Addr: d.Addr, HostName: "guest", User: "bc", Auth: u.Signer,
					HostCA: b.ca.PublicKey(), Command: c.command, Stdin: inR, Stdout: outW,
					Pty: &sshca.Pty{Term: "xterm-256color", Width: 100, Height: 30, Resize: resize}})
				_ = outW.Close()
				done <- result{res, err}
			}()
			require.Equal(t, bctest.TermEvent{Type: "pty-req", Term: "xterm-256color", Width: 100, Height: 30, Permit: true}, nextEvent(t, d))
			ev := nextEvent(t, d)
			require.Equal(t, c.want, ev.Type)
			require.Equal(t, c.command, ev.Command)
			out := bufio.NewReader(outR)
			require.Equal(t, "ready\r\n", readLine(t, out))

			resize <- sshca.WindowSize{Width: 120, Height: 40}
			require.Equal(t, bctest.TermEvent{Type: "window-change", Width: 120, Height: 40, Permit: true}, nextEvent(t, d))

			_, err := io.WriteString(inW, "hello\r")
			require.NoError(t, err)
			require.Equal(t, "got: hello\r\n", readLine(t, out))
			_, err = io.WriteString(inW, "exit 7\r")
			require.NoError(t, err)
			r := <-done
			require.NoError(t, r.err)
			require.Equal(t, 7, r.res.ExitCode)
			require.Equal(t, sshca.HostCertValid, r.res.HostCert)
		})
	}
}

// TestExecTerminalRefused: a certificate without permit-pty gets no
// terminal, and the session says so rather than run without one.
func TestExecTerminalRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := bctest.StartTermSSHD(t, b.ca.PublicKey(), "ins_1", b.hostSig)
	// A certificate as SignUser makes it, less the extension.
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	key, err := ssh.NewSignerFromKey(priv)
	require.NoError(t, err)
	now := time.Now()
	cert := &ssh.Certificate{Key: key.PublicKey(), CertType: ssh.UserCert, ValidPrincipals: []string{"ins_1"},
		ValidAfter: uint64(now.Add(-time.Minute).Unix()), ValidBefore: uint64(now.Add(time.Minute).Unix())}
	require.NoError(t, cert.SignCert(rand.Reader, b.ca.Signer()))
	cs, err := ssh.NewCertSigner(cert, key)
	require.NoError(t, err)
	_, err = sshca.Exec(context.Background(), sshca.ExecParams{Addr: d.Addr, HostName: "guest", User: "bc", Auth: cs,
		HostCA: b.ca.PublicKey(), Pty: &sshca.Pty{Width: 80, Height: 24}})
	require.ErrorContains(t, err, "the guest refused a terminal")
	ev := nextEvent(t, d)
	require.Equal(t, "pty-req", ev.Type)
	require.Equal(t, "xterm", ev.Term, "no $TERM is xterm")
	require.False(t, ev.Permit)
}
