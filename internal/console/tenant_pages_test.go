package console_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/console"
)

// TestConsoleUsage: the tenant's hourly usage windows with each metric's
// total; never the rival's; a bad metric is the API's INVALID_ARGUMENT.
func TestConsoleUsage(t *testing.T) {
	t.Parallel()
	f := setup(t)
	// Half an hour of the active reservations' open hour (or of the hour
	// before it and this one, when the half hour crosses one).
	bctest.WaitFor(t, "the reservations active", func() bool {
		return f.state(t, "acme", f.acmeRsv) == "active" && f.state(t, "rival", f.rivalRsv) == "active"
	})
	f.cp.Clock.Advance(30 * time.Minute)
	b := newBrowser(t, f.cp.URL, nil)
	b.signIn(f.viewer)
	res, body := b.get(console.PathUsage)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, `aria-current="page">Usage`)
	require.Contains(t, body, f.acmeRsv)
	require.NotContains(t, body, f.rivalRsv)
	require.Contains(t, body, "<th scope=\"row\">gpu.H100.hours</th>")
	require.Contains(t, body, "(so far: the hour is open)")
	// One GPU for at most half an hour in the open hour (the hour before
	// is recorded by the meter, which this test does not run).
	m := regexp.MustCompile(`gpu\.H100\.hours</th><td class="num">1</td><td class="num">([0-9.]+)</td>.*GPU-hours, all models</th><td class="num">([0-9.]+)</td>`).FindStringSubmatch(body)
	require.NotNil(t, m, body)
	require.Equal(t, m[1], m[2], "the GPU-hours total is the H100 rows' sum")
	gpuHours, err := strconv.ParseFloat(m[2], 64)
	require.NoError(t, err)
	require.True(t, gpuHours > 0 && gpuHours <= 0.5, "one GPU for half an hour at most: %v", gpuHours)

	res, body = b.get(console.PathUsage + "?tenant=rival")
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.NotContains(t, body, f.rivalRsv, "a tenant's key reads its own tenant whatever the link says")

	res, body = b.get(console.PathUsage + "?metric=" + url.QueryEscape("gpu.A100.hours"))
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, "No usage recorded yet", "the empty state says what to do next")
	require.Contains(t, body, "better-compute reserve")
	res, body = b.get(console.PathUsage + "?metric=bananas")
	require.Equal(t, http.StatusBadRequest, res.StatusCode, body)
	require.Contains(t, body, "<code>INVALID_ARGUMENT</code>")
}

// TestConsoleAPIKeys: a tenant admin lists, creates (the secret shown on
// that answer only) and revokes keys through the API; members and viewers
// are refused by the API (keys are the admin's), a viewer's forged create
// too; the rival's keys are never listed and its key's id answers 404.
func TestConsoleAPIKeys(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	k, err := f.cp.Admin().ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "admin", Name: "acme-admin"}))
	require.NoError(t, err)
	rivalKey, err := f.cp.Admin().ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "rival", Role: "admin", Name: "rival-admin"}))
	require.NoError(t, err)

	b := newBrowser(t, f.cp.URL, nil)
	token := b.signIn(k.Msg.GetSecret())
	res, body := b.get(console.PathAPIKeys)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, "<th scope=\"row\">acme-member</th>")
	require.Contains(t, body, `aria-label="Revoke acme-viewer"`)
	require.NotContains(t, body, "rival-")
	require.NotContains(t, body, k.Msg.GetSecret(), "no secret is ever listed")

	created := `SELECT COUNT(*) FROM audit_log WHERE action = 'apiKeys.create' AND decision = 'allow'`
	n := f.count(t, created)
	f.cp.Authz.Reset()
	res, body = b.post(console.PathAPIKeys, url.Values{"csrf": {token}, "name": {"ci-runner"}, "role": {"viewer"}, "ttl": {"30d"}})
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Equal(t, "no-store", res.Header.Get("Cache-Control"))
	require.EqualValues(t, 1, f.cp.Authz.Calls())
	require.Equal(t, n+1, f.count(t, created))
	m := regexpSecret.FindStringSubmatch(body)
	require.NotNil(t, m, "the secret is shown: %s", body)
	secret := m[1]
	require.Equal(t, 1, strings.Count(body, secret), "shown once")
	require.Contains(t, body, "this is the only time it is shown")
	// The secret works, and no later page shows it.
	_, err = f.cp.Client(secret).Identity.WhoAmI(ctx, connect.NewRequest(&apiv1.WhoAmIRequest{}))
	require.NoError(t, err)
	res, body = b.get(console.PathAPIKeys)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, "<th scope=\"row\">ci-runner</th>")
	require.NotContains(t, body, secret)

	res, body = b.post(console.PathAPIKeys, url.Values{"csrf": {token}, "name": {"Bad Name"}, "role": {"viewer"}})
	require.Equal(t, http.StatusBadRequest, res.StatusCode, body)
	require.Contains(t, body, "<code>INVALID_ARGUMENT</code>")
	require.Contains(t, body, "name")
	res, body = b.post(console.PathAPIKeys, url.Values{"csrf": {token}, "name": {"x"}, "role": {"viewer"}, "ttl": {"soon"}})
	require.Equal(t, http.StatusBadRequest, res.StatusCode, body)
	require.Contains(t, body, "ttl: must be a span")

	var id string
	res, body = b.get(console.PathAPIKeys)
	for _, line := range strings.Split(body, "<tr id=\"key-") {
		if strings.Contains(line, "ci-runner") {
			id = line[:strings.IndexByte(line, '"')]
		}
	}
	require.NotEmpty(t, id, body)
	res, body = b.post(console.PathAPIKeys+"/"+id+"/revoke", url.Values{"csrf": {token}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
	_, err = f.cp.Client(secret).Identity.WhoAmI(ctx, connect.NewRequest(&apiv1.WhoAmIRequest{}))
	require.Equal(t, connect.CodeUnauthenticated, connect.CodeOf(err), "revoked")
	res, body = b.get(res.Header.Get("Location"))
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Regexp(t, `<th scope="row">ci-runner</th>.*<td>revoked `, body)
	require.NotContains(t, body, `aria-label="Revoke ci-runner"`)

	res, body = b.post(console.PathAPIKeys+"/"+rivalKey.Msg.GetApiKey().GetId()+"/revoke", url.Values{"csrf": {token}, "tenant": {"rival"}})
	require.Equal(t, http.StatusNotFound, res.StatusCode, body)
	_, err = f.cp.Client(rivalKey.Msg.GetSecret()).Identity.WhoAmI(ctx, connect.NewRequest(&apiv1.WhoAmIRequest{}))
	require.NoError(t, err, "the rival's key lives on")

	for _, who := range []string{f.member, f.viewer} {
		o := newBrowser(t, f.cp.URL, nil)
		tok := o.signIn(who)
		res, body = o.get(console.PathAPIKeys)
		require.Equal(t, http.StatusForbidden, res.StatusCode, body)
		require.Contains(t, body, "<code>PERMISSION_DENIED</code>")
		require.NotContains(t, body, "Create key")
		require.NotContains(t, body, "Revoke")
		keys := f.count(t, `SELECT COUNT(*) FROM api_keys`)
		res, body = o.post(console.PathAPIKeys, url.Values{"csrf": {tok}, "name": {"forged"}, "role": {"admin"}})
		require.Equal(t, http.StatusForbidden, res.StatusCode, body)
		require.Contains(t, body, "PERMISSION_DENIED")
		res, _ = o.post(console.PathAPIKeys, url.Values{"name": {"forged"}, "role": {"admin"}})
		require.Equal(t, http.StatusForbidden, res.StatusCode)
		res, _ = o.post(console.PathAPIKeys+"/"+k.Msg.GetApiKey().GetId()+"/revoke", url.Values{"csrf": {tok}})
		require.Equal(t, http.StatusForbidden, res.StatusCode)
		require.Equal(t, keys, f.count(t, `SELECT COUNT(*) FROM api_keys`), "nothing created")
	}
	_, err = f.cp.Client(k.Msg.GetSecret()).Identity.WhoAmI(ctx, connect.NewRequest(&apiv1.WhoAmIRequest{}))
	require.NoError(t, err, "the admin's key was not revoked by the forged posts")
}

// TestConsoleTenantPagesPlatform: a platform key opens every tenant page,
// for every tenant or for the one ?tenant= names, and the named tenant's
// rows are the ones shown.
func TestConsoleTenantPagesPlatform(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.tenantWorkloads(t)
	b := newBrowser(t, f.cp.URL, nil)
	b.signIn(f.cp.AdminKey)
	for _, path := range []string{console.PathReservations, console.PathReservationNew, console.PathUsage, console.PathAPIKeys,
		console.PathWebhooks, console.PathInstances, console.PathSandboxes} {
		for _, q := range []string{"", "?tenant=acme"} {
			res, body := b.get(path + q)
			require.Equal(t, http.StatusOK, res.StatusCode, "%s%s: %s", path, q, body)
			require.Contains(t, body, `name="tenant"`, "%s%s: a platform key's forms name the tenant", path, q)
		}
	}
	res, body := b.get(console.PathAPIKeys + "?tenant=acme")
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, "acme-member")
	require.NotContains(t, body, "rival-member")
	res, body = b.get(console.PathWebhooks)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, "name one to list its endpoints")

	// Lists are paginated on the server, 50 a page; the next page's link
	// keeps the tenant a platform key lists.
	for i := range 50 {
		_, err := f.cp.Admin().ApiKeys.Create(context.Background(), connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme",
			Role: "viewer", Name: "bulk-" + strconv.Itoa(i)}))
		require.NoError(t, err)
	}
	res, body = b.get(console.PathAPIKeys + "?tenant=acme")
	require.Equal(t, http.StatusOK, res.StatusCode)
	first := strings.Count(body, `<tr id="key-`)
	require.Equal(t, 50, first)
	m := regexp.MustCompile(`<a href="([^"]+)" rel="next">Next page</a>`).FindStringSubmatch(body)
	require.NotNil(t, m, body)
	next := strings.ReplaceAll(m[1], "&amp;", "&")
	require.Contains(t, next, "tenant=acme")
	res, body = b.get(next)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Equal(t, 2, strings.Count(body, `<tr id="key-`), "52 keys: 50 and 2")
	require.NotContains(t, body, "rel=\"next\"")
	require.NotContains(t, body, "rival-member")
}
