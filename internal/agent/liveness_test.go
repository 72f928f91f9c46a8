package agent_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/agent/cgroups"
)

// TestHelloAckTimeout: a gateway that takes the session and never answers
// the Hello is given up on after HelloTimeout and dialled again.
func TestHelloAckTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.gw.silent = 1
	a := b.newAgent(t, func(c *agent.Config) { c.HelloTimeout = 200 * time.Millisecond })
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	run(t, a)
	b.gw.hello(t) // unanswered
	// Without the deadline the agent would wait for the HelloAck forever and
	// this second Hello would never come.
	b.gw.hello(t)
	bctest.WaitFor(t, "the agent to connect", a.Connected)
}

// TestGoodbyeOnStop: a stopping agent says Goodbye and closes its side;
// Run returns once the gateway has ended the session.
func TestGoodbyeOnStop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.newAgent(t)
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	stop := run(t, a)
	b.gw.hello(t)
	bctest.WaitFor(t, "the agent to connect", a.Connected)
	stop()
	select {
	case gb := <-b.gw.goodbyes:
		require.Equal(t, "shutdown", gb.GetReason())
	case <-bctest.Deadline(t):
		t.Fatal("no Goodbye")
	}
	require.False(t, a.Connected())
}

// TestGoodbyeUnanswered: a gateway that never closes the session after the
// Goodbye does not hold the agent past GoodbyeTimeout.
func TestGoodbyeUnanswered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.gw.ignoreGoodbye = true
	a := b.newAgent(t, func(c *agent.Config) { c.GoodbyeTimeout = 100 * time.Millisecond })
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	stop := run(t, a)
	b.gw.hello(t)
	bctest.WaitFor(t, "the agent to connect", a.Connected)
	stop() // returns: the test would hang here otherwise
	require.Equal(t, "shutdown", (<-b.gw.goodbyes).GetReason())
}

// freezer makes connections half-open on demand: once frozen, what the
// agent writes is swallowed and nothing the gateway sends arrives, as when
// the gateway's host dies without closing anything.
type freezer struct {
	mu    sync.Mutex
	conns []*freezable
}

type freezable struct {
	net.Conn
	frozen atomic.Bool
}

func (c *freezable) Read(p []byte) (int, error) {
	for {
		n, err := c.Conn.Read(p)
		if err != nil || !c.frozen.Load() {
			return n, err
		}
	}
}

func (c *freezable) Write(p []byte) (int, error) {
	if c.frozen.Load() {
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func (f *freezer) dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	fc := &freezable{Conn: c}
	f.mu.Lock()
	f.conns = append(f.conns, fc)
	f.mu.Unlock()
	return fc, nil
}

// freeze turns every connection made so far half-open.
func (f *freezer) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		c.frozen.Store(true)
	}
}

// TestHalfOpenConnectionNoticed: when the gateway vanishes without closing
// the connection, keepalive pings go unanswered and the agent dials again
// (after KeepaliveTime, at least 10 s, plus KeepaliveTimeout) instead of
// heartbeating into the void until TCP gives up.
func TestHalfOpenConnectionNoticed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var f freezer
	a := b.newAgent(t, func(c *agent.Config) {
		c.Dialer = f.dial
		c.KeepaliveTime = agent.MinKeepaliveTime
		c.KeepaliveTimeout = 500 * time.Millisecond
	})
	require.NoError(t, a.Join(context.Background(), b.gw.token))
	run(t, a)
	b.gw.hello(t)
	f.freeze()
	// The guard only stops a hung test; the keepalive fires after ~10.5 s.
	b.gw.hello(t)
}

// TestCgroupRootMustBeCgroup2: a real node's cgroup root must be on a
// cgroup2 filesystem, or limits would be written into plain files that
// nothing enforces and reported applied; only a simulated node may use a
// plain directory.
func TestCgroupRootMustBeCgroup2(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := agent.Config{
		Server: "127.0.0.1:1", StateDir: filepath.Join(dir, "state"), CgroupRoot: filepath.Join(dir, "cg", "bettercompute"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	_, err := agent.New(cfg)
	require.ErrorIs(t, err, cgroups.ErrNotCgroup2)
	require.ErrorContains(t, err, cfg.CgroupRoot)

	cfg.PlainCgroupDir = true
	a, err := agent.New(cfg)
	require.NoError(t, err)
	require.NoError(t, a.Close())
}
