package sshca_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/better-compute/better-compute/internal/sshca"
)

// guest is a real SSH server (x/crypto/ssh) that trusts userCA for logins
// and presents hostKey as its host key: a plain key or a certificate.
type guest struct {
	addr string
}

func startGuest(t *testing.T, userCA ssh.PublicKey, hostKey ssh.Signer) *guest {
	t.Helper()
	checker := &ssh.CertChecker{
		IsUserAuthority: func(auth ssh.PublicKey) bool { return string(auth.Marshal()) == string(userCA.Marshal()) },
	}
	cfg := &ssh.ServerConfig{PublicKeyCallback: checker.Authenticate}
	cfg.AddHostKey(hostKey)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(c, cfg)
		}
	}()
	return &guest{addr: ln.Addr().String()}
}

func serve(c net.Conn, cfg *ssh.ServerConfig) {
	defer func() { _ = c.Close() }()
	_, chans, reqs, err := ssh.NewServerConn(c, cfg)
	if err != nil {
		return
	}
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		ch, creqs, err := nc.Accept()
		if err != nil {
			return
		}
		go func() {
			defer func() { _ = ch.Close() }()
			for r := range creqs {
				if r.Type != "exec" {
					_ = r.Reply(false, nil)
					continue
				}
				_ = r.Reply(true, nil)
				n := binary.BigEndian.Uint32(r.Payload[:4])
				cmd := exec.Command("/bin/sh", "-c", string(r.Payload[4:4+n]))
				cmd.Stdout, cmd.Stderr = ch, ch.Stderr()
				code := 0
				if err := cmd.Run(); err != nil {
					var ee *exec.ExitError
					if errors.As(err, &ee) {
						code = ee.ExitCode()
					} else {
						code = 255
					}
				}
				var st [4]byte
				binary.BigEndian.PutUint32(st[:], uint32(code))
				_, _ = ch.SendRequest("exit-status", false, st[:])
				return
			}
		}()
	}
}

type bundle struct {
	ca      *sshca.CA
	host    *sshca.HostKey
	hostSig ssh.Signer // host key with a valid certificate
}

func setup(t *testing.T) bundle {
	t.Helper()
	ca, err := sshca.New(nil)
	require.NoError(t, err)
	hk, err := sshca.NewHostKey()
	require.NoError(t, err)
	return bundle{ca: ca, host: hk, hostSig: hostSigner(t, ca, hk, time.Hour)}
}

func hostSigner(t *testing.T, ca *sshca.CA, hk *sshca.HostKey, ttl time.Duration) ssh.Signer {
	t.Helper()
	cert, err := ca.SignHost(hk.Signer.PublicKey(), []string{"127.0.0.1", "guest"}, ttl)
	require.NoError(t, err)
	s, err := ssh.NewCertSigner(cert, hk.Signer)
	require.NoError(t, err)
	return s
}

func run(t *testing.T, b bundle, g *guest, user string, u *sshca.UserCert, cmd string) (*sshca.ExecResult, error) {
	t.Helper()
	return sshca.Exec(context.Background(), sshca.ExecParams{
		Addr: g.addr, User: user, Auth: u.Signer, HostCA: b.ca.PublicKey(), Command: cmd,
	})
}

func TestExecWithPinnedHostCertificate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g := startGuest(t, b.ca.PublicKey(), b.hostSig)
	u, err := b.ca.NewUser("alice", 5*time.Minute)
	require.NoError(t, err)

	res, err := run(t, b, g, "alice", u, "echo out; echo err >&2; exit 3")
	require.NoError(t, err)
	require.Equal(t, "out\n", string(res.Stdout))
	require.Equal(t, "err\n", string(res.Stderr))
	require.Equal(t, 3, res.ExitCode)
	require.Equal(t, sshca.HostCertValid, res.HostCert)
}

func TestUserCertificateRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g := startGuest(t, b.ca.PublicKey(), b.hostSig)

	other, err := sshca.New(nil)
	require.NoError(t, err)
	// Same key as the guest trusts, but the clock of an hour ago: expired.
	expiredCA := sshca.FromSigner(caSigner(t, b.ca), func() time.Time { return time.Now().Add(-time.Hour) })
	expired, err := expiredCA.NewUser("alice", 10*time.Minute)
	require.NoError(t, err)
	wrongCA, err := other.NewUser("alice", 10*time.Minute)
	require.NoError(t, err)
	wrongPrincipal, err := b.ca.NewUser("bob", 10*time.Minute)
	require.NoError(t, err)

	for name, u := range map[string]*sshca.UserCert{"expired": expired, "wrong CA": wrongCA, "wrong principal": wrongPrincipal} {
		_, err := run(t, b, g, "alice", u, "true")
		require.Error(t, err, name)
		require.Contains(t, err.Error(), "unable to authenticate", name)
	}
}

// caSigner is the CA's key, to build a second CA value on another clock.
func caSigner(t *testing.T, ca *sshca.CA) ssh.Signer {
	t.Helper()
	return ca.Signer()
}

func TestHostPinningRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	other, err := sshca.New(nil)
	require.NoError(t, err)
	expiredHost := hostSigner(t, sshca.FromSigner(caSigner(t, b.ca), func() time.Time { return time.Now().Add(-2 * time.Hour) }), b.host, time.Hour)

	cases := []struct {
		name string
		key  ssh.Signer
		want sshca.HostCertStatus
	}{
		{"bare host key", b.host.Signer, sshca.HostCertNone},
		{"certificate from another CA", hostSigner(t, other, b.host, time.Hour), sshca.HostCertNone},
		{"expired host certificate", expiredHost, sshca.HostCertExpired},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := startGuest(t, b.ca.PublicKey(), tc.key)
			u, err := b.ca.NewUser("alice", time.Minute)
			require.NoError(t, err)
			res, err := run(t, b, g, "alice", u, "true")
			require.ErrorIs(t, err, sshca.ErrHostNotPinned)
			require.Equal(t, tc.want, res.HostCert)
		})
	}
}

func TestHostCertificateForAnotherName(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g := startGuest(t, b.ca.PublicKey(), b.hostSig)
	u, err := b.ca.NewUser("alice", time.Minute)
	require.NoError(t, err)
	res, err := sshca.Exec(context.Background(), sshca.ExecParams{
		Addr: g.addr, HostName: "someone-else", User: "alice", Auth: u.Signer, HostCA: b.ca.PublicKey(), Command: "true",
	})
	require.ErrorIs(t, err, sshca.ErrHostNotPinned)
	require.Equal(t, sshca.HostCertNone, res.HostCert)
}

func TestSignRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pub := b.host.Signer.PublicKey()
	_, err := b.ca.SignUser(pub, "alice", sshca.MaxUserTTL+time.Second)
	require.ErrorContains(t, err, "ttl")
	_, err = b.ca.SignUser(pub, "", time.Minute)
	require.ErrorContains(t, err, "principal is required")
	_, err = b.ca.SignHost(pub, nil, time.Hour)
	require.ErrorContains(t, err, "hostname is required")

	cert, err := b.ca.SignUser(pub, "alice", sshca.MaxUserTTL)
	require.NoError(t, err)
	require.LessOrEqual(t, time.Until(time.Unix(int64(cert.ValidBefore), 0)), sshca.MaxUserTTL)
	require.Equal(t, []string{"alice"}, cert.ValidPrincipals)
	// Interactive shells need a pty, which OpenSSH grants only on this.
	require.Contains(t, cert.Extensions, "permit-pty")
}

func TestLoadRoundTrip(t *testing.T) {
	t.Parallel()
	hk, err := sshca.NewHostKey()
	require.NoError(t, err)
	ca, err := sshca.Load(hk.PrivatePEM, nil)
	require.NoError(t, err)
	require.Equal(t, hk.Signer.PublicKey().Marshal(), ca.PublicKey().Marshal())
	_, err = sshca.Load([]byte("not a key"), nil)
	require.ErrorContains(t, err, "parse CA key")
}
