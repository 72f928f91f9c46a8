package console_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/console"
)

// TestConsoleBrowserOps opens each operator page in Debian's chromium as a
// platform operator: every page draws its heading and content, every form
// field has a label, the overview's chart is an SVG image with a title,
// and the page's console stays clean (no CSP violation, failed load or
// exception). Each page's screenshot goes to BC_CONSOLE_SCREENSHOTS, else
// BC_ARTIFACTS, else the test's temporary directory. BC_BROWSER=1 runs it.
func TestConsoleBrowserOps(t *testing.T) {
	if os.Getenv("BC_BROWSER") == "" {
		t.Skip("BC_BROWSER is not set: this test drives Debian's chromium (apt-get install chromium); set BC_BROWSER=1 to run it")
	}
	t.Parallel()
	path, err := exec.LookPath("chromium")
	require.NoError(t, err, "BC_BROWSER is set but chromium is not installed (apt-get install chromium)")
	f := setup(t)
	ids := f.opsIDs(t)
	acmeID := f.tenantID(t, "acme")

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		// Root in a container: chromium's sandbox needs user namespaces.
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 800),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancelTab := chromedp.NewContext(allocCtx)
	t.Cleanup(cancelTab)
	// A bound for a stuck browser, far above what the steps take on a
	// busy machine; each step waits on the page, never on time.
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	t.Cleanup(cancel)
	require.NoError(t, chromedp.Do(ctx), "start chromium")

	var (
		mu       sync.Mutex
		problems []string
	)
	consoleCtx, stopConsole := context.WithCancel(ctx)
	messages := chromedp.Console(consoleCtx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleWarning || m.IsException() {
				mu.Lock()
				problems = append(problems, m.String()+" at "+m.URL)
				mu.Unlock()
			}
		}
	}()

	shots := os.Getenv("BC_CONSOLE_SCREENSHOTS")
	if shots == "" {
		shots = os.Getenv("BC_ARTIFACTS")
	}
	if shots == "" {
		shots = t.TempDir()
	}
	require.NoError(t, os.MkdirAll(shots, 0o755))

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(f.cp.URL+"/console"),
		chromedp.WaitVisible(chromedp.ID("api-key")),
		chromedp.SendKeys(chromedp.ID("api-key"), f.cp.AdminKey),
		chromedp.Click(chromedp.CSS(`form.signin button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`table caption`)),
	), "sign in as the platform's admin")

	pages := []struct {
		name, path, h1, want, wait string
	}{
		{"ops-overview", console.PathOverview, "Fleet overview", "GPUs free and booked", `figure.chart svg`},
		{"ops-nodes", console.PathNodes, "Nodes", "fake-dgxh100", `#node-` + ids.rivalNode},
		{"ops-node", console.PathNodes + "/" + ids.acmeNode + "?tenant=" + acmeID, "Node ", "NVLink island 0", `#gpu-0`},
		{"ops-pools", console.PathPools, "Pools and offers", "gpu.model In (H100)", `#pool-` + ids.acmePool},
		{"ops-pool", console.PathPools + "/" + ids.acmePool + "?tenant=" + acmeID, "Pool gpu", "Capacity by model", `table caption`},
		{"ops-sites", console.PathSites + "?tenant=acme", "Sites", "No sites yet", `p.empty`},
		{"ops-images", console.PathImages + "?tenant=acme", "Images", "No images yet", `p.empty`},
		{"ops-audit", console.PathAudit + "?tenant=acme", "Audit log", "reservations.create", `table caption`},
		{"ops-quotas", console.PathQuotas, "Quotas and usage", "better-compute quotas set", `p.empty`},
	}
	for _, pg := range pages {
		require.NoError(t, chromedp.Do(ctx,
			chromedp.Navigate(f.cp.URL+pg.path),
			chromedp.WaitVisible(chromedp.CSS(pg.wait)),
		), "open %s", pg.name)
		h1, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("h1")))
		require.NoError(t, err)
		main, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("main")))
		require.NoError(t, err)
		// Every visible field has a label that names it.
		unlabelled, err := chromedp.Run(ctx, chromedp.Evaluate[int](`[...document.querySelectorAll('input:not([type=hidden]), select')]
			.filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label')).length`))
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(strings.TrimSpace(h1), pg.h1), "%s: heading %q", pg.name, h1)
		require.Contains(t, main, pg.want, pg.name)
		require.Zero(t, unlabelled, "%s: every field has a label", pg.name)
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(shots, pg.name+".png"), png, 0o644))
	}

	// The chart is an image for screen readers, named by its title.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(f.cp.URL+console.PathOverview),
		chromedp.WaitVisible(chromedp.CSS(`figure.chart svg`)),
	))
	role, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('figure.chart svg').getAttribute('role')`))
	require.NoError(t, err)
	title, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('figure.chart svg title').textContent`))
	require.NoError(t, err)
	require.Equal(t, "img", role)
	require.Equal(t, "GPUs free and booked, last 24 hours", title)

	stopConsole()
	<-done
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, problems, "the page's console stays clean")
}
