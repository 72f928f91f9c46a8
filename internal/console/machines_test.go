package console_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/console"
)

// machineFixture adds bare metal to the console's fixture: each tenant
// has a site with a simulated agent and one enrolled machine m1, and acme
// has an admin key (tenant admins run their machines).
type machineFixture struct {
	*fixture
	acmeAdmin       string
	acmeSim         *bctest.SimSite
	acmeM1, rivalM1 string
}

func setupMachines(t *testing.T) *machineFixture {
	t.Helper()
	f := &machineFixture{fixture: setup(t)}
	ctx := context.Background()
	admin := f.cp.Admin()
	k, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "admin", Name: "acme-admin"}))
	require.NoError(t, err)
	f.acmeAdmin = k.Msg.GetSecret()
	for _, tenant := range []string{"acme", "rival"} {
		s, err := admin.Sites.Create(ctx, connect.NewRequest(&apiv1.CreateSiteRequest{Tenant: tenant, Name: "dc1", Networks: []string{"127.0.0.0/8"}}))
		require.NoError(t, err)
		sim := bctest.NewSimSite(t, f.cp.App.Metal, s.Msg.GetSite().GetId())
		sm := sim.AddMachine(t, "m1")
		m, err := admin.Machines.Enroll(ctx, connect.NewRequest(&apiv1.EnrollMachineRequest{Tenant: tenant, Site: "dc1", Name: "m1",
			BmcDriver: "redfish", BmcAddress: sm.BMCAddress, BmcUsername: sm.Username, BmcPassword: sm.Password, Mac: sm.MAC,
			HardwareProfile: "sim-8xh100"}))
		require.NoError(t, err)
		if tenant == "acme" {
			f.acmeSim, f.acmeM1 = sim, m.Msg.GetMachine().GetId()
		} else {
			f.rivalM1 = m.Msg.GetMachine().GetId()
		}
	}
	return f
}

func (f *machineFixture) machine(t *testing.T, tenant, id string) *apiv1.Machine {
	t.Helper()
	res, err := f.cp.Admin().Machines.Get(context.Background(), connect.NewRequest(&apiv1.GetMachineRequest{Tenant: tenant, Machine: id}))
	require.NoError(t, err)
	return res.Msg.GetMachine()
}

func (f *machineFixture) waitIdle(t *testing.T, tenant, id string) *apiv1.Machine {
	t.Helper()
	var m *apiv1.Machine
	bctest.WaitFor(t, id+"'s workflow to end", func() bool {
		m = f.machine(t, tenant, id)
		return m.GetWorkflowId() == ""
	})
	return m
}

var commissionButton = regexp.MustCompile(`<button type="submit">Commission</button>`)

// TestConsoleMachines: the list and a machine's page render what the API
// says; an admin commissions from the page (one decision, the API's audit
// row) and the page then lists the workflow's steps; a viewer sees no
// buttons and a forged post is refused by the API; another tenant's
// machine answers 404 and never appears.
func TestConsoleMachines(t *testing.T) {
	t.Parallel()
	f := setupMachines(t)
	page := console.PathMachines + "/" + f.acmeM1
	commission := page + "/commission"

	t.Run("viewer: list and page, no buttons, a forged post refused", func(t *testing.T) {
		b := newBrowser(t, f.cp.URL, nil)
		token := b.signIn(f.viewer)
		res, body := b.get(console.PathMachines)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, `<tr id="mch-`+f.acmeM1+`">`)
		require.Contains(t, body, "<td>enrolled</td>")
		require.Contains(t, body, `data-live="machine.*,workflow.*"`)
		require.NotContains(t, body, f.rivalM1)
		res, body = b.get(page)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, `<dd id="machine-state">enrolled</dd>`)
		require.Contains(t, body, "has run no workflow yet")
		require.Contains(t, body, `data-live-id="`+f.acmeM1+`"`)
		require.NotRegexp(t, commissionButton, body)
		require.NotContains(t, body, "/commission")

		f.cp.Authz.Reset()
		res, body = b.post(commission, url.Values{"csrf": {token}})
		require.Equal(t, http.StatusForbidden, res.StatusCode, body)
		require.Contains(t, body, "<code>PERMISSION_DENIED</code>")
		require.EqualValues(t, 1, f.cp.Authz.Calls(), "one decision: the API's")
		require.Equal(t, "enrolled", f.machine(t, "acme", f.acmeM1).GetState())
		res, body = b.post(commission, url.Values{})
		require.Equal(t, http.StatusForbidden, res.StatusCode)
		require.Contains(t, body, "CSRF_REFUSED")
	})

	t.Run("another tenant's machine answers 404", func(t *testing.T) {
		b := newBrowser(t, f.cp.URL, nil)
		token := b.signIn(f.acmeAdmin)
		res, body := b.get(console.PathMachines + "/" + f.rivalM1)
		require.Equal(t, http.StatusNotFound, res.StatusCode, body)
		require.Contains(t, body, "<code>NOT_FOUND</code>")
		res, body = b.post(console.PathMachines+"/"+f.rivalM1+"/commission", url.Values{"csrf": {token}, "tenant": {"rival"}})
		require.Equal(t, http.StatusNotFound, res.StatusCode, body)
		require.Equal(t, "enrolled", f.machine(t, "rival", f.rivalM1).GetState())
		res, _ = b.post(page+"/explode", url.Values{"csrf": {token}})
		require.Equal(t, http.StatusNotFound, res.StatusCode, "no such action")

		rival := newBrowser(t, f.cp.URL, nil)
		rival.signIn(f.rivalMember)
		res, body = rival.get(console.PathMachines)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, f.rivalM1)
		require.NotContains(t, body, f.acmeM1)
	})

	t.Run("an admin commissions from the page", func(t *testing.T) {
		b := newBrowser(t, f.cp.URL, nil)
		b.signIn(f.acmeAdmin)
		res, body := b.get(page)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Regexp(t, commissionButton, body)
		allowed := `SELECT COUNT(*) FROM audit_log WHERE action = 'machines.commission' AND resource_id = $1 AND decision = 'allow'`
		f.cp.Authz.Reset()
		res, body = b.post(commission, url.Values{"csrf": {csrf(t, body)}})
		require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
		require.Equal(t, page, res.Header.Get("Location"))
		require.EqualValues(t, 1, f.cp.Authz.CallsFor("machines.commission"), "one decision per mutation")
		require.Equal(t, 1, f.count(t, allowed, f.acmeM1))
		require.Equal(t, "ready", f.waitIdle(t, "acme", f.acmeM1).GetState())
		res, body = b.get(page)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, `<dd id="machine-state">ready</dd>`)
		require.Contains(t, body, "commission, succeeded")
		require.Regexp(t, `<tr data-step-state="succeeded"><td class="num">\d+</td><th scope="row">wipe`, body)
		require.Contains(t, body, `<tr data-step-state="skipped">`, "burn-in was not asked for")
		require.Contains(t, body, "Deploy", "a ready machine offers deploy")
	})
}
