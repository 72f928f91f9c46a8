package bctest

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/better-compute/better-compute/internal/agent/confine"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

// fakeSSHD is a fake guest's sshd: a real golang.org/x/crypto/ssh server
// configured from the guest's cloud-init seed as the real guest's sshd is
// (HostKey, HostCertificate, TrustedUserCAKeys, AuthorizedPrincipalsFile,
// AuthorizedKeys). It accepts, for the seed's account, a user certificate
// signed by a trusted CA, valid now, that names one of the seed's
// authorized principals (or, for a seed without them, the account, as
// sshd without an AuthorizedPrincipalsFile does), or a plain authorized
// key, and runs exec requests with /bin/sh -c in the guest's fs directory
// (HOME and cwd there), confined as bcd confines an allocation's processes
// where this process can (guestJail): its own uid, and nothing of the
// node's state or of other guests reachable.
type fakeSSHD struct {
	cfg  *ssh.ServerConfig
	dir  string
	jail *guestJail
	ln   net.Listener
	wg   sync.WaitGroup
	// Commands counts the exec requests the guest ran.
	mu       sync.Mutex
	commands int
}

// sshdConfig builds the server configuration from the seed. uncertified
// drops the host certificate (a guest whose host key the CA never signed).
func sshdConfig(seed vmcmd.Seed, uncertified bool, now func() time.Time) (*ssh.ServerConfig, error) {
	var cas, keys [][]byte
	for _, k := range seed.TrustedUserCAKeys {
		pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k))
		if err != nil {
			return nil, fmt.Errorf("seed trusted_user_ca_keys: %w", err)
		}
		cas = append(cas, pub.Marshal())
	}
	for _, k := range seed.AuthorizedKeys {
		pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k))
		if err != nil {
			return nil, fmt.Errorf("seed authorized_keys: %w", err)
		}
		keys = append(keys, pub.Marshal())
	}
	checker := &ssh.CertChecker{
		Clock: now,
		IsUserAuthority: func(auth ssh.PublicKey) bool {
			return slices.ContainsFunc(cas, func(b []byte) bool { return bytes.Equal(b, auth.Marshal()) })
		},
		UserKeyFallback: func(conn ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			if conn.User() == seed.User && slices.ContainsFunc(keys, func(b []byte) bool { return bytes.Equal(b, key.Marshal()) }) {
				return &ssh.Permissions{}, nil
			}
			return nil, errors.New("key not authorized")
		},
	}
	cfg := &ssh.ServerConfig{
		ServerVersion: "SSH-2.0-OpenSSH_9.2 bctest",
		PublicKeyCallback: func(conn ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			if conn.User() != seed.User {
				return nil, fmt.Errorf("no account %q", conn.User())
			}
			cert, ok := key.(*ssh.Certificate)
			if !ok {
				return checker.Authenticate(conn, key)
			}
			return authenticateCert(checker, seed, cert)
		},
	}
	var hostKey ssh.Signer
	if seed.HostKey != "" && !uncertified {
		s, err := ssh.ParsePrivateKey([]byte(seed.HostKey))
		if err != nil {
			return nil, fmt.Errorf("seed host_key: %w", err)
		}
		hostKey = s
		if seed.HostCertificate != "" {
			pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(seed.HostCertificate))
			if err != nil {
				return nil, fmt.Errorf("seed host_certificate: %w", err)
			}
			cert, ok := pub.(*ssh.Certificate)
			if !ok {
				return nil, errors.New("seed host_certificate is not a certificate")
			}
			cs, err := ssh.NewCertSigner(cert, s)
			if err != nil {
				return nil, fmt.Errorf("seed host_certificate: %w", err)
			}
			cfg.AddHostKey(cs)
		}
	} else {
		// No seeded key: the guest makes its own, as sshd-keygen does.
		hk, err := newHostSigner()
		if err != nil {
			return nil, err
		}
		hostKey = hk
	}
	cfg.AddHostKey(hostKey)
	return cfg, nil
}

// authenticateCert admits a user certificate as sshd does for the seed:
// from a trusted CA, and naming a principal of the account's
// AuthorizedPrincipalsFile (the seed's authorized principals); a seed
// without them has no such file, and sshd then wants the account name.
// Validity, signature and critical options are the checker's.
func authenticateCert(checker *ssh.CertChecker, seed vmcmd.Seed, cert *ssh.Certificate) (*ssh.Permissions, error) {
	if cert.CertType != ssh.UserCert {
		return nil, errors.New("not a user certificate")
	}
	if !checker.IsUserAuthority(cert.SignatureKey) {
		return nil, errors.New("certificate signed by an untrusted CA")
	}
	allowed := seed.AuthorizedPrincipals
	if len(allowed) == 0 {
		allowed = []string{seed.User}
	}
	i := slices.IndexFunc(cert.ValidPrincipals, func(p string) bool { return slices.Contains(allowed, p) })
	if i < 0 {
		return nil, fmt.Errorf("certificate principals %q are not authorized for %s", cert.ValidPrincipals, seed.User)
	}
	if err := checker.CheckCert(cert.ValidPrincipals[i], cert); err != nil {
		return nil, err
	}
	return &cert.Permissions, nil
}

func startSSHD(cfg *ssh.ServerConfig, dir string, jail *guestJail) (*fakeSSHD, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("guest fs: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	d := &fakeSSHD{cfg: cfg, dir: dir, jail: jail, ln: ln}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			d.wg.Add(1)
			go func() {
				defer d.wg.Done()
				d.serve(c)
			}()
		}
	}()
	return d, nil
}

func (d *fakeSSHD) addr() string { return d.ln.Addr().String() }

func (d *fakeSSHD) close() { _ = d.ln.Close() }

func (d *fakeSSHD) ran() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.commands
}

func (d *fakeSSHD) serve(c net.Conn) {
	defer func() { _ = c.Close() }()
	// A client that never finishes the handshake is dropped.
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	conn, chans, reqs, err := ssh.NewServerConn(c, d.cfg)
	if err != nil {
		return
	}
	_ = c.SetDeadline(time.Time{})
	defer func() { _ = conn.Close() }()
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		if nc.ChannelType() != "session" {
			_ = nc.Reject(ssh.UnknownChannelType, "only sessions")
			continue
		}
		ch, creqs, err := nc.Accept()
		if err != nil {
			continue
		}
		go d.session(ch, creqs)
	}
}

// session answers one session channel: env is ignored, exec runs; shells
// and ptys are refused (the fake has no terminal).
func (d *fakeSSHD) session(ch ssh.Channel, reqs <-chan *ssh.Request) {
	defer func() { _ = ch.Close() }()
	for r := range reqs {
		switch r.Type {
		case "env":
			_ = r.Reply(true, nil)
		case "exec":
			var p struct{ Command string }
			if err := ssh.Unmarshal(r.Payload, &p); err != nil {
				_ = r.Reply(false, nil)
				continue
			}
			_ = r.Reply(true, nil)
			code := d.run(ch, p.Command)
			var status [4]byte
			binary.BigEndian.PutUint32(status[:], uint32(code))
			_, _ = ch.SendRequest("exit-status", false, status[:])
			return
		default:
			_ = r.Reply(false, nil)
		}
	}
}

func (d *fakeSSHD) run(ch ssh.Channel, command string) int {
	d.mu.Lock()
	d.commands++
	d.mu.Unlock()
	cmd, confined, err := d.jail.command(command)
	if err != nil {
		_, _ = fmt.Fprintf(ch.Stderr(), "sh: %v\n", err)
		return 127
	}
	cmd.Env = []string{"HOME=" + d.dir, "PATH=/usr/local/bin:/usr/bin:/bin"}
	cmd.Stdin = io.LimitReader(ch, 0)
	cmd.Stdout, cmd.Stderr = ch, ch.Stderr()
	if confined {
		var p *confine.Process
		if p, err = confine.Start(cmd); err == nil {
			err = cmd.Wait()
			if st, ok := p.Status(); ok && st.StartError != "" {
				_, _ = fmt.Fprintf(ch.Stderr(), "sh: %s\n", st.StartError)
				return 127
			}
		}
	} else {
		err = cmd.Run()
	}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exitErr) && exitErr.ExitCode() >= 0:
		return exitErr.ExitCode()
	default:
		_, _ = fmt.Fprintf(ch.Stderr(), "sh: %v\n", err)
		return 127
	}
}

func newHostSigner() (ssh.Signer, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("guest host key: %w", err)
	}
	return ssh.NewSignerFromKey(priv)
}
