// Command console measures how fast the web console's pages come back from
// `better-compute dev` with a large simulated fleet: it starts the real dev
// process (--sim-nodes N), waits until every node's GPUs are in the
// fleet overview, signs in with dev's admin key as a browser would (the
// sign-in form, its CSRF cookie, the session cookie), then fetches every
// page the console's navigation names -requests times and reports, per
// page, the time to the first byte and to the whole page (p50, p95, max).
// With -browser it also opens each page in Debian's chromium and reads the
// page's first-contentful-paint from the Performance API.
//
// With -json the last line of stdout is one JSON object.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/console"
)

type options struct {
	bin      string
	nodes    int
	requests int
	browser  bool
	jsonOut  bool
	ready    time.Duration
	api, key string
	pages    string
}

// pageFigures is one page's timings, in milliseconds.
type pageFigures struct {
	Path       string  `json:"path"`
	Status     int     `json:"status"`
	Bytes      int     `json:"bytes"`
	TTFBP50    float64 `json:"ttfb_p50_ms"`
	TotalP50   float64 `json:"total_p50_ms"`
	TotalP95   float64 `json:"total_p95_ms"`
	TotalMax   float64 `json:"total_max_ms"`
	FirstPaint float64 `json:"first_contentful_paint_ms,omitempty"`
}

type result struct {
	Nodes    int           `json:"nodes"`
	GPUs     int32         `json:"gpus"`
	Requests int           `json:"requests"`
	Load     string        `json:"loadavg"`
	Pages    []pageFigures `json:"pages"`
}

func main() {
	var o options
	flag.StringVar(&o.bin, "bin", "", "the better-compute binary (default: go build ./cmd/better-compute into a temporary directory)")
	flag.IntVar(&o.nodes, "nodes", 1000, "simulated nodes dev runs (8 GPUs each)")
	flag.IntVar(&o.requests, "requests", 20, "fetches of each page")
	flag.BoolVar(&o.browser, "browser", false, "also read each page's first-contentful-paint in chromium")
	flag.BoolVar(&o.jsonOut, "json", false, "print the result as one JSON object on the last line")
	flag.DurationVar(&o.ready, "ready-timeout", 20*time.Minute, "how long the fleet may take to join")
	flag.StringVar(&o.api, "api", "", "measure a dev already running at this API address (with -key) instead of starting one; run it with --request-rate 0")
	flag.StringVar(&o.key, "key", "", "the admin key of the dev named by -api")
	flag.StringVar(&o.pages, "pages", "", "comma-separated console paths to measure (default: every page the navigation names)")
	flag.Parse()
	if err := run(context.Background(), o); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, o options) error {
	api, key := o.api, o.key
	if api == "" {
		var stop func()
		var err error
		if api, key, stop, err = startDev(ctx, o); err != nil {
			return err
		}
		defer stop()
	}
	log.Printf("dev is up at %s; waiting for %d nodes' GPUs", api, o.nodes)
	gpus, err := waitForFleet(ctx, api, key, int32(o.nodes*8), o.ready)
	if err != nil {
		return err
	}
	log.Printf("%d GPUs in the overview; measuring", gpus)

	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar}
	if err := signIn(hc, api, key); err != nil {
		return err
	}
	res := result{Nodes: o.nodes, GPUs: gpus, Requests: o.requests}
	paths := console.NavPaths()
	if o.pages != "" {
		paths = strings.Split(o.pages, ",")
	}
	for _, path := range paths {
		f, err := measure(hc, api+path, o.requests)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		f.Path = path
		res.Pages = append(res.Pages, f)
	}
	if o.browser {
		if err := firstPaints(ctx, api, key, res.Pages); err != nil {
			return err
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		res.Load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	for _, p := range res.Pages {
		fmt.Printf("%-24s %3d %7d B  ttfb p50 %6.1f ms  total p50 %6.1f  p95 %6.1f  max %6.1f ms  fcp p50 %6.1f ms\n",
			p.Path, p.Status, p.Bytes, p.TTFBP50, p.TotalP50, p.TotalP95, p.TotalMax, p.FirstPaint)
	}
	fmt.Printf("load average %s\n", res.Load)
	if o.jsonOut {
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	return nil
}

// startDev runs dev with o.nodes simulated nodes in a temporary state
// directory; stop ends it and removes the directory.
func startDev(ctx context.Context, o options) (api, key string, stop func(), err error) {
	dir, err := os.MkdirTemp("", "bc-console-bench-")
	if err != nil {
		return "", "", nil, err
	}
	if o.bin == "" {
		o.bin = filepath.Join(dir, "better-compute")
		build := exec.CommandContext(ctx, "go", "build", "-o", o.bin, "./cmd/better-compute")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			_ = os.RemoveAll(dir)
			return "", "", nil, fmt.Errorf("build: %w", err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	dev := exec.CommandContext(ctx, o.bin, "dev", "--sim-nodes", fmt.Sprint(o.nodes), "--sim-cgroups", "plain",
		"--state-dir", filepath.Join(dir, "state"), "--config", filepath.Join(dir, "config.yaml"),
		"--listen", "127.0.0.1:0", "--gateway-listen", "127.0.0.1:0", "--log-level", "error",
		// Every page is a few API calls (WhoAmI, then its reads) with the
		// viewer's key: fetching each page back to back would measure the
		// per-principal rate limit, not the page.
		"--request-rate", "0")
	dev.Stderr = os.Stderr
	dev.Cancel = func() error { return dev.Process.Signal(os.Interrupt) }
	dev.WaitDelay = 30 * time.Second
	out, err := dev.StdoutPipe()
	if err == nil {
		err = dev.Start()
	}
	if err != nil {
		cancel()
		_ = os.RemoveAll(dir)
		return "", "", nil, err
	}
	stop = func() {
		cancel()
		_ = dev.Wait()
		_ = os.RemoveAll(dir)
	}
	api, key, err = devAddress(out)
	if err != nil {
		stop()
		return "", "", nil, err
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	return api, key, stop, nil
}

// devAddress reads dev's start-up lines for the API address and the admin
// key (a fresh state directory: the key is shown).
func devAddress(out io.Reader) (api, key string, err error) {
	apiRe, keyRe := regexp.MustCompile(`^API: (\S+)`), regexp.MustCompile(`^admin key: (bc_\S+)`)
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if m := apiRe.FindStringSubmatch(sc.Text()); m != nil {
			api = m[1]
		}
		if m := keyRe.FindStringSubmatch(sc.Text()); m != nil {
			key = m[1]
		}
		if api != "" && key != "" {
			return api, key, nil
		}
	}
	return "", "", errors.New("dev ended before it printed its API address and admin key")
}

func waitForFleet(ctx context.Context, api, key string, want int32, limit time.Duration) (int32, error) {
	c := client.New(api, key)
	deadline := time.Now().Add(limit)
	for {
		res, err := c.Capacity.ByPool(ctx, connect.NewRequest(&apiv1.CapacityByPoolRequest{}))
		var total int32
		if err == nil {
			for _, r := range res.Msg.GetRows() {
				total += r.GetTotal()
			}
			if total >= want {
				return total, nil
			}
		}
		if time.Now().After(deadline) {
			return total, fmt.Errorf("the fleet has %d of %d GPUs after %s (last error: %w)", total, want, limit, err)
		}
		time.Sleep(2 * time.Second)
	}
}

var csrfRe = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// signIn posts the sign-in form as a browser does: the form's token
// (echoed from its cookie) and the key.
func signIn(hc *http.Client, api, key string) error {
	res, err := hc.Get(api + console.PathSignIn)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	m := csrfRe.FindSubmatch(body)
	if m == nil {
		return errors.New("the sign-in page has no CSRF token")
	}
	req, _ := http.NewRequest(http.MethodPost, api+console.PathSignIn, strings.NewReader(url.Values{"csrf": {string(m[1])}, "api_key": {key}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", api)
	res, err = hc.Do(req)
	if err != nil {
		return err
	}
	res.Body.Close()
	u, _ := url.Parse(api + console.PathOverview)
	for _, c := range hc.Jar.Cookies(u) {
		if c.Name == console.SessionCookie {
			return nil
		}
	}
	return fmt.Errorf("sign-in answered %d and set no session", res.StatusCode)
}

func measure(hc *http.Client, u string, n int) (pageFigures, error) {
	var f pageFigures
	var ttfb, total []float64
	for i := 0; i < n+1; i++ {
		start := time.Now()
		res, err := hc.Get(u)
		if err != nil {
			return f, err
		}
		first := time.Since(start)
		b, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil {
			return f, err
		}
		whole := time.Since(start)
		f.Status, f.Bytes = res.StatusCode, len(b)
		if res.StatusCode != http.StatusOK {
			return f, fmt.Errorf("answered %d: %.300s", res.StatusCode, b)
		}
		if i == 0 {
			continue // the first fetch warms the page's queries
		}
		ttfb, total = append(ttfb, ms(first)), append(total, ms(whole))
	}
	slices.Sort(ttfb)
	slices.Sort(total)
	f.TTFBP50, f.TotalP50 = pct(ttfb, 50), pct(total, 50)
	f.TotalP95, f.TotalMax = pct(total, 95), total[len(total)-1]
	return f, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func pct(sorted []float64, p int) float64 {
	return sorted[min(len(sorted)-1, (len(sorted)*p+99)/100-1)]
}

// paintsPerPage is how many times -browser opens each page; the median
// is reported (one paint on a busy machine is mostly scheduling noise).
const paintsPerPage = 5

// firstPaints opens each page in chromium (signed in through the form) and
// reads the page's first-contentful-paint: from navigation start to the
// first text drawn, what a person waits for.
func firstPaints(ctx context.Context, api, key string, pages []pageFigures) error {
	path, err := exec.LookPath("chromium")
	if err != nil {
		return errors.New("-browser needs Debian's chromium (apt-get install chromium)")
	}
	dir, err := os.MkdirTemp("", "bc-console-bench-chromium-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.UserDataDir(dir))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancel := chromedp.NewContext(allocCtx)
	defer cancel()
	if err := chromedp.Do(bctx,
		chromedp.Navigate(api+console.PathSignIn),
		chromedp.WaitVisible(chromedp.ID("api-key")),
		chromedp.SendKeys(chromedp.ID("api-key"), key),
		chromedp.Click(chromedp.CSS(`form.signin button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`nav[aria-label="Console"]`)),
	); err != nil {
		return fmt.Errorf("sign in with chromium: %w", err)
	}
	for i := range pages {
		var paints []float64
		for range paintsPerPage {
			if err := chromedp.Do(bctx, chromedp.Navigate(api+pages[i].Path), chromedp.WaitVisible(chromedp.CSS("main h1"))); err != nil {
				return fmt.Errorf("open %s: %w", pages[i].Path, err)
			}
			fcp, err := chromedp.Run(bctx, chromedp.Evaluate[float64](
				`new Promise(ok => new PerformanceObserver((l, o) => { const e = l.getEntriesByName("first-contentful-paint")[0]; if (e) { o.disconnect(); ok(e.startTime); } }).observe({type: "paint", buffered: true}))`,
				chromedp.EvalAwaitPromise))
			if err != nil {
				return fmt.Errorf("first paint of %s: %w", pages[i].Path, err)
			}
			paints = append(paints, fcp)
		}
		slices.Sort(paints)
		pages[i].FirstPaint = pct(paints, 50)
	}
	return nil
}
