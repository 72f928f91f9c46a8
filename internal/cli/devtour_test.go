package cli

import (
	"bytes"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/doctest"
)

// devTourCapacity are the README tour's capacity lines that this test runs
// as written (with the member's key in place of bc_...).
var devTourCapacity = []string{
	"bin/better-compute tenants create acme",
	"bin/better-compute projects create --tenant acme web",
	"bin/better-compute quotas set --tenant acme --pool h100 --gpus 8",
	"bin/better-compute api-keys create --tenant acme --role member",
	"bin/better-compute --token bc_... reservations preview --tenant acme --pool h100 --gpus 4 --for 1h",
	"bin/better-compute --token bc_... reserve --tenant acme --pool h100 --gpus 4 --for 1h",
	"bin/better-compute --token bc_... reserve --tenant acme --pool h100 --gpus 8 --for 1h",
	"bin/better-compute reservations list --on-my-pools",
	"bin/better-compute capacity by-consumer",
}

// TestDevTourBudgetAndTenantDelete walks what a newcomer's first week does
// on `dev --sim-nodes 2`: the README's capacity tour as written, then the
// pool's owner prices it, the tenant gets a hard budget the next booking
// would pass (SPEND_LIMIT_REACHED with the amounts), and the tenant is
// suspended, listed for deletion and deleted with a second admin's
// approval, leaving nothing of it but the audit log.
func TestDevTourBudgetAndTenantDelete(t *testing.T) {
	t.Parallel()
	readme := doctest.Read(t, "README.md")
	for _, line := range devTourCapacity {
		require.Contains(t, readme, line, "the README tour runs what this test runs")
	}
	dir := t.TempDir()
	state, cfgPath := filepath.Join(dir, "state"), filepath.Join(dir, "config.yaml")
	startDev(t, cfgPath, "sandbox template", "--state-dir", state, "--listen", "127.0.0.1:0", "--gateway-listen", "127.0.0.1:0", "--sim-nodes", "2")

	env := map[string]string{envConfig: cfgPath, "HOME": dir}
	cli := func(argv ...string) (int, string, string) {
		a := newApp("test", func(k string) (string, bool) { v, ok := env[k]; return v, ok && v != "" })
		var o, e bytes.Buffer
		code := run(t.Context(), a, argv, strings.NewReader(""), &o, &e)
		return code, o.String(), e.String()
	}
	ok := func(argv ...string) string {
		t.Helper()
		code, out, errs := cli(argv...)
		require.Equal(t, 0, code, "%v: %s", argv, errs)
		return out
	}
	secretRE := regexp.MustCompile(`secret: (bc_[A-Za-z0-9]+)`)
	var member, acmeID string
	tour := func(line string) (int, string, string) {
		argv := strings.Fields(line)[1:]
		for i, a := range argv {
			if a == "bc_..." {
				argv[i] = member
			}
		}
		return cli(argv...)
	}
	for i, line := range devTourCapacity {
		code, out, errs := tour(line)
		switch i {
		case 0:
			require.Equal(t, 0, code, errs)
			acmeID = regexp.MustCompile(`tnt_[0-9a-z]{26}`).FindString(out)
			require.NotEmpty(t, acmeID, out)
		case 3:
			require.Equal(t, 0, code, errs)
			m := secretRE.FindStringSubmatch(out)
			require.NotNil(t, m, out)
			member = m[1]
		case 5:
			require.Equal(t, 0, code, errs)
			require.Contains(t, out, "active")
		case 6:
			require.Equal(t, 1, code, out)
			require.Contains(t, errs, "QUOTA_EXCEEDED")
			require.Contains(t, errs, "h100", "the quota is named as the user named it")
		default:
			require.Equal(t, 0, code, "%s: %s", line, errs)
		}
	}
	rsv := regexp.MustCompile(`rsv_[0-9a-z]{26}`).FindString(ok("reservations", "list", "--tenant", "acme"))
	require.NotEmpty(t, rsv)

	// The owner (sim, the dev context's tenant) prices its pool; acme gets
	// a hard budget that holds its 4-GPU hour (10.00) and not another.
	ok("pools", "update", "h100", "--price-gpu-hour", "H100=2.50")
	ok("budgets", "set", "--tenant", "acme", "--period", "month", "--amount", "15")
	require.Contains(t, ok("budgets", "get", "--tenant", "acme"), "10.00", "the booked hour is committed at the new price")
	code, out, errs := cli("--token", member, "reservations", "preview", "--tenant", "acme", "--pool", "h100", "--gpus", "4", "--for", "1h")
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "10.00", "preview shows what the request costs")
	code, _, errs = cli("--token", member, "reserve", "--tenant", "acme", "--pool", "h100", "--gpus", "4", "--for", "1h")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "SPEND_LIMIT_REACHED")
	require.Contains(t, errs, "15.00")
	code, _, errs = cli("--token", member, "reservations", "extend", "--tenant", "acme", rsv, "--for", "2h")
	require.Equal(t, 1, code, "an extension that would pass the budget is refused too")
	require.Contains(t, errs, "SPEND_LIMIT_REACHED")

	// Suspend: acme's key still reads, cannot write.
	ok("tenants", "suspend", "acme")
	code, _, errs = cli("--token", member, "reserve", "--tenant", "acme", "--pool", "h100", "--gpus", "1", "--for", "1h")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "TENANT_SUSPENDED")
	require.Contains(t, ok("--token", member, "reservations", "list", "--tenant", "acme"), rsv)

	// Delete: the dry run names the rows and what blocks it; the live
	// reservation blocks, then a release and a second admin's approval.
	plan := ok("tenants", "delete", "acme", "--dry-run")
	require.Regexp(t, `(?m)^budgets\s+`, plan)
	require.Regexp(t, `(?m)^blocked-by\s+.*`+rsv, plan)
	ok("reservations", "release", "--tenant", "acme", rsv)
	code, _, errs = cli("tenants", "delete", "acme")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "CONFIRMATION_REQUIRED")
	cfm := regexp.MustCompile(`cfm_[0-9a-z]{26}`).FindString(errs)
	require.NotEmpty(t, cfm, errs)
	second := secretRE.FindStringSubmatch(ok("api-keys", "create", "--role", "platform-admin", "--person", "--name", "second-admin"))
	require.NotNil(t, second)
	ok("--token", second[1], "confirmations", "approve", cfm, "--tenant", "acme")
	ok("tenants", "delete", "acme", "--confirmation-id", cfm)
	code, _, errs = cli("tenants", "get", "acme")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "NOT_FOUND")
	code, _, errs = cli("--token", member, "reservations", "list", "--tenant", "acme")
	require.Equal(t, 1, code, "the deleted tenant's key is gone with it")
	require.Contains(t, errs, "UNAUTHENTICATED")
	require.Contains(t, ok("audit", "list", "--tenant", acmeID), "tenants.delete", "the audit log stays, read by the tenant's id")
	ok("tenants", "create", "globex")
	globex := secretRE.FindStringSubmatch(ok("api-keys", "create", "--tenant", "globex", "--role", "admin"))
	require.NotNil(t, globex)
	code, out, errs = cli("--token", globex[1], "audit", "list", "--tenant", acmeID)
	require.Equal(t, 1, code, "another tenant reads nothing of a deleted tenant's log: %s", out)
	require.Contains(t, errs, "PERMISSION_DENIED")
}
