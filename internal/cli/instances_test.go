package cli

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
)

// TestInstanceCatalogCommands drives flavors and ip-pools against a real
// control plane: a platform flavor acme sees beside its own, a pool with
// its defaults, a refused pool naming its field, and deletes.
func TestInstanceCatalogCommands(t *testing.T) {
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

	require.Contains(t, ok("flavors", "create", "small", "--vcpus", "2", "--memory-mib", "2048", "--disk-gib", "20"), "platform")
	out := ok("flavors", "create", "gpu", "--tenant", "acme", "--vcpus", "16", "--memory-mib", "65536", "--disk-gib", "100",
		"--gpus", "1", "--gpu-model", "H100", "--pinned", "--hugepages")
	require.Contains(t, out, "1 H100")
	require.Contains(t, out, "pinned,hugepages")
	list := ok("flavors", "list", "--tenant", "acme")
	require.Contains(t, list, "small")
	require.Contains(t, list, "gpu")
	require.Contains(t, ok("flavors", "get", "small", "--tenant", "acme"), "2048 MiB")
	code, _, errs := cli("flavors", "create", "bad", "--tenant", "acme", "--vcpus", "0", "--memory-mib", "512", "--disk-gib", "1")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "vcpus")
	// Ballooning flavors and the pools that overcommit memory for them.
	require.Contains(t, ok("flavors", "create", "elastic", "--tenant", "acme", "--vcpus", "2", "--memory-mib", "8192", "--disk-gib", "10",
		"--balloon", "--min-memory-mib", "2048"), "balloon")
	code, _, errs = cli("flavors", "create", "bad", "--tenant", "acme", "--vcpus", "2", "--memory-mib", "8192", "--disk-gib", "10",
		"--balloon", "--hugepages")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "hugepage-backed memory cannot be ballooned")
	require.Contains(t, ok("pools", "create", "elastic", "--tenant", "acme", "--selector", "gpu.model=H100", "--memory-overcommit", "1.5"),
		"memory x1.5")
	code, _, errs = cli("pools", "create", "bad", "--tenant", "acme", "--selector", "gpu.model=H100", "--memory-overcommit", "3")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "policy.memory_overcommit")

	out = ok("ip-pools", "create", "lan", "--tenant", "acme", "--cidr", "10.20.0.0/24", "--dns", "10.20.0.53", "--network", "dc1/br0")
	require.Contains(t, out, "10.20.0.1")
	require.Contains(t, out, "10.20.0.2-10.20.0.254")
	require.Contains(t, out, "0/253")
	require.Contains(t, ok("ip-pools", "list", "--tenant", "acme"), "dc1/br0")
	require.Contains(t, ok("ip-pools", "get", "lan", "--tenant", "acme", "--leases"), "ADDRESS")
	code, _, errs = cli("ip-pools", "create", "bad", "--tenant", "acme", "--cidr", "10.20.0.1/24")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "did you mean 10.20.0.0/24")

	require.Contains(t, ok("ip-pools", "delete", "lan", "--tenant", "acme"), "deleted lan")
	require.Contains(t, ok("flavors", "delete", "gpu", "--tenant", "acme"), "deleted gpu")
}
