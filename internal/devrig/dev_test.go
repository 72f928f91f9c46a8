package devrig

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/server"
)

// options are dev's flag defaults on free ports in state.
func options(state string) Options {
	return Options{
		Server: server.Options{Listen: "127.0.0.1:0", GatewayListen: "127.0.0.1:0", StateDir: state, LogFormat: "text", LogLevel: "error",
			HeartbeatInterval: 10 * time.Second, UnreachableAfter: 30 * time.Second, LostAfter: 5 * time.Minute},
		Profile: "dgxh100",
		Cgroups: "plain",
	}
}

// A setting dev refuses is refused by its flag before the state directory
// is made.
func TestOpenRefusesSettingsFirst(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		flag   string
		mutate func(*Options)
	}{
		{"sim-nodes", func(o *Options) { o.Nodes = 1001 }},
		{"sim-machines", func(o *Options) { o.Machines = -1 }},
		{"sim-profile", func(o *Options) { o.Profile = "dgxz900" }},
		{"sim-cgroups", func(o *Options) { o.Cgroups = "some" }},
		{"lost-after", func(o *Options) { o.Server.LostAfter = 20 * time.Second }},
		{"log-level", func(o *Options) { o.Server.LogLevel = "loud" }},
	} {
		t.Run(c.flag, func(t *testing.T) {
			t.Parallel()
			state := filepath.Join(t.TempDir(), "state")
			o := options(state)
			c.mutate(&o)
			_, err := Open(t.Context(), o, io.Discard)
			var fe *server.FlagError
			require.ErrorAs(t, err, &fe)
			require.Equal(t, c.flag, fe.Flag)
			_, err = os.Stat(state)
			require.ErrorIs(t, err, os.ErrNotExist)
		})
	}
}

// With both ports taken Open names both flags and creates no key; a start
// that succeeds shows the key until one marks it shown, and a restart
// opens the same platform with the same key.
func TestOpenBindsBeforeTheKey(t *testing.T) {
	t.Parallel()
	state := filepath.Join(t.TempDir(), "state")
	apiTaken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer apiTaken.Close()
	gwTaken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer gwTaken.Close()
	o := options(state)
	o.Server.Listen, o.Server.GatewayListen = apiTaken.Addr().String(), gwTaken.Addr().String()
	_, err = Open(t.Context(), o, io.Discard)
	require.ErrorContains(t, err, "pass --listen 127.0.0.1:0")
	require.ErrorContains(t, err, "pass --gateway-listen 127.0.0.1:0")
	_, err = os.Stat(filepath.Join(state, "admin.key"))
	require.ErrorIs(t, err, os.ErrNotExist, "a start that cannot serve creates no key")

	open := func() *Rig {
		t.Helper()
		r, err := Open(t.Context(), options(state), io.Discard)
		require.NoError(t, err)
		r.Close()
		return r
	}
	first := open()
	require.True(t, first.ShowKey)
	require.True(t, strings.HasPrefix(first.AdminKey, "bc_"), first.AdminKey)
	key, err := os.ReadFile(first.KeyFile)
	require.NoError(t, err)
	require.Equal(t, first.AdminKey+"\n", string(key))
	require.True(t, open().ShowKey, "not marked shown: shown again")
	require.NoError(t, first.MarkKeyShown())
	again := open()
	require.False(t, again.ShowKey)
	require.Equal(t, first.AdminKey, again.AdminKey)
	for _, f := range []string{"admin.key", "admin.key.shown", "secret"} {
		fi, err := os.Stat(filepath.Join(state, f))
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), f)
	}
}

// dev's secret is the one given, else the one kept in the state directory,
// made once; a kept secret others can read is refused.
func TestDevSecret(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	got, err := devSecret(state, " given \n")
	require.NoError(t, err)
	require.Equal(t, "given", got)
	_, err = os.Stat(filepath.Join(state, "secret"))
	require.ErrorIs(t, err, os.ErrNotExist, "a given secret is not kept")

	made, err := devSecret(state, "")
	require.NoError(t, err)
	require.NotEmpty(t, made)
	kept, err := devSecret(state, "")
	require.NoError(t, err)
	require.Equal(t, made, kept, "a restart opens the same PKI")

	require.NoError(t, os.Chmod(filepath.Join(state, "secret"), 0o644))
	_, err = devSecret(state, "")
	require.ErrorContains(t, err, "is readable by others")
}

// waitWriter collects output and closes seen the first time it contains
// want, so a test waits on the rig's own announcement, not on a timer.
type waitWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	once sync.Once
	seen chan struct{}
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

// runUntil opens a rig with o and runs it until its output contains want,
// then stops it; it returns what Run printed.
func runUntil(t *testing.T, o Options, want string) string {
	t.Helper()
	r, err := Open(t.Context(), o, io.Discard)
	require.NoError(t, err)
	defer r.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	out := &waitWriter{want: want, seen: make(chan struct{})}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, out) }()
	select {
	case err := <-done:
		t.Fatalf("the rig stopped (%v) before printing %q: %s", err, want, out.String())
	case <-out.seen:
	}
	cancel()
	require.NoError(t, <-done)
	return out.String()
}
