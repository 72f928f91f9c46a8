package metalbench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/metal"
	"github.com/better-compute/better-compute/internal/store"
)

var (
	machinesFlag = flag.Int("machines", 1000, "machines the benchmark commissions")
	clientsFlag  = flag.Int("clients", 16, "API calls in flight while enrolling and commissioning")
)

// result is what one run measured.
type result struct {
	machines int
	// wall is from the first commission call to the last machine ready.
	wall time.Duration
	// cpu is the process's user+system CPU time over the same span: the
	// control plane's, with the simulated site and its BMC emulators
	// (which share the process) included.
	cpu time.Duration
	// peakHeap is the largest live heap sampled during the span; maxRSS
	// the process's peak resident set since it started.
	peakHeap, maxRSS uint64
	failed           int
}

// commission starts a control plane, enrolls n simulated machines at one
// site and commissions them all, returning what it measured.
func commission(tb testing.TB, n, clients int) result {
	tb.Helper()
	cp := bctest.NewControlPlane(tb)
	admin := cp.Admin()
	ctx := context.Background()
	if _, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"})); err != nil {
		tb.Fatal(err)
	}
	s, err := admin.Sites.Create(ctx, connect.NewRequest(&apiv1.CreateSiteRequest{Tenant: "acme", Name: "dc1", Networks: []string{"127.0.0.0/8"}}))
	if err != nil {
		tb.Fatal(err)
	}
	sim := bctest.NewSimSite(tb, cp.App.Metal, s.Msg.GetSite().GetId())
	sms := make([]*bctest.SimMachine, n)
	for i := range sms {
		sms[i] = sim.AddMachine(tb, fmt.Sprintf("m%04d", i))
	}
	parallel(tb, n, clients, func(i int) error {
		m := sms[i]
		_, err := admin.Machines.Enroll(ctx, connect.NewRequest(&apiv1.EnrollMachineRequest{Tenant: "acme", Site: "dc1", Name: m.Name,
			BmcDriver: "redfish", BmcAddress: m.BMCAddress, BmcUsername: m.Username, BmcPassword: m.Password, Mac: m.MAC}))
		return err
	})

	stopSampling := sampleHeap()
	var before syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	start := time.Now()
	parallel(tb, n, clients, func(i int) error {
		_, err := admin.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: sms[i].Name}))
		return err
	})
	var ready, failed int
	bctest.WaitFor(tb, fmt.Sprintf("%d machines to end their commissioning", n), func() bool {
		ready, failed = countStates(tb, cp, metal.StateReady), countStates(tb, cp, metal.StateFailed)
		return ready+failed == n
	})
	r := result{machines: n, wall: time.Since(start), failed: failed}
	var after syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	r.cpu = cpuTime(after) - cpuTime(before)
	r.peakHeap = stopSampling()
	r.maxRSS = uint64(after.Maxrss) << 10 // KiB on Linux
	if failed > 0 {
		var reason string
		_ = cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT failure_reason FROM machines WHERE state = 'failed' LIMIT 1`).Scan(&reason)
		})
		tb.Errorf("%d of %d machines failed their commissioning; one said: %s", failed, n, reason)
	}
	if got := sim.MaxApplied(); got != 1 {
		tb.Errorf("a step was applied %d times; every key at most once", got)
	}
	return r
}

// parallel runs fn(0..n-1) on k goroutines and fails on the first error.
func parallel(tb testing.TB, n, k int, fn func(i int) error) {
	tb.Helper()
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				if err := fn(i); err != nil {
					mu.Lock()
					first = cmpErr(first, fmt.Errorf("item %d: %w", i, err))
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if first != nil {
		tb.Fatal(first)
	}
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func countStates(tb testing.TB, cp *bctest.ControlPlane, st metal.State) int {
	tb.Helper()
	var n int
	if err := cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM machines WHERE state = $1`, string(st)).Scan(&n)
	}); err != nil {
		tb.Fatal(err)
	}
	return n
}

func cpuTime(r syscall.Rusage) time.Duration {
	return time.Duration(r.Utime.Nano() + r.Stime.Nano())
}

// sampleHeap samples the live heap every 100 ms until the returned
// function is called, which returns the peak.
func sampleHeap() func() uint64 {
	done, out := make(chan struct{}), make(chan uint64, 1)
	go func() {
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		var peak uint64
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(s)
			peak = max(peak, s[0].Value.Uint64())
			select {
			case <-done:
				out <- peak
				return
			case <-t.C:
			}
		}
	}()
	return func() uint64 { close(done); return <-out }
}

func storeName() string {
	if os.Getenv(bctest.PostgresURLEnv) != "" {
		return "postgres"
	}
	return "sqlite"
}

// BenchmarkCommission commissions -machines machines (1,000 by default)
// with one simulated site agent. Run it once per store:
//
//	go test ./bench/metal -run '^$' -bench Commission -benchtime 1x
func BenchmarkCommission(b *testing.B) {
	for b.Loop() {
		r := commission(b, *machinesFlag, *clientsFlag)
		b.ReportMetric(r.wall.Seconds(), "s-to-ready")
		b.ReportMetric(r.cpu.Seconds(), "cpu-s")
		b.ReportMetric(float64(r.peakHeap)/(1<<20), "peak-heap-MiB")
		b.ReportMetric(float64(r.maxRSS)/(1<<20), "max-RSS-MiB")
		b.Logf("store=%s machines=%d GOMAXPROCS=%d wall=%s cpu=%s peak_heap=%.0fMiB max_rss=%.0fMiB", storeName(), r.machines,
			runtime.GOMAXPROCS(0), r.wall.Round(time.Millisecond), r.cpu.Round(time.Millisecond),
			float64(r.peakHeap)/(1<<20), float64(r.maxRSS)/(1<<20))
	}
}

// TestCommissionSmall is the benchmark's path at a small scale: every
// machine ends ready, every step applied once.
func TestCommissionSmall(t *testing.T) {
	t.Parallel()
	r := commission(t, 12, 4)
	if r.failed != 0 {
		t.Fatalf("%d machines failed", r.failed)
	}
	if r.wall <= 0 || r.cpu <= 0 || r.peakHeap == 0 {
		t.Fatalf("nothing measured: %+v", r)
	}
}
