package console_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/console"
)

// tenantTab is a chromium tab for the tenant pages' browser test: the
// setup of TestConsoleBrowser (browser_test.go), kept in this file so that
// one stays as it is.
type tenantTab struct {
	t        *testing.T
	ctx      context.Context
	shots    string
	mu       sync.Mutex
	problems []string
	stop     func()
	done     chan struct{}
}

func newTenantTab(t *testing.T) *tenantTab {
	t.Helper()
	path, err := exec.LookPath("chromium")
	require.NoError(t, err, "BC_BROWSER is set but chromium is not installed (apt-get install chromium)")
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		// Root in a container: chromium's sandbox needs user namespaces.
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancelTab := chromedp.NewContext(allocCtx)
	t.Cleanup(cancelTab)
	// A bound for a stuck browser; each step waits on the page, never on
	// time.
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	t.Cleanup(cancel)
	require.NoError(t, chromedp.Do(ctx), "start chromium")

	tab := &tenantTab{t: t, ctx: ctx, done: make(chan struct{})}
	// Screenshots go where BC_CONSOLE_SCREENSHOTS or BC_ARTIFACTS says,
	// else into the test's temporary directory: always taken, so a page
	// that cannot be drawn fails the test.
	tab.shots = os.Getenv("BC_CONSOLE_SCREENSHOTS")
	if tab.shots == "" {
		tab.shots = os.Getenv("BC_ARTIFACTS")
	}
	if tab.shots == "" {
		tab.shots = t.TempDir()
	}
	require.NoError(t, os.MkdirAll(tab.shots, 0o755))

	consoleCtx, stop := context.WithCancel(ctx)
	tab.stop = stop
	messages := chromedp.Console(consoleCtx)
	go func() {
		defer close(tab.done)
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleWarning || m.IsException() {
				tab.mu.Lock()
				tab.problems = append(tab.problems, m.String()+" at "+m.URL)
				tab.mu.Unlock()
			}
		}
	}()
	return tab
}

func (tab *tenantTab) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	tab.t.Helper()
	require.NoError(tab.t, chromedp.Do(tab.ctx, steps...), what)
}

func (tab *tenantTab) text(sel string) string {
	tab.t.Helper()
	s, err := chromedp.Run(tab.ctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(tab.t, err, "text of %s", sel)
	return strings.TrimSpace(s)
}

// until waits for a JavaScript predicate on the page, bounded only by the
// tab's context.
func (tab *tenantTab) until(what, predicate string) {
	tab.t.Helper()
	_, err := chromedp.Run(tab.ctx, chromedp.Poll[chromedp.Void](predicate, chromedp.WithPollingTimeout(0)))
	require.NoError(tab.t, err, what)
}

func (tab *tenantTab) shot(name string) {
	tab.t.Helper()
	png, err := chromedp.Run(tab.ctx, chromedp.FullScreenshot(100))
	require.NoError(tab.t, err)
	require.NoError(tab.t, os.WriteFile(filepath.Join(tab.shots, name+".png"), png, 0o644))
}

// clearInput empties an input as selecting its text and deleting it
// would, without an event: the typing that follows sends them.
func clearInput(id string) chromedp.Action[chromedp.Void] {
	return chromedp.Evaluate[chromedp.Void](`document.getElementById(` + strconv.Quote(id) + `).value = ""`)
}

// clean fails the test if the page's console logged an error or warning.
func (tab *tenantTab) clean() {
	tab.t.Helper()
	tab.stop()
	<-tab.done
	tab.mu.Lock()
	defer tab.mu.Unlock()
	require.Empty(tab.t, tab.problems, "the page's console stays clean")
}

// TestConsoleBrowserTenant drives chromium through the tenant pages: a
// member signs in with a key, fills the reservation form and sees the
// API's preview (where it would go, and why nodes do not fit) change as
// the form does, without a reload; reserves, sees the reservation with its
// timeline, releases it; then opens each tenant page. No console errors;
// screenshots of each page.
func TestConsoleBrowserTenant(t *testing.T) {
	if os.Getenv("BC_BROWSER") == "" {
		t.Skip("BC_BROWSER is not set: this test drives Debian's chromium (apt-get install chromium); set BC_BROWSER=1 to run it")
	}
	t.Parallel()
	f := setup(t)
	f.tenantWorkloads(t)
	tab := newTenantTab(t)
	base := f.cp.URL

	tab.do("sign in",
		chromedp.Navigate(base+"/console"),
		chromedp.WaitVisible(chromedp.ID("api-key")),
		chromedp.SendKeys(chromedp.ID("api-key"), f.member),
		chromedp.Click(chromedp.CSS(`form.signin button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`table caption`)),
	)
	tab.do("open my reservations",
		chromedp.Click(chromedp.CSS(`nav a[href="/console/reservations"]`)),
		chromedp.WaitVisible(chromedp.ID("r-pool")),
	)
	// A full reload would drop this mark; htmx's swaps keep it.
	_, err := chromedp.Run(tab.ctx, chromedp.Evaluate[bool](`window.bcNoReload = true`))
	require.NoError(t, err)

	tab.do("name the pool: the preview shows where it would go",
		chromedp.SendKeys(chromedp.ID("r-pool"), "gpu"),
		chromedp.WaitVisible(chromedp.CSS(`#reserve-preview .verdict.fits`)),
	)
	acmeNode := f.tenantNode(t, "acme")
	require.Contains(t, tab.text("#reserve-preview"), acmeNode)
	require.Contains(t, tab.text("#reserve-preview"), "1 nodes evaluated, 1 could take it")
	tab.shot("tenant-reserve-fits")

	tab.do("ask for more GPUs than a node has: the preview says why",
		clearInput("r-gpus"),
		chromedp.SendKeys(chromedp.ID("r-gpus"), "9"),
		chromedp.WaitVisible(chromedp.CSS(`#reserve-preview .verdict.nofit`)),
		chromedp.WaitVisible(chromedp.CSS(`#reserve-preview .explanation table`)),
	)
	preview := tab.text("#reserve-preview")
	require.Contains(t, preview, "Why other nodes were rejected")
	require.Contains(t, preview, "0 could take it")
	tab.shot("tenant-reserve-explanation")

	tab.do("back to two GPUs",
		clearInput("r-gpus"),
		chromedp.SendKeys(chromedp.ID("r-gpus"), "2"),
		chromedp.WaitVisible(chromedp.CSS(`#reserve-preview .verdict.fits`)),
	)
	noReload, err := chromedp.Run(tab.ctx, chromedp.Evaluate[bool](`window.bcNoReload === true`))
	require.NoError(t, err)
	require.True(t, noReload, "the preview changed without a reload")

	tab.do("reserve",
		chromedp.Click(chromedp.CSS(`form.reserve-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.ID("timeline-title")),
	)
	h1 := tab.text("h1")
	require.True(t, strings.HasPrefix(h1, "Reservation rsv_"), h1)
	id := strings.TrimPrefix(h1, "Reservation ")
	require.Equal(t, 3, f.tenantReservations(t, "acme")+f.tenantReservations(t, "rival"), "one more reservation")
	bctest.WaitFor(t, "the node binds it", func() bool { return f.state(t, "acme", id) == "active" })
	tab.do("see it active",
		chromedp.Navigate(base+console.PathReservations+"/"+id),
		chromedp.WaitVisible(chromedp.ID("timeline-title")),
	)
	require.Equal(t, "active", tab.text("dl.facts dd"))
	require.Contains(t, tab.text(".timeline"), "placed on "+acmeNode)
	tab.shot("tenant-reservation")

	tab.do("release it", chromedp.Click(chromedp.CSS(`button[aria-label="Release `+id+`"]`)))
	tab.until("the page shows it released", `document.querySelector("dl.facts dd")?.textContent === "released"`)
	require.Equal(t, "released", f.state(t, "acme", id))
	require.Contains(t, tab.text(".timeline"), "Ended")
	tab.shot("tenant-reservation-released")

	for _, pg := range []struct{ name, path, sel string }{
		{"tenant-reservations", console.PathReservations, "#rsv-" + id},
		{"tenant-reserve-new", console.PathReservationNew, "#r-pool"},
		{"tenant-usage", console.PathUsage, "#u-metric"},
		{"tenant-instances", console.PathInstances, "#i-name"},
		{"tenant-sandboxes", console.PathSandboxes, "#s-template"},
	} {
		tab.do("open "+pg.path,
			chromedp.Navigate(base+pg.path),
			chromedp.WaitVisible(chromedp.CSS(pg.sel)),
		)
		tab.shot(pg.name)
	}

	tab.do("start a sandbox from the form",
		chromedp.SendKeys(chromedp.ID("s-template"), "box"),
		chromedp.Click(chromedp.CSS(`form.row-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`dl.facts`)),
	)
	sbx := strings.TrimPrefix(tab.text("h1"), "Sandbox ")
	require.Contains(t, tab.text("main"), "better-compute sandboxes exec "+sbx+" -it")
	tab.shot("tenant-sandbox")
	tab.do("delete it", chromedp.Click(chromedp.CSS(`button[aria-label="Delete `+sbx+`"]`)))
	tab.until("the page shows it going", `["deleting", "deleted"].includes(document.querySelector("dl.facts dd")?.textContent)`)

	// API keys are the tenant admin's: sign in again as one, create a key
	// (its secret shown once), and revoke it.
	k, err := f.cp.Admin().ApiKeys.Create(context.Background(), connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "admin", Name: "acme-admin"}))
	require.NoError(t, err)
	tab.do("sign in as the tenant's admin",
		chromedp.Click(chromedp.CSS(`header form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.ID("api-key")),
		chromedp.SendKeys(chromedp.ID("api-key"), k.Msg.GetSecret()),
		chromedp.Click(chromedp.CSS(`form.signin button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`table caption`)),
		chromedp.Click(chromedp.CSS(`nav a[href="/console/api-keys"]`)),
		chromedp.WaitVisible(chromedp.ID("k-name")),
	)
	tab.shot("tenant-api-keys")
	tab.do("create a key",
		chromedp.SendKeys(chromedp.ID("k-name"), "ci-runner"),
		chromedp.SetValue(chromedp.ID("k-role"), "viewer"),
		chromedp.Click(chromedp.CSS(`form.row-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.ID("new-secret")),
	)
	secret, err := chromedp.Run(tab.ctx, chromedp.Evaluate[string](`document.getElementById("new-secret").value`))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(secret, "bc_"), secret)
	tab.shot("tenant-api-key-created")
	tab.do("revoke it",
		chromedp.Click(chromedp.CSS(`button[aria-label="Revoke ci-runner"]`)),
		// The revoked-keys list links back to the live ones.
		chromedp.WaitVisible(chromedp.CSS(`main a[href="/console/api-keys"]`)),
	)
	require.Contains(t, tab.text("main table"), "revoked")
	require.NotContains(t, tab.text("main"), secret, "the secret is not shown again")

	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(recv.Close)
	hook := recv.URL + "/hook"
	tab.do("create a webhook",
		chromedp.Click(chromedp.CSS(`nav a[href="/console/webhooks"]`)),
		chromedp.WaitVisible(chromedp.ID("w-url")),
		chromedp.SendKeys(chromedp.ID("w-url"), hook),
		chromedp.SendKeys(chromedp.ID("w-types"), "reservation.*"),
		chromedp.Click(chromedp.CSS(`form.row-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.ID("new-secret")),
	)
	whsec, err := chromedp.Run(tab.ctx, chromedp.Evaluate[string](`document.getElementById("new-secret").value`))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(whsec, "whsec_"), whsec)
	tab.shot("tenant-webhook-created")
	tab.do("send it a test event", chromedp.Click(chromedp.CSS(`button[aria-label="Send test `+hook+`"]`)))
	tab.until("the page says the test is queued", `document.querySelector("p.notice")?.textContent.startsWith("Test delivery")`)
	require.NotContains(t, tab.text("main"), whsec)
	tab.shot("tenant-webhooks")
	tab.do("delete it",
		chromedp.Click(chromedp.CSS(`button[aria-label="Delete `+hook+`"]`)),
		chromedp.WaitVisible(chromedp.CSS(`p.empty`)),
	)
	tab.clean()
}
