package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
)

// lockedBuffer is a bytes.Buffer safe to write from a child process's
// copier while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// promQuery asks Prometheus's HTTP API for an instant vector and returns
// the value of its only sample ("" when the result is empty or the query
// failed: the caller polls).
func promQuery(ctx context.Context, base, query string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/query?query="+url.QueryEscape(query), nil)
	if err != nil {
		return ""
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Data   struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if json.NewDecoder(resp.Body).Decode(&body) != nil || body.Status != "success" || len(body.Data.Result) != 1 {
		return ""
	}
	s, _ := body.Data.Result[0].Value[1].(string)
	return s
}

// TestPrometheusScrapesDev runs `better-compute dev --sim-nodes 2` and the
// real Prometheus server scraping its /metrics every second, then asks
// Prometheus's query API for the free H100s (2 DGX H100 × 8) and for the
// simulated nodes' GPU telemetry, as an operator's dashboard would.
func TestPrometheusScrapesDev(t *testing.T) {
	t.Parallel()
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus is not on PATH (Debian package prometheus; .ci/run installs it): the real scrape is not tested")
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "config.yaml")
	a := newApp("dev", func(k string) (string, bool) {
		v := map[string]string{envConfig: cfgPath}[k]
		return v, v != ""
	})
	out := newWaitWriter("sim: 2 simulated nodes")
	var errb lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, a, []string{"dev", "--config", cfgPath, "--log-level", "error", "--state-dir", filepath.Join(dir, "state"),
			"--listen", "127.0.0.1:0", "--gateway-listen", "127.0.0.1:0", "--sim-nodes", "2", "--sim-cgroups", "plain",
			"--heartbeat-interval", "1s"}, nil, out, &errb)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	select {
	case code := <-done:
		t.Fatalf("dev exited with %d before its simulated nodes started:\n%s\n%s", code, out.String(), errb.String())
	case <-out.seen:
	case <-bctest.Deadline(t):
		t.Fatalf("gave up waiting for dev at the test deadline:\n%s", out.String())
	}
	m := regexp.MustCompile(`API: http://(\S+)`).FindStringSubmatch(out.String())
	require.NotNil(t, m, "dev names its API address:\n%s", out.String())
	target := m[1]

	// A free port for Prometheus's own listener.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	promAddr := ln.Addr().String()
	require.NoError(t, ln.Close())
	promCfg := filepath.Join(dir, "prometheus.yml")
	require.NoError(t, os.WriteFile(promCfg, fmt.Appendf(nil, `global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - %s
scrape_configs:
  - job_name: better-compute
    metrics_path: /metrics
    static_configs:
      - targets: [%q]
`, repoPath(t, "deploy/prometheus/alerts.yml"), target), 0o600))
	var promOut lockedBuffer
	prom := exec.CommandContext(ctx, promBin, "--config.file="+promCfg, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address="+promAddr, "--log.level=warn")
	prom.Stdout, prom.Stderr = &promOut, &promOut
	require.NoError(t, prom.Start())
	promDone := make(chan error, 1)
	go func() { promDone <- prom.Wait() }()
	t.Cleanup(func() {
		cancel()
		<-promDone
	})

	base := "http://" + promAddr
	poll := func(what, query, want string) {
		t.Helper()
		bctest.WaitFor(t, what, func() bool {
			select {
			case err := <-promDone:
				t.Fatalf("prometheus exited (%v):\n%s", err, promOut.String())
			default:
			}
			return promQuery(ctx, base, query) == want
		})
	}
	poll("prometheus scraping the control plane", `up{job="better-compute"}`, "1")
	poll("16 free H100s through Prometheus", `sum(bc_capacity_gpus{state="free",model=~".*H100.*"})`, "16")
	poll("two nodes ready", `sum(bc_fleet_nodes{liveness="ready"})`, "2")
	poll("GPU telemetry of both nodes", `count(bc_node_gpus_reporting == 8)`, "2")
	bctest.WaitFor(t, "every alert rule evaluated without error", func() bool {
		total, ok := promRulesOK(ctx, base)
		return total > 0 && ok == total
	})
}

// promRulesOK counts the rules Prometheus loaded and those whose last
// evaluation succeeded (health "ok").
func promRulesOK(ctx context.Context, base string) (total, ok int) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/rules", nil)
	if err != nil {
		return 0, 0
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0
	}
	defer resp.Body.Close()
	var body struct {
		Data struct {
			Groups []struct {
				Rules []struct {
					Health string `json:"health"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	if json.NewDecoder(resp.Body).Decode(&body) != nil {
		return 0, 0
	}
	for _, g := range body.Data.Groups {
		for _, r := range g.Rules {
			total++
			if r.Health == "ok" {
				ok++
			}
		}
	}
	return total, ok
}

// repoPath is a file of the repository, absolute.
func repoPath(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "..", filepath.FromSlash(name)))
	require.NoError(t, err)
	_, err = os.Stat(p)
	require.NoError(t, err)
	return p
}
