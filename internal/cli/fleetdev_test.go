package cli

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFleetConfigOnDev is the fleet-as-code acceptance on a real `dev
// --sim-nodes 1 --sim-machines 1`: the example fleet (examples/fleet and
// examples/fleet-machines) applies, plans no changes, exports and plans
// its export with no changes for every scope; a quota changed by hand is
// named by fleet drift; plan --prune with a pool removed lists its delete,
// and apply refuses it while a reservation in it is live.
func TestFleetConfigOnDev(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	state, cfgPath := filepath.Join(dir, "state"), filepath.Join(dir, "config.yaml")
	startDev(t, cfgPath, "sandbox template", "--state-dir", state, "--listen", "127.0.0.1:0", "--gateway-listen", "127.0.0.1:0",
		"--sim-nodes", "1", "--sim-machines", "1", "--sim-cgroups", "plain")
	env := map[string]string{envConfig: cfgPath, "HOME": dir}
	cli := func(code int, argv ...string) result {
		t.Helper()
		a := newApp("test", func(k string) (string, bool) { v, ok := env[k]; return v, ok && v != "" })
		var o, e bytes.Buffer
		got := run(t.Context(), a, argv, strings.NewReader(""), &o, &e)
		require.Equal(t, code, got, "%v\nstdout: %s\nstderr: %s", argv, o.String(), e.String())
		return result{code: got, stdout: o.String(), stderr: e.String()}
	}
	const machines = "../../examples/fleet-machines"

	res := cli(exitPlanChanges, "fleet", "plan", "-f", exampleFleet, "-f", machines)
	require.NotContains(t, res.stdout, "Site sim/sim-site", "dev's site matches its document")
	require.NotContains(t, res.stdout, "Image sim/sample", "dev's sample image matches its reference")
	res = cli(0, "fleet", "apply", "-f", exampleFleet, "-f", machines)
	require.Contains(t, res.stdout, "Applied 12 changes.")
	res = cli(0, "fleet", "plan", "-f", exampleFleet, "-f", machines)
	require.Contains(t, res.stdout, "No changes")

	// Every scope exports to documents that plan no changes.
	for _, scope := range [][]string{{"--tenant", "sim"}, {"--tenant", "research"}, {"--platform"}} {
		out := filepath.Join(dir, "export"+scope[len(scope)-1])
		cli(0, append([]string{"fleet", "export", "-o", out}, scope...)...)
		res = cli(0, "fleet", "plan", "-f", out)
		require.Contains(t, res.stdout, "No changes", "%v", scope)
	}
	res = cli(0, "fleet", "export", "--tenant", "sim", "-o", "-")
	for _, doc := range []string{"kind: SandboxTemplate\nmetadata:\n    name: default\n", "kind: Site\nmetadata:\n    name: sim-site\n",
		"kind: Image\nmetadata:\n    name: sample\n", "kind: Webhook\n"} {
		require.Contains(t, res.stdout, doc)
	}

	// A quota changed by hand: drift names it, and only it.
	cli(0, "quotas", "set", "--tenant", "sim", "--pool", "h100", "--gpus", "6")
	res = cli(exitPlanChanges, "fleet", "drift", "-f", exampleFleet, "-f", machines)
	require.Contains(t, res.stdout, "~ drift Quota sim/pool=h100")
	require.Contains(t, res.stdout, "    spec.gpus: 16 → 6\n")
	require.Contains(t, res.stdout, "Drift: 1 changed by hand, 0 gone (applied → live).")
	cli(0, "fleet", "apply", "-f", exampleFleet, "-f", machines)
	cli(0, "fleet", "drift", "-f", exampleFleet, "-f", machines)

	// The pool removed: plan --prune lists the delete, apply refuses it
	// while a reservation in it is live.
	var created struct{ Reservation struct{ Id string } }
	require.NoError(t, json.Unmarshal([]byte(cli(0, "reservations", "create", "--tenant", "sim", "--pool", "h100", "--gpus", "1", "--for", "1h",
		"-o", "json").stdout), &created))
	require.NotEmpty(t, created.Reservation.Id)
	noH100 := copyExample(t, func(doc string) bool {
		return strings.Contains(doc, "name: h100\n") || strings.Contains(doc, "pool: h100\n")
	})
	res = cli(exitPlanChanges, "fleet", "plan", "-f", noH100, "-f", machines, "--prune")
	require.Contains(t, res.stdout, "- delete Pool sim/h100")
	res = cli(1, "fleet", "apply", "-f", noH100, "-f", machines, "--prune")
	require.Contains(t, res.stderr, "delete Pool sim/h100 refused: FAILED_PRECONDITION")
	// The one made here, and dev's warm sandbox guest once it has booted:
	// one live reservation or more.
	require.Regexp(t, `pool h100 has \d+ live reservations? \(rsv_`, res.stderr)
	require.Contains(t, cli(0, "pools", "get", "h100", "--tenant", "sim").stdout, "active")
}
