package app_test

import (
	"context"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/store"
)

// createTenantVia creates a tenant over plain Connect JSON with an
// X-Forwarded-For header and returns the client address its audit row
// recorded.
func createTenantVia(t *testing.T, cp *bctest.ControlPlane, name, xff string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, cp.URL+"/bettercompute.api.v1.TenantService/Create", strings.NewReader(`{"name":"`+name+`"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+cp.AdminKey)
	if xff != "" {
		req.Header.Set("X-Forwarded-For", xff)
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, res.Body.Close())
	require.Equal(t, http.StatusOK, res.StatusCode)
	reqID := res.Header.Get("X-Request-Id")
	require.NotEmpty(t, reqID)
	var addr string
	require.NoError(t, cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT client_addr FROM audit_log WHERE request_id = $1`, reqID).Scan(&addr)
	}))
	return addr
}

// TestTrustedProxies: the audit row's client address comes from
// X-Forwarded-For only when the request came through a trusted proxy; a
// caller that is not one cannot put an address in the log.
func TestTrustedProxies(t *testing.T) {
	t.Parallel()
	direct := bctest.NewControlPlane(t)
	require.Equal(t, "127.0.0.1", createTenantVia(t, direct, "a", ""), "the peer")
	require.Equal(t, "127.0.0.1", createTenantVia(t, direct, "b", "203.0.113.9"), "an untrusted caller's header is ignored")

	proxied := bctest.NewControlPlane(t, func(c *app.Config) { c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")} })
	require.Equal(t, "203.0.113.9", createTenantVia(t, proxied, "a", "203.0.113.9"), "the client the proxy names")
	require.Equal(t, "203.0.113.9", createTenantVia(t, proxied, "b", "198.51.100.7, 203.0.113.9"),
		"what the client itself sent before the proxy's hop is not believed")
	require.Equal(t, "127.0.0.1", createTenantVia(t, proxied, "c", ""), "the proxy itself when it names no one")
}
