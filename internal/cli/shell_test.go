package cli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/sshca"
	"github.com/better-compute/better-compute/internal/tunnel"
)

// shellAPI answers InstanceService/Ssh and SandboxService/Exec as the API
// does (a certificate from its CA for the guest's principal, and a
// ticket), and carries the ticket's tunnel to a bctest.TermSSHD.
type shellAPI struct {
	apiv1connect.UnimplementedInstanceServiceHandler
	ca      *sshca.CA
	tickets atomic.Int32
}

func (s *shellAPI) grant(key string) (*apiv1.SshTicket, error) {
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(key))
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	cert, err := s.ca.SignUser(pub, "ins_1", time.Minute)
	if err != nil {
		return nil, err
	}
	n := s.tickets.Add(1)
	return &apiv1.SshTicket{Ticket: fmt.Sprintf("tkt_%d", n), UserCertificate: sshca.MarshalCert(cert), HostCaKey: s.ca.AuthorizedKey(),
		Account: "bc", HostName: "guest"}, nil
}

func (s *shellAPI) Ssh(_ context.Context, req *connect.Request[apiv1.SshInstanceRequest]) (*connect.Response[apiv1.SshInstanceResponse], error) {
	t, err := s.grant(req.Msg.GetPublicKey())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&apiv1.SshInstanceResponse{Ticket: t}), nil
}

type shellSandboxes struct {
	apiv1connect.UnimplementedSandboxServiceHandler
	api *shellAPI
}

func (s shellSandboxes) Exec(_ context.Context, req *connect.Request[apiv1.ExecSandboxRequest]) (*connect.Response[apiv1.ExecSandboxResponse], error) {
	t, err := s.api.grant(req.Msg.GetPublicKey())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&apiv1.ExecSandboxResponse{Ticket: t}), nil
}

type shellRig struct {
	api  *shellAPI
	sshd *bctest.TermSSHD
	env  map[string]string
}

func newShellRig(t *testing.T) *shellRig {
	t.Helper()
	ca, err := sshca.New(nil)
	require.NoError(t, err)
	hk, err := sshca.NewHostKey()
	require.NoError(t, err)
	hc, err := ca.SignHost(hk.Signer.PublicKey(), []string{"guest"}, time.Hour)
	require.NoError(t, err)
	hostSig, err := ssh.NewCertSigner(hc, hk.Signer)
	require.NoError(t, err)
	d := bctest.StartTermSSHD(t, ca.PublicKey(), "ins_1", hostSig)
	api := &shellAPI{ca: ca}
	mux := http.NewServeMux()
	mux.Handle(apiv1connect.NewInstanceServiceHandler(api))
	mux.Handle(apiv1connect.NewSandboxServiceHandler(shellSandboxes{api: api}))
	// The tunnel endpoint as the API answers it: 101, then the guest's
	// sshd on the same connection.
	mux.HandleFunc(tunnel.Path, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(tunnel.HeaderTicket) == "" || r.Header.Get("Upgrade") != tunnel.Protocol {
			http.Error(w, "no ticket", http.StatusUnauthorized)
			return
		}
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		g, err := net.Dial("tcp", d.Addr)
		if err != nil {
			_ = conn.Close()
			return
		}
		if _, err := fmt.Fprintf(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", tunnel.Protocol); err != nil {
			_ = conn.Close()
			_ = g.Close()
			return
		}
		tunnel.Pipe(conn, g)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	return &shellRig{api: api, sshd: d, env: map[string]string{envConfig: filepath.Join(dir, "config.yaml"), envServer: srv.URL,
		envToken: token, "HOME": dir, "TERM": "xterm-256color"}}
}

// start runs the CLI with stdin until it exits, reporting its code on
// the channel; its stdout is the returned reader.
func (r *shellRig) start(t *testing.T, stdin io.Reader, argv ...string) (*bufio.Reader, <-chan int, *strings.Builder) {
	t.Helper()
	a := newApp("test", func(k string) (string, bool) { v, ok := r.env[k]; return v, ok && v != "" })
	outR, outW := io.Pipe()
	var errb strings.Builder
	done := make(chan int, 1)
	go func() {
		code := run(t.Context(), a, argv, stdin, outW, &errb)
		_ = outW.Close()
		done <- code
	}()
	return bufio.NewReader(outR), done, &errb
}

func (r *shellRig) event(t *testing.T) bctest.TermEvent {
	t.Helper()
	return bctest.Receive(t, "a session request at the guest", r.sshd.Events)
}

func termios(t *testing.T, f *os.File) unix.Termios {
	t.Helper()
	var tio *unix.Termios
	require.NoError(t, control(f, func(fd int) (err error) {
		tio, err = unix.IoctlGetTermios(fd, unix.TCGETS)
		return err
	}))
	return *tio
}

func control(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

func line(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	s, err := r.ReadString('\n')
	require.NoError(t, err)
	return s
}

// TestInstancesSshLoginShell: with no command and a terminal on stdin,
// instances ssh opens the login shell on a pty of $TERM and the
// terminal's size, with the terminal raw; a resize (SIGWINCH) reaches the
// guest as a window-change, keys typed reach it and its output comes
// back; its exit status is the CLI's, and the terminal is restored.
func TestInstancesSshLoginShell(t *testing.T) {
	r := newShellRig(t)
	master, tty := bctest.OpenPTY(t, 100, 30)
	cooked := termios(t, tty)
	require.NotZero(t, cooked.Lflag&unix.ECHO, "a fresh terminal echoes")

	out, done, errb := r.start(t, tty, "instances", "ssh", "vm1", "--tenant", "acme")
	require.Equal(t, bctest.TermEvent{Type: "pty-req", Term: "xterm-256color", Width: 100, Height: 30, Permit: true}, r.event(t))
	require.Equal(t, bctest.TermEvent{Type: "shell", Permit: true}, r.event(t))
	require.Equal(t, "ready\r\n", line(t, out))
	raw := termios(t, tty)
	require.Zero(t, raw.Lflag&(unix.ECHO|unix.ICANON|unix.ISIG), "the local terminal is raw during the session")

	// The window grows: the kernel signals the terminal's foreground
	// process; this test is not one, so it sends the signal itself.
	bctest.SetPTYSize(t, master, 120, 40)
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGWINCH))
	require.Equal(t, bctest.TermEvent{Type: "window-change", Width: 120, Height: 40, Permit: true}, r.event(t))

	// Ctrl-C is a byte for the guest in raw mode, not a signal here.
	_, err := master.WriteString("hello\x03\r")
	require.NoError(t, err)
	require.Equal(t, "got: hello\x03\r\n", line(t, out))
	_, err = master.WriteString("exit 3\r")
	require.NoError(t, err)
	require.Equal(t, 3, bctest.Receive(t, "the CLI's exit", done), errb.String())
	require.Equal(t, cooked, termios(t, tty), "the terminal is restored")
}

// TestGuestShellFlags: -it with a command runs it on a pty (sandboxes
// exec too); -i alone forwards stdin with no pty; -t without a terminal,
// no command without one, and -t with -o json are refused before any
// ticket is asked for.
func TestGuestShellFlags(t *testing.T) {
	r := newShellRig(t)
	master, tty := bctest.OpenPTY(t, 80, 24)
	cooked := termios(t, tty)

	out, done, errb := r.start(t, tty, "sandboxes", "exec", "sbx_1", "--tenant", "acme", "-it", "--", "top", "-b")
	require.Equal(t, "pty-req", r.event(t).Type)
	require.Equal(t, bctest.TermEvent{Type: "exec", Command: "top -b", Permit: true}, r.event(t))
	require.Equal(t, "ready\r\n", line(t, out))
	_, err := master.WriteString("exit 0\r")
	require.NoError(t, err)
	require.Equal(t, 0, bctest.Receive(t, "the CLI's exit", done), errb.String())
	require.Equal(t, cooked, termios(t, tty), "the terminal is restored")

	_, tty = bctest.OpenPTY(t, 80, 24)
	cooked = termios(t, tty)
	out, done, errb = r.start(t, strings.NewReader("a\nb\nexit 5\n"), "instances", "ssh", "vm1", "--tenant", "acme", "-i", "--", "cat")
	require.Equal(t, bctest.TermEvent{Type: "exec", Command: "cat", Permit: true}, r.event(t), "no pty without -t")
	rest, err := io.ReadAll(out)
	require.NoError(t, err)
	require.Equal(t, "ready\r\ngot: a\r\ngot: b\r\n", string(rest))
	require.Equal(t, 5, bctest.Receive(t, "the CLI's exit", done), errb.String())
	require.Equal(t, cooked, termios(t, tty), "a terminal never used is left alone")

	before := r.api.tickets.Load()
	for _, c := range []struct {
		stdin io.Reader
		argv  []string
		want  string
	}{
		{strings.NewReader(""), []string{"instances", "ssh", "vm1", "-t", "--", "top"}, "unable to use a TTY: input is not a terminal"},
		{strings.NewReader(""), []string{"instances", "ssh", "vm1"}, "no command and stdin is not a terminal"},
		{strings.NewReader(""), []string{"sandboxes", "exec", "sbx_1"}, "give the command after --, e.g. exec sbx_1 -- uname -a, or -it for a login shell"},
		{tty, []string{"sandboxes", "exec", "sbx_1", "-t"}, "or -it for a login shell"},
		{tty, []string{"instances", "ssh", "vm1", "-it", "-o", "json"}, "--output"},
	} {
		argv := append(append(c.argv[:3:3], "--tenant", "acme"), c.argv[3:]...)
		out, done, errb := r.start(t, c.stdin, argv...)
		_, err := io.ReadAll(out)
		require.NoError(t, err)
		require.Equal(t, 1, bctest.Receive(t, "the CLI's exit", done), "%v", c.argv)
		require.Contains(t, errb.String(), c.want, "%v", c.argv)
	}
	require.Equal(t, before, r.api.tickets.Load(), "no refusal asked for a ticket")
	select {
	case ev := <-r.sshd.Events:
		t.Fatalf("a refused command reached the guest: %+v", ev)
	default:
	}
}
