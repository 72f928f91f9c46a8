package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/metal"
	"github.com/better-compute/better-compute/internal/store"
)

// TestDriversList: drivers list shows each site agent's drivers with their
// versions and kind, for every site or the one --site names; a site of
// another tenant is not found. (The site agent's own report is
// internal/agent/site's TestSiteAgentExternalDriver.)
func TestDriversList(t *testing.T) {
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
	ok("tenants", "create", "other")
	var dc1, dc2 struct{ Site struct{ Id string } }
	require.NoError(t, json.Unmarshal([]byte(ok("sites", "create", "dc1", "--tenant", "acme", "--networks", "127.0.0.0/8", "-o", "json")), &dc1))
	require.NoError(t, json.Unmarshal([]byte(ok("sites", "create", "dc2", "--tenant", "acme", "--networks", "127.0.0.0/8", "-o", "json")), &dc2))
	ok("sites", "create", "far", "--tenant", "other", "--networks", "10.0.0.0/8")

	// As dc1's agent's Hello records them.
	require.NoError(t, cp.App.DB.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return metal.SiteDriversReplace(ctx, tx, &metal.SiteDriversReplaceParams{NodeID: "node_site1", SiteID: dc1.Site.Id, ReportTime: time.Now(),
			Drivers: []metal.SiteDriver{
				{Name: "ipmi", Reports: "ipmi", Version: "v0.9.0", BuiltIn: true, Capabilities: []string{"set_password", "boot_override"}},
				{Name: "redfish", Reports: "redfish", Version: "v0.9.0", BuiltIn: true, Capabilities: []string{"boot_override", "virtual_media"}},
				{Name: "acme-bmc", Reports: "acme", Version: "v1.2.0", Path: "/usr/lib/better-compute/drivers/acme-bmc", Capabilities: []string{"set_password"}},
			}})
	}))

	out := ok("drivers", "list", "--tenant", "acme")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 4, out)
	require.Regexp(t, `^SITE\s+AGENT\s+NAME\s+VERSION\s+KIND`, lines[0])
	require.Regexp(t, `^dc1\s+node_site1\s+ipmi\s+v0\.9\.0\s+builtin`, lines[1])
	require.Regexp(t, `^dc1\s+node_site1\s+redfish\s+v0\.9\.0\s+builtin`, lines[2])
	require.Regexp(t, `^dc1\s+node_site1\s+acme-bmc\s+v1\.2\.0\s+external\s+acme\s+set_password\s+/usr/lib/better-compute/drivers/acme-bmc$`, lines[3])

	var js struct {
		Drivers []struct{ Name, Kind, Version, SiteId string }
	}
	require.NoError(t, json.Unmarshal([]byte(ok("drivers", "list", "--tenant", "acme", "--site", "dc1", "-o", "json")), &js))
	require.Len(t, js.Drivers, 3)
	require.Equal(t, "acme-bmc", js.Drivers[2].Name)
	require.Equal(t, "external", js.Drivers[2].Kind)
	require.Equal(t, dc1.Site.Id, js.Drivers[2].SiteId)
	require.NotContains(t, ok("drivers", "list", "--tenant", "acme", "--site", dc2.Site.Id), "ipmi", "dc2's agents reported nothing")

	// A machine may now name the external driver at dc1, not at dc2.
	pw := filepath.Join(dir, "pw")
	require.NoError(t, os.WriteFile(pw, []byte("pw\n"), 0o600))
	ok("machines", "enroll", "m1", "--tenant", "acme", "--site", "dc1", "--bmc-driver", "acme-bmc", "--bmc-address", "127.0.0.5:623",
		"--bmc-username", "admin", "--bmc-password-file", pw, "--mac", "52:54:00:00:09:01")
	code, _, errs := cli("machines", "enroll", "m2", "--tenant", "acme", "--site", "dc2", "--bmc-driver", "acme-bmc", "--bmc-address", "127.0.0.6:623",
		"--bmc-username", "admin", "--bmc-password-file", pw, "--mac", "52:54:00:00:09:02")
	require.Equal(t, 1, code)
	require.Contains(t, errs, `site dc2 has no driver "acme-bmc"`)

	code, _, errs = cli("drivers", "list", "--tenant", "acme", "--site", "far")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "NOT_FOUND")
	code, _, errs = cli("drivers", "list", "--tenant", "acme", "--site", "bad site!")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "INVALID_ARGUMENT")
}
