package bmc_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/bctest/redfish"
	"github.com/better-compute/better-compute/internal/metal/bmc"
)

// password is at most 20 bytes, IPMI's limit, and distinctive enough that
// finding it in an error or a log is no accident.
const password = "Zq8-unique-secret"

type redfishFixture struct {
	svc   *redfish.Service
	power *redfish.MemoryPower
	srv   *httptest.Server
	clock *bctest.SimClock
	logs  *bytes.Buffer
}

func setupRedfish(t *testing.T) redfishFixture {
	t.Helper()
	power := &redfish.MemoryPower{}
	clock := bctest.NewSimClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	svc := redfish.New(redfish.Config{Username: "admin", Password: password, Power: power, Now: clock.Now, SessionTimeout: time.Hour})
	srv := httptest.NewServer(svc)
	t.Cleanup(srv.Close)
	return redfishFixture{svc: svc, power: power, srv: srv, clock: clock, logs: &bytes.Buffer{}}
}

func (f redfishFixture) driver(t *testing.T, opts bmc.Options) bmc.Driver {
	t.Helper()
	opts.Logger = slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	d, err := bmc.New("redfish", f.srv.URL, bmc.NewCredentials("admin", password), opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close(context.Background()) })
	return d
}

func TestRedfishDriverPower(t *testing.T) {
	t.Parallel()
	for _, basic := range []bool{false, true} {
		f := setupRedfish(t)
		d := f.driver(t, bmc.Options{BasicAuth: basic})
		ctx := context.Background()

		st, err := d.PowerStatus(ctx)
		require.NoError(t, err)
		require.Equal(t, bmc.PowerOff, st)
		require.NoError(t, d.PowerOff(ctx), "off when off is a no-op")
		require.NoError(t, d.PowerOn(ctx))
		require.NoError(t, d.PowerOn(ctx), "on when on is a no-op")
		st, err = d.PowerStatus(ctx)
		require.NoError(t, err)
		require.Equal(t, bmc.PowerOn, st)
		require.NoError(t, d.PowerCycle(ctx))
		require.Equal(t, []string{"None", "None"}, f.power.Boots(), "one boot for on, one for the cycle")
		require.NoError(t, d.Shutdown(ctx))
		st, err = d.PowerStatus(ctx)
		require.NoError(t, err)
		require.Equal(t, bmc.PowerOff, st, "the simulated guest obeys the ACPI shutdown")
		require.NoError(t, d.PowerCycle(ctx), "a cycle of a machine that is off turns it on")
		st, err = d.PowerStatus(ctx)
		require.NoError(t, err)
		require.Equal(t, bmc.PowerOn, st)

		if basic {
			require.Zero(t, f.svc.Sessions(), "Basic auth opens no session")
		} else {
			require.Equal(t, 1, f.svc.Sessions(), "one session for all calls")
			require.NoError(t, d.Close(ctx))
			require.Zero(t, f.svc.Sessions(), "Close logs out")
		}
		require.NotContains(t, f.logs.String(), password)
	}
}

func TestRedfishDriverBootOverrideAndVirtualMedia(t *testing.T) {
	t.Parallel()
	f := setupRedfish(t)
	d := f.driver(t, bmc.Options{})
	ctx := context.Background()

	require.NoError(t, d.SetBootOverride(ctx, bmc.BootOverride{Target: bmc.BootPXE}))
	target, enabled := f.svc.BootOverride()
	require.Equal(t, "Pxe", target)
	require.Equal(t, "Once", enabled)
	require.NoError(t, d.PowerOn(ctx))
	require.NoError(t, d.PowerCycle(ctx))
	require.Equal(t, []string{"Pxe", "None"}, f.power.Boots(), "a one-time override is spent by one boot")

	require.NoError(t, d.SetBootOverride(ctx, bmc.BootOverride{Target: bmc.BootDisk, Persistent: true}))
	target, enabled = f.svc.BootOverride()
	require.Equal(t, "Hdd", target)
	require.Equal(t, "Continuous", enabled)
	require.NoError(t, d.SetBootOverride(ctx, bmc.BootOverride{Target: bmc.BootNone}))
	_, enabled = f.svc.BootOverride()
	require.Equal(t, "Disabled", enabled)

	err := d.SetBootOverride(ctx, bmc.BootOverride{Target: "floppy"})
	require.ErrorIs(t, err, bmc.ErrInvalidArgument)
	require.Contains(t, err.Error(), `boot target "floppy"`)

	require.NoError(t, d.InsertVirtualMedia(ctx, "http://192.0.2.10/ramdisk.iso"))
	image, inserted := f.svc.Media()
	require.Equal(t, "http://192.0.2.10/ramdisk.iso", image)
	require.True(t, inserted)
	require.NoError(t, d.InsertVirtualMedia(ctx, "https://192.0.2.10/other.iso"), "inserting over media ejects it first")
	image, _ = f.svc.Media()
	require.Equal(t, "https://192.0.2.10/other.iso", image)
	require.NoError(t, d.EjectVirtualMedia(ctx))
	image, inserted = f.svc.Media()
	require.Empty(t, image)
	require.False(t, inserted)
	require.NoError(t, d.EjectVirtualMedia(ctx), "ejecting nothing is a no-op")

	for _, bad := range []string{"file:///etc/passwd", "http://user:pw@192.0.2.10/x.iso", "not a url", "//192.0.2.10/x.iso"} {
		err := d.InsertVirtualMedia(ctx, bad)
		require.ErrorIs(t, err, bmc.ErrInvalidArgument, bad)
	}
	image, _ = f.svc.Media()
	require.Empty(t, image, "a refused image never reached the BMC")
}

func TestRedfishDriverLogsInAgainWhenTheSessionExpires(t *testing.T) {
	t.Parallel()
	f := setupRedfish(t)
	d := f.driver(t, bmc.Options{})
	ctx := context.Background()
	_, err := d.PowerStatus(ctx)
	require.NoError(t, err)
	f.clock.Advance(2 * time.Hour) // the BMC drops the idle session
	require.Zero(t, f.svc.Sessions())
	st, err := d.PowerStatus(ctx)
	require.NoError(t, err)
	require.Equal(t, bmc.PowerOff, st)
	require.Equal(t, 1, f.svc.Sessions())
}

func TestRedfishDriverTypedErrorsNeverCarryThePassword(t *testing.T) {
	t.Parallel()
	f := setupRedfish(t)
	ctx := context.Background()

	// Wrong password, by session and by Basic auth.
	for _, basic := range []bool{false, true} {
		d, err := bmc.New("redfish", f.srv.URL, bmc.NewCredentials("admin", "wrong-"+password), bmc.Options{BasicAuth: basic})
		require.NoError(t, err)
		err = d.PowerOn(ctx)
		require.ErrorIs(t, err, bmc.ErrAuth)
		var be *bmc.Error
		require.ErrorAs(t, err, &be)
		require.Equal(t, "power on", be.Op)
		require.Contains(t, err.Error(), "authentication failed")
		require.Contains(t, err.Error(), "HTTP 401")
		require.NotContains(t, err.Error(), password)
	}
	on, err := f.power.IsOn(ctx)
	require.NoError(t, err)
	require.False(t, on)

	// Nothing listens: unreachable.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	d, err := bmc.New("redfish", "http://"+addr, bmc.NewCredentials("admin", password), bmc.Options{})
	require.NoError(t, err)
	_, err = d.PowerStatus(ctx)
	require.ErrorIs(t, err, bmc.ErrUnreachable)
	require.NotContains(t, err.Error(), password)

	// Something listens but never answers: the driver's timeout ends the call.
	hang := make(chan struct{})
	stuck := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(stuck.Close)
	t.Cleanup(func() { close(hang) })
	d, err = bmc.New("redfish", stuck.URL, bmc.NewCredentials("admin", password), bmc.Options{Timeout: 50 * time.Millisecond})
	require.NoError(t, err)
	err = d.PowerOn(ctx)
	require.ErrorIs(t, err, bmc.ErrUnreachable)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	// A BMC that redirects elsewhere is not followed (it would receive the
	// session token at another host).
	elsewhere := httptest.NewServer(f.svc)
	t.Cleanup(elsewhere.Close)
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, elsewhere.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	t.Cleanup(redirect.Close)
	d, err = bmc.New("redfish", redirect.URL, bmc.NewCredentials("admin", password), bmc.Options{})
	require.NoError(t, err)
	err = d.PowerOn(ctx)
	require.ErrorIs(t, err, bmc.ErrRefused)
	require.Contains(t, err.Error(), "HTTP 307")
	require.Zero(t, f.svc.Sessions())
}

func TestRedfishDriverTLS(t *testing.T) {
	t.Parallel()
	svc := redfish.New(redfish.Config{Username: "admin", Password: password})
	srv := httptest.NewUnstartedServer(svc)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake is expected
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ctx := context.Background()

	d, err := bmc.New("redfish", srv.URL, bmc.NewCredentials("admin", password), bmc.Options{})
	require.NoError(t, err)
	_, err = d.PowerStatus(ctx)
	require.ErrorIs(t, err, bmc.ErrUnreachable, "an untrusted certificate is refused")
	require.Contains(t, err.Error(), "certificate")

	pool := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	for _, opts := range []bmc.Options{{RootCAs: pool}, {InsecureSkipVerify: true}} {
		d, err := bmc.New("redfish", srv.URL, bmc.NewCredentials("admin", password), opts)
		require.NoError(t, err)
		require.NoError(t, d.PowerOn(ctx))
		st, err := d.PowerStatus(ctx)
		require.NoError(t, err)
		require.Equal(t, bmc.PowerOn, st)
		require.NoError(t, d.Close(ctx))
	}
}

func TestUnsupportedOperationsAreTyped(t *testing.T) {
	t.Parallel()
	d, err := bmc.New("ipmi", "127.0.0.1:623", bmc.NewCredentials("admin", password), bmc.Options{})
	require.NoError(t, err)
	err = d.InsertVirtualMedia(context.Background(), "http://192.0.2.1/x.iso")
	require.ErrorIs(t, err, bmc.ErrUnsupported)
	require.Contains(t, err.Error(), "IPMI has no standard virtual media")
	require.ErrorIs(t, d.EjectVirtualMedia(context.Background()), bmc.ErrUnsupported)

	_, err = bmc.New("ilo", "127.0.0.1", bmc.NewCredentials("admin", password), bmc.Options{})
	require.ErrorIs(t, err, bmc.ErrUnsupported)
	require.Contains(t, err.Error(), `unknown driver "ilo"`)
	require.False(t, errors.Is(err, bmc.ErrAuth))
}

// A BMC that offers fewer reset types and no virtual CD: the driver falls
// back where it can (ForceRestart for a cycle) and says "unsupported" where
// it cannot, before sending anything.
func TestRedfishDriverOnALesserBMC(t *testing.T) {
	t.Parallel()
	power := &redfish.MemoryPower{}
	svc := redfish.New(redfish.Config{Username: "admin", Password: password, Power: power,
		ResetTypes: []string{"On", "ForceOff", "ForceRestart"}, NoVirtualMedia: true})
	srv := httptest.NewServer(svc)
	t.Cleanup(srv.Close)
	d, err := bmc.New("redfish", srv.URL, bmc.NewCredentials("admin", password), bmc.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close(context.Background()) })
	ctx := context.Background()

	require.NoError(t, d.PowerOn(ctx))
	require.NoError(t, d.PowerCycle(ctx), "no PowerCycle: ForceRestart instead")
	require.Equal(t, []string{"None", "None"}, power.Boots())

	err = d.Shutdown(ctx)
	require.ErrorIs(t, err, bmc.ErrUnsupported)
	require.Contains(t, err.Error(), "not GracefulShutdown")
	on, err := power.IsOn(ctx)
	require.NoError(t, err)
	require.True(t, on, "the refused shutdown reached nothing")

	err = d.InsertVirtualMedia(ctx, "http://192.0.2.1/x.iso")
	require.ErrorIs(t, err, bmc.ErrUnsupported)
	require.Contains(t, err.Error(), "no virtual CD")
	require.ErrorIs(t, d.EjectVirtualMedia(ctx), bmc.ErrUnsupported)
}
