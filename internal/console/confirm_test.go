package console_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/console"
)

// adminsConfirmCommission makes acme's admins' commissions wait for a
// second person (a tenant policy, as docs/iam.md shows).
const adminsConfirmCommission = `@id("admins-confirm-commission")
@confirm("human")
forbid (principal, action == BC::Action::"machines.commission", resource)
when { principal.role == "admin" }
unless { context.confirmed };`

func (f *machineFixture) confirmCommissions(t *testing.T) {
	t.Helper()
	_, err := f.cp.Admin().Policies.Put(context.Background(), connect.NewRequest(&apiv1.PutPolicyRequest{Tenant: "acme",
		Id: "admins-confirm-commission", Text: adminsConfirmCommission}))
	require.NoError(t, err)
}

var cfmRE = regexp.MustCompile(`name="confirmation" value="(cfm_[0-9A-Za-z]+)"`)

// TestConsoleConfirmations: a commission policy holds for a human is
// answered with a page that says so and links to the confirmations; the
// requester sees it waiting and cannot approve it (the API refuses and the
// page says why); another tenant neither sees nor approves it; a second
// person approves it in the page, and the requester's replay runs it.
func TestConsoleConfirmations(t *testing.T) {
	t.Parallel()
	f := setupMachines(t)
	f.confirmCommissions(t)
	page := console.PathMachines + "/" + f.acmeM1

	requester := newBrowser(t, f.cp.URL, nil)
	token := requester.signIn(f.acmeAdmin)
	res, body := requester.post(page+"/commission", url.Values{"csrf": {token}, "burn_in": {"on"}})
	require.Equal(t, http.StatusAccepted, res.StatusCode, body)
	require.Contains(t, body, "<code>CONFIRMATION_REQUIRED</code>")
	require.Contains(t, body, "needs a second person to approve this action first")
	require.Contains(t, body, `href="/console/confirmations?state=pending"`)
	require.Contains(t, body, `<input type="hidden" name="burn_in" value="on">`, "the replay sends the same form")
	m := cfmRE.FindStringSubmatch(body)
	require.NotNil(t, m, body)
	cfm := m[1]
	require.Equal(t, "enrolled", f.machine(t, "acme", f.acmeM1).GetState(), "nothing was done")

	res, body = requester.get(console.PathConfirmations)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, `<tr id="cfm-`+cfm+`">`)
	require.Contains(t, body, "machines.commission")
	require.Contains(t, body, "Yours: waiting for another person to approve it")
	require.NotContains(t, body, `aria-label="Approve `+cfm+`"`)
	require.Contains(t, body, `data-live="confirmation.*"`)
	res, body = requester.post(console.PathConfirmations+"/"+cfm+"/approve", url.Values{"csrf": {token}})
	require.Equal(t, http.StatusForbidden, res.StatusCode, body)
	require.Contains(t, body, "<code>PERMISSION_DENIED</code>")
	res, body = requester.post(page+"/commission", url.Values{"csrf": {token}, "burn_in": {"on"}, "confirmation": {cfm}})
	require.Equal(t, http.StatusConflict, res.StatusCode, "a replay before approval: %s", body)
	require.Contains(t, body, "CONFIRMATION_NOT_USABLE")

	// Another tenant neither sees nor approves it; acme's viewer sees it
	// but has no button, and a forged approval is refused.
	rival := newBrowser(t, f.cp.URL, nil)
	rivalToken := rival.signIn(f.rivalMember)
	res, body = rival.get(console.PathConfirmations)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.NotContains(t, body, cfm)
	require.Contains(t, body, "better-compute confirmations list", "the empty state says what to do")
	res, body = rival.post(console.PathConfirmations+"/"+cfm+"/approve", url.Values{"csrf": {rivalToken}, "tenant": {"acme"}})
	require.Contains(t, []int{http.StatusNotFound, http.StatusForbidden}, res.StatusCode, body)
	viewer := newBrowser(t, f.cp.URL, nil)
	viewerToken := viewer.signIn(f.viewer)
	res, body = viewer.get(console.PathConfirmations)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, cfm)
	require.NotContains(t, body, `aria-label="Approve `)
	res, body = viewer.post(console.PathConfirmations+"/"+cfm+"/approve", url.Values{"csrf": {viewerToken}})
	require.Equal(t, http.StatusForbidden, res.StatusCode, body)
	res, _ = viewer.post(console.PathConfirmations+"/"+cfm+"/approve", url.Values{})
	require.Equal(t, http.StatusForbidden, res.StatusCode, "no CSRF token")
	res, body = requester.get(console.PathConfirmations)
	require.Contains(t, body, `<td>pending</td>`, "still pending: %s", body)

	// A second person (the platform's human admin) approves in the page.
	approver := newBrowser(t, f.cp.URL, nil)
	approver.signIn(f.cp.AdminKey)
	// A platform key names the tenant first: the API lists one tenant's.
	res, body = approver.get(console.PathConfirmations)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, `<label for="c-tenant">Tenant</label>`)
	res, body = approver.get(console.PathConfirmations + "?tenant=acme")
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, `aria-label="Approve `+cfm+`"`)
	f.cp.Authz.Reset()
	res, body = approver.post(console.PathConfirmations+"/"+cfm+"/approve", url.Values{"csrf": {csrf(t, body)}, "tenant": {"acme"}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
	require.EqualValues(t, 1, f.cp.Authz.CallsFor("confirmations.approve"))
	require.Equal(t, "/console/confirmations?state=approved&tenant=acme", res.Header.Get("Location"))
	res, body = approver.get(res.Header.Get("Location"))
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, cfm)
	require.Contains(t, body, "approved by")

	// The requester sends it again with the approval: it runs.
	res, body = requester.post(page+"/commission", url.Values{"csrf": {token}, "burn_in": {"on"}, "confirmation": {cfm}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
	require.Equal(t, "ready", f.waitIdle(t, "acme", f.acmeM1).GetState())
	_, body = requester.get(page)
	require.Regexp(t, `<tr data-step-state="succeeded"><td class="num">\d+</td><th scope="row">burn-in`, body, "burn-in ran: the replay was the same request")
	res, body = requester.get(console.PathConfirmations + "?state=used")
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, cfm)
}
