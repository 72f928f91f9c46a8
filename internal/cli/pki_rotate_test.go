package cli

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/store/storeopen"
)

// TestPKIRotate drives a rotation from the CLI: rotate publishes, status
// shows the node that has not renewed, rotate waits (FAILED_PRECONDITION)
// until it has, and then finishes; show names the new generation's CAs.
func TestPKIRotate(t *testing.T) {
	t.Parallel()
	if os.Getenv(pki.SecretEnv) != "" {
		t.Fatalf("unset %s to run this test: it reads the secret from the state directory", pki.SecretEnv)
	}
	state := pkiStateDir(t)
	r := runPKI(t, "pki", "init", "--state-dir", state)
	require.Equal(t, 0, r.code, r.stderr)
	oldPin := pinRE.FindStringSubmatch(r.stdout)[1]

	// A node holds a certificate of generation 1.
	ctx := t.Context()
	db, err := storeopen.Open(ctx, store.Config{StateDir: state})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	require.NoError(t, db.Migrate(ctx, pki.Migrations()))
	s, err := pki.LoadSealer(nil, state)
	require.NoError(t, err)
	issue := func() {
		t.Helper()
		a, err := pki.Load(ctx, db, s, nil) // what the gateway holds after its refresh
		require.NoError(t, err)
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
		require.NoError(t, err)
		_, _, err = a.IssueNode(ctx, csr, "nod_1", pki.RoleNode, 0)
		require.NoError(t, err)
	}
	issue()

	r = runPKI(t, "pki", "status", "--state-dir", state)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "rotation: steady")

	r = runPKI(t, "pki", "rotate", "--state-dir", state)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "published fleet generation 2 and command-signing root v2")

	r = runPKI(t, "pki", "status", "--state-dir", state)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "fleet generation: 1 serves, 2 published")
	require.Regexp(t, `(?m)^nod_1 .* node +1 .* renews onto generation 2$`, r.stdout)

	r = runPKI(t, "pki", "rotate", "--state-dir", state)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "FAILED_PRECONDITION")
	require.Contains(t, r.stderr, "waits on 1 node certificate")

	r = runPKI(t, "pki", "show", "--state-dir", state)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "(generation 2, published by pki rotate)")

	issue() // the node renews onto generation 2
	r = runPKI(t, "pki", "status", "--state-dir", state)
	require.Regexp(t, `(?m)^nod_1 .* node +2 .* current$`, r.stdout)
	r = runPKI(t, "pki", "rotate", "--state-dir", state)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stdout, "fleet generation: 2 serves\ncommand-signing root: v2 signs, v1 retiring")
	require.Contains(t, r.stderr, "retires at the next pki rotate")
	r = runPKI(t, "pki", "rotate", "--state-dir", state)
	require.Equal(t, 0, r.code, r.stderr+r.stdout)
	require.Contains(t, r.stdout, "rotation finished: generation 2 serves and command-signing root v2 signs")

	r = runPKI(t, "pki", "show", "--state-dir", state)
	require.Equal(t, 0, r.code, r.stderr)
	require.NotContains(t, r.stdout, "pin: "+oldPin)
	require.Regexp(t, `(?m)^root CA: +CN=better-compute g2 root CA,`, r.stdout)
	require.Regexp(t, `(?m)^command-signing root v1: .* \(retired\)$`, r.stdout)

	// An offline root needs somewhere to write the next roots' keys.
	off := pkiStateDir(t)
	rootDir := filepath.Join(t.TempDir(), "root")
	r = runPKI(t, "pki", "init", "--state-dir", off, "--offline-root", "--root-out", rootDir)
	require.Equal(t, 0, r.code, r.stderr)
	r = runPKI(t, "pki", "rotate", "--state-dir", off)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "root-out")
	r = runPKI(t, "pki", "rotate", "--state-dir", off, "--root-out", rootDir)
	require.Equal(t, 0, r.code, r.stderr)
	for _, f := range []string{"root-2.key", "command-root-2.key"} {
		fi, err := os.Stat(filepath.Join(rootDir, f))
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	}
}
