package agent_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/agent/hypervisor"
)

// ballooningRunner is an instance runner with a balloon controller over
// one guest whose balloon obeys at once, as *hypervisor.Hypervisor has.
type ballooningRunner struct {
	gatedRunner
	c *hypervisor.BalloonController
}

func (r *ballooningRunner) Collector() prometheus.Collector { return r.c.Collector() }

type oneBalloon struct{ mib int }

func (b *oneBalloon) SetBalloon(_ context.Context, _ string, mib int) error { b.mib = mib; return nil }
func (b *oneBalloon) Balloon(context.Context, string) (int, error)          { return b.mib, nil }

// TestBalloonMetricServed: bcd serves the hypervisor's
// bcd.instance.memory.balloon.reclaimed with its own metrics.
func TestBalloonMetricServed(t *testing.T) {
	t.Parallel()
	b := &oneBalloon{mib: 1536}
	c, err := hypervisor.NewBalloonController(hypervisor.BalloonConfig{
		MemInfo:  func() (uint64, uint64, error) { return 8 << 30, 2 << 30, nil }, // between the marks: nothing moves
		Balloons: b,
		Guests: func(context.Context) []hypervisor.BalloonGuest {
			return []hypervisor.BalloonGuest{{ID: "web-1", MemoryMiB: 2048, FloorMiB: 1024}}
		},
	})
	require.NoError(t, err)
	a := setup(t).newAgent(t, func(cfg *agent.Config) { cfg.Instances = &ballooningRunner{c: c} })
	require.NoError(t, c.Tick(context.Background()))
	mfs, err := a.Metrics().Gather()
	require.NoError(t, err)
	var got []float64
	for _, mf := range mfs {
		if mf.GetName() == hypervisor.BalloonMetric {
			for _, m := range mf.GetMetric() {
				require.Equal(t, "web-1", m.GetLabel()[0].GetValue())
				got = append(got, m.GetGauge().GetValue())
			}
		}
	}
	require.Equal(t, []float64{512 << 20}, got)
}
