package hypervisor_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/agent/hypervisor"
	"github.com/better-compute/better-compute/internal/vmcmd"
)

// fakeBalloons is a guest's balloon that reaches its target at once, as
// virtio-balloon does when the guest has the memory free.
type fakeBalloons struct {
	mu     sync.Mutex
	actual map[string]int
	sets   map[string][]int
}

func (f *fakeBalloons) SetBalloon(_ context.Context, id string, mib int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.actual[id]; !ok {
		return errors.New("no such guest")
	}
	f.actual[id] = mib
	f.sets[id] = append(f.sets[id], mib)
	return nil
}

func (f *fakeBalloons) Balloon(_ context.Context, id string) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	mib, ok := f.actual[id]
	if !ok {
		return 0, errors.New("no such guest")
	}
	return mib, nil
}

// host is an injected /proc/meminfo: available memory moves as balloons
// give memory back or take it.
type host struct {
	mu           sync.Mutex
	total, avail uint64
}

func (h *host) read() (uint64, uint64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.total, h.avail, nil
}

func (h *host) set(availMiB int) {
	h.mu.Lock()
	h.avail = uint64(availMiB) << 20
	h.mu.Unlock()
}

type balloonFixture struct {
	c      *hypervisor.BalloonController
	b      *fakeBalloons
	h      *host
	guests []hypervisor.BalloonGuest
}

// setupBalloons is a 10 GiB host (low mark 1 GiB, high 2 GiB) with two
// ballooning guests of 4 GiB (floors 1 GiB and 3 GiB) and one that does
// not balloon.
func setupBalloons(t *testing.T) *balloonFixture {
	t.Helper()
	f := &balloonFixture{
		b: &fakeBalloons{actual: map[string]int{"a": 4096, "b": 4096, "plain": 4096}, sets: map[string][]int{}},
		h: &host{total: 10240 << 20, avail: 8192 << 20},
		guests: []hypervisor.BalloonGuest{{ID: "a", MemoryMiB: 4096, FloorMiB: 1024}, {ID: "b", MemoryMiB: 4096, FloorMiB: 3072},
			{ID: "plain", MemoryMiB: 4096}},
	}
	c, err := hypervisor.NewBalloonController(hypervisor.BalloonConfig{MemInfo: f.h.read, Balloons: f.b,
		Guests: func(context.Context) []hypervisor.BalloonGuest { return f.guests }})
	require.NoError(t, err)
	f.c = c
	return f
}

func (f *balloonFixture) actual(id string) int {
	mib, _ := f.b.Balloon(context.Background(), id)
	return mib
}

func TestBalloonInflatesUnderPressureAndDeflatesWhenFree(t *testing.T) {
	t.Parallel()
	f := setupBalloons(t)
	ctx := context.Background()

	// Plenty free: nothing moves.
	require.NoError(t, f.c.Tick(ctx))
	require.Equal(t, 4096, f.actual("a"))
	require.Equal(t, 4096, f.actual("b"))

	// 512 MiB free, under the 1 GiB mark: the balloons take back what
	// lifts the host to its 2 GiB high mark (1536 MiB), each guest in
	// proportion to what it can give (a 3072 MiB, b 1024 MiB).
	f.h.set(512)
	require.NoError(t, f.c.Tick(ctx))
	require.Equal(t, 4096-1152, f.actual("a"))
	require.Equal(t, 4096-384, f.actual("b"))

	// Between the marks: nothing moves (no oscillation).
	f.h.set(1500)
	require.NoError(t, f.c.Tick(ctx))
	require.Equal(t, 2944, f.actual("a"))
	require.Equal(t, 3712, f.actual("b"))

	// Far under the mark, several ticks: never below the floors.
	for range 5 {
		f.h.set(100)
		require.NoError(t, f.c.Tick(ctx))
	}
	require.Equal(t, 1024, f.actual("a"))
	require.Equal(t, 3072, f.actual("b"))
	for _, set := range append(f.b.sets["a"], f.b.sets["b"]...) {
		require.GreaterOrEqual(t, set, 1024)
	}
	require.GreaterOrEqual(t, f.b.sets["b"][len(f.b.sets["b"])-1], 3072)

	// Plenty free again: the balloons deflate, but only by the surplus
	// over the high mark (2 GiB): 3 GiB free gives back 1 GiB.
	f.h.set(3072)
	require.NoError(t, f.c.Tick(ctx))
	require.Equal(t, 1024+1024*3072/4096, f.actual("a"))
	require.Equal(t, 3072+1024*1024/4096, f.actual("b"))
	f.h.set(8192)
	require.NoError(t, f.c.Tick(ctx))
	require.Equal(t, 4096, f.actual("a"))
	require.Equal(t, 4096, f.actual("b"))

	// The guest without a floor was never touched.
	require.Empty(t, f.b.sets["plain"])
	require.Equal(t, 4096, f.actual("plain"))
}

func TestBalloonReportsReclaimedBytes(t *testing.T) {
	t.Parallel()
	f := setupBalloons(t)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(f.c.Collector()))

	f.h.set(100)
	require.NoError(t, f.c.Tick(ctx))
	// The metric reports what the balloons measured at the tick: the next
	// one (between the marks, so nothing moves) sees where the last one
	// put them.
	f.h.set(1500)
	require.NoError(t, f.c.Tick(ctx))
	require.Equal(t, map[string]float64{"a": float64(int64(4096-f.actual("a")) << 20), "b": float64(int64(4096-f.actual("b")) << 20)},
		reclaimed(t, reg))
	require.Positive(t, 4096-f.actual("a"))

	// A guest gone (deleted, stopped) leaves the metric.
	f.guests = f.guests[1:]
	require.NoError(t, f.c.Tick(ctx))
	require.Equal(t, map[string]float64{"b": float64(int64(4096-f.actual("b")) << 20)}, reclaimed(t, reg))
}

// reclaimed reads bcd.instance.memory.balloon.reclaimed per instance from
// a registry, as a scrape would.
func reclaimed(t *testing.T, g prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != hypervisor.BalloonMetric {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "instance" {
					out[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	return out
}

func TestBalloonConfigAndMeminfo(t *testing.T) {
	t.Parallel()
	b := &fakeBalloons{}
	none := func(context.Context) []hypervisor.BalloonGuest { return nil }
	_, err := hypervisor.NewBalloonController(hypervisor.BalloonConfig{MemInfo: (&host{}).read, Balloons: b, Guests: none,
		LowPercent: 30, HighPercent: 20})
	require.ErrorContains(t, err, "water marks")
	_, err = hypervisor.NewBalloonController(hypervisor.BalloonConfig{Balloons: b, Guests: none})
	require.Error(t, err)

	dir := t.TempDir()
	p := filepath.Join(dir, "meminfo")
	require.NoError(t, os.WriteFile(p, []byte("MemTotal:       16318480 kB\nMemFree:         1234 kB\nMemAvailable:    8159240 kB\n"), 0o600))
	total, avail, err := hypervisor.ProcMemInfo(p)()
	require.NoError(t, err)
	require.Equal(t, uint64(16318480)<<10, total)
	require.Equal(t, uint64(8159240)<<10, avail)
	require.NoError(t, os.WriteFile(p, []byte("MemTotal:       16318480 kB\n"), 0o600))
	_, _, err = hypervisor.ProcMemInfo(p)()
	require.ErrorContains(t, err, "MemAvailable")
}

// balloonRuntime is the fake runtime with balloons: a guest's balloon
// starts at its memory.
type balloonRuntime struct {
	*fakeRuntime
	b *fakeBalloons
}

func (r *balloonRuntime) Balloon(ctx context.Context, id string) (int, error) {
	info, err := r.Get(ctx, id)
	if err != nil {
		return 0, err
	}
	r.b.mu.Lock()
	if _, ok := r.b.actual[id]; !ok {
		r.b.actual[id] = info.Spec.MemoryMiB
	}
	r.b.mu.Unlock()
	return r.b.Balloon(ctx, id)
}

func (r *balloonRuntime) SetBalloon(ctx context.Context, id string, mib int) error {
	if _, err := r.Balloon(ctx, id); err != nil {
		return err
	}
	return r.b.SetBalloon(ctx, id, mib)
}

// TestHypervisorBalloonsCreatedFloors: instance.create's balloon floor
// reaches the host's controller, which shrinks that guest under pressure
// and leaves a guest created without one alone; a floor the create cannot
// have is refused with its field; the hypervisor hands bcd the metric.
func TestHypervisorBalloonsCreatedFloors(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	mem := &host{total: 8192 << 20, avail: 4096 << 20}
	br := &balloonRuntime{fakeRuntime: r.rt, b: &fakeBalloons{actual: map[string]int{}, sets: map[string][]int{}}}
	hv, err := hypervisor.New(hypervisor.Config{StateDir: r.state, Images: r.images, SysfsRoot: r.sysfs, Runtime: br,
		BridgeAddress: "10.77.0.1/24", MemInfo: mem.read, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	hv.SetDial(func(context.Context, string) (net.Conn, error) { return bannerConn(), nil })
	require.NoError(t, hv.Start(context.Background()))
	r.hv = hv

	bad := createParams("web-9")
	bad.BalloonFloorMiB = 1024
	_, err = r.apply(t, vmcmd.KindInstanceCreate, bad)
	requireCode(t, err, vmcmd.FailInvalid, "balloon_floor_mib")
	require.Zero(t, r.rt.count("create"), "nothing made")

	p := createParams("web-1")
	p.MemoryMiB, p.BalloonFloorMiB = 2048, 1024
	r.must(t, vmcmd.KindInstanceCreate, p)
	plain := createParams("web-2")
	plain.MemoryMiB = 2048
	plain.Network.MAC, plain.Network.Address = "52:54:00:77:00:06", "10.77.0.6/24"
	r.must(t, vmcmd.KindInstanceCreate, plain)

	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(hv.Collector()))
	mem.set(100)
	require.NoError(t, hv.Balloons().Tick(context.Background()))
	require.Equal(t, 1024, br.b.actual["web-1"], "shrunk to its floor")
	require.Empty(t, br.b.sets["web-2"], "a guest without a floor is not ballooned")
	mem.set(1000) // between the marks: the tick only measures
	require.NoError(t, hv.Balloons().Tick(context.Background()))
	require.Equal(t, map[string]float64{"web-1": 1024 << 20}, reclaimed(t, reg))
}
