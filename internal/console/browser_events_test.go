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

// TestConsoleBrowserEvents opens the events page in Debian's chromium as
// acme's viewer: the fields are labelled, Next page and the filter form
// work, a reservation's event links to its page, and the console stays
// clean. Screenshots go where TestConsoleBrowserOps puts them.
// BC_BROWSER=1 runs it.
func TestConsoleBrowserEvents(t *testing.T) {
	if os.Getenv("BC_BROWSER") == "" {
		t.Skip("BC_BROWSER is not set: this test drives Debian's chromium (apt-get install chromium); set BC_BROWSER=1 to run it")
	}
	t.Parallel()
	path, err := exec.LookPath("chromium")
	require.NoError(t, err, "BC_BROWSER is set but chromium is not installed (apt-get install chromium)")
	f := setup(t)
	f.waitForEvents(t)

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
		chromedp.SendKeys(chromedp.ID("api-key"), f.viewer),
		chromedp.Click(chromedp.CSS(`form.signin button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`table caption`)),
	), "sign in as acme's viewer")

	// The filter form, submitted in the browser, narrows the list.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(f.cp.URL+console.PathEvents+"?size=1"),
		chromedp.WaitVisible(chromedp.CSS(`a[rel="next"]`)),
	), "open the events page")
	unlabelled, err := chromedp.Run(ctx, chromedp.Evaluate[int](`[...document.querySelectorAll('input:not([type=hidden]), select')]
		.filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label')).length`))
	require.NoError(t, err)
	require.Zero(t, unlabelled, "every field has a label")
	h1, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("h1")))
	require.NoError(t, err)
	require.Equal(t, "Events", strings.TrimSpace(h1))
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(shots, "events.png"), png, 0o644))
	first, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('tbody tr').id`))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(first, "event-"), first)
	// hx-boost swaps the page in place: wait for the next page's row, not
	// for a table the first page already has.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`a[rel="next"]`)),
		chromedp.WaitVisible(chromedp.CSS(`tbody tr:not(#`+first+`)`)),
	), "follow Next page")

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(f.cp.URL+console.PathEvents),
		chromedp.WaitVisible(chromedp.ID("f-resource-id")),
		chromedp.SendKeys(chromedp.ID("f-resource-id"), f.acmeRsv),
		chromedp.Click(chromedp.CSS(`form.filters button[type="submit"]`)),
		// The value attribute is the server's echo of the filtered page.
		chromedp.WaitVisible(chromedp.CSS(`input#f-resource-id[value="`+f.acmeRsv+`"]`)),
		chromedp.WaitVisible(chromedp.CSS(`a[href="/console/reservations/`+f.acmeRsv+`"]`)),
	), "filter by the reservation's id")
	main, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("main")))
	require.NoError(t, err)
	require.Contains(t, main, "reservation.created")
	require.NotContains(t, main, "project.created")
	png, err = chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(shots, "events-filtered.png"), png, 0o644))

	stopConsole()
	<-done
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, problems, "the page's console stays clean")
}
