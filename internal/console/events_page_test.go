package console_test

import (
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/console"
)

// waitForEvents waits until both reservations' events are listed. On
// PostgreSQL an event is served only once every older transaction in the
// cluster has ended (docs/architecture.md, "Event watchers"), and CI's other
// packages share the cluster: under their load the setup's events could be
// a moment behind the page.
func (f *fixture) waitForEvents(t *testing.T) {
	t.Helper()
	admin := f.cp.Admin()
	for tenant, id := range map[string]string{"acme": f.acmeRsv, "rival": f.rivalRsv} {
		bctest.WaitFor(t, "the events of "+id, func() bool {
			resp, err := admin.Events.List(t.Context(), connect.NewRequest(&apiv1.ListEventsRequest{Tenant: tenant, ResourceId: id}))
			require.NoError(t, err)
			return len(resp.Msg.GetEvents()) > 0
		})
	}
}

// TestConsoleEvents: the events page lists the outbox newest first, filters,
// pages, links a reservation's events to its page, and shows a tenant only
// its own events whatever the link names.
func TestConsoleEvents(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.waitForEvents(t)

	t.Run("a viewer sees acme's events with links and filters", func(t *testing.T) {
		b := newBrowser(t, f.cp.URL, nil)
		b.signIn(f.viewer)
		res, body := b.get(console.PathEvents)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, `<caption>Events, newest first</caption>`)
		require.Contains(t, body, `aria-current="page"`)
		require.Contains(t, body, "reservation.created")
		require.Contains(t, body, `href="/console/reservations/`+f.acmeRsv+`"`, "a reservation's event links to its page")
		require.NotContains(t, body, f.rivalRsv)
		require.NotContains(t, body, `id="f-tenant"`, "a tenant's key lists its own tenant")
		require.NotContains(t, body, "style=")
		for _, l := range []string{`<label for="f-type">`, `<label for="f-resource-type">`, `<label for="f-resource-id">`} {
			require.Contains(t, body, l)
		}

		res, body = b.get(console.PathEvents + "?type=reservation.&resource_id=" + f.acmeRsv)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, "reservation.created")
		require.NotContains(t, body, "project.created")

		res, body = b.get(console.PathEvents + "?size=1")
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Equal(t, 1, strings.Count(body, `<tr id="event-`))
		require.Contains(t, body, `rel="next">Next page</a>`)
		next := body[strings.Index(body, `href="/console/events?`)+len(`href="`):]
		next = strings.ReplaceAll(next[:strings.Index(next, `"`)], "&amp;", "&")
		res, body2 := b.get(next)
		require.Equal(t, http.StatusOK, res.StatusCode, body2)
		require.Equal(t, 1, strings.Count(body2, `<tr id="event-`))
		require.NotEqual(t, body[strings.Index(body, `<tr id="event-`):][:30], body2[strings.Index(body2, `<tr id="event-`):][:30], "the next page holds the next event")

		res, body = b.get(console.PathEvents + "?type=no.such.type.")
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, "better-compute events watch", "the empty state says what to do")

		res, body = b.get(console.PathEvents + "?page=not-a-token")
		require.Equal(t, http.StatusBadRequest, res.StatusCode, body)
		require.Contains(t, body, "page_token")
	})

	t.Run("another tenant never sees acme's events", func(t *testing.T) {
		r := newBrowser(t, f.cp.URL, nil)
		r.signIn(f.rivalMember)
		for _, path := range []string{console.PathEvents, console.PathEvents + "?tenant=acme"} {
			res, body := r.get(path)
			require.Equal(t, http.StatusOK, res.StatusCode, "%s: %s", path, body)
			require.NotContains(t, body, f.acmeRsv, path)
			require.NotContains(t, body, f.tenantID(t, "acme"), path)
		}
		// Asked for acme's reservation by id, the rival gets no row (the
		// form echoes the id it was given, nothing more).
		res, body := r.get(console.PathEvents + "?resource_id=" + f.acmeRsv)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.NotContains(t, body, `<tr id="event-`)
		require.NotContains(t, body, f.tenantID(t, "acme"))
		_, body = r.get(console.PathEvents)
		require.Contains(t, body, f.rivalRsv, "rival's own events")
		// acme's reservation by id answers 404 to the rival.
		res, _ = r.get(console.PathReservations + "/" + f.acmeRsv)
		require.Equal(t, http.StatusNotFound, res.StatusCode)
	})

	t.Run("a platform key lists every tenant or one, and an unknown tenant is 404", func(t *testing.T) {
		b := newBrowser(t, f.cp.URL, nil)
		b.signIn(f.cp.AdminKey)
		res, body := b.get(console.PathEvents)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, `<label for="f-tenant">Tenant</label>`)
		require.Contains(t, body, f.acmeRsv)
		require.Contains(t, body, f.rivalRsv)
		require.Contains(t, body, `href="/console/reservations/`+f.acmeRsv+`?tenant=`+f.tenantID(t, "acme")+`"`)
		res, body = b.get(console.PathEvents + "?tenant=rival")
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.NotContains(t, body, f.acmeRsv)
		res, body = b.get(console.PathEvents + "?tenant=nosuch")
		require.Equal(t, http.StatusNotFound, res.StatusCode, body)
	})
}
