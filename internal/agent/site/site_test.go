package site_test

import (
	"context"
	"errors"
	"net"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/better-compute/better-compute/bctest/redfish"
	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent/site"
	"github.com/better-compute/better-compute/internal/site/pxe"
)

func command(t *testing.T, id, kind, key string, params map[string]any) *agentv1.Command {
	t.Helper()
	ps, err := structpb.NewStruct(params)
	require.NoError(t, err)
	return &agentv1.Command{Id: id, Kind: kind, IdempotencyKey: key, Params: ps}
}

func machines(epoch int, addr string) map[string]any {
	return map[string]any{"epoch": epoch, "machines": []any{map[string]any{"id": "mch_1", "name": "m1", "mac": "52:54:00:00:00:01",
		"bmc_driver": "redfish", "bmc_address": addr, "boot": "disk"}}}
}

func power(epoch int, machine, addr, password string) map[string]any {
	return map[string]any{"epoch": epoch, "machine_id": machine, "mac": "52:54:00:00:00:01", "action": "cycle", "boot": "ramdisk",
		"bmc": map[string]any{"driver": "redfish", "address": addr, "username": "admin", "password": password}}
}

// failureCode digs the failure code out of a site command's error (the
// agent's command error prints "CODE: reason").
func failureCode(err error) string {
	if err == nil {
		return ""
	}
	msg := err.Error()
	for i := range msg {
		if msg[i] == ':' {
			return msg[:i]
		}
	}
	return msg
}

// TestSiteAgentRefuses: the site agent touches only machines the control
// plane sent as enrolled at its site, refuses an older epoch, applies a key
// once — across a restart too, where a key that was out to the BMC when
// bcd stopped is never applied again.
func TestSiteAgentRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := &countingPower{}
	bmcSrv := httptest.NewServer(redfish.New(redfish.Config{Username: "admin", Password: "pw", Power: p}))
	t.Cleanup(bmcSrv.Close)
	stranger := &countingPower{}
	strangerSrv := httptest.NewServer(redfish.New(redfish.Config{Username: "admin", Password: "pw", Power: stranger}))
	t.Cleanup(strangerSrv.Close)
	dir := t.TempDir()
	a, err := site.New(site.Config{StateDir: dir, Logger: quiet(), Ramdisk: pxe.Ramdisk{Kernel: "k", Initrd: "i"}})
	require.NoError(t, err)

	_, err = a.Apply(ctx, command(t, "c1", site.KindSiteMachines, "", machines(2, bmcSrv.URL)))
	require.NoError(t, err)

	tests := []struct {
		name, key string
		params    map[string]any
		code      string
	}{
		{"a machine not in the list", "k-a", power(2, "mch_other", strangerSrv.URL, "pw"), site.FailNotEnrolled},
		{"an enrolled machine's id with another BMC", "k-b", power(2, "mch_1", strangerSrv.URL, "pw"), site.FailNotEnrolled},
		{"a former lease holder's epoch", "k-c", power(1, "mch_1", bmcSrv.URL, "pw"), site.FailStaleEpoch},
		{"no credential (fenced at delivery)", "k-d", power(2, "mch_1", bmcSrv.URL, ""), site.FailNoCredential},
		{"bad action", "k-e", map[string]any{"epoch": 2, "action": "reboot"}, "INVALID_PARAMS"},
	}
	for _, tc := range tests {
		_, err := a.Apply(ctx, command(t, "c-"+tc.key, site.KindBMCPower, tc.key, tc.params))
		require.Error(t, err, tc.name)
		require.Equal(t, tc.code, failureCode(err), tc.name)
	}
	_, err = a.Apply(ctx, command(t, "c-old", site.KindSiteMachines, "", machines(1, strangerSrv.URL)))
	require.Equal(t, site.FailStaleEpoch, failureCode(err), "an older machine list is refused")
	require.Zero(t, stranger.Calls()+p.Calls(), "no refused command reached a BMC")

	res, err := a.Apply(ctx, command(t, "c2", site.KindBMCPower, "wf:0:1", power(2, "mch_1", bmcSrv.URL, "pw")))
	require.NoError(t, err)
	require.Equal(t, "cycle", res.AsMap()["power"])
	_, err = a.Apply(ctx, command(t, "c2-again", site.KindBMCPower, "wf:0:1", power(2, "mch_1", bmcSrv.URL, "pw")))
	require.NoError(t, err, "a repeated key answers its result")
	require.Equal(t, 1, p.Calls())
	boot, err := a.Decide(ctx, pxe.Request{MAC: mustMAC(t, "52:54:00:00:00:01")})
	require.NoError(t, err)
	require.IsType(t, pxe.Ramdisk{}, boot, "the power cycle asked for the ramdisk")

	// A key out to the BMC when bcd stops stays taken after a restart.
	p.mu.Lock()
	p.gate, p.entered = make(chan struct{}), make(chan struct{}, 1)
	p.mu.Unlock()
	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := a.Apply(cctx, command(t, "c3", site.KindBMCPower, "wf:1:1", power(2, "mch_1", bmcSrv.URL, "pw")))
		errc <- err
	}()
	<-p.entered
	cancel()
	require.True(t, errors.Is(<-errc, context.Canceled))
	close(p.gate)
	restarted, err := site.New(site.Config{StateDir: dir, Logger: quiet()})
	require.NoError(t, err)
	require.EqualValues(t, 2, restarted.Epoch(), "the epoch survives a restart")
	_, err = restarted.Apply(ctx, command(t, "c3-redelivered", site.KindBMCPower, "wf:1:1", power(2, "mch_1", bmcSrv.URL, "pw")))
	require.Equal(t, site.FailKeyInterrupts, failureCode(err))
	require.Equal(t, 2, p.Calls(), "the interrupted key reached the BMC once and was not applied again")
}

func mustMAC(t *testing.T, s string) net.HardwareAddr {
	t.Helper()
	hw, err := net.ParseMAC(s)
	require.NoError(t, err)
	return hw
}

// TestSiteAgentFencedMachine: a machine the list says is fenced (a lease
// being torn down) is unknown to the site's PXE decision — no boot answer —
// until a power cycle asks for the ramdisk.
func TestSiteAgentFencedMachine(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := &countingPower{}
	bmcSrv := httptest.NewServer(redfish.New(redfish.Config{Username: "admin", Password: "pw", Power: p}))
	t.Cleanup(bmcSrv.Close)
	a, err := site.New(site.Config{StateDir: t.TempDir(), Logger: quiet(), Ramdisk: pxe.Ramdisk{Kernel: "k", Initrd: "i"}})
	require.NoError(t, err)
	list := machines(2, bmcSrv.URL)
	list["machines"].([]any)[0].(map[string]any)["boot"] = site.BootFenced
	_, err = a.Apply(ctx, command(t, "c1", site.KindSiteMachines, "", list))
	require.NoError(t, err)
	boot, err := a.Decide(ctx, pxe.Request{MAC: mustMAC(t, "52:54:00:00:00:01")})
	require.NoError(t, err)
	require.IsType(t, pxe.Unknown{}, boot, "a fenced machine gets no boot")

	_, err = a.Apply(ctx, command(t, "c2", site.KindBMCPower, "wf:1:1", power(2, "mch_1", bmcSrv.URL, "pw")))
	require.NoError(t, err)
	boot, err = a.Decide(ctx, pxe.Request{MAC: mustMAC(t, "52:54:00:00:00:01")})
	require.NoError(t, err)
	require.IsType(t, pxe.Ramdisk{}, boot, "the teardown's cycle into the ramdisk lifts the fence")
}
