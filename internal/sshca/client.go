package sshca

import (
	"bytes"
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
)

func pemEncode(typ string, b []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b})
}

// HostCertStatus is what the guest presented when a client dialled it.
type HostCertStatus string

const (
	HostCertValid   HostCertStatus = "valid"
	HostCertExpired HostCertStatus = "expired"
	// HostCertNone: a bare host key, or a certificate from another CA
	// (neither pins the guest).
	HostCertNone HostCertStatus = "none"
)

// ErrHostNotPinned is returned when the guest's host key is not a valid
// certificate from the trusted CA; the session never starts.
var ErrHostNotPinned = errors.New("sshca: guest host key is not pinned by a valid CA certificate")

// ExecParams is one command on one guest.
type ExecParams struct {
	// Addr is host:port of the guest's sshd.
	Addr string
	// HostName is the name the host certificate must carry (defaults to
	// Addr's host).
	HostName string
	// User is the guest account to log in as.
	User string
	// Auth is the signer carrying the user certificate (UserCert.Signer).
	Auth ssh.Signer
	// HostCA is the CA the guest's host certificate must be signed by.
	HostCA ssh.PublicKey
	// Command runs in the guest; empty starts the account's login shell
	// (which wants Pty and Stdin to be of use).
	Command string
	// Stdin, when set, is forwarded to the command; nil sends it EOF.
	Stdin io.Reader
	// Pty, when set, asks the guest for a terminal first.
	Pty *Pty
	// Dial opens the connection (net.Dialer's when nil): a caller reaching
	// a guest in a network namespace brings its own.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Now is the clock host certificates are checked against (time.Now
	// when nil).
	Now func() time.Time
	// Stdout and Stderr, when set, receive the output as it comes
	// (ExecResult then holds none of it).
	Stdout, Stderr io.Writer
}

// Pty is the terminal a session asks for: sshd then runs the command (or
// the shell) on a pseudo-terminal of that type and size.
type Pty struct {
	// Term is the terminal type ($TERM); empty is xterm.
	Term string
	// Width and Height are in characters.
	Width, Height int
	// Resize carries the local terminal's new sizes while the session
	// runs, each forwarded as a window-change request; nil: none.
	Resize <-chan WindowSize
}

// WindowSize is a terminal's size in characters.
type WindowSize struct{ Width, Height int }

// ExecResult is the command's outcome.
type ExecResult struct {
	Stdout, Stderr []byte
	ExitCode       int
	HostCert       HostCertStatus
}

// Exec dials the guest, pins it by its host certificate, runs the command
// and returns its output and exit code. A guest that presents no valid
// host certificate from HostCA is refused with ErrHostNotPinned and the
// status in the result.
func Exec(ctx context.Context, p ExecParams) (*ExecResult, error) {
	if p.Addr == "" || p.User == "" || p.Auth == nil || p.HostCA == nil {
		return nil, errors.New("sshca: exec: addr, user, auth and host CA are required")
	}
	host := p.HostName
	if host == "" {
		h, _, err := net.SplitHostPort(p.Addr)
		if err != nil {
			return nil, fmt.Errorf("sshca: exec: addr %q: %w", p.Addr, err)
		}
		host = h
	}
	now := p.Now
	if now == nil {
		now = time.Now
	}
	res := &ExecResult{HostCert: HostCertNone}
	var mu sync.Mutex
	setStatus := func(s HostCertStatus) { mu.Lock(); res.HostCert = s; mu.Unlock() }
	checker := &ssh.CertChecker{
		Clock: now,
		IsHostAuthority: func(auth ssh.PublicKey, _ string) bool {
			return bytes.Equal(auth.Marshal(), p.HostCA.Marshal())
		},
		// A bare key is never trusted: no first-use pinning.
		HostKeyFallback: func(string, net.Addr, ssh.PublicKey) error {
			setStatus(HostCertNone)
			return ErrHostNotPinned
		},
	}
	cfg := &ssh.ClientConfig{
		User: p.User,
		Auth: []ssh.AuthMethod{ssh.PublicKeys(p.Auth)},
		HostKeyCallback: func(hostname string, remote net.Addr, key ssh.PublicKey) error {
			cert, ok := key.(*ssh.Certificate)
			if !ok {
				return checker.CheckHostKey(hostname, remote, key)
			}
			if cert.CertType != ssh.HostCert || !checker.IsHostAuthority(cert.SignatureKey, hostname) {
				setStatus(HostCertNone)
				return fmt.Errorf("%w: certificate from another CA", ErrHostNotPinned)
			}
			t := uint64(now().Unix())
			if cert.ValidBefore != ssh.CertTimeInfinity && t >= cert.ValidBefore {
				setStatus(HostCertExpired)
				return fmt.Errorf("%w: host certificate expired", ErrHostNotPinned)
			}
			if err := checker.CheckHostKey(net.JoinHostPort(host, "22"), remote, key); err != nil {
				setStatus(HostCertNone)
				return fmt.Errorf("%w: %w", ErrHostNotPinned, err)
			}
			setStatus(HostCertValid)
			return nil
		},
		// Certificates first, so a guest that has one shows it; bare keys
		// stay in the list only to report "none" rather than fail
		// negotiation.
		HostKeyAlgorithms: slices.Concat(certAlgos, plainAlgos),
		Timeout:           30 * time.Second,
	}
	dial := p.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	conn, err := dial(ctx, "tcp", p.Addr)
	if err != nil {
		return res, fmt.Errorf("sshca: dial %s: %w", p.Addr, err)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	c, chans, reqs, err := ssh.NewClientConn(conn, p.Addr, cfg)
	if err != nil {
		_ = conn.Close()
		if s := status(res, &mu); s != HostCertValid {
			return res, fmt.Errorf("%w (%s): %w", ErrHostNotPinned, s, err)
		}
		return res, fmt.Errorf("sshca: handshake with %s: %w", p.Addr, err)
	}
	client := ssh.NewClient(c, chans, reqs)
	defer func() { _ = client.Close() }()
	sess, err := client.NewSession()
	if err != nil {
		return res, fmt.Errorf("sshca: session: %w", err)
	}
	defer func() { _ = sess.Close() }()
	var stdout, stderr bytes.Buffer
	sess.Stdout, sess.Stderr = &stdout, &stderr
	if p.Stdout != nil {
		sess.Stdout = p.Stdout
	}
	if p.Stderr != nil {
		sess.Stderr = p.Stderr
	}
	sess.Stdin = p.Stdin
	if p.Pty != nil {
		term := p.Pty.Term
		if term == "" {
			term = "xterm"
		}
		// Echo is the guest's: the local terminal is raw.
		modes := ssh.TerminalModes{ssh.ECHO: 1, ssh.TTY_OP_ISPEED: 38400, ssh.TTY_OP_OSPEED: 38400}
		if err := sess.RequestPty(term, p.Pty.Height, p.Pty.Width, modes); err != nil {
			return res, fmt.Errorf("sshca: the guest refused a terminal: %w", err)
		}
		if p.Pty.Resize != nil {
			done := make(chan struct{})
			defer close(done)
			go forwardResize(sess, p.Pty.Resize, done)
		}
	}
	if p.Command == "" {
		if err = sess.Shell(); err == nil {
			err = sess.Wait()
		}
	} else {
		err = sess.Run(p.Command)
	}
	res.Stdout, res.Stderr = stdout.Bytes(), stderr.Bytes()
	var exitErr *ssh.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		res.ExitCode = exitErr.ExitStatus()
	default:
		if ctx.Err() != nil {
			return res, fmt.Errorf("sshca: run: %w", ctx.Err())
		}
		return res, fmt.Errorf("sshca: run: %w", err)
	}
	return res, nil
}

// forwardResize sends each new size as a window-change until done.
func forwardResize(sess *ssh.Session, sizes <-chan WindowSize, done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case ws, ok := <-sizes:
			if !ok {
				return
			}
			// A guest that drops it keeps the old size; nothing to undo.
			_ = sess.WindowChange(ws.Height, ws.Width)
		}
	}
}

func status(r *ExecResult, mu *sync.Mutex) HostCertStatus {
	mu.Lock()
	defer mu.Unlock()
	return r.HostCert
}

var certAlgos = []string{
	ssh.CertAlgoED25519v01, ssh.CertAlgoECDSA256v01, ssh.CertAlgoRSASHA512v01, ssh.CertAlgoRSASHA256v01,
}

var plainAlgos = []string{
	ssh.KeyAlgoED25519, ssh.KeyAlgoECDSA256, ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256,
}
