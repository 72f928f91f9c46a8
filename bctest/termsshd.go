package bctest

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
)

// TermEvent is one session request a TermSSHD received, in order.
type TermEvent struct {
	// Type is the request: pty-req, window-change, shell or exec.
	Type string
	// Term, Width and Height come with pty-req (Width and Height with
	// window-change too).
	Term          string
	Width, Height int
	// Command comes with exec.
	Command string
	// Permit is the user certificate's permit-pty extension: whether sshd
	// would have granted the pty.
	Permit bool
}

// TermSSHD is a guest sshd for terminal sessions: a real
// golang.org/x/crypto/ssh server that admits user certificates from a
// CA, grants a pty only to a certificate carrying permit-pty (as OpenSSH
// does), and runs a line-echo "shell" for shell and exec requests: it
// writes "ready\r\n", answers each input line (ended by \r or \n, as a raw
// terminal sends Enter) with "got: LINE\r\n", and a line "exit N" ends the
// session with exit status N; EOF on stdin ends it with 0. Every request
// is sent to Events, so a test waits on them rather than on time.
type TermSSHD struct {
	Addr   string
	Events chan TermEvent
}

// StartTermSSHD listens on 127.0.0.1 until the test ends. It admits user
// certificates signed by userCA that name principal; hostKey is what it presents (a
// certificate signer pins it).
func StartTermSSHD(t testing.TB, userCA ssh.PublicKey, principal string, hostKey ssh.Signer) *TermSSHD {
	t.Helper()
	checker := &ssh.CertChecker{
		IsUserAuthority: func(auth ssh.PublicKey) bool { return string(auth.Marshal()) == string(userCA.Marshal()) },
	}
	cfg := &ssh.ServerConfig{
		PublicKeyCallback: func(_ ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			cert, ok := key.(*ssh.Certificate)
			if !ok {
				return nil, fmt.Errorf("only certificates")
			}
			if cert.CertType != ssh.UserCert || !checker.IsUserAuthority(cert.SignatureKey) {
				return nil, fmt.Errorf("not a user certificate from the trusted CA")
			}
			// CA signature, validity window, critical options and the
			// principal (sshd's AuthorizedPrincipalsFile holds principal).
			if err := checker.CheckCert(principal, cert); err != nil {
				return nil, err
			}
			return &cert.Permissions, nil
		},
	}
	cfg.AddHostKey(hostKey)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("term sshd: %v", err)
	}
	d := &TermSSHD{Addr: ln.Addr().String(), Events: make(chan TermEvent, 64)}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go d.serve(c, cfg)
		}
	}()
	return d
}

func (d *TermSSHD) serve(c net.Conn, cfg *ssh.ServerConfig) {
	defer func() { _ = c.Close() }()
	conn, chans, reqs, err := ssh.NewServerConn(c, cfg)
	if err != nil {
		return
	}
	_, permit := conn.Permissions.Extensions["permit-pty"]
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		if nc.ChannelType() != "session" {
			_ = nc.Reject(ssh.UnknownChannelType, "only sessions")
			continue
		}
		ch, creqs, err := nc.Accept()
		if err != nil {
			return
		}
		go d.session(ch, creqs, permit)
	}
}

func (d *TermSSHD) session(ch ssh.Channel, reqs <-chan *ssh.Request, permit bool) {
	defer func() { _ = ch.Close() }()
	started := make(chan int, 1)
	for {
		select {
		case code := <-started:
			var st [4]byte
			binary.BigEndian.PutUint32(st[:], uint32(code))
			_, _ = ch.SendRequest("exit-status", false, st[:])
			return
		case r, ok := <-reqs:
			if !ok {
				return
			}
			ev := TermEvent{Type: r.Type, Permit: permit}
			reply := true
			switch r.Type {
			case "pty-req":
				var p struct {
					Term                 string
					Cols, Rows, PxW, PxH uint32
					Modes                string
				}
				if ssh.Unmarshal(r.Payload, &p) != nil {
					reply = false
					break
				}
				ev.Term, ev.Width, ev.Height = p.Term, int(p.Cols), int(p.Rows)
				reply = permit
			case "window-change":
				var p struct{ Cols, Rows, PxW, PxH uint32 }
				if ssh.Unmarshal(r.Payload, &p) != nil {
					reply = false
					break
				}
				ev.Width, ev.Height = int(p.Cols), int(p.Rows)
			case "exec", "shell":
				if r.Type == "exec" {
					var p struct{ Command string }
					if ssh.Unmarshal(r.Payload, &p) != nil {
						reply = false
						break
					}
					ev.Command = p.Command
				}
				go func() { started <- echo(ch) }()
			case "env":
			default:
				reply = false
			}
			if r.WantReply {
				_ = r.Reply(reply, nil)
			}
			if r.Type != "env" {
				d.Events <- ev
			}
		}
	}
}

// echo is the session's "shell": see TermSSHD.
func echo(ch ssh.Channel) int {
	if _, err := fmt.Fprint(ch, "ready\r\n"); err != nil {
		return 255
	}
	sc := bufio.NewScanner(ch)
	sc.Split(func(data []byte, atEOF bool) (int, []byte, error) {
		if i := strings.IndexAny(string(data), "\r\n"); i >= 0 {
			return i + 1, data[:i], nil
		}
		if atEOF && len(data) > 0 {
			return len(data), data, nil
		}
		return 0, nil, nil
	})
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		if n, ok := strings.CutPrefix(line, "exit "); ok {
			code, err := strconv.Atoi(n)
			if err == nil {
				return code
			}
		}
		if _, err := fmt.Fprintf(ch, "got: %s\r\n", line); err != nil {
			return 255
		}
	}
	return 0
}
