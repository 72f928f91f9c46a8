package console_test

import (
	"context"
	"fmt"
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

// liveTab is a chromium tab that records every console error, warning and
// uncaught exception of its pages.
type liveTab struct {
	t        *testing.T
	ctx      context.Context
	mu       sync.Mutex
	problems []string
	stop     func()
	done     chan struct{}
}

func watchTab(t *testing.T, ctx context.Context) *liveTab {
	t.Helper()
	require.NoError(t, chromedp.Do(ctx), "open a tab")
	tab := &liveTab{t: t, ctx: ctx, done: make(chan struct{})}
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

// requireClean stops recording and fails on anything the page logged.
func (tab *liveTab) requireClean(name string) {
	tab.t.Helper()
	tab.stop()
	<-tab.done
	tab.mu.Lock()
	defer tab.mu.Unlock()
	require.Empty(tab.t, tab.problems, "%s: the page's console stays clean", name)
}

func (tab *liveTab) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	tab.t.Helper()
	// A bound for a stuck step, far above what one takes.
	ctx, cancel := context.WithTimeout(tab.ctx, stepBound)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		// Show where it stopped.
		html, _ := chromedp.Run(tab.ctx, chromedp.OuterHTML(chromedp.CSS("main")))
		tab.t.Fatalf("%s: %v\n%s", what, err, html)
	}
}

func (tab *liveTab) text(sel string) string {
	tab.t.Helper()
	s, err := chromedp.Run(tab.ctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(tab.t, err, "text of %s", sel)
	return strings.TrimSpace(s)
}

func (tab *liveTab) signIn(base, key string) {
	tab.t.Helper()
	tab.do("sign in",
		chromedp.Navigate(base+console.Path),
		chromedp.WaitVisible(chromedp.ID("api-key")),
		chromedp.SendKeys(chromedp.ID("api-key"), key),
		chromedp.Click(chromedp.CSS(`form.signin button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`main[data-live-url]`)),
	)
}

// shotDir is where screenshots go: BC_CONSOLE_SCREENSHOTS, else
// BC_ARTIFACTS, else the test's own directory.
func shotDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("BC_CONSOLE_SCREENSHOTS")
	if dir == "" && os.Getenv("BC_ARTIFACTS") != "" {
		dir = filepath.Join(os.Getenv("BC_ARTIFACTS"), "console")
	}
	if dir == "" {
		dir = t.TempDir()
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	return dir
}

func (tab *liveTab) shot(dir, name string) {
	tab.t.Helper()
	png, err := chromedp.Run(tab.ctx, chromedp.FullScreenshot(100))
	require.NoError(tab.t, err)
	require.NoError(tab.t, os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644))
}

// TestConsoleBrowserLive drives chromium through a commission that policy
// holds for a second person: acme's admin presses Commission on the
// machine's page and is told it needs an approval; the platform's admin,
// in another browser context (its own cookies), approves it on the
// confirmations page; the admin sends it again, and the machine's step
// list moves from the held wipe to the end with no reload — each step
// waits on the page's DOM, never on time. No page logs an error.
// stepBound bounds one step of a tab that is stuck; each waits on the
// page, never on time.
const stepBound = time.Minute

func TestConsoleBrowserLive(t *testing.T) {
	if os.Getenv("BC_BROWSER") == "" {
		t.Skip("BC_BROWSER is not set: this test drives Debian's chromium (apt-get install chromium); set BC_BROWSER=1 to run it")
	}
	t.Parallel()
	path, err := exec.LookPath("chromium")
	require.NoError(t, err, "BC_BROWSER is set but chromium is not installed (apt-get install chromium)")
	f := setupMachines(t)
	f.confirmCommissions(t)
	shots := shotDir(t)

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
	operatorCtx, cancelOperator := chromedp.NewContext(allocCtx)
	t.Cleanup(cancelOperator)
	operator := watchTab(t, operatorCtx)
	approverCtx, cancelApprover := chromedp.NewContext(operatorCtx, chromedp.WithNewBrowserContext())
	t.Cleanup(cancelApprover)
	approver := watchTab(t, approverCtx)

	machinePage := f.cp.URL + console.PathMachines + "/" + f.acmeM1
	operator.signIn(f.cp.URL, f.acmeAdmin)
	operator.do("open the machines", chromedp.Click(chromedp.CSS(`nav a[href="/console/machines"]`)))
	operator.do("see the list", chromedp.WaitVisible(chromedp.CSS(`tr[id="mch-`+f.acmeM1+`"]`)))
	operator.do("open the machine",
		chromedp.WaitVisible(chromedp.CSS(`tr[id="mch-`+f.acmeM1+`"] a`)),
		liveClick(`tr[id="mch-`+f.acmeM1+`"] a`),
		chromedp.WaitVisible(chromedp.CSS(`#machine-live[data-state="enrolled"]`)),
	)
	require.Equal(t, "Machine m1", operator.text("h1"))
	operator.shot(shots, "machine-enrolled")
	operator.do("press Commission",
		chromedp.WaitVisible(chromedp.CSS(`form[action$="/commission"] button[type="submit"]`)),
		liveClick(`form[action$="/commission"] button[type="submit"]`),
		chromedp.WaitVisible(chromedp.ID("replay")),
	)
	require.Equal(t, "Approval needed", operator.text("h1"))
	require.Contains(t, operator.text("main"), "CONFIRMATION_REQUIRED")
	operator.shot(shots, "approval-needed")

	approver.signIn(f.cp.URL, f.cp.AdminKey)
	approver.do("open acme's pending confirmations",
		chromedp.Navigate(f.cp.URL+console.PathConfirmations+"?tenant=acme"),
		chromedp.WaitVisible(chromedp.CSS(`button[aria-label^="Approve cfm_"]`)),
	)
	require.Contains(t, approver.text("main"), "machines.commission")
	approver.shot(shots, "confirmations-pending")
	approver.do("approve it",
		chromedp.WaitVisible(chromedp.CSS(`button[aria-label^="Approve cfm_"]`)),
		liveClick(`button[aria-label^="Approve cfm_"]`),
		chromedp.WaitVisible(chromedp.CSS(`nav.filters a[aria-current="page"][href*="state=approved"]`)),
	)
	require.Contains(t, approver.text("main"), "approved by")
	approver.shot(shots, "confirmations-approved")

	// The wipe is held, so the page opens mid-workflow and must move on
	// by itself once it is let go.
	release := f.acmeSim.HoldNext("disk.wipe")
	t.Cleanup(release)
	operator.do("send it again with the approval",
		chromedp.WaitVisible(chromedp.ID("replay")),
		liveClick(`#replay`),
		chromedp.WaitVisible(chromedp.CSS(`#machine-live[data-state="commissioning"]`)),
		chromedp.WaitVisible(chromedp.CSS(`html[data-live-state="open"][data-live-types="machine.*,workflow.*"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#workflow-steps tr[data-step-state="running"]`)),
	)
	loc, err := chromedp.Run(operator.ctx, chromedp.Location())
	require.NoError(t, err)
	require.Equal(t, machinePage, loc)
	operator.shot(shots, "machine-commissioning")
	// A reload would drop this mark; an htmx refresh keeps it.
	_, err = chromedp.Run(operator.ctx, chromedp.Evaluate[bool](`window.bcNoReload = true`))
	require.NoError(t, err)
	release()
	operator.do("watch the steps finish",
		chromedp.WaitVisible(chromedp.CSS(`#machine-live[data-state="ready"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#workflow-steps caption`)),
	)
	kept, err := chromedp.Run(operator.ctx, chromedp.Evaluate[bool](`window.bcNoReload === true`))
	require.NoError(t, err)
	require.True(t, kept, "the page updated without a reload")
	steps := operator.text("#workflow-steps")
	require.Contains(t, steps, "commission, succeeded")
	require.NotContains(t, steps, "running")
	require.Contains(t, steps, "wipe")
	operator.shot(shots, "machine-ready")
	require.Equal(t, "ready", f.machine(t, "acme", f.acmeM1).GetState())

	approver.requireClean("approver")
	operator.requireClean("operator")
}

// liveClick clicks the element sel names as the page has it at that
// moment: a live part may swap in a fresh copy between a query and a
// DevTools click, which would then name a node no longer in the page.
func liveClick(sel string) chromedp.Action[chromedp.Void] {
	return chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`document.querySelector(%q).click()`, sel))
}
