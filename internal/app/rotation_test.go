package app_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"log/slog"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/store"
)

// rotationNodes is how many simulated nodes the rotation test moves: 100,
// or 30 under the race detector (which is looking for races, not scale).
var rotationNodes = map[bool]int{false: 100, true: 30}[raceEnabled]

// TestRootRotationKeepsSessions: a trust-root rotation with 100 real bcd
// sessions open. The new generation is published, nodes renew onto it (the
// renewal every node makes at two thirds of its certificate's life, made
// here at once), the old roots retire, and through all of it no session
// closes: every node stays connected with no reconnect, applies commands
// signed under the old command root before the switch and under the new
// one after it, and a node that connects afresh afterwards does so on the
// new generation alone.
func TestRootRotationKeepsSessions(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "gpu"}))
	require.NoError(t, err)
	// The agents' warnings are kept and shown on failure: a session that
	// ended says why.
	var warnings lockedBuffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent warnings:\n%s", warnings.String())
		}
	})
	logger := slog.New(slog.NewTextHandler(&warnings, &slog.HandlerOptions{Level: slog.LevelWarn}))
	sim, err := bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		Template: bctest.FakeDaemonConfig{Gateway: cp.GatewayAddr, Logger: logger}, Root: t.TempDir(), N: rotationNodes,
		Token: func(ctx context.Context, i int) (string, error) {
			tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "gpu"}))
			if err != nil {
				return "", err
			}
			return tok.Msg.GetToken(), nil
		},
	})
	require.NoError(t, err)
	t.Cleanup(sim.Stop)
	// Ready, and its first inventory committed: that write follows the
	// HelloAck, and a session whose write failed would reconnect for a
	// reason of its own, after the check below.
	ready := func() int {
		return countRows(t, cp, `SELECT COUNT(*) FROM nodes WHERE state = 'active' AND liveness = 'ready' AND trust_version = 1
			AND inventory_digest <> ''`)
	}
	eventually(t, "every node ready with command trust v1 and its inventory", func() bool { return ready() == rotationNodes })

	// Sessions are judged by the agents themselves: connected, and no
	// session attempt after the baseline taken once all joined. The join
	// storm itself may cost a node a reconnect on a loaded machine (100
	// Hellos at once can meet a lock timeout, and the agent retries at
	// once); what the rotation must not do is add one.
	baseline := map[string]float64{}
	sessionsKept := func(what string) {
		t.Helper()
		for _, d := range sim.Daemons {
			require.True(t, d.Connected(), "%s: %s is connected", what, d.NodeID())
			require.Equal(t, baseline[d.NodeID()], metricValue(t, d, "bcd_session_reconnects_total", nil), "%s: %s never reconnected", what, d.NodeID())
		}
	}
	// A node is ready once the gateway took its Hello; the agent counts
	// itself connected when the answer arrives.
	eventually(t, "every agent connected", func() bool {
		for _, d := range sim.Daemons {
			if !d.Connected() {
				return false
			}
		}
		return true
	})
	for _, d := range sim.Daemons {
		baseline[d.NodeID()] = metricValue(t, d, "bcd_session_reconnects_total", nil)
	}
	eventually(t, "every node ready again after any reconnect of the join", func() bool { return ready() == rotationNodes })
	sessionsKept("before")

	a := cp.App.PKI
	open := func(ctx context.Context, tx store.Tx, v int64) (int, error) {
		return fleet.CommandOpenSignedUpTo(ctx, tx, v)
	}
	runOn := func(d *bctest.FakeDaemon) fleet.Command {
		t.Helper()
		run, err := admin.Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{Tenant: "acme", Node: d.NodeID(), Kind: "inventory.refresh"}))
		require.NoError(t, err)
		var c fleet.Command
		eventually(t, "command on "+d.NodeID()+" ended", func() bool {
			require.NoError(t, cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
				c, err = fleet.CommandGet(ctx, tx, "", run.Msg.GetCommand().GetId())
				return err
			}))
			return c.State == fleet.CommandSucceeded || c.State == fleet.CommandFailed
		})
		require.Equal(t, fleet.CommandSucceeded, c.State, "%s: %s", c.FailureCode, c.Message)
		return c
	}
	renew := func(ds []*bctest.FakeDaemon) {
		t.Helper()
		var g errgroup.Group
		g.SetLimit(8)
		for _, d := range ds {
			g.Go(func() error { return d.Renew(ctx) })
		}
		require.NoError(t, g.Wait())
	}

	// Step 1: published. The old generation still serves and signs.
	st, err := a.BeginRotation(ctx, "")
	require.NoError(t, err)
	require.Equal(t, int64(2), st.Newest)
	require.Equal(t, int64(1), runOn(sim.Daemons[0]).TrustVersion)

	// Half the fleet renews: the rotation waits on the other half.
	half := rotationNodes / 2
	renew(sim.Daemons[:half])
	for _, d := range sim.Daemons[:half] {
		require.NoError(t, d.Certificate().CheckSignatureFrom(caOf(t, a, 2)), "%s renewed onto generation 2", d.NodeID())
	}
	st, err = a.AdvanceRotation(ctx, open)
	require.ErrorIs(t, err, pki.ErrRotationWaiting)
	require.Len(t, st.Stragglers, rotationNodes-half)
	require.Equal(t, int64(1), st.Serving)
	sessionsKept("half renewed")

	// The rest renews: the new generation serves and signs.
	renew(sim.Daemons[half:])
	st, err = a.AdvanceRotation(ctx, open)
	require.ErrorIs(t, err, pki.ErrRotationWaiting, "the old command root retires in a later step")
	require.Equal(t, int64(2), st.Serving)
	require.Equal(t, int64(2), st.CommandActive)
	for _, d := range []*bctest.FakeDaemon{sim.Daemons[0], sim.Daemons[half], sim.Daemons[rotationNodes-1]} {
		c := runOn(d)
		require.Equal(t, int64(2), c.TrustVersion, "signed under the new command root, and applied")
	}
	st, err = a.AdvanceRotation(ctx, open)
	require.NoError(t, err)
	require.False(t, st.InProgress())
	_, version, minVersion := a.CommandBundle()
	require.Equal(t, []int64{2, 2}, []int64{version, minVersion})
	sessionsKept("after")

	// A node that connects afresh now trusts the new root alone (its next
	// renewal drops the old) and presents a new-generation certificate.
	d := sim.Daemons[1]
	renew([]*bctest.FakeDaemon{d})
	require.NoError(t, d.Stop())
	d2, err := d.Restart()
	require.NoError(t, err)
	d2.Start()
	t.Cleanup(func() { _ = d2.Stop() })
	eventually(t, "the restarted node back on the new generation", func() bool { return d2.Connected() })
	require.Equal(t, fleet.CommandSucceeded, runOn(d2).State)
	require.Equal(t, 0, countRows(t, cp, `SELECT COUNT(*) FROM pki_certs WHERE generation = 1 AND revoke_time IS NULL
		AND supersede_time IS NULL AND not_after > compute_now()`), "no live certificate chains to the retired root")
}

// caOf returns the node CA of a generation from the authority's bundle
// view: the CA that issues nodes now.
func caOf(t *testing.T, a *pki.Authority, gen int64) *x509.Certificate {
	t.Helper()
	require.Equal(t, gen, a.IssuingGeneration())
	return a.NodeCA()
}

// lockedBuffer is a bytes.Buffer many goroutines may write.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
