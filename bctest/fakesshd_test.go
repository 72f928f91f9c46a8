package bctest

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/better-compute/better-compute/internal/sshca"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

// TestFakeSSHDPrincipals: the fake guest's sshd admits a CA certificate as
// sshd does with the seed's AuthorizedPrincipalsFile: only for a principal
// the seed lists, never for the account name all guests share; a seed with
// no principals (guests seeded before them) wants the account name, as
// sshd without the file does, so it refuses a certificate for an instance.
func TestFakeSSHDPrincipals(t *testing.T) {
	t.Parallel()
	ca, err := sshca.New(nil)
	require.NoError(t, err)
	otherCA, err := sshca.New(nil)
	require.NoError(t, err)
	hk, err := sshca.NewHostKey()
	require.NoError(t, err)
	hostCert, err := ca.SignHost(hk.Signer.PublicKey(), []string{"ins-a"}, time.Hour)
	require.NoError(t, err)
	seed := vmcmd.Seed{Hostname: "a", User: "bc", TrustedUserCAKeys: []string{ca.AuthorizedKey()},
		AuthorizedPrincipals: []string{"ins_a"}, HostKey: string(hk.PrivatePEM), HostCertificate: sshca.MarshalCert(hostCert)}
	oldSeed := seed
	oldSeed.AuthorizedPrincipals = nil

	// user is a certificate for principals, from ca (several: what
	// SignUser never makes).
	user := func(ca *sshca.CA, principals ...string) ssh.Signer {
		t.Helper()
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		require.NoError(t, err)
		s, err := ssh.NewSignerFromKey(priv)
		require.NoError(t, err)
		now := time.Now()
		cert := &ssh.Certificate{Key: s.PublicKey(), CertType: ssh.UserCert, ValidPrincipals: principals,
			ValidAfter: uint64(now.Add(-time.Minute).Unix()), ValidBefore: uint64(now.Add(time.Hour).Unix())}
		require.NoError(t, cert.SignCert(rand.Reader, ca.Signer()))
		cs, err := ssh.NewCertSigner(cert, s)
		require.NoError(t, err)
		return cs
	}
	cases := []struct {
		name    string
		seed    vmcmd.Seed
		account string
		auth    ssh.Signer
		ok      bool
	}{
		{"its own principal", seed, "bc", user(ca, "ins_a"), true},
		{"one of several", seed, "bc", user(ca, "ins_z", "ins_a"), true},
		{"another instance's", seed, "bc", user(ca, "ins_b"), false},
		{"the shared account name", seed, "bc", user(ca, "bc"), false},
		{"another CA", seed, "bc", user(otherCA, "ins_a"), false},
		{"another account", seed, "root", user(ca, "ins_a"), false},
		{"old seed: the account name", oldSeed, "bc", user(ca, "bc"), true},
		{"old seed: an instance's", oldSeed, "bc", user(ca, "ins_a"), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := sshdConfig(tc.seed, false, time.Now)
			require.NoError(t, err)
			d, err := startSSHD(cfg, t.TempDir(), nil)
			require.NoError(t, err)
			t.Cleanup(d.close)
			res, err := sshca.Exec(context.Background(), sshca.ExecParams{Addr: d.addr(), HostName: "ins-a", User: tc.account,
				Auth: tc.auth, HostCA: ca.PublicKey(), Command: "exit 3"})
			if !tc.ok {
				require.ErrorContains(t, err, "unable to authenticate")
				require.Zero(t, d.ran())
				return
			}
			require.NoError(t, err)
			require.Equal(t, 3, res.ExitCode)
			require.Equal(t, 1, d.ran())
		})
	}
}
