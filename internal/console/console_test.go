package console_test

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/console"
	"github.com/better-compute/better-compute/internal/store"
)

// fixture is a control plane with two tenants, each with one simulated
// node of 8 GPUs in a pool "gpu" and one active reservation of one GPU.
type fixture struct {
	cp *bctest.ControlPlane
	// Keys of acme: a member (may release) and a viewer (may not).
	member, viewer string
	// A member of the other tenant.
	rivalMember string
	// Each tenant's reservation.
	acmeRsv, rivalRsv string
}

func setup(t *testing.T) *fixture {
	t.Helper()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	f := &fixture{cp: cp}
	for _, tenant := range []string{"acme", "rival"} {
		_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: tenant}))
		require.NoError(t, err)
		_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: tenant, Name: "default"}))
		require.NoError(t, err)
	}
	key := func(tenant, role string) string {
		k, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: tenant, Role: role, Name: tenant + "-" + role}))
		require.NoError(t, err)
		return k.Msg.GetSecret()
	}
	f.member, f.viewer, f.rivalMember = key("acme", "member"), key("acme", "viewer"), key("rival", "member")

	tenants := []string{"acme", "rival"}
	sim, err := bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		Template: bctest.FakeDaemonConfig{Gateway: cp.GatewayAddr}, Root: t.TempDir(), N: 2,
		Token: func(ctx context.Context, i int) (string, error) {
			tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: tenants[i], Project: "default"}))
			return tok.Msg.GetToken(), err
		},
	})
	require.NoError(t, err)
	t.Cleanup(sim.Stop)
	bctest.WaitFor(t, "two nodes with 8 GPUs each", func() bool { return f.count(t, `SELECT COUNT(*) FROM gpus`) == 16 })
	for _, tenant := range tenants {
		_, err := admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: tenant, Name: "gpu",
			Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}}}))
		require.NoError(t, err)
	}
	reserve := func(key, tenant string) string {
		res, err := cp.Client(key).Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{
			Tenant: tenant, Pool: "gpu", Gpus: 1, DurationSeconds: 3600}))
		require.NoError(t, err)
		return res.Msg.GetReservation().GetId()
	}
	f.acmeRsv, f.rivalRsv = reserve(f.member, "acme"), reserve(f.rivalMember, "rival")
	// The tests start from active reservations: binding ends when each
	// node's agent reports the allocation.
	bctest.WaitFor(t, "both reservations active", func() bool {
		return f.state(t, "acme", f.acmeRsv) == "active" && f.state(t, "rival", f.rivalRsv) == "active"
	})
	return f
}

func (f *fixture) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, query, args...).Scan(&n)
	}))
	return n
}

func (f *fixture) state(t *testing.T, tenant, id string) string {
	t.Helper()
	res, err := f.cp.Admin().Reservations.Get(context.Background(), connect.NewRequest(&apiv1.GetReservationRequest{Tenant: tenant, Reservation: id}))
	require.NoError(t, err)
	return res.Msg.GetReservation().GetState()
}

// browser is an HTTP client with a cookie jar that does not follow
// redirects, so each answer's status and cookies can be checked.
type browser struct {
	t    *testing.T
	base string
	c    *http.Client
}

func newBrowser(t *testing.T, base string, c *http.Client) *browser {
	t.Helper()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	if c == nil {
		c = &http.Client{}
	}
	c.Jar = jar
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &browser{t: t, base: base, c: c}
}

// reply is a response read whole.
type reply struct {
	StatusCode int
	Header     http.Header
	cookies    []*http.Cookie
}

func (r reply) Cookies() []*http.Cookie { return r.cookies }

func (b *browser) do(req *http.Request) (reply, string) {
	b.t.Helper()
	res, err := b.c.Do(req)
	require.NoError(b.t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(b.t, err)
	return reply{StatusCode: res.StatusCode, Header: res.Header, cookies: res.Cookies()}, string(body)
}

func (b *browser) get(path string) (reply, string) {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodGet, b.base+path, nil)
	require.NoError(b.t, err)
	return b.do(req)
}

func (b *browser) post(path string, form url.Values, header ...string) (reply, string) {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.base+path, strings.NewReader(form.Encode()))
	require.NoError(b.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return b.do(req)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// csrf is the CSRF token of the page's first form.
func csrf(t *testing.T, body string) string {
	t.Helper()
	m := csrfRE.FindStringSubmatch(body)
	require.NotNil(t, m, "the page has a form with a CSRF token: %s", body)
	return m[1]
}

// signIn signs in with key and returns the CSRF token of the overview.
func (b *browser) signIn(key string) string {
	b.t.Helper()
	_, body := b.get(console.PathSignIn)
	res, body := b.post(console.PathSignIn, url.Values{"csrf": {csrf(b.t, body)}, "api_key": {key}})
	require.Equal(b.t, http.StatusSeeOther, res.StatusCode, body)
	require.Equal(b.t, console.PathOverview, res.Header.Get("Location"))
	res, body = b.get(console.PathOverview)
	require.Equal(b.t, http.StatusOK, res.StatusCode, body)
	return csrf(b.t, body)
}

func cookieNamed(res reply, name string) *http.Cookie {
	for _, c := range res.Cookies() {
		if c.Name == name {
			return c
		}
	}
	return nil
}

func requireSecurityHeaders(t *testing.T, res reply) {
	t.Helper()
	require.Equal(t, console.ContentSecurityPolicy, res.Header.Get("Content-Security-Policy"))
	require.Equal(t, "nosniff", res.Header.Get("X-Content-Type-Options"))
	require.Equal(t, "DENY", res.Header.Get("X-Frame-Options"))
}

func TestConsole(t *testing.T) {
	t.Parallel()
	f := setup(t)

	t.Run("sign in, cookie flags, security headers, overview, sign out", func(t *testing.T) {
		b := newBrowser(t, f.cp.URL, nil)
		res, body := b.get(console.Path)
		require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
		require.Equal(t, console.PathOverview, res.Header.Get("Location"))
		requireSecurityHeaders(t, res)
		res, _ = b.get(console.PathOverview)
		require.Equal(t, http.StatusSeeOther, res.StatusCode, "not signed in: sent to sign in")
		require.Equal(t, console.PathSignIn, res.Header.Get("Location"))
		requireSecurityHeaders(t, res)

		res, body = b.get(console.PathSignIn)
		require.Equal(t, http.StatusOK, res.StatusCode)
		requireSecurityHeaders(t, res)
		require.NotContains(t, body, "<script>", "no inline script")
		require.NotContains(t, body, "style=", "no inline style")
		res, body = b.post(console.PathSignIn, url.Values{"csrf": {csrf(t, body)}, "api_key": {" " + f.member + "\n"}})
		require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
		requireSecurityHeaders(t, res)
		ck := cookieNamed(res, console.SessionCookie)
		require.NotNil(t, ck, "a session cookie")
		require.True(t, ck.HttpOnly)
		require.Equal(t, http.SameSiteStrictMode, ck.SameSite)
		require.False(t, ck.Secure, "plain HTTP: not Secure, or the browser would drop it")
		require.Equal(t, "/console", ck.Path)
		require.NotContains(t, ck.Value, f.member)
		require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM console_sessions`))
		require.Zero(t, f.count(t, `SELECT COUNT(*) FROM console_sessions WHERE api_key = $1`, []byte(f.member)), "the key is sealed")

		res, body = b.get(console.PathOverview)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		requireSecurityHeaders(t, res)
		require.Equal(t, "no-store", res.Header.Get("Cache-Control"))
		require.Contains(t, body, "<th scope=\"row\">gpu</th>")
		require.Contains(t, body, "H100")
		require.Regexp(t, `<td class="num">8</td><td class="num">7</td><td class="num">1</td>`, body, "8 GPUs: 7 free, 1 booked")
		require.Contains(t, body, "acme")

		res, body = b.post(console.PathSignOut, url.Values{"csrf": {csrf(t, body)}})
		require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
		require.Zero(t, f.count(t, `SELECT COUNT(*) FROM console_sessions`))
		res, _ = b.get(console.PathOverview)
		require.Equal(t, http.StatusSeeOther, res.StatusCode, "signed out")
	})

	t.Run("a bad key is refused with the API's code", func(t *testing.T) {
		b := newBrowser(t, f.cp.URL, nil)
		_, body := b.get(console.PathSignIn)
		res, body := b.post(console.PathSignIn, url.Values{"csrf": {csrf(t, body)}, "api_key": {"bc_not-a-key"}})
		require.Equal(t, http.StatusUnauthorized, res.StatusCode)
		require.Contains(t, body, "<code>UNAUTHENTICATED</code>")
		ck := cookieNamed(res, console.SessionCookie)
		require.True(t, ck == nil || ck.MaxAge < 0, "no session cookie set: %v", ck)
		res, body = b.post(console.PathSignIn, url.Values{"csrf": {csrf(t, body)}, "api_key": {""}})
		require.Equal(t, http.StatusBadRequest, res.StatusCode)
		require.Contains(t, body, "api_key: paste an API key")
	})

	t.Run("a post without its CSRF token is 403", func(t *testing.T) {
		b := newBrowser(t, f.cp.URL, nil)
		b.get(console.PathSignIn)
		res, body := b.post(console.PathSignIn, url.Values{"api_key": {f.member}})
		require.Equal(t, http.StatusForbidden, res.StatusCode, "sign-in without the form's token")
		require.Contains(t, body, "CSRF_REFUSED")
		requireSecurityHeaders(t, res)

		token := b.signIn(f.member)
		release := console.PathReservations + "/" + f.acmeRsv + "/release"
		res, body = b.post(release, url.Values{})
		require.Equal(t, http.StatusForbidden, res.StatusCode, body)
		require.Contains(t, body, "CSRF_REFUSED")
		res, _ = b.post(release, url.Values{"csrf": {strings.Repeat("0", len(token))}})
		require.Equal(t, http.StatusForbidden, res.StatusCode, "another token")
		res, _ = b.post(release, url.Values{"csrf": {token}}, "Origin", "http://evil.example")
		require.Equal(t, http.StatusForbidden, res.StatusCode, "posted from another site")
		res, _ = b.post(release, url.Values{"csrf": {token}}, "Sec-Fetch-Site", "cross-site")
		require.Equal(t, http.StatusForbidden, res.StatusCode, "posted from another site")
		// Origin: null (a form post under no-referrer) is trusted only where
		// Sec-Fetch-Site says the console's own page sent it.
		res, _ = b.post(release, url.Values{"csrf": {token}}, "Origin", "null")
		require.Equal(t, http.StatusForbidden, res.StatusCode, "an opaque origin, nothing else")
		res, _ = b.post(release, url.Values{"csrf": {token}}, "Origin", "null", "Sec-Fetch-Site", "cross-site")
		require.Equal(t, http.StatusForbidden, res.StatusCode, "an opaque origin from another site")
		require.Equal(t, "active", f.state(t, "acme", f.acmeRsv), "nothing was released")

		_, body = b.get(console.PathReservations)
		res, body = b.post(release, url.Values{"csrf": {csrf(t, body)}, "pad": {strings.Repeat("x", console.MaxFormBytes)}})
		require.Equal(t, http.StatusBadRequest, res.StatusCode, "a form over 64 KiB")
		require.Contains(t, body, "INVALID_ARGUMENT")
		require.Equal(t, "active", f.state(t, "acme", f.acmeRsv))

		fresh := newBrowser(t, f.cp.URL, nil)
		res, _ = fresh.post(release, url.Values{"csrf": {token}})
		require.Equal(t, http.StatusForbidden, res.StatusCode, "no session")
	})

	t.Run("a viewer sees no buttons and a forged release is refused by the API", func(t *testing.T) {
		b := newBrowser(t, f.cp.URL, nil)
		token := b.signIn(f.viewer)
		res, body := b.get(console.PathReservations)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, f.acmeRsv)
		require.NotContains(t, body, "Release")
		require.NotContains(t, body, "<button type=\"submit\" aria-label")
		res, body = b.get(console.PathReservations + "/" + f.acmeRsv)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.NotContains(t, body, "/release")

		f.cp.Authz.Reset()
		denied := f.count(t, `SELECT COUNT(*) FROM audit_log WHERE action = 'reservations.release' AND decision = 'deny'`)
		// As chromium posts a plain form under Referrer-Policy: no-referrer.
		res, body = b.post(console.PathReservations+"/"+f.acmeRsv+"/release", url.Values{"csrf": {token}},
			"Origin", "null", "Sec-Fetch-Site", "same-origin")
		require.Equal(t, http.StatusForbidden, res.StatusCode, body)
		require.Contains(t, body, "<code>PERMISSION_DENIED</code>")
		require.EqualValues(t, 1, f.cp.Authz.Calls(), "one decision: the API's")
		require.Equal(t, "active", f.state(t, "acme", f.acmeRsv))
		require.Equal(t, denied+1, f.count(t, `SELECT COUNT(*) FROM audit_log WHERE action = 'reservations.release' AND decision = 'deny'`),
			"the API decided and audited the refusal")
	})

	t.Run("another tenant's reservation answers 404", func(t *testing.T) {
		b := newBrowser(t, f.cp.URL, nil)
		token := b.signIn(f.member)
		res, body := b.get(console.PathReservations + "/" + f.rivalRsv)
		require.Equal(t, http.StatusNotFound, res.StatusCode, body)
		require.Contains(t, body, "<code>NOT_FOUND</code>")
		require.NotContains(t, body, "rival")
		res, body = b.post(console.PathReservations+"/"+f.rivalRsv+"/release", url.Values{"csrf": {token}, "tenant": {"rival"}})
		require.Equal(t, http.StatusNotFound, res.StatusCode, body)
		require.Equal(t, "active", f.state(t, "rival", f.rivalRsv))
		res, body = b.get(console.PathReservations)
		require.Equal(t, http.StatusOK, res.StatusCode)
		require.NotContains(t, body, f.rivalRsv)
		res, _ = b.get("/console/no-such-page")
		require.Equal(t, http.StatusNotFound, res.StatusCode)
		requireSecurityHeaders(t, res)
	})

	t.Run("an expired session and a revoked key end the session", func(t *testing.T) {
		// Its own clock would move the others' sessions too: expiry is
		// checked against a session signed in an hour past the rest.
		b := newBrowser(t, f.cp.URL, nil)
		b.signIn(f.member)
		k, err := f.cp.Admin().ApiKeys.Create(context.Background(), connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "member", Name: "revoked"}))
		require.NoError(t, err)
		r := newBrowser(t, f.cp.URL, nil)
		r.signIn(k.Msg.GetSecret())
		_, err = f.cp.Admin().ApiKeys.Revoke(context.Background(), connect.NewRequest(&apiv1.RevokeApiKeyRequest{Tenant: "acme", Id: k.Msg.GetApiKey().GetId()}))
		require.NoError(t, err)
		res, _ := r.get(console.PathOverview)
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		require.Equal(t, console.PathSignIn+"?ended=1", res.Header.Get("Location"))
		require.Zero(t, f.count(t, `SELECT COUNT(*) FROM console_sessions WHERE principal_id = $1`, k.Msg.GetApiKey().GetId()))
		res, body := b.get(console.PathOverview)
		require.Equal(t, http.StatusOK, res.StatusCode, "the other session lives on: %s", body)
	})
}

// TestConsoleRelease: a member releases a reservation from the page; the
// release is the API's (one decision, one allow row in the audit log as
// the CLI's), and the page shows it released.
func TestConsoleRelease(t *testing.T) {
	t.Parallel()
	f := setup(t)
	b := newBrowser(t, f.cp.URL, nil)
	token := b.signIn(f.member)
	res, body := b.get(console.PathReservations)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, `aria-label="Release `+f.acmeRsv+`"`)

	allowed := `SELECT COUNT(*) FROM audit_log WHERE action = 'reservations.release' AND resource_id = $1 AND decision = 'allow'`
	f.cp.Authz.Reset()
	// As chromium posts a plain form under Referrer-Policy: no-referrer.
	res, body = b.post(console.PathReservations+"/"+f.acmeRsv+"/release", url.Values{"csrf": {token}},
		"Origin", "null", "Sec-Fetch-Site", "same-origin")
	require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
	require.EqualValues(t, 1, f.cp.Authz.Calls(), "one decision per mutation")
	require.Equal(t, console.PathReservations+"/"+f.acmeRsv, res.Header.Get("Location"))
	require.Equal(t, "released", f.state(t, "acme", f.acmeRsv))
	require.Equal(t, 1, f.count(t, allowed, f.acmeRsv), "one allowed release in the audit log")
	res, body = b.get(res.Header.Get("Location"))
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, "<dd>released</dd>")
	require.NotContains(t, body, "/release", "an ended reservation offers no release")

	// Expiry: a session lasts 8 hours by default. An expired one is
	// refused and deleted when used, and a sign-in sweeps the rest.
	idle := newBrowser(t, f.cp.URL, nil)
	idle.signIn(f.viewer)
	require.Equal(t, 2, f.count(t, `SELECT COUNT(*) FROM console_sessions`))
	f.cp.Clock.Advance(8*time.Hour + time.Second)
	res, _ = b.get(console.PathOverview)
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, console.PathSignIn+"?ended=1", res.Header.Get("Location"))
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM console_sessions`), "the used one is gone")
	b.signIn(f.member)
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM console_sessions`), "the idle one was swept at sign-in")
	res, _ = idle.get(console.PathOverview)
	require.Equal(t, http.StatusSeeOther, res.StatusCode)

	// A sign-in posted with a live session's cookie (a second tab's form)
	// replaces that session.
	u, err := url.Parse(f.cp.URL + console.PathHome)
	require.NoError(t, err)
	tab := newBrowser(t, f.cp.URL, nil)
	_, body = tab.get(console.PathSignIn)
	tab.c.Jar.SetCookies(u, b.c.Jar.Cookies(u))
	res, body = tab.post(console.PathSignIn, url.Values{"csrf": {csrf(t, body)}, "api_key": {f.member}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM console_sessions`), "the earlier session was replaced")
	res, _ = b.get(console.PathOverview)
	require.Equal(t, http.StatusSeeOther, res.StatusCode, "the replaced session is gone")
}

// TestConsoleTLSCookie: over TLS the session cookie is Secure.
func TestConsoleTLSCookie(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	srv := httptest.NewTLSServer(cp.App.Handler)
	t.Cleanup(srv.Close)
	b := newBrowser(t, srv.URL, srv.Client())
	_, body := b.get(console.PathSignIn)
	res, body := b.post(console.PathSignIn, url.Values{"csrf": {csrf(t, body)}, "api_key": {cp.AdminKey}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
	ck := cookieNamed(res, console.SessionCookie)
	require.NotNil(t, ck)
	require.True(t, ck.Secure)
	require.True(t, ck.HttpOnly)
	res, body = b.get(console.PathOverview)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, "No pool holds GPUs yet", "the empty state says what to do next")
	res, body = b.get(console.PathReservations)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, "better-compute reserve --pool POOL")
}

// TestConsoleWithoutSecret: a server without BETTER_COMPUTE_SECRET cannot
// seal keys, and the sign-in page says so instead of signing anyone in.
func TestConsoleWithoutSecret(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	web, err := console.New(console.Config{API: cp.App.Handler, DB: cp.App.DB, Clock: cp.Clock})
	require.NoError(t, err)
	srv := httptest.NewServer(web)
	t.Cleanup(srv.Close)
	b := newBrowser(t, srv.URL, nil)
	res, body := b.get(console.PathSignIn)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, "set BETTER_COMPUTE_SECRET for serve")
	require.NotContains(t, body, `name="api_key"`)
	u, err := url.Parse(srv.URL + console.PathHome)
	require.NoError(t, err)
	var token string
	for _, c := range b.c.Jar.Cookies(u) {
		if c.Name == "bc_console_signin" {
			token = c.Value
		}
	}
	require.NotEmpty(t, token)
	res, body = b.post(console.PathSignIn, url.Values{"csrf": {token}, "api_key": {cp.AdminKey}})
	require.Equal(t, http.StatusConflict, res.StatusCode)
	require.Contains(t, body, "<code>FAILED_PRECONDITION</code>")
	ck := cookieNamed(res, console.SessionCookie)
	require.True(t, ck == nil || ck.MaxAge < 0, "no session: %v", ck)
}
