package console_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/console"
	"github.com/better-compute/better-compute/internal/store"
)

// queryText reads one string with query.
func (f *fixture) queryText(t *testing.T, query string, args ...any) string {
	t.Helper()
	var s string
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, query, args...).Scan(&s)
	}))
	return s
}

// tenantNode is the name of the tenant's one simulated node.
func (f *fixture) tenantNode(t *testing.T, tenant string) string {
	t.Helper()
	return f.queryText(t, `SELECT n.name FROM nodes n JOIN tenants t ON t.id = n.tenant_id WHERE t.name = $1`, tenant)
}

// tenantReservations counts the tenant's reservations.
func (f *fixture) tenantReservations(t *testing.T, tenant string) int {
	t.Helper()
	return f.count(t, `SELECT COUNT(*) FROM reservations r JOIN tenants t ON t.id = r.tenant_id WHERE t.name = $1`, tenant)
}

var regexpSecret = regexp.MustCompile(`id="new-secret" class="secret-value" readonly value="([^"]+)"`)

var idempotencyRE = regexp.MustCompile(`name="idempotency_key" value="([^"]+)"`)

// reserveForm is a filled-in reservation form as the page posts it.
func reserveForm(token, key string, kv ...string) url.Values {
	v := url.Values{"csrf": {token}, "idempotency_key": {key}, "pool": {"gpu"}, "gpus": {"2"}, "duration": {"2h"}, "binding": {"node"}}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Set(kv[i], kv[i+1])
	}
	return v
}

// TestConsoleReserve: the reservations page carries the form; its preview
// answers where the API would place the request and why nodes do not fit,
// booking nothing; submitting creates the reservation once per form (its
// idempotency key) with one authorization decision, and shows it with its
// timeline; refusals come back next to the form with the API's code.
func TestConsoleReserve(t *testing.T) {
	t.Parallel()
	f := setup(t)
	b := newBrowser(t, f.cp.URL, nil)
	b.signIn(f.member)
	res, body := b.get(console.PathReservations)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	token := csrf(t, body)
	require.Contains(t, body, `hx-post="`+console.PathReservationPreview+`"`)
	require.Contains(t, body, `hx-trigger="change, keyup delay:400ms"`)
	require.Contains(t, body, `<label for="r-pool">Pool</label>`)
	require.NotContains(t, body, "style=")
	m := idempotencyRE.FindStringSubmatch(body)
	require.NotNil(t, m, "the form carries an idempotency key")
	key := m[1]
	_, again := b.get(console.PathReservations)
	require.NotContains(t, again, key, "each drawn form gets its own key")

	acmeNode, rivalNode := f.tenantNode(t, "acme"), f.tenantNode(t, "rival")
	before := f.tenantReservations(t, "acme")

	t.Run("preview", func(t *testing.T) {
		res, body := b.post(console.PathReservationPreview, reserveForm(token, key))
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.NotContains(t, body, "<html", "a fragment, swapped into the page")
		require.Contains(t, body, "Fits now.")
		require.Contains(t, body, acmeNode)
		require.NotContains(t, body, rivalNode, "another tenant's node is never named")
		require.Regexp(t, `1 nodes evaluated, 1 could take it`, body)

		res, body = b.post(console.PathReservationPreview, reserveForm(token, key, "gpus", "8"))
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, "No node fits now.")
		require.Contains(t, body, "<caption>Why other nodes were rejected</caption>")
		require.Regexp(t, `1 nodes evaluated, 0 could take it`, body)
		require.NotContains(t, body, rivalNode)

		res, body = b.post(console.PathReservationPreview, reserveForm(token, key, "pool", ""))
		require.Equal(t, http.StatusOK, res.StatusCode)
		require.Contains(t, body, "Name a pool")
		res, body = b.post(console.PathReservationPreview, reserveForm(token, key, "duration", "soon"))
		require.Equal(t, http.StatusOK, res.StatusCode)
		require.Contains(t, body, "duration: must be a span")
		require.Contains(t, body, "<code>INVALID_ARGUMENT</code>")
		res, body = b.post(console.PathReservationPreview, reserveForm(token, key, "pool", "nope"))
		require.Equal(t, http.StatusOK, res.StatusCode)
		require.Contains(t, body, "<code>NOT_FOUND</code>", "the API's refusal, in the preview box")
		res, body = b.post(console.PathReservationPreview, reserveForm("", key))
		require.Equal(t, http.StatusForbidden, res.StatusCode, "the preview is a POST: CSRF checked")
		require.Contains(t, body, "CSRF_REFUSED")
		require.Equal(t, before, f.tenantReservations(t, "acme"), "a preview books nothing")
	})

	t.Run("refusals come back next to the form", func(t *testing.T) {
		res, body := b.post(console.PathReservations, reserveForm(token, key, "gpus", "two"))
		require.Equal(t, http.StatusBadRequest, res.StatusCode, body)
		require.Contains(t, body, "gpus: must be a whole number")
		require.Contains(t, body, `value="two"`, "the form as it was typed")
		res, body = b.post(console.PathReservations, reserveForm(token, key, "pool", "nope"))
		require.Equal(t, http.StatusNotFound, res.StatusCode, body)
		require.Contains(t, body, "<code>NOT_FOUND</code>")
		require.Contains(t, body, `id="reserve-preview"`)
		require.Contains(t, body, `value="nope"`)
		require.Equal(t, before, f.tenantReservations(t, "acme"))
	})

	t.Run("create, once per form, and its page", func(t *testing.T) {
		created := `SELECT COUNT(*) FROM audit_log WHERE action = 'reservations.create' AND decision = 'allow'`
		allowed := f.count(t, created)
		f.cp.Authz.Reset()
		// A platform field posted by a tenant's member changes nothing: a
		// tenant's key acts in its own tenant.
		res, body := b.post(console.PathReservations, reserveForm(token, key, "tenant", "rival"))
		require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
		require.EqualValues(t, 1, f.cp.Authz.Calls(), "one decision: the API's")
		require.Equal(t, allowed+1, f.count(t, created), "one audit row, as for the CLI")
		loc := res.Header.Get("Location")
		require.Regexp(t, `^`+console.PathReservations+`/[^/?]+$`, loc)
		require.Equal(t, before+1, f.tenantReservations(t, "acme"))
		require.Equal(t, 1, f.tenantReservations(t, "rival"), "nothing booked for the rival")

		res, body = b.post(console.PathReservations, reserveForm(token, key, "tenant", "rival"))
		require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
		require.Equal(t, loc, res.Header.Get("Location"), "the same form sent twice books once")
		require.Equal(t, before+1, f.tenantReservations(t, "acme"))

		id := strings.TrimPrefix(loc, console.PathReservations+"/")
		bctest.WaitFor(t, "the node binds it", func() bool { return f.state(t, "acme", id) == "active" })
		res, body = b.get(loc)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, "<dd>active</dd>")
		require.Contains(t, body, `<h2 id="timeline-title">Timeline</h2>`)
		require.Contains(t, body, "<strong>Created</strong>")
		require.Contains(t, body, "placed on "+acmeNode)
		require.Regexp(t, `<time datetime="[0-9T:Z-]+">`, body)

		res, body = b.post(loc+"/release", url.Values{"csrf": {token}})
		require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
		res, body = b.get(loc)
		require.Equal(t, http.StatusOK, res.StatusCode)
		require.Contains(t, body, "<strong>Ended</strong>")
	})
}

// TestConsoleReserveViewer: a viewer sees no form, and a forged create
// (with the session's CSRF token) is refused by the API; without the token
// it is refused before the API is asked.
func TestConsoleReserveViewer(t *testing.T) {
	t.Parallel()
	f := setup(t)
	b := newBrowser(t, f.cp.URL, nil)
	token := b.signIn(f.viewer)
	res, body := b.get(console.PathReservations)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.NotContains(t, body, "idempotency_key")
	require.NotContains(t, body, "Reserve</button>")
	before := f.tenantReservations(t, "acme")
	denied := `SELECT COUNT(*) FROM audit_log WHERE action = 'reservations.create' AND decision = 'deny'`
	n := f.count(t, denied)

	f.cp.Authz.Reset()
	res, body = b.post(console.PathReservations, reserveForm(token, "forged-1"))
	require.Equal(t, http.StatusForbidden, res.StatusCode, body)
	require.Contains(t, body, "<code>PERMISSION_DENIED</code>")
	require.EqualValues(t, 1, f.cp.Authz.Calls(), "the API decided")
	require.Equal(t, n+1, f.count(t, denied), "and audited the refusal")

	res, body = b.post(console.PathReservations, reserveForm("", "forged-2"))
	require.Equal(t, http.StatusForbidden, res.StatusCode, body)
	require.Contains(t, body, "CSRF_REFUSED")
	res, _ = b.post(console.PathReservations, reserveForm(token, "forged-3"), "Origin", "http://evil.example")
	require.Equal(t, http.StatusForbidden, res.StatusCode)
	require.Equal(t, before, f.tenantReservations(t, "acme"), "nothing booked")
}

// TestConsoleReserveRival: the rival's reservation page answers 404 to
// acme and its timeline is never drawn; a platform key reserves in the
// tenant its form names.
func TestConsoleReserveRival(t *testing.T) {
	t.Parallel()
	f := setup(t)
	b := newBrowser(t, f.cp.URL, nil)
	b.signIn(f.member)
	res, body := b.get(console.PathReservations + "/" + f.rivalRsv)
	require.Equal(t, http.StatusNotFound, res.StatusCode)
	require.NotContains(t, body, "Timeline")
	require.NotContains(t, body, f.tenantNode(t, "rival"))

	admin := newBrowser(t, f.cp.URL, nil)
	token := admin.signIn(f.cp.AdminKey)
	res, body = admin.get(console.PathReservationNew)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, `<label for="r-tenant">Tenant</label>`, "a platform key names the tenant")
	res, body = admin.post(console.PathReservationPreview, reserveForm(token, "k", "tenant", "rival"))
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, f.tenantNode(t, "rival"))
	require.NotContains(t, body, f.tenantNode(t, "acme"))
	before := f.tenantReservations(t, "rival")
	res, body = admin.post(console.PathReservations, reserveForm(token, "platform-1", "tenant", "rival"))
	require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
	require.Contains(t, res.Header.Get("Location"), "?tenant=")
	require.Equal(t, before+1, f.tenantReservations(t, "rival"))
	res, body = admin.get(res.Header.Get("Location"))
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, "Timeline")
}
