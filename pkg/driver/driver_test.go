package driver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/pkg/driver"
)

// TestMain makes this test binary a driver when BC_DRIVER_TEST_MODE is
// set: the tests start it as their child process, as a host starts a
// driver binary.
func TestMain(m *testing.M) {
	log := driver.NewLogger(slog.LevelDebug) // before Serve redirects os.Stderr
	switch mode := os.Getenv("BC_DRIVER_TEST_MODE"); mode {
	case "":
		os.Exit(m.Run())
	case "memory":
		driver.ServeBMC(memoryDriver{log: log})
	case "leaky":
		driver.ServeBMC(leakyDriver{memoryDriver{log: log}})
	case "badcookie":
		driver.ServeWith(memoryDriver{log: log}, "not-the-cookie", driver.ProtocolVersion)
	case "v2":
		driver.ServeWith(memoryDriver{log: log}, driver.MagicCookieValue, 2)
	case "notadriver":
		fmt.Println("hello, I am not a driver")
	default:
		fmt.Fprintf(os.Stderr, "unknown BC_DRIVER_TEST_MODE %q\n", mode)
		os.Exit(2)
	}
	os.Exit(0)
}

// leakyDriver is a careless driver: it logs the password, prints it,
// returns it in an error and panics with it. The host must keep it out of
// its logs and errors all the same.
type leakyDriver struct{ memoryDriver }

func (d leakyDriver) Open(ctx context.Context, t driver.Target) (driver.BMC, error) {
	d.log.Warn("opening a BMC", "password", t.Password)
	fmt.Fprintln(os.Stderr, "raw stderr: the password is", t.Password)
	fmt.Fprintln(os.Stdout, "raw stdout: the password is", t.Password)
	b, err := d.memoryDriver.Open(ctx, t)
	if err != nil {
		return nil, err
	}
	return leakyBMC{b.(*memoryBMC)}, nil
}

type leakyBMC struct{ *memoryBMC }

func (b leakyBMC) PowerOn(context.Context) error {
	return fmt.Errorf("the BMC said: bad password %s: %w", b.target.Password, driver.ErrRefused)
}

// PowerCycle waits for a BMC that never answers, until the call's
// context ends.
func (b leakyBMC) PowerCycle(ctx context.Context) error {
	<-ctx.Done()
	return &driver.Error{Driver: "memory", Address: b.target.Address, Op: "power cycle", Kind: driver.ErrUnreachable,
		Detail: "no answer", Err: ctx.Err()}
}

func (b leakyBMC) Shutdown(context.Context) error {
	panic("shutting down with password " + b.target.Password)
}

// logRecorder is a host logger whose lines a test waits for.
type logRecorder struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	wrote chan struct{}
}

func newLogRecorder() (*logRecorder, *slog.Logger) {
	r := &logRecorder{wrote: make(chan struct{}, 1)}
	return r, slog.New(slog.NewJSONHandler(r, &slog.HandlerOptions{Level: slog.LevelDebug - 4}))
}

func (r *logRecorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	r.buf.Write(p)
	r.mu.Unlock()
	select {
	case r.wrote <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (r *logRecorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buf.String()
}

// waitFor waits until a logged line holds every one of parts, and returns
// it decoded.
func (r *logRecorder) waitFor(t *testing.T, parts ...string) map[string]any {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		for _, line := range strings.Split(r.String(), "\n") {
			match := line != ""
			for _, p := range parts {
				match = match && strings.Contains(line, p)
			}
			if match {
				var m map[string]any
				require.NoError(t, json.Unmarshal([]byte(line), &m))
				return m
			}
		}
		select {
		case <-r.wrote:
		case <-deadline:
			t.Fatalf("no log line holds %q; the log:\n%s", parts, r.String())
		}
	}
}

func launch(t *testing.T, mode string, log *slog.Logger) (*driver.Client, error) {
	t.Helper()
	c, err := driver.Launch(t.Context(), os.Args[0], driver.Options{Logger: log, Env: []string{"BC_DRIVER_TEST_MODE=" + mode}})
	if err == nil {
		t.Cleanup(func() { _ = c.Close() })
	}
	return c, err
}

func TestLaunchInfoAndPing(t *testing.T) {
	t.Parallel()
	c, err := launch(t, "memory", nil)
	require.NoError(t, err)
	require.Equal(t, driver.Info{Name: "memory", Version: "0.1.0", ProtocolVersion: driver.ProtocolVersion,
		Capabilities: []driver.Capability{driver.CapSetPassword}}, c.Info())
	require.NoError(t, c.Ping())
	require.NoError(t, c.Close())
	require.ErrorIs(t, c.Ping(), driver.ErrDriver, "a closed driver fails its health check")
	require.NoError(t, c.Close(), "closing twice is fine")
}

func TestHandshakeRefusals(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mode    string
		wantErr []string
		wantLog string // what the child said, captured into the host's logger
	}{
		{mode: "badcookie", wantErr: []string{"handshake failed", driver.MagicCookieKey},
			wantLog: "This binary is a plugin"},
		{mode: "v2", wantErr: []string{"protocol version mismatch", "this host speaks BMC driver protocol 1", "Plugin version: 2"}},
		{mode: "notadriver", wantErr: []string{"handshake failed", "hello, I am not a driver"}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			t.Parallel()
			rec, log := newLogRecorder()
			_, err := launch(t, tc.mode, log)
			require.ErrorIs(t, err, driver.ErrDriver)
			for _, want := range tc.wantErr {
				require.ErrorContains(t, err, want)
			}
			if tc.wantLog != "" {
				rec.waitFor(t, tc.wantLog)
			}
		})
	}
}

func TestErrorsKeepTheirKindAcrossTheProcess(t *testing.T) {
	t.Parallel()
	c, err := launch(t, "memory", nil)
	require.NoError(t, err)
	ctx := t.Context()

	_, err = c.Open(ctx, driver.Target{Username: exampleUser, Password: examplePassword})
	require.ErrorIs(t, err, driver.ErrInvalidAddress)

	wrong, err := c.Open(ctx, driver.Target{Address: "10.0.0.7:623", Username: exampleUser, Password: "not-" + examplePassword})
	require.NoError(t, err)
	err = wrong.PowerOn(ctx)
	require.ErrorIs(t, err, driver.ErrAuth)
	require.EqualError(t, err, "bmc memory 10.0.0.7:623: power on: authentication failed: the BMC refused user admin")

	good, err := c.Open(ctx, driver.Target{Address: "10.0.0.8:623", Username: exampleUser, Password: examplePassword})
	require.NoError(t, err)
	setter, ok := good.(driver.PasswordSetter)
	require.True(t, ok, "the driver has CapSetPassword")
	require.ErrorIs(t, setter.SetPassword(ctx, "short"), driver.ErrInvalidArgument)
	require.NoError(t, setter.SetPassword(ctx, "long-enough-pw"))
	require.ErrorIs(t, good.SetBootOverride(ctx, driver.BootOverride{Target: "floppy"}), driver.ErrInvalidArgument)
	require.NoError(t, good.SetBootOverride(ctx, driver.BootOverride{Target: driver.BootPXE, Persistent: true}))
	require.ErrorIs(t, good.EjectVirtualMedia(ctx), driver.ErrUnsupported)

	// Two BMCs through one process keep apart.
	require.NoError(t, good.PowerOn(ctx))
	st, err := good.PowerStatus(ctx)
	require.NoError(t, err)
	require.Equal(t, driver.PowerOn, st)
	_, err = wrong.PowerStatus(ctx)
	require.ErrorIs(t, err, driver.ErrAuth)

	require.NoError(t, good.Close(ctx))
	_, err = good.PowerStatus(ctx)
	require.ErrorIs(t, err, driver.ErrInvalidArgument, "a closed BMC's session is gone")
	require.NoError(t, good.Close(ctx), "closing twice is fine")
}

// TestDriverOutputReachesHostLoggerScrubbed: what a driver logs (at its
// level, with its attributes), prints to stdout and stderr, returns and
// panics with reaches the host, and the password it was handed appears
// in none of it.
func TestDriverOutputReachesHostLoggerScrubbed(t *testing.T) {
	t.Parallel()
	const secret = examplePassword
	rec, log := newLogRecorder()
	c, err := launch(t, "leaky", log)
	require.NoError(t, err)
	ctx := t.Context()
	b, err := c.Open(ctx, driver.Target{Address: "10.0.0.9:623", Username: exampleUser, Password: secret})
	require.NoError(t, err)

	line := rec.waitFor(t, "opening a BMC")
	require.Equal(t, "WARN", line["level"], "the driver's level is kept")
	require.Equal(t, "[redacted]", line["password"])
	require.Equal(t, os.Args[0][strings.LastIndex(os.Args[0], "/")+1:], line["driver"])
	rec.waitFor(t, "raw stderr: the password is [redacted]", `"stream":"stderr"`)
	rec.waitFor(t, "raw stdout: the password is [redacted]", `"stream":"stdout"`)
	rec.waitFor(t, "opened a BMC", "[redacted]")

	err = b.PowerOn(ctx)
	require.ErrorIs(t, err, driver.ErrRefused)
	require.ErrorContains(t, err, "bad password [redacted]")

	err = b.Shutdown(ctx)
	require.ErrorIs(t, err, driver.ErrDriver, "a driver that panics fails its process, not the BMC")
	require.NotContains(t, err.Error(), secret)
	rec.waitFor(t, "panic: shutting down with password [redacted]", `"level":"ERROR"`)
	require.ErrorIs(t, c.Ping(), driver.ErrDriver)

	require.NotContains(t, rec.String(), secret)
}

// TestDeadlineCrossesTheProcess: the host's deadline ends the driver's
// call, and the host sees a BMC that did not answer in time.
func TestDeadlineCrossesTheProcess(t *testing.T) {
	t.Parallel()
	c, err := launch(t, "leaky", nil)
	require.NoError(t, err)
	b, err := c.Open(t.Context(), driver.Target{Address: "10.0.0.10:623", Username: exampleUser, Password: examplePassword})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	err = b.PowerCycle(ctx)
	require.ErrorIs(t, err, driver.ErrUnreachable)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, c.Ping(), "the driver lives on")
	st, err := b.PowerStatus(t.Context())
	require.NoError(t, err)
	require.Equal(t, driver.PowerOff, st)
}

func TestTargetRedactsItsPassword(t *testing.T) {
	t.Parallel()
	target := driver.Target{Address: "10.0.0.5:623", Username: "admin", Password: examplePassword}
	var logged bytes.Buffer
	slog.New(slog.NewTextHandler(&logged, nil)).Info("target", "target", target)
	js, err := json.Marshal(target)
	require.NoError(t, err)
	for _, s := range []string{
		fmt.Sprint(target), fmt.Sprintf("%+v", target), fmt.Sprintf("%#v", target), fmt.Sprintf("%s", target), //nolint:gosimple,staticcheck // every verb on purpose
		fmt.Sprintf("%x", target), fmt.Sprintf("%v", &target), logged.String(), string(js),
	} {
		require.NotContains(t, s, examplePassword)
		require.Contains(t, s, "admin")
	}
}

// TestSDKImportsNothingInternal: third parties build drivers with this
// package alone, and Go refuses their import of anything under internal/.
func TestSDKImportsNothingInternal(t *testing.T) {
	t.Parallel()
	goBin, err := exec.LookPath("go")
	require.NoError(t, err, "the go tool runs this test")
	out, err := exec.CommandContext(t.Context(), goBin, "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	require.NoError(t, err)
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "github.com/hashicorp/go-plugin")
	for _, dep := range deps {
		require.NotContains(t, dep, "better-compute/internal", "pkg/driver depends on %s", dep)
	}
}
