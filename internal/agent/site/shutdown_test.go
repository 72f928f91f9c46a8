package site_test

import (
	"context"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest/redfish"
	"github.com/better-compute/better-compute/internal/agent/site"
	"github.com/better-compute/better-compute/internal/site/pxe"
)

// gracefulPower records whether each power off was a guest shutdown.
type gracefulPower struct {
	redfish.MemoryPower
	mu   sync.Mutex
	offs []bool
}

func (p *gracefulPower) Off(ctx context.Context, graceful bool) error {
	p.mu.Lock()
	p.offs = append(p.offs, graceful)
	p.mu.Unlock()
	return p.MemoryPower.Off(ctx, graceful)
}

// TestSiteAgentShutdown: the shutdown action (a profile's driver.invoke
// power.shutdown) asks the guest to shut down through the machine's
// driver, once per key.
func TestSiteAgentShutdown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := &gracefulPower{}
	require.NoError(t, p.On(ctx, ""))
	srv := httptest.NewServer(redfish.New(redfish.Config{Username: "admin", Password: "pw", Power: p}))
	t.Cleanup(srv.Close)
	a, err := site.New(site.Config{StateDir: t.TempDir(), Logger: quiet(), Ramdisk: pxe.Ramdisk{Kernel: "k", Initrd: "i"}})
	require.NoError(t, err)
	_, err = a.Apply(ctx, command(t, "c1", site.KindSiteMachines, "", machines(1, srv.URL)))
	require.NoError(t, err)
	params := power(1, "mch_1", srv.URL, "pw")
	params["action"], params["boot"] = "shutdown", ""
	res, err := a.Apply(ctx, command(t, "c2", site.KindBMCPower, "wf:0:1", params))
	require.NoError(t, err)
	require.Equal(t, "shutdown", res.AsMap()["power"])
	_, err = a.Apply(ctx, command(t, "c3", site.KindBMCPower, "wf:0:1", params))
	require.NoError(t, err)
	p.mu.Lock()
	defer p.mu.Unlock()
	require.Equal(t, []bool{true}, p.offs, "one guest shutdown, for one key")
	on, err := p.IsOn(ctx)
	require.NoError(t, err)
	require.False(t, on)
}
