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
)

// TestConsoleBrowser drives Debian's chromium through the console as a
// person would: sign in with a pasted key, see the fleet overview, open my
// reservations, release one, and see it released — with no error in the
// page's console (a CSP violation, a failed script or an uncaught
// exception would be one). BC_BROWSER=1 runs it (.ci/run installs
// chromium and does); BC_CONSOLE_SCREENSHOTS=DIR saves the pages as PNGs.
func TestConsoleBrowser(t *testing.T) {
	if os.Getenv("BC_BROWSER") == "" {
		t.Skip("BC_BROWSER is not set: this test drives Debian's chromium (apt-get install chromium); set BC_BROWSER=1 to run it")
	}
	t.Parallel()
	path, err := exec.LookPath("chromium")
	require.NoError(t, err, "BC_BROWSER is set but chromium is not installed (apt-get install chromium)")
	f := setup(t)

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
	// busy machine; each step waits on the page, never on time. The first
	// call starts chromium under this context, so the bound is the
	// browser's life.
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
	if shots != "" {
		require.NoError(t, os.MkdirAll(shots, 0o755))
	}
	shot := func(name string) {
		t.Helper()
		if shots == "" {
			return
		}
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(shots, name+".png"), png, 0o644))
	}
	text := func(sel chromedp.CSS) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(sel))
		require.NoError(t, err, "text of %s", sel)
		return strings.TrimSpace(s)
	}

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(f.cp.URL+"/console"),
		chromedp.WaitVisible(chromedp.ID("api-key")),
	), "open the console")
	shot("sign-in")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.ID("api-key"), f.member),
		chromedp.Click(chromedp.CSS(`form.signin button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`table caption`)),
	), "sign in")
	require.Equal(t, "Fleet overview", text("h1"))
	overview := text("main")
	require.Contains(t, overview, "H100")
	require.Contains(t, overview, "gpu")
	shot("overview")

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`nav a[href="/console/reservations"]`)),
		chromedp.WaitVisible(chromedp.ID("rsv-"+f.acmeRsv)),
	), "open my reservations")
	list := text("main")
	require.Contains(t, list, f.acmeRsv)
	require.Contains(t, list, "active")
	shot("reservations")

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`button[aria-label="Release `+f.acmeRsv+`"]`)),
		chromedp.WaitVisible(chromedp.CSS(`dl.facts`)),
	), "release it")
	require.Equal(t, "Reservation "+f.acmeRsv, text("h1"))
	require.Equal(t, "released", text("dl.facts dd"))
	require.Equal(t, "released", f.state(t, "acme", f.acmeRsv))
	shot("reservation")

	stopConsole()
	<-done
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, problems, "the page's console stays clean")
}
