package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
)

// TestMetalCommands drives the sites and machines verbs against a real
// control plane with a simulated site: a site, a machine enrolled with its
// password from a file (never echoed), commissioned to ready with its
// erase record shown, a refused release, retire and the site's delete.
func TestMetalCommands(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	dir := t.TempDir()
	env := map[string]string{envConfig: filepath.Join(dir, "config.yaml"), envServer: cp.URL, envToken: cp.AdminKey, "HOME": dir}
	cli := func(argv ...string) (int, string, string) {
		a := newApp("test", func(k string) (string, bool) { v, ok := env[k]; return v, ok && v != "" })
		a.retryBackoff = time.Millisecond
		var out, errb bytes.Buffer
		code := run(t.Context(), a, argv, strings.NewReader(""), &out, &errb)
		return code, out.String(), errb.String()
	}
	ok := func(argv ...string) string {
		t.Helper()
		code, out, errs := cli(argv...)
		require.Equal(t, 0, code, "%v: %s", argv, errs)
		return out
	}
	ok("tenants", "create", "acme")

	var site struct{ Site struct{ Id string } }
	require.NoError(t, json.Unmarshal([]byte(ok("sites", "create", "dc1", "--tenant", "acme", "--networks", "127.0.0.0/8", "-o", "json")), &site))
	require.Contains(t, ok("sites", "list", "--tenant", "acme"), "127.0.0.0/8")
	require.Contains(t, ok("sites", "update", "dc1", "--tenant", "acme", "--dhcp-mode", "proxy"), "proxy")
	sim := bctest.NewSimSite(t, cp.App.Metal, site.Site.Id)
	sm := sim.AddMachine(t, "m1")

	pwFile := filepath.Join(dir, "bmc-password")
	require.NoError(t, os.WriteFile(pwFile, []byte(sm.Password+"\n"), 0o600))
	code, _, errs := cli("machines", "enroll", "m1", "--tenant", "acme", "--site", "dc1", "--bmc-driver", "redfish",
		"--bmc-address", sm.BMCAddress, "--bmc-username", sm.Username, "--mac", sm.MAC)
	require.Equal(t, 1, code)
	require.Contains(t, errs, "bmc-password-file")
	out := ok("machines", "enroll", "m1", "--tenant", "acme", "--site", "dc1", "--bmc-driver", "redfish",
		"--bmc-address", sm.BMCAddress, "--bmc-username", sm.Username, "--bmc-password-file", pwFile, "--mac", sm.MAC, "-o", "json")
	require.NotContains(t, out, sm.Password)
	require.Contains(t, out, `"enrolled"`)

	require.Contains(t, ok("machines", "commission", "m1", "--tenant", "acme"), "commissioning")
	bctest.WaitFor(t, "m1 to be ready", func() bool {
		return strings.Contains(ok("machines", "list", "--tenant", "acme", "--state", "ready"), "m1")
	})
	got := ok("machines", "get", "m1", "--tenant", "acme")
	require.Contains(t, got, "last wipe (attested=true")
	require.Contains(t, got, "nvme-format")

	code, _, errs = cli("machines", "release", "m1", "--tenant", "acme")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "FAILED_PRECONDITION")
	require.Contains(t, errs, "release starts from deployed, rescue, failed")

	require.Contains(t, ok("machines", "retire", "m1", "--tenant", "acme"), "retired")
	require.Contains(t, ok("sites", "delete", "dc1", "--tenant", "acme"), "deleted dc1")
}
