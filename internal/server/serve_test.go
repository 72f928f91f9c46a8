package server

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	bcapp "github.com/better-compute/better-compute/internal/app"
)

// options are serve's flag defaults for the api and worker roles on a free
// port in state.
func options(state string) Options {
	return Options{Roles: []string{bcapp.RoleAPI, bcapp.RoleWorker}, Listen: "127.0.0.1:0", StateDir: state,
		LogFormat: "json", LogLevel: "info",
		HeartbeatInterval: 10 * time.Second, UnreachableAfter: 30 * time.Second, LostAfter: 5 * time.Minute}
}

// A setting serve refuses is refused by its flag before the state
// directory is made.
func TestServeRefusesSettingsFirst(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		flag   string
		mutate func(*Options)
	}{
		{"log-format", func(o *Options) { o.LogFormat = "xml" }},
		{"db-lock-timeout", func(o *Options) { o.DBLockTimeout = -time.Second }},
		{"heartbeat-interval", func(o *Options) { o.HeartbeatInterval = 0 }},
		{"unreachable-after", func(o *Options) { o.UnreachableAfter = 15 * time.Second }},
		{"trusted-proxies", func(o *Options) { o.TrustedProxies = "10.0.0.0/8, proxy.example" }},
		{"roles", func(o *Options) { o.Roles = append(o.Roles, bcapp.RoleGateway); o.Secret = " " }},
	} {
		t.Run(c.flag, func(t *testing.T) {
			t.Parallel()
			state := filepath.Join(t.TempDir(), "state")
			o := options(state)
			c.mutate(&o)
			err := Serve(t.Context(), o, io.Discard)
			var fe *FlagError
			require.ErrorAs(t, err, &fe)
			require.Equal(t, c.flag, fe.Flag)
			require.True(t, strings.HasPrefix(err.Error(), "invalid --"+c.flag+": "), err.Error())
			_, err = os.Stat(state)
			require.ErrorIs(t, err, os.ErrNotExist)
		})
	}
}

// logWriter closes seen once the log says serve is serving.
type logWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	once sync.Once
	seen chan struct{}
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.buf.Write(p)
	if strings.Contains(w.buf.String(), `"msg":"serving"`) {
		w.once.Do(func() { close(w.seen) })
	}
	return n, err
}

func (w *logWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// serveUntilServing runs Serve until it logs that it serves, then stops it.
func serveUntilServing(t *testing.T, o Options) string {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	logs := &logWriter{seen: make(chan struct{})}
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, o, logs) }()
	select {
	case err := <-done:
		t.Fatalf("serve stopped (%v) before serving: %s", err, logs.String())
	case <-logs.seen:
	}
	cancel()
	require.NoError(t, <-done, "a stop by the context is clean")
	return logs.String()
}

// An empty database is bootstrapped into the key file alone, never the
// logs; a restart finds the platform and leaves the file; and a key file
// left from another database is never replaced.
func TestServeBootstrapsIntoTheKeyFile(t *testing.T) {
	t.Parallel()
	state := filepath.Join(t.TempDir(), "state")
	o := options(state)
	logs := serveUntilServing(t, o)
	require.Contains(t, logs, "platform created")
	keyFile := filepath.Join(state, "admin.key")
	key, err := os.ReadFile(keyFile)
	require.NoError(t, err)
	require.NotContains(t, logs, strings.TrimSpace(string(key)), "the key is never logged")
	fi, err := os.Stat(keyFile)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	logs = serveUntilServing(t, o)
	require.NotContains(t, logs, "platform created")
	again, err := os.ReadFile(keyFile)
	require.NoError(t, err)
	require.Equal(t, string(key), string(again))

	// A fresh database whose key file is taken: refused, UNAVAILABLE.
	fresh := options(filepath.Join(t.TempDir(), "state"))
	fresh.BootstrapKeyFile = keyFile
	err = Serve(t.Context(), fresh, io.Discard)
	require.ErrorContains(t, err, "bootstrap the platform")
	require.Equal(t, connect.CodeUnavailable, connect.CodeOf(err))
	again, err = os.ReadFile(keyFile)
	require.NoError(t, err)
	require.Equal(t, string(key), string(again), "the other database's key is kept")
}
