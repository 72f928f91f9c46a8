package hypervisor

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The balloon controller gives a host's memory back and forth between
// guests of memory-overcommitting pools (docs/instances.md). Invariants:
//   - only guests created with a balloon floor are touched;
//   - a guest's balloon target is never below its floor nor above its
//     memory;
//   - between the low and the high water mark nothing moves (hysteresis),
//     so a host at its mark does not make guests' memory oscillate;
//   - below the low mark it takes back what lifts MemAvailable to the
//     high mark, from each guest in proportion to what it can give;
//     above the high mark it hands back only the surplus over the high
//     mark, so a deflate never pushes the host under the low mark.

// MemInfo reads the host's memory in bytes: MemTotal and MemAvailable.
type MemInfo func() (total, available uint64, err error)

// ProcMemInfo reads MemTotal and MemAvailable from a meminfo file
// (/proc/meminfo on a host).
func ProcMemInfo(path string) MemInfo {
	return func() (uint64, uint64, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return 0, 0, fmt.Errorf("meminfo: %w", err)
		}
		return parseMemInfo(b)
	}
}

func parseMemInfo(b []byte) (total, avail uint64, err error) {
	var haveTotal, haveAvail bool
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) < 2 {
			continue
		}
		var dst *uint64
		switch string(f[0]) {
		case "MemTotal:":
			dst, haveTotal = &total, true
		case "MemAvailable:":
			dst, haveAvail = &avail, true
		default:
			continue
		}
		kib, err := strconv.ParseUint(string(f[1]), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("meminfo: %s %q: %w", f[0], f[1], err)
		}
		*dst = kib << 10
	}
	if !haveTotal || !haveAvail {
		return 0, 0, errors.New("meminfo: no MemTotal or MemAvailable (a kernel before 3.14?)")
	}
	return total, avail, nil
}

// Balloons moves guests' balloons (runtime.Runtime does it over QMP).
type Balloons interface {
	// SetBalloon asks the guest's balloon driver to bring its memory to
	// mib.
	SetBalloon(ctx context.Context, id string, mib int) error
	// Balloon is the guest's memory as its balloon reports it (MiB).
	Balloon(ctx context.Context, id string) (int, error)
}

// BalloonGuest is one running guest as the controller sees it.
type BalloonGuest struct {
	ID        string
	MemoryMiB int
	// FloorMiB is the least memory its balloon may leave it; 0: the guest
	// does not balloon and is never touched.
	FloorMiB int
}

// BalloonConfig configures a BalloonController.
type BalloonConfig struct {
	MemInfo  MemInfo
	Balloons Balloons
	// Guests lists the running guests.
	Guests func(ctx context.Context) []BalloonGuest
	// LowPercent and HighPercent are the water marks as percents of
	// MemTotal (defaults 10 and 20): below low, balloons inflate until
	// MemAvailable is back at high; above high, they deflate.
	LowPercent, HighPercent int
	// Interval is how often Run looks (default 5s).
	Interval time.Duration
	Logger   *slog.Logger
}

// BalloonMetric is the Prometheus name of bcd.instance.memory.balloon.reclaimed:
// the bytes a guest's balloon holds back (its memory less the balloon's
// actual), per instance.
const BalloonMetric = "bcd_instance_memory_balloon_reclaimed_bytes"

// BalloonController inflates and deflates the balloons of one host's
// guests with the host's free memory.
type BalloonController struct {
	cfg       BalloonConfig
	reclaimed *prometheus.GaugeVec

	mu sync.Mutex
	// targets are the last balloon sizes asked per guest (MiB).
	targets map[string]int
}

// NewBalloonController checks cfg and fills its defaults.
func NewBalloonController(cfg BalloonConfig) (*BalloonController, error) {
	if cfg.MemInfo == nil || cfg.Balloons == nil || cfg.Guests == nil {
		return nil, errors.New("balloon: MemInfo, Balloons and Guests are required")
	}
	cfg.LowPercent = cmp.Or(cfg.LowPercent, 10)
	cfg.HighPercent = cmp.Or(cfg.HighPercent, 2*cfg.LowPercent)
	if cfg.LowPercent < 1 || cfg.HighPercent <= cfg.LowPercent || cfg.HighPercent > 90 {
		return nil, fmt.Errorf("balloon: water marks must be 1 <= low < high <= 90 percent, got low %d high %d", cfg.LowPercent, cfg.HighPercent)
	}
	cfg.Interval = cmp.Or(cfg.Interval, 5*time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &BalloonController{cfg: cfg, targets: map[string]int{},
		reclaimed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: BalloonMetric,
			Help: "bcd.instance.memory.balloon.reclaimed: bytes of a ballooning guest's memory its balloon holds back for the host.",
		}, []string{"instance"})}, nil
}

// Collector is the controller's metric, for bcd's registry.
func (c *BalloonController) Collector() prometheus.Collector { return c.reclaimed }

// Run ticks every Interval until ctx ends; a failed tick is logged and the
// next one tries again.
func (c *BalloonController) Run(ctx context.Context) error {
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		if err := c.Tick(ctx); err != nil && ctx.Err() == nil {
			c.cfg.Logger.Warn("balloon: tick failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

type balloonState struct {
	g      BalloonGuest
	actual int
	target int
}

// Tick reads the host's memory and every ballooning guest's balloon,
// reports what is reclaimed and moves the balloons as the water marks say.
func (c *BalloonController) Tick(ctx context.Context) error {
	total, avail, err := c.cfg.MemInfo()
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var gs []*balloonState
	seen := map[string]bool{}
	for _, g := range c.cfg.Guests(ctx) {
		if g.FloorMiB <= 0 || g.FloorMiB > g.MemoryMiB {
			continue
		}
		actual, err := c.cfg.Balloons.Balloon(ctx, g.ID)
		if err != nil {
			// Stopped between the list and the query: next tick.
			continue
		}
		seen[g.ID] = true
		target, ok := c.targets[g.ID]
		if !ok {
			// After a bcd restart the balloon is where the last one left
			// it.
			target = actual
		}
		target = min(max(target, g.FloorMiB), g.MemoryMiB)
		gs = append(gs, &balloonState{g: g, actual: actual, target: target})
		c.reclaimed.WithLabelValues(g.ID).Set(float64(int64(max(g.MemoryMiB-actual, 0)) << 20))
	}
	for id := range c.targets {
		if !seen[id] {
			delete(c.targets, id)
			c.reclaimed.DeleteLabelValues(id)
		}
	}
	// In MiB, as balloons move.
	totalMiB, availMiB := int(total>>20), int(avail>>20)
	low, high := totalMiB*c.cfg.LowPercent/100, totalMiB*c.cfg.HighPercent/100
	switch {
	case availMiB < low:
		share(gs, high-availMiB, func(s *balloonState) int { return s.target - s.g.FloorMiB }, -1)
	case availMiB > high:
		share(gs, availMiB-high, func(s *balloonState) int { return s.g.MemoryMiB - s.target }, 1)
	}
	var errs []error
	for _, s := range gs {
		if prev, ok := c.targets[s.g.ID]; ok && prev == s.target {
			continue
		}
		if err := c.cfg.Balloons.SetBalloon(ctx, s.g.ID, s.target); err != nil {
			errs = append(errs, fmt.Errorf("balloon %s to %d MiB: %w", s.g.ID, s.target, err))
			continue
		}
		c.targets[s.g.ID] = s.target
	}
	return errors.Join(errs...)
}

// share moves want MiB of targets in direction dir (-1 inflate: the guest
// gets less; +1 deflate), each guest in proportion to room(s), never more
// than its room.
func share(gs []*balloonState, want int, room func(*balloonState) int, dir int) {
	sum := 0
	for _, s := range gs {
		sum += room(s)
	}
	if want <= 0 || sum <= 0 {
		return
	}
	want = min(want, sum)
	// Largest room first, so the rounding remainder lands where there is
	// most to give; id breaks ties for a stable order.
	slices.SortFunc(gs, func(a, b *balloonState) int {
		return cmp.Or(cmp.Compare(room(b), room(a)), cmp.Compare(a.g.ID, b.g.ID))
	})
	left := want
	for _, s := range gs {
		n := min(room(s), (want*room(s)+sum-1)/sum, left)
		s.target += dir * n
		left -= n
	}
}
