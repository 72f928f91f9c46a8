package console_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/console"
)

// TestConsoleWebhooks: a tenant admin creates an endpoint (its signing
// secret shown on that answer only), sends it a test event, rotates its
// secret and deletes it, each through the API; a member reads the list
// without buttons and a viewer's forged posts are refused; the rival's
// endpoints are never listed and their ids answer 404.
func TestConsoleWebhooks(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	admin := f.cp.Admin()
	k, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "admin", Name: "acme-admin"}))
	require.NoError(t, err)
	// A receiver on loopback (the test control plane allows it) that
	// takes every delivery.
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(recv.Close)
	acmeURL, rivalURL := recv.URL+"/acme", recv.URL+"/rival"
	rivalHook, err := admin.Webhooks.Create(ctx, connect.NewRequest(&apiv1.CreateWebhookRequest{Tenant: "rival", Url: rivalURL}))
	require.NoError(t, err)
	rivalID := rivalHook.Msg.GetWebhook().GetId()

	b := newBrowser(t, f.cp.URL, nil)
	token := b.signIn(k.Msg.GetSecret())
	res, body := b.get(console.PathWebhooks)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, "No webhooks.")
	require.Contains(t, body, `<label for="w-url">URL</label>`)
	require.NotContains(t, body, rivalURL)

	res, body = b.post(console.PathWebhooks, url.Values{"csrf": {token}, "url": {"ftp://acme.example.com"}})
	require.Equal(t, http.StatusBadRequest, res.StatusCode, body)
	require.Contains(t, body, "<code>INVALID_ARGUMENT</code>")
	require.Contains(t, body, "url")

	created := `SELECT COUNT(*) FROM audit_log WHERE action = 'webhooks.create' AND decision = 'allow'`
	n := f.count(t, created)
	f.cp.Authz.Reset()
	res, body = b.post(console.PathWebhooks, url.Values{"csrf": {token}, "url": {acmeURL},
		"types": {"reservation.*, node.lost"}, "description": {"pager"}})
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Equal(t, "no-store", res.Header.Get("Cache-Control"))
	require.EqualValues(t, 1, f.cp.Authz.Calls(), "one decision")
	require.Equal(t, n+1, f.count(t, created), "one audit row")
	m := regexpSecret.FindStringSubmatch(body)
	require.NotNil(t, m, body)
	secret := m[1]
	require.True(t, strings.HasPrefix(secret, "whsec_"), secret)
	require.Equal(t, 1, strings.Count(body, secret))
	require.Contains(t, body, "reservation.*, node.lost")
	res, body = b.get(console.PathWebhooks)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.NotContains(t, body, secret, "never shown again")
	require.Contains(t, body, `aria-label="Send test `+acmeURL+`"`)
	list, err := admin.Webhooks.List(ctx, connect.NewRequest(&apiv1.ListWebhooksRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Len(t, list.Msg.GetWebhooks(), 1)
	id := list.Msg.GetWebhooks()[0].GetId()

	res, body = b.post(console.PathWebhooks+"/"+id+"/test", url.Values{"csrf": {token}})
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, "Test delivery ")
	require.Contains(t, body, "better-compute webhooks deliveries "+id)
	dl, err := admin.Webhooks.ListDeliveries(ctx, connect.NewRequest(&apiv1.ListWebhookDeliveriesRequest{Tenant: "acme", Webhook: id}))
	require.NoError(t, err)
	require.NotEmpty(t, dl.Msg.GetDeliveries(), "a test delivery queued")

	res, body = b.post(console.PathWebhooks+"/"+id+"/rotate", url.Values{"csrf": {token}})
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	m = regexpSecret.FindStringSubmatch(body)
	require.NotNil(t, m, body)
	require.NotEqual(t, secret, m[1], "a new secret")
	require.Contains(t, body, "the previous one also signs until")

	for _, action := range []string{"test", "rotate", "delete"} {
		res, body = b.post(console.PathWebhooks+"/"+rivalID+"/"+action, url.Values{"csrf": {token}, "tenant": {"rival"}})
		require.Equal(t, http.StatusNotFound, res.StatusCode, "%s: %s", action, body)
	}

	for _, who := range []string{f.member, f.viewer} {
		o := newBrowser(t, f.cp.URL, nil)
		tok := o.signIn(who)
		res, body = o.get(console.PathWebhooks)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, acmeURL, "members and viewers read the list")
		require.NotContains(t, body, "Create webhook")
		require.NotContains(t, body, "Rotate secret")
		require.NotContains(t, body, "/delete")
		for _, action := range []string{"test", "rotate", "delete"} {
			res, body = o.post(console.PathWebhooks+"/"+id+"/"+action, url.Values{"csrf": {tok}})
			require.Equal(t, http.StatusForbidden, res.StatusCode, "%s: %s", action, body)
			require.Contains(t, body, "<code>PERMISSION_DENIED</code>")
		}
		res, body = o.post(console.PathWebhooks, url.Values{"csrf": {tok}, "url": {recv.URL + "/forged"}})
		require.Equal(t, http.StatusForbidden, res.StatusCode, body)
		res, _ = o.post(console.PathWebhooks+"/"+id+"/delete", url.Values{})
		require.Equal(t, http.StatusForbidden, res.StatusCode, "no CSRF token")
	}

	res, body = b.post(console.PathWebhooks+"/"+id+"/delete", url.Values{"csrf": {token}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
	list, err = admin.Webhooks.List(ctx, connect.NewRequest(&apiv1.ListWebhooksRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Empty(t, list.Msg.GetWebhooks(), "deleted, and nothing forged was created")
	_, err = admin.Webhooks.Get(ctx, connect.NewRequest(&apiv1.GetWebhookRequest{Tenant: "rival", Webhook: rivalID}))
	require.NoError(t, err, "the rival's endpoint lives on")
}
