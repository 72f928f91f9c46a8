package cli

import (
	"bytes"
	"encoding/pem"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/store/storeopen"
)

// runPKI runs the CLI with no server; pki commands reach the database
// directly.
func runPKI(t *testing.T, argv ...string) result {
	t.Helper()
	a := newApp("v1.2.3", func(string) (string, bool) { return "", false })
	var out, errb bytes.Buffer
	code := run(t.Context(), a, argv, strings.NewReader(""), &out, &errb)
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// pkiStateDir returns a state directory holding a secret, as dev creates it.
func pkiStateDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	secret, err := pki.GenerateSecret()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, pki.SecretFile), []byte(secret+"\n"), 0o600))
	return dir
}

var pinRE = regexp.MustCompile(`(?m)^pin: ([0-9a-f]{64})$`)

func TestPKICommands(t *testing.T) {
	t.Parallel()
	if os.Getenv(pki.SecretEnv) != "" {
		t.Fatalf("unset %s to run this test: it reads the secret from the state directory", pki.SecretEnv)
	}
	state := pkiStateDir(t)

	r := runPKI(t, "pki", "show", "--state-dir", state)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "FAILED_PRECONDITION")
	require.Contains(t, r.stderr, "pki init")

	r = runPKI(t, "pki", "init", "--state-dir", state, "--trust-domain", "fleet.example")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "trust domain: fleet.example\n")
	m := pinRE.FindStringSubmatch(r.stdout)
	require.NotNil(t, m, r.stdout)
	pin := m[1]

	r = runPKI(t, "pki", "init", "--state-dir", state)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "FAILED_PRECONDITION")
	require.Contains(t, r.stderr, "already initialized")

	r = runPKI(t, "pki", "show", "--state-dir", state)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "trust domain: fleet.example\n")
	for _, kind := range []string{"root", "node", "serving", "internal"} {
		require.Regexp(t, `(?m)^`+kind+` CA: +CN=better-compute `+kind+` CA,.*, expires \d{4}-`, r.stdout)
	}
	require.Regexp(t, `(?m)^command-signing root v1: CN=better-compute command-signing root v1,.*, expires \d{4}-`, r.stdout)
	require.NotContains(t, r.stdout, "offline")
	require.Contains(t, r.stdout, "pin: "+pin+"\n")

	out := filepath.Join(t.TempDir(), "gw")
	r = runPKI(t, "pki", "issue-gateway", "--state-dir", state, "--host", "gateway.test", "--host", "127.0.0.1", "--out", out)
	require.Equal(t, 0, r.code, r.stderr)
	fi, err := os.Stat(filepath.Join(out, "gateway.key"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	crt, err := os.ReadFile(filepath.Join(out, "gateway.crt"))
	require.NoError(t, err)
	var chain [][]byte
	for rest := crt; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		chain = append(chain, b.Bytes)
	}
	require.Len(t, chain, 3, "leaf, serving CA, root")
	require.NoError(t, pki.VerifyPinnedChain(chain, pin))

	// Again: the files are replaced.
	r = runPKI(t, "pki", "issue-gateway", "--state-dir", state, "--host", "gateway.test", "--out", out)
	require.Equal(t, 0, r.code, r.stderr)
	crt2, err := os.ReadFile(filepath.Join(out, "gateway.crt"))
	require.NoError(t, err)
	require.NotEqual(t, crt, crt2)
	entries, err := os.ReadDir(out)
	require.NoError(t, err)
	require.Len(t, entries, 2, "no temporary files left")
}

func TestPKIRefusals(t *testing.T) {
	t.Parallel()
	if os.Getenv(pki.SecretEnv) != "" {
		t.Fatalf("unset %s to run this test", pki.SecretEnv)
	}
	state := pkiStateDir(t)
	tests := []struct {
		name string
		argv []string
		want string
	}{
		{"no secret", []string{"pki", "init", "--state-dir", t.TempDir()}, pki.SecretEnv},
		{"bad trust domain", []string{"pki", "init", "--state-dir", state, "--trust-domain", "Bad_Domain"}, "INVALID_ARGUMENT"},
		{"offline root without out", []string{"pki", "init", "--state-dir", state, "--offline-root"}, "root-out"},
		{"root-out without offline root", []string{"pki", "init", "--state-dir", state, "--root-out", t.TempDir()}, "root-out"},
		{"gateway without host", []string{"pki", "issue-gateway", "--state-dir", state, "--out", t.TempDir()}, "host"},
		{"gateway without out", []string{"pki", "issue-gateway", "--state-dir", state, "--host", "gw"}, "out"},
	}
	for _, tt := range tests {
		r := runPKI(t, tt.argv...)
		require.Equal(t, 1, r.code, tt.name)
		require.Contains(t, r.stderr, tt.want, tt.name)
	}
}

func TestPKIOfflineRoot(t *testing.T) {
	t.Parallel()
	if os.Getenv(pki.SecretEnv) != "" {
		t.Fatalf("unset %s to run this test", pki.SecretEnv)
	}
	state := pkiStateDir(t)
	rootOut := filepath.Join(t.TempDir(), "offline")
	r := runPKI(t, "pki", "init", "--state-dir", state, "--offline-root", "--root-out", rootOut)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "root.key")
	fi, err := os.Stat(filepath.Join(rootOut, "root.key"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	r = runPKI(t, "pki", "show", "--state-dir", state)
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `(?m)^root CA: .*\(key offline\)$`, r.stdout)
	require.Regexp(t, `(?m)^command-signing root v1: .*\(key offline\)$`, r.stdout)
	fi, err = os.Stat(filepath.Join(rootOut, "command-root-1.key"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	// The gateway is issued by the serving CA: no root key needed.
	r = runPKI(t, "pki", "issue-gateway", "--state-dir", state, "--host", "gw.test", "--out", t.TempDir())
	require.Equal(t, 0, r.code, r.stderr)
}

// TestPKIRotateWorkloadKey: each rotation prints a new kid, and the newest
// two are what the JWKS publishes.
func TestPKIRotateWorkloadKey(t *testing.T) {
	t.Parallel()
	if os.Getenv(pki.SecretEnv) != "" {
		t.Fatalf("unset %s to run this test: it reads the secret from the state directory", pki.SecretEnv)
	}
	state := pkiStateDir(t)
	var kids []string
	for range 3 {
		r := runPKI(t, "pki", "rotate-workload-key", "--state-dir", state)
		require.Equal(t, 0, r.code, r.stderr)
		m := regexp.MustCompile(`^workload key: ([A-Za-z0-9_-]{43})\n$`).FindStringSubmatch(r.stdout)
		require.NotNil(t, m, r.stdout)
		kids = append(kids, m[1])
	}
	require.Len(t, map[string]bool{kids[0]: true, kids[1]: true, kids[2]: true}, 3)
	db, err := storeopen.Open(t.Context(), store.Config{StateDir: state})
	require.NoError(t, err)
	defer func() { _ = db.Close() }()
	s, err := pki.LoadSealer(nil, state)
	require.NoError(t, err)
	set, err := pki.NewWorkloadKeys(db, s).JWKS(t.Context())
	require.NoError(t, err)
	require.Len(t, set.Keys, 2)
	require.Equal(t, []string{kids[2], kids[1]}, []string{set.Keys[0].KeyID, set.Keys[1].KeyID})
}
