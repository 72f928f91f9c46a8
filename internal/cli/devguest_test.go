package cli

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/devrig"
	"github.com/better-compute/better-compute/internal/store"
)

// TestDevGuestsAreConfined is issue 21's item 3 as it was reported: on
// dev's simulated nodes a member of another tenant creates an instance in
// dev's pool and runs commands in it. They do not run as root, and nothing
// of dev's state directory (its admin key, its database) is reachable,
// though the guest's own directory lies inside it.
func TestDevGuestsAreConfined(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: guests are confined only where dev runs as root")
	}
	if _, err := os.Stat("/proc/self/ns/user"); err != nil {
		t.Skip("this kernel has no user namespaces (no /proc/self/ns/user): guests cannot be confined")
	}
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	// Outside /tmp, as a dev state directory is: hidden for itself, not
	// only because guests have a /tmp of their own. The key is readable
	// by everyone here, so only hiding keeps it from the guest.
	state, err := os.MkdirTemp("/var/lib", "bctest-dev-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(state) })
	require.NoError(t, os.Chmod(state, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(state, "admin.key"), []byte("bc_admin_secret\n"), 0o644))

	sim, err := devrig.StartFleet(ctx, cp.URL, cp.AdminKey, cp.GatewayAddr, state, 1, nil, "", slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	require.NoError(t, err)
	t.Cleanup(sim.Stop)
	bctest.WaitFor(t, "the simulated node's GPUs in dev's pool", func() bool {
		var n int
		require.NoError(t, cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT COUNT(*) FROM atoms a JOIN node_pools np ON np.node_id = a.node_id
				JOIN pools p ON p.id = np.pool_id WHERE p.name = $1 AND a.kind = 'gpu'`, devrig.Pool).Scan(&n)
		}))
		return n == 8
	})
	admin := cp.Admin()
	_, err = admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "evil"}))
	require.NoError(t, err)
	_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "evil", Name: "default"}))
	require.NoError(t, err)
	key, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "evil", Role: "member"}))
	require.NoError(t, err)

	dir := t.TempDir()
	env := map[string]string{envConfig: filepath.Join(dir, "config.yaml"), envServer: cp.URL, envToken: key.Msg.GetSecret(), "HOME": dir}
	ok := func(argv ...string) string {
		t.Helper()
		a := newApp("test", func(k string) (string, bool) { v, ok := env[k]; return v, ok && v != "" })
		a.retryBackoff = time.Millisecond
		var out, errb bytes.Buffer
		code := run(t.Context(), a, argv, strings.NewReader(""), &out, &errb)
		require.Equal(t, 0, code, "%v: %s", argv, errb.String())
		return out.String()
	}
	require.Contains(t, ok("instances", "create", "evil1", "--tenant", "evil", "--flavor", devrig.Flavor, "--ip-pool", devrig.IPPool, "--pool", devrig.Pool, "--wait", "2m"), "running")
	out := ok("instances", "ssh", "evil1", "--tenant", "evil", "--",
		"id -u; cat "+filepath.Join(state, "admin.key")+" 2>&1; ls "+state+"; pwd")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.NotEqual(t, "0", lines[0], "the guest is not root: %s", out)
	require.NotContains(t, out, "bc_admin_secret", "dev's admin key is out of reach")
	require.Contains(t, out, "admin.key: No such file or directory", "dev's state directory is hidden, not only closed")
	require.True(t, strings.HasPrefix(lines[len(lines)-1], filepath.Join(state, "sim")), "the guest runs in its own directory: %s", out)
}
