package cli

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// waitWriter collects output and closes seen the first time it contains
// want, so a test waits on the server's own announcement, not on a timer.
type waitWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	once sync.Once
	seen chan struct{}
}

func newWaitWriter(want string) *waitWriter {
	return &waitWriter{want: want, seen: make(chan struct{})}
}

func (w *waitWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return n, err
}

func (w *waitWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// runDev starts dev with args; when it comes up it is stopped again. It
// returns the exit code and what dev printed.
func runDev(t *testing.T, cfgPath string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	a := newApp("dev", func(k string) (string, bool) {
		v := map[string]string{envConfig: cfgPath}[k]
		return v, v != ""
	})
	out := newWaitWriter("CLI context")
	var errb bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, a, append([]string{"dev", "--config", cfgPath, "--log-level", "error"}, args...), nil, out, &errb)
	}()
	select {
	case code := <-done:
		return code, out.String(), errb.String()
	case <-out.seen:
	}
	cancel()
	code := <-done
	return code, out.String(), errb.String()
}

// With both ports taken, dev creates nothing and names both flags; a start
// with the suggested flags succeeds and shows the admin key, once.
func TestDevPortsInUseNameTheFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	state, cfgPath := filepath.Join(dir, "state"), filepath.Join(dir, "config.yaml")
	apiTaken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer apiTaken.Close()
	gwTaken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer gwTaken.Close()
	_, apiPort, _ := net.SplitHostPort(apiTaken.Addr().String())
	_, gwPort, _ := net.SplitHostPort(gwTaken.Addr().String())

	code, stdout, stderr := runDev(t, cfgPath, "--state-dir", state,
		"--listen", apiTaken.Addr().String(), "--gateway-listen", gwTaken.Addr().String())
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "port "+apiPort+" is in use: pass --listen 127.0.0.1:0 or another port")
	require.Contains(t, stderr, "port "+gwPort+" is in use: pass --gateway-listen 127.0.0.1:0 or another port")
	require.NotContains(t, stdout, "admin key")
	_, err = os.Stat(filepath.Join(state, "admin.key"))
	require.ErrorIs(t, err, os.ErrNotExist, "a start that cannot serve creates no key")

	// The flags the error suggested.
	suggested := []string{"--state-dir", state, "--listen", "127.0.0.1:0", "--gateway-listen", "127.0.0.1:0"}
	code, stdout, stderr = runDev(t, cfgPath, suggested...)
	require.Equal(t, 0, code, stderr)
	key, err := os.ReadFile(filepath.Join(state, "admin.key"))
	require.NoError(t, err)
	require.Contains(t, stdout, "admin key: "+strings.TrimSpace(string(key)))
	require.Regexp(t, `(?m)^console: http://127\.0\.0\.1:\d+/console `, stdout, "dev's start-up names the console's URL")

	code, stdout, stderr = runDev(t, cfgPath, suggested...)
	require.Equal(t, 0, code, stderr)
	require.NotContains(t, stdout, strings.TrimSpace(string(key)), "the key is shown once")
	require.Contains(t, stdout, "admin key: in ")

	// A key created by a start that failed before showing it (the marker
	// missing) is shown by the next start that succeeds.
	require.NoError(t, os.Remove(filepath.Join(state, "admin.key.shown")))
	code, stdout, stderr = runDev(t, cfgPath, suggested...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "admin key: "+strings.TrimSpace(string(key)))
}

// dev takes the liveness flags, refused by name when they cannot work.
func TestDevLivenessFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	code, _, stderr := runDev(t, filepath.Join(dir, "config.yaml"), "--state-dir", filepath.Join(dir, "state"), "--lost-after", "20s")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "Error: INVALID_ARGUMENT: invalid --lost-after: must be longer than --unreachable-after (30s), not 20s")
	_, err := os.Stat(filepath.Join(dir, "state"))
	require.ErrorIs(t, err, os.ErrNotExist)

	code, stdout, stderr := runDev(t, filepath.Join(dir, "config.yaml"), "--state-dir", filepath.Join(dir, "state"),
		"--listen", "127.0.0.1:0", "--gateway-listen", "127.0.0.1:0",
		"--heartbeat-interval", "2s", "--unreachable-after", "5s", "--lost-after", "15s")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "admin key: bc_")
}

// A simulated fleet larger than the admin's request burst still starts:
// its join-token calls wait out RATE_LIMITED instead of ending dev.
func TestDevSimFleetOutrunsRequestRate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "config.yaml")
	a := newApp("dev", func(k string) (string, bool) {
		v := map[string]string{envConfig: cfgPath}[k]
		return v, v != ""
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	out := newWaitWriter("sim: 4 simulated nodes")
	var errb lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, a, []string{"dev", "--config", cfgPath, "--log-level", "error", "--state-dir", filepath.Join(dir, "state"),
			"--listen", "127.0.0.1:0", "--gateway-listen", "127.0.0.1:0", "--sim-nodes", "4", "--sim-cgroups", "plain",
			"--request-rate", "2", "--request-burst", "1"}, nil, out, &errb)
	}()
	select {
	case code := <-done:
		t.Fatalf("dev exited with %d before its simulated nodes started:\n%s\n%s", code, out.String(), errb.String())
	case <-out.seen:
	}
	cancel()
	<-done
}
