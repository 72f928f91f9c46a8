package console_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/console"
)

const (
	axeFile   = "testdata/axe/axe-4.14.1.min.js"
	axeSHA256 = "29348999450cdf2849a8e70b7912fc2da85a849da39c0d0d5394f51d4a9ed95c"
)

// TestVendoredAxeIsPinned: the axe-core the accessibility test runs is the
// file whose checksum testdata/axe/VENDORED.md records.
func TestVendoredAxeIsPinned(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(axeFile)
	require.NoError(t, err)
	sum := sha256.Sum256(b)
	require.Equal(t, axeSHA256, hex.EncodeToString(sum[:]))
	doc, err := os.ReadFile("testdata/axe/VENDORED.md")
	require.NoError(t, err)
	require.Contains(t, string(doc), axeSHA256)
	lic, err := os.ReadFile("testdata/axe/LICENSE")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(lic), "Mozilla Public License, version 2.0"))
}

// tab is one chromium with its own profile (its own cookies: its own
// person), and what its pages logged as errors.
type tab struct {
	ctx      context.Context
	mu       sync.Mutex
	problems []string
}

// newTab starts Debian's chromium for a browser test, or skips the test
// where BC_BROWSER is not set.
func newTab(t *testing.T) *tab {
	t.Helper()
	if os.Getenv("BC_BROWSER") == "" {
		t.Skip("BC_BROWSER is not set: this test drives Debian's chromium (apt-get install chromium); set BC_BROWSER=1 to run it")
	}
	path, err := exec.LookPath("chromium")
	require.NoError(t, err, "BC_BROWSER is set but chromium is not installed (apt-get install chromium)")
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 800))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancelTab := chromedp.NewContext(allocCtx)
	t.Cleanup(cancelTab)
	// A bound for a stuck browser only; every step waits on the page.
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	t.Cleanup(cancel)
	require.NoError(t, chromedp.Do(ctx), "start chromium")
	b := &tab{ctx: ctx}
	go func() {
		for m, err := range chromedp.Console(ctx) {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleWarning || m.IsException() {
				b.mu.Lock()
				b.problems = append(b.problems, m.String()+" at "+m.URL)
				b.mu.Unlock()
			}
		}
	}()
	return b
}

func (b *tab) signIn(t *testing.T, base, key string) {
	t.Helper()
	require.NoError(t, chromedp.Do(b.ctx,
		chromedp.Navigate(base+console.PathSignIn),
		chromedp.WaitVisible(chromedp.ID("api-key")),
		chromedp.SendKeys(chromedp.ID("api-key"), key),
		chromedp.Click(chromedp.CSS(`form.signin button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`nav[aria-label="Console"]`)),
	), "sign in")
}

// clean fails the test if any page the tab opened logged an error or a
// warning (a CSP violation, a failed script, an uncaught exception).
func (b *tab) clean(t *testing.T) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	require.Empty(t, b.problems, "the page's console stays clean")
}

// axeViolation is what axe-core reports of one rule a page breaks.
type axeViolation struct {
	ID     string `json:"id"`
	Impact string `json:"impact"`
	Help   string `json:"help"`
	Nodes  []struct {
		Target []any `json:"target"`
	} `json:"nodes"`
}

// audit runs axe-core's WCAG 2 A and AA rules on the page the tab shows.
// It is evaluated through the DevTools protocol, outside the page's CSP:
// the console never serves it.
func (b *tab) audit(t *testing.T) []string {
	t.Helper()
	src, err := os.ReadFile(axeFile)
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(b.ctx, chromedp.Evaluate[chromedp.Void](string(src))), "load axe-core")
	violations, err := chromedp.Run(b.ctx, chromedp.Evaluate[[]axeViolation](
		`axe.run(document, {runOnly: {type: "tag", values: ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]}}).then(r => r.violations)`,
		chromedp.EvalAwaitPromise))
	require.NoError(t, err, "run axe-core")
	var out []string
	for _, v := range violations {
		var where []string
		for _, n := range v.Nodes {
			where = append(where, fmt.Sprint(n.Target...))
		}
		out = append(out, fmt.Sprintf("%s (%s): %s at %s", v.ID, v.Impact, v.Help, strings.Join(where, ", ")))
	}
	return out
}

// TestConsoleAccessible opens every page the navigation names, as a
// platform operator, and every page a tenant's member's navigation shows, and requires each to pass
// axe-core's WCAG 2.1 A/AA rules, to be served (not the console's 404) and
// to start with a skip link the keyboard reaches first.
func TestConsoleAccessible(t *testing.T) {
	f := setup(t)
	t.Parallel()
	for _, who := range []struct {
		name, key string
		pages     []string
	}{
		{"operator", f.cp.AdminKey, console.NavPaths()},
		{"member", f.member, console.NavPathsFor("acme", "member")},
	} {
		b := newTab(t)
		b.signIn(t, f.cp.URL, who.key)
		for _, path := range who.pages {
			require.NoError(t, chromedp.Do(b.ctx,
				chromedp.Navigate(f.cp.URL+path),
				chromedp.WaitVisible(chromedp.CSS(`main h1`)),
			), "open %s as %s", path, who.name)
			main, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS(`main`)))
			require.NoError(t, err)
			require.NotContains(t, main, "the console has no page", "%s serves %s", path, who.name)
			require.Empty(t, b.audit(t), "%s as %s breaks WCAG 2.1 A/AA rules", path, who.name)
		}
		// The keyboard: the first Tab reaches the skip link, and it leads
		// to the page's main content.
		require.NoError(t, chromedp.Do(b.ctx,
			chromedp.Navigate(f.cp.URL+console.PathOverview),
			chromedp.WaitVisible(chromedp.CSS(`main h1`)),
			chromedp.KeyEvent(kb.Tab),
		))
		focused, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.activeElement.textContent`))
		require.NoError(t, err)
		require.NoError(t, chromedp.Do(b.ctx, chromedp.KeyEvent(kb.Enter)))
		hash, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](`location.hash`))
		require.NoError(t, err)
		require.Equal(t, "Skip to content", strings.TrimSpace(focused))
		require.Equal(t, "#main", hash)
		b.clean(t)
	}
}

// TestConsoleBrowserViewer: a viewer sees no action on any page of their
// navigation (no button or posting form in the page's main part; a GET
// filter form's button changes nothing), and a
// release forged from their own browser is refused twice over — without
// the session's CSRF token by the console, with it by the API.
func TestConsoleBrowserViewer(t *testing.T) {
	f := setup(t)
	t.Parallel()
	b := newTab(t)
	b.signIn(t, f.cp.URL, f.viewer)
	for _, path := range console.NavPathsFor("acme", "viewer") {
		require.NoError(t, chromedp.Do(b.ctx,
			chromedp.Navigate(f.cp.URL+path),
			chromedp.WaitVisible(chromedp.CSS(`main h1`)),
		), "open %s", path)
		actions, err := chromedp.Run(b.ctx, chromedp.Evaluate[[]string](
			`[...document.querySelectorAll('main button, main form[method="post"]')]
				.filter(e => e.closest("form")?.getAttribute("method") !== "get")
				.map(e => e.outerHTML.slice(0, 120))`))
		require.NoError(t, err)
		require.Empty(t, actions, "a viewer sees no action on %s", path)
	}
	b.clean(t)

	// Forged from the viewer's own page: the browser sends its cookie.
	release := console.PathReservations + "/" + f.acmeRsv + "/release"
	forge := func(withToken bool) string {
		t.Helper()
		js := fmt.Sprintf(`(async () => {
			const body = new URLSearchParams();
			if (%t) { body.set("csrf", document.querySelector('header input[name="csrf"]').value); }
			const r = await fetch(%q, {method: "POST", body});
			return r.status + " " + (await r.text());
		})()`, withToken, release)
		out, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](js, chromedp.EvalAwaitPromise))
		require.NoError(t, err)
		return out
	}
	out := forge(false)
	require.True(t, strings.HasPrefix(out, "403 "), out)
	require.Contains(t, out, "CSRF_REFUSED")
	out = forge(true)
	require.True(t, strings.HasPrefix(out, "403 "), out)
	require.Contains(t, out, "PERMISSION_DENIED")
	require.Equal(t, "active", f.state(t, "acme", f.acmeRsv), "nothing was released")
}
