package robot

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/providers"
)

func TestKindOfCode(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		code string
		want providers.ErrorKind
	}{
		{"SERVER_NOT_FOUND", providers.KindNotFound},
		{"NOT_FOUND", providers.KindNotFound},
		{"INVALID_INPUT", providers.KindInvalid},
		{"RATE_LIMIT_EXCEEDED", providers.KindRateLimited},
		{"CONFLICT", providers.KindConflict},
		{"BOOT_ALREADY_ENABLED", providers.KindConflict},
		{"RESET_MANUAL_ACTIVE", providers.KindConflict},
		{"RESET_NOT_AVAILABLE", providers.KindNotSupported},
		{"MAINTENANCE", providers.KindUnavailable},
		{"UNAUTHORIZED", providers.KindAuth},
		{"SOMETHING_NEW", ""},
	} {
		require.Equal(t, c.want, kindOfCode(c.code), c.code)
	}
	for status, want := range map[int]providers.ErrorKind{
		400: providers.KindInvalid, 401: providers.KindAuth, 403: providers.KindForbidden,
		404: providers.KindNotFound, 409: providers.KindConflict, 422: providers.KindInvalid,
		500: providers.KindUnavailable, 503: providers.KindUnavailable,
	} {
		require.Equal(t, want, kindOfStatus(status), status)
	}
	require.Equal(t, time.Second, retryAfter(apiError{}))
	require.Equal(t, time.Second, retryAfter(apiError{MaxRequest: 5000, Interval: 3600}))
}

func TestNames(t *testing.T) {
	t.Parallel()
	n := names{tag: controlPlaneTag("cp1")}
	require.Equal(t, "bc-cp1-ins_a", n.final("ins_a"))
	id, installed, ok := n.parse("bcp-cp1-ins_a")
	require.Equal(t, []any{"ins_a", false, true}, []any{id, installed, ok})
	_, _, ok = names{tag: controlPlaneTag("cp")}.parse("bc-cp1-ins_a")
	require.False(t, ok, "another control plane's claim")
	_, _, ok = n.parse("db-1")
	require.False(t, ok)
	require.Regexp(t, `^h[0-9a-f]{10}$`, controlPlaneTag("control-plane-eu-central"))
	require.False(t, n.validInstanceID("ins a"))
	require.False(t, n.validInstanceID(string(make([]byte, 80))))
	require.Equal(t, "gpu-1", hostname("GPU-1", "ins_x"))
	require.Equal(t, "ins-x", hostname("not a hostname", "ins_x"))
}

func TestRedactUserData(t *testing.T) {
	t.Parallel()
	p := &Provider{user: "#ws+abcdef", password: "webservice-password"}
	msg := p.redact("echoed: content: bcjoin_secret_token_1 and webservice-password",
		"#cloud-config\nwrite_files:\n- content: bcjoin_secret_token_1\n")
	require.NotContains(t, msg, "bcjoin_secret_token_1")
	require.NotContains(t, msg, "webservice-password")
}

func TestHourly(t *testing.T) {
	t.Parallel()
	require.Equal(t, "0.2521", hourly("184.0000"))
	require.Equal(t, "", hourly("n/a"))
}

// The post-install script, run by a real shell, writes the user data into
// the seed byte for byte and removes itself.
func TestPostInstallScriptSeedsUserData(t *testing.T) {
	t.Parallel()
	sh, err := exec.LookPath("sh")
	require.NoError(t, err)
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	require.NoError(t, os.MkdirAll(bin, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(bin, "cloud-init"), []byte("#!/bin/sh\n"), 0o755))
	userData := "#cloud-config\nruncmd:\n- echo 'BC_USER_DATA' \"$HOME\" `x`\n"
	script := postInstallScript(install{instanceID: "ins_a", hostname: "n1", userData: userData})
	seed := filepath.Join(dir, "seed")
	script = strings.ReplaceAll(script, "seed=/var/lib/cloud/seed/nocloud", "seed="+seed)
	path := filepath.Join(dir, "post-install")
	require.NoError(t, os.WriteFile(path, []byte(script), 0o700))
	cmd := exec.Command(sh, path)
	cmd.Env = []string{"PATH=" + bin + ":/usr/bin:/bin"}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	got, err := os.ReadFile(filepath.Join(seed, "user-data"))
	require.NoError(t, err)
	require.Equal(t, userData, string(got))
	meta, err := os.ReadFile(filepath.Join(seed, "meta-data"))
	require.NoError(t, err)
	require.Equal(t, "instance-id: ins_a\nlocal-hostname: n1\n", string(meta))
	_, err = os.Stat(path)
	require.True(t, os.IsNotExist(err), "the script removes itself")
}
