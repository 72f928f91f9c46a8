package cli

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
)

// TestBudgetsCLI: budgets set, get, list and delete against a control
// plane, a refusal naming its field, and a pool's prices from the pool
// flags.
func TestBudgetsCLI(t *testing.T) {
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

	code, _, errs := cli("budgets", "set", "--tenant", "acme", "--period", "year", "--amount", "100")
	require.NotZero(t, code)
	require.Contains(t, errs, "period")
	out := ok("budgets", "set", "--tenant", "acme", "--amount", "2500", "--thresholds", "75,90")
	require.Contains(t, out, "month")
	require.Contains(t, out, "2500.00")
	require.Contains(t, out, "75%,90%")
	require.Contains(t, ok("budgets", "get", "--tenant", "acme"), "hard")
	var listed struct {
		Budgets []struct {
			Amount    string `json:"amount"`
			Committed string `json:"committed"`
		} `json:"budgets"`
	}
	require.NoError(t, json.Unmarshal([]byte(ok("budgets", "list", "-o", "json")), &listed))
	require.Len(t, listed.Budgets, 1)
	require.Equal(t, "2500.00", listed.Budgets[0].Amount)
	require.Equal(t, "0.00", listed.Budgets[0].Committed)
	require.Contains(t, ok("budgets", "delete", "--tenant", "acme"), "deleted")
	code, _, errs = cli("budgets", "get", "--tenant", "acme")
	require.NotZero(t, code)
	require.Contains(t, errs, "NOT_FOUND")

	// Prices are the pool's policy.
	out = ok("pools", "create", "h100", "--tenant", "acme", "--selector", "gpu.model=H100",
		"--price-gpu-hour", "H100=2.5", "--price-vcpu-hour", "0.01", "-o", "json")
	var pool struct {
		Policy struct {
			Prices struct {
				GPUHour  map[string]string `json:"gpuHour"`
				VCPUHour string            `json:"vcpuHour"`
			} `json:"prices"`
		} `json:"policy"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &struct {
		Pool any `json:"pool"`
	}{Pool: &pool}), out)
	require.Equal(t, map[string]string{"H100": "2.5"}, pool.Policy.Prices.GPUHour, out)
	require.Equal(t, "0.01", pool.Policy.Prices.VCPUHour)
	code, _, errs = cli("pools", "create", "bad", "--tenant", "acme", "--selector", "gpu.model=H100", "--price-gpu-hour", "H100=lots")
	require.NotZero(t, code)
	require.Contains(t, errs, "policy.prices.gpu_hour[H100]")
}
