package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
)

// TestProfilesCommands: validate shows the expansion, create and update
// take a file (or standard input, as JSON), a bad document's error names
// its field, list shows the built-ins and the tenant's, get shows the
// steps, delete removes it.
func TestProfilesCommands(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	dir := t.TempDir()
	env := map[string]string{envConfig: dir + "/config.yaml", envServer: cp.URL, envToken: cp.AdminKey, "HOME": dir}
	cli := func(stdin string, argv ...string) (int, string, string) {
		a := newApp("test", func(k string) (string, bool) { v, ok := env[k]; return v, ok && v != "" })
		a.retryBackoff = time.Millisecond
		var out, errb bytes.Buffer
		code := run(t.Context(), a, argv, strings.NewReader(stdin), &out, &errb)
		return code, out.String(), errb.String()
	}
	ok := func(stdin string, argv ...string) string {
		t.Helper()
		code, out, errs := cli(stdin, argv...)
		require.Equal(t, 0, code, "%v: %s", argv, errs)
		return out
	}
	ok("", "tenants", "create", "acme")
	doc := `apiVersion: bettercompute.io/v1
kind: DeployProfile
metadata: {name: quick, description: A power cycle with a fallback.}
spec:
  steps:
    - name: cycle
      kind: power.cycle
      destructive: true
      fallback:
        driver.invoke: {operation: power.cycle}
    - {name: check, kind: inventory.refresh, when: input.check == true}
`
	file := filepath.Join(dir, "quick.yaml")
	require.NoError(t, os.WriteFile(file, []byte(doc), 0o600))

	out := ok("", "profiles", "validate", "-f", file, "--tenant", "acme")
	require.Regexp(t, `cycle-fallback\s+driver.invoke\s+true\s+-\s+cycle`, out)
	require.Regexp(t, `check\s+inventory.refresh\s+false\s+input.check == true`, out)
	require.NotContains(t, ok("", "profiles", "list", "--tenant", "acme"), "quick")

	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte(strings.Replace(doc, "input.check == true", "input.check ===", 1)), 0o600))
	code, _, errs := cli("", "profiles", "create", "-f", bad, "--tenant", "acme")
	require.NotZero(t, code)
	require.Contains(t, errs, "spec.steps[1].when")
	code, _, errs = cli("", "profiles", "create", "--tenant", "acme")
	require.NotZero(t, code)
	require.Contains(t, errs, "-f FILE")

	require.Contains(t, ok("", "profiles", "create", "-f", file, "--tenant", "acme"), "quick")
	list := ok("", "profiles", "list", "--tenant", "acme")
	require.Regexp(t, `quick\s+DeployProfile\s+1\s+false`, list)
	require.Regexp(t, `deploy\s+DeployProfile\s+1\s+true`, list)
	require.Contains(t, ok("", "profiles", "get", "deploy", "--tenant", "acme"), "os-joined")

	json := `{"apiVersion":"bettercompute.io/v1","kind":"DeployProfile","metadata":{"name":"quick"},
		"spec":{"steps":[{"name":"cycle","kind":"power.cycle","destructive":true}]}}`
	out = ok(json, "profiles", "update", "quick", "-f", "-", "--format", "json", "--tenant", "acme")
	require.Regexp(t, `quick\s+DeployProfile\s+2`, out)
	require.Contains(t, ok("", "profiles", "get", "quick", "--tenant", "acme", "-o", "json"), `"format": "json"`)
	require.Contains(t, ok("", "profiles", "delete", "quick", "--tenant", "acme"), "deleted quick")
	code, _, errs = cli("", "profiles", "get", "quick", "--tenant", "acme")
	require.NotZero(t, code)
	require.Contains(t, errs, "not found")
}
