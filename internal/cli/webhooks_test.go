package cli

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client/webhook"
)

// TestWebhooksCommands drives the webhooks verbs against a real control
// plane: create prints the secret once, test delivers a signed event the
// receiver verifies, rotate-secret, deliveries, update, delete; and a URL
// the SSRF guard refuses is a field error.
func TestWebhooksCommands(t *testing.T) {
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

	var (
		mu     sync.Mutex
		secret string
		got    []string
	)
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body bytes.Buffer
		_, _ = body.ReadFrom(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if err := webhook.VerifyAt(secret, r.Header, body.Bytes(), cp.Clock.Now()); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		var ev struct{ Type string }
		_ = json.Unmarshal(body.Bytes(), &ev)
		got = append(got, ev.Type)
	}))
	t.Cleanup(rcv.Close)

	out := ok("webhooks", "create", "--tenant", "acme", "--url", rcv.URL+"/hook", "--types", "webhook.test,reservation.*")
	m := regexp.MustCompile(`secret: (whsec_\S+)`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	mu.Lock()
	secret = m[1]
	mu.Unlock()
	id := regexp.MustCompile(`whk_\w+`).FindString(out)
	require.NotEmpty(t, id)
	require.Contains(t, ok("webhooks", "list", "--tenant", "acme"), "webhook.test,reservation.*")
	require.NotContains(t, ok("webhooks", "get", id, "--tenant", "acme"), "whsec_", "the secret is shown once")

	ok("webhooks", "test", id, "--tenant", "acme")
	bctest.WaitFor(t, "the test event", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 1 })
	// The receiver answers before the worker records the delivery: wait for the row.
	bctest.WaitFor(t, "the delivery recorded as succeeded", func() bool {
		return strings.Contains(ok("webhooks", "deliveries", id, "--tenant", "acme"), "succeeded")
	})

	out = ok("webhooks", "rotate-secret", id, "--tenant", "acme", "--overlap", "1h")
	require.Regexp(t, `secret: whsec_`, out)
	require.NotContains(t, out, secret, "a new secret")
	ok("webhooks", "test", id, "--tenant", "acme") // the old secret still verifies during the overlap
	bctest.WaitFor(t, "the second test event", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 2 })

	require.Contains(t, ok("webhooks", "update", id, "--tenant", "acme", "--state", "disabled"), "disabled")
	code, _, errs := cli("webhooks", "create", "--tenant", "acme", "--url", cp.URL+"/x")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "own API listener")
	code, _, errs = cli("webhooks", "update", id, "--tenant", "acme", "--state", "sleeping")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "state")
	ok("webhooks", "delete", id, "--tenant", "acme")
	require.NotContains(t, ok("webhooks", "list", "--tenant", "acme"), id)
}
