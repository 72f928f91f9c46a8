package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/bench/fleetload"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/store/storeopen"
)

// reservationLength is how long every benchmark reservation lasts.
const reservationLength = time.Hour

// bench is a control plane with its fleet loaded.
type bench struct {
	app                   *app.App
	api                   *client.Client
	txns                  *txnObserver
	tenant, project, pool string
}

// prepare opens the store, builds the control plane (the api role only: no
// job worker, so nothing but the harness places reservations, and no gateway,
// since bindings none and kubernetes need no agent), creates the tenant and
// pool, and loads the fleet. closeAll closes the store (and drops a
// PostgreSQL database).
func prepare(ctx context.Context, o options, dir string, res *result) (b *bench, closeAll func() error, err error) {
	db, closeStore, err := openStore(ctx, o, dir)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, closeStore())
		}
	}()
	a, err := app.NewWithDB(ctx, app.Config{Roles: []string{app.RoleAPI}, StateDir: dir, Logger: slog.New(slog.DiscardHandler), PlacerLinger: o.linger}, db)
	if err != nil {
		return nil, nil, err
	}
	b = &bench{app: a, txns: &txnObserver{}}
	a.Capacity.Engine.ObserveBatches(b.txns.observe)
	key, _, err := a.Bootstrap(ctx, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("bootstrap: %w", err)
	}
	b.api = client.New("http://placement.bench", key, client.WithHTTPClient(&http.Client{Transport: inProcess{a.Handler}}))
	if b.tenant, b.project, b.pool, err = setup(ctx, b.api, o); err != nil {
		return nil, nil, err
	}
	loadStart := time.Now()
	if err := fleetload.LoadSyntheticFleet(ctx, a.DB, fleetload.SyntheticFleet{Nodes: o.nodes, GPUsPerNode: o.gpusPerNode, CPUsPerNode: o.cpusPerNode,
		TenantID: b.tenant, ProjectID: b.project, PoolID: b.pool, Direct: !o.reconcile, Now: time.Now()}); err != nil {
		return nil, nil, fmt.Errorf("load fleet: %w", err)
	}
	fleetLoad := time.Since(loadStart)
	historyStart := time.Now()
	// The history ends a minute ago: over before the first create.
	if err := preloadHistory(ctx, a.DB, o.history, historyStart.Add(-time.Minute), historyRowsPerTx); err != nil {
		return nil, nil, err
	}
	res.HistoryLoadS = time.Since(historyStart).Seconds()
	analyzeStart := time.Now()
	if err := analyze(ctx, a.DB); err != nil {
		return nil, nil, err
	}
	res.LoadS = (fleetLoad + time.Since(analyzeStart)).Seconds()
	if res.Atoms, err = countAtoms(ctx, a.DB); err != nil {
		return nil, nil, err
	}
	return b, closeStore, nil
}

func run(ctx context.Context, o options, logf func(string, ...any)) (res result, err error) {
	start := time.Now()
	res = result{Nodes: o.nodes, Store: o.store, GPUsPerNode: o.gpusPerNode, CPUsPerNode: o.cpusPerNode, GPUs: o.nodes * o.gpusPerNode,
		Clients: o.clients, Count: max(o.count, o.gang, 1), Gang: o.gang, LingerUS: o.linger.Microseconds(), Binding: o.binding, AtomsFrom: "direct", GoMaxProcs: runtime.GOMAXPROCS(0),
		Machine: fmt.Sprintf("%d cores", runtime.NumCPU()), StartedAt: start.UTC().Format(time.RFC3339)}
	if o.reconcile {
		res.AtomsFrom = "reconciler"
	}
	if o.gang > 0 {
		res.GangGPUs = cmp.Or(o.gangGPUs, o.gpusPerNode)
	}
	heap := startHeapSampler()
	defer heap.stop()
	dir, err := os.MkdirTemp("", "bc-bench-placement-")
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, os.RemoveAll(dir)) }()

	if o.store == "postgres" {
		res.PostgresServer = "url"
		if o.postgresURL == "" {
			res.PostgresServer = "throw-away"
			c, err := startCluster(ctx, clusterConns(o.clients), logf)
			if err != nil {
				return res, fmt.Errorf("throw-away postgres: %w", err)
			}
			// Deferred first, so it runs last: after the database is
			// dropped and the pool closed.
			defer func() { err = errors.Join(err, c.stop()) }()
			o.postgresURL = c.URL
		}
	}

	logf("loading %d nodes × %d GPUs (%s atoms) into %s", o.nodes, o.gpusPerNode, res.AtomsFrom, o.store)
	b, closeAll, err := prepare(ctx, o, dir, &res)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, closeAll()) }()
	// The placers hand their pools back (and their lock session to the
	// pool) before the store closes.
	defer b.app.Stop()
	logf("loaded %d atoms in %.1fs", res.Atoms, res.LoadS)
	if o.history > 0 {
		logf("preloaded %d ended bookings in %.1fs", o.history, res.HistoryLoadS)
	}
	if err := serverSettings(ctx, b.app.DB, &res); err != nil {
		return res, err
	}
	if res.HistoryBookings, err = countEndedBookings(ctx, b.app.DB, time.Now()); err != nil {
		return res, fmt.Errorf("count ended bookings: %w", err)
	}

	// Half the GPUs at most wait for the queued placer; the inline clients
	// may take the rest.
	res.Pending = min(o.pending, res.GPUs/2)
	limit := res.GPUs - res.Pending
	if res.GangGPUs > 0 {
		// A gang's members take GangGPUs each.
		limit /= res.GangGPUs
	}
	if err := b.inline(ctx, o, limit, &res); err != nil {
		return res, err
	}
	logf("inline: %.0f placements/s (%d placed, %d pending, %d failed); %d transactions, batch p50 %d, hold p99 %.2f ms",
		res.PlacementsPerS, res.InlinePlaced, res.InlinePending, res.InlineFailed, res.LockHolds, res.BatchP50, res.TxnHoldP99ms)
	if res.InlineError != "" {
		logf("inline: first failure: %s", res.InlineError)
	}
	if err := b.queued(ctx, o, &res); err != nil {
		return res, err
	}
	logf("queued: %.0f placements/s (%d placed in %.2fs)", res.QueuedPlacementsPerS, res.QueuedPlaced, res.QueuedS)

	res.Replans = b.app.Capacity.Engine.Replans()
	res.RSSMiB = maxRSSMiB()
	res.HeapMiB = heap.stop()
	res.TotalS = time.Since(start).Seconds()
	return res, nil
}

// setup creates the tenant, its default project and the pool through the
// API, before any node exists (a pool's creation reconciles the tenant's
// nodes).
func setup(ctx context.Context, api *client.Client, o options) (tenant, project, pool string, err error) {
	t, err := api.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "bench"}))
	if err != nil {
		return "", "", "", fmt.Errorf("create tenant: %w", err)
	}
	p, err := api.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "bench", Name: "default"}))
	if err != nil {
		return "", "", "", fmt.Errorf("create project: %w", err)
	}
	pl, err := api.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "bench", Name: "gpu",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}}}))
	if err != nil {
		return "", "", "", fmt.Errorf("create pool: %w", err)
	}
	if o.quota {
		gpus := int32(o.nodes * o.gpusPerNode)
		if _, err := api.Quotas.Set(ctx, connect.NewRequest(&apiv1.SetQuotaRequest{Tenant: "bench", Gpus: &gpus})); err != nil {
			return "", "", "", fmt.Errorf("set quota: %w", err)
		}
	}
	return t.Msg.GetTenant().GetId(), p.Msg.GetProject().GetId(), pl.Msg.GetPool().GetId(), nil
}

// inline runs o.clients clients creating 1-GPU reservations through the API
// for o.duration, until limit were asked for, or until the pool is full.
func (b *bench) inline(ctx context.Context, o options, limit int, res *result) error {
	per := max(o.count, o.gang, 1)
	// create books one reservation (Create), or with -count N an array of
	// N (CreateReservations, all or nothing), or with -gang N a gang of N
	// nodes in one rack; it returns how many were placed and how many
	// wait.
	create := func() (placed, waiting int, err error) {
		tmpl := &apiv1.CreateReservationRequest{
			Tenant: "bench", Pool: "gpu", Gpus: 1, Binding: o.binding, DurationSeconds: int64(reservationLength / time.Second)}
		if per > 1 {
			msg := &apiv1.CreateReservationsRequest{Template: tmpl, Count: int32(per)}
			if o.gang > 0 {
				tmpl.Gpus = int32(cmp.Or(o.gangGPUs, o.gpusPerNode))
				msg.Gang = &apiv1.Gang{Topology: "rack"}
			}
			r, err := b.api.Reservations.CreateReservations(ctx, connect.NewRequest(msg))
			if err != nil {
				return 0, 0, err
			}
			return len(r.Msg.GetReservations()), 0, nil
		}
		r, err := b.api.Reservations.Create(ctx, connect.NewRequest(tmpl))
		switch {
		case err != nil:
			return 0, 0, err
		case r.Msg.GetReservation().GetPlacement().GetNodeId() != "":
			return 1, 0, nil
		default:
			// Nothing fit now, or it lost the race for its atoms
			// MaxReplans times: it waits in the queue.
			return 0, 1, nil
		}
	}
	// One create before the clock starts: the first in a process loads what
	// the engine caches (the pool's index, the compiled policies), which
	// later ones only refresh.
	t0 := time.Now()
	if _, _, err := create(); err != nil {
		return fmt.Errorf("first create: %w", err)
	}
	res.FirstCreateMS = float64(time.Since(t0).Microseconds()) / 1000
	limit -= per

	var samples []txn
	b.txns.start(&samples)
	defer b.txns.start(nil)
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return errors.Join(err, f.Close())
		}
		defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
	}
	var (
		asked, placed, pending, failed atomic.Int64
		full                           atomic.Bool
		firstErr                       sync.Once
		wg                             sync.WaitGroup
	)
	lat := make([][]time.Duration, o.clients)
	began := time.Now()
	deadline := began.Add(o.duration)
	for c := range o.clients {
		wg.Go(func() {
			for ctx.Err() == nil && !full.Load() && time.Now().Before(deadline) && asked.Add(int64(per)) <= int64(limit) {
				t0 := time.Now()
				p, w, err := create()
				lat[c] = append(lat[c], time.Since(t0))
				switch {
				case err == nil:
					placed.Add(int64(p))
					pending.Add(int64(w))
				case client.Code(err) == "NO_CAPACITY":
					full.Store(true)
				default:
					failed.Add(1)
					firstErr.Do(func() { res.InlineError = err.Error() })
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(began)
	if err := ctx.Err(); err != nil {
		return err
	}
	res.LoadAvg = loadAvg()
	res.InlineS = elapsed.Seconds()
	res.InlinePlaced, res.InlinePending, res.InlineFailed = placed.Load(), pending.Load(), failed.Load()
	res.PlacementsPerS = float64(res.InlinePlaced) / elapsed.Seconds()
	all := slices.Concat(lat...)
	res.CreateP50ms, res.CreateP99ms, res.CreateMaxms = percentileMS(all, 0.50), percentileMS(all, 0.99), percentileMS(all, 1)
	txns := b.txns.start(nil)
	hs, sizes := holdsAndSizes(txns)
	res.LockHolds = len(hs)
	res.LockHoldP50ms, res.LockHoldP90ms = percentileMS(hs, 0.50), percentileMS(hs, 0.90)
	res.LockHoldP99ms, res.LockHoldMaxms = percentileMS(hs, 0.99), percentileMS(hs, 1)
	res.TxnHoldP50ms, res.TxnHoldP99ms = res.LockHoldP50ms, res.LockHoldP99ms
	res.BatchP50, res.BatchMax = percentile(sizes, 0.50), percentile(sizes, 1)
	if res.InlinePlaced == 0 && res.InlineFailed > 0 {
		return fmt.Errorf("no create succeeded; %d failed, the first with: %s", res.InlineFailed, res.InlineError)
	}
	return nil
}

// queued inserts res.Pending pending reservations and times the queued
// placer (Runner.PlacePending, one transaction per batch) until a pass
// places nothing more.
func (b *bench) queued(ctx context.Context, o options, res *result) error {
	if res.Pending == 0 {
		return nil
	}
	if err := insertPending(ctx, b.app.DB, pendingSpec{n: res.Pending, tenantID: b.tenant, projectID: b.project, poolID: b.pool,
		binding: o.binding, vcpu: o.cpusPerNode / o.gpusPerNode, memoryGiB: fleetload.SyntheticMemoryGiB / o.gpusPerNode,
		createdBy: "bench", now: time.Now(), duration: reservationLength}); err != nil {
		return fmt.Errorf("insert pending: %w", err)
	}
	var samples []txn
	b.txns.start(&samples)
	began := time.Now()
	var busy time.Duration
	for {
		n, err := b.app.Capacity.PlacePending(ctx, b.pool)
		if err != nil {
			return fmt.Errorf("place pending: %w", err)
		}
		if n == 0 {
			// The pass that finds nothing more to place is not counted.
			break
		}
		res.QueuedPlaced += n
		res.QueuedBatches++
		busy = time.Since(began)
	}
	txns := b.txns.start(nil)
	// Observations arrive in commit order and only PlacePending writes
	// now: the last is the pass that placed nothing.
	if len(txns) > res.QueuedBatches {
		txns = txns[:res.QueuedBatches]
	}
	hs, _ := holdsAndSizes(txns)
	res.QueuedS = busy.Seconds()
	if busy > 0 {
		res.QueuedPlacementsPerS = float64(res.QueuedPlaced) / busy.Seconds()
	}
	res.QueuedLockHoldP50ms, res.QueuedLockHoldP99ms = percentileMS(hs, 0.50), percentileMS(hs, 0.99)
	res.QueuedTxnHoldP50ms, res.QueuedTxnHoldP99ms = res.QueuedLockHoldP50ms, res.QueuedLockHoldP99ms
	return nil
}

// openStore opens SQLite in dir, or a fresh database on the PostgreSQL
// server; the returned func closes it (and drops the database).
func openStore(ctx context.Context, o options, dir string) (*store.DB, func() error, error) {
	if o.store == "sqlite" {
		db, err := storeopen.Open(ctx, store.Config{StateDir: dir})
		if err != nil {
			return nil, nil, err
		}
		return db, db.Close, nil
	}
	u, err := url.Parse(o.postgresURL)
	if err != nil {
		return nil, nil, fmt.Errorf("-postgres-url: %w", err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "bench_" + hex.EncodeToString(b[:])
	admin := func(stmt string) error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, o.postgresURL)
		if err != nil {
			return err
		}
		defer func() { _ = conn.Close(ctx) }()
		_, err = conn.Exec(ctx, stmt)
		return err
	}
	if err := admin("CREATE DATABASE " + name); err != nil {
		return nil, nil, fmt.Errorf("create database %s: %w", name, err)
	}
	drop := func() error { return admin("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)") }
	u.Path = "/" + name
	db, err := storeopen.Open(ctx, store.Config{URL: u.String()})
	if err != nil {
		return nil, nil, errors.Join(err, drop())
	}
	return db, func() error { return errors.Join(db.Close(), drop()) }, nil
}

// analyze refreshes PostgreSQL's statistics after the bulk load, as
// autovacuum would shortly after; SQLite keeps none unless asked, and the
// control plane never asks.
func analyze(ctx context.Context, db *store.DB) error {
	if db.Dialect() != store.Postgres {
		return nil
	}
	return db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `ANALYZE`)
		return err
	})
}

func countAtoms(ctx context.Context, db *store.DB) (int, error) {
	var n int
	err := db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM atoms`).Scan(&n)
	})
	return n, err
}

// inProcess serves requests with the API's handler in this process: the
// Connect client, codec, interceptor and handler run as over the network,
// without sockets competing for the two cores.
type inProcess struct{ h http.Handler }

func (t inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, req)
	return rec.Result(), nil
}

// txn is one placer transaction as Engine.BatchObserved reports it: the
// mutations it carried and its hold, BEGIN to COMMIT.
type txn struct {
	size int
	hold time.Duration
}

// txnObserver collects Engine.BatchObserved observations into the current
// phase's slice.
type txnObserver struct {
	mu  sync.Mutex
	cur *[]txn
}

func (l *txnObserver) observe(size int, hold time.Duration) {
	l.mu.Lock()
	if l.cur != nil {
		*l.cur = append(*l.cur, txn{size: size, hold: hold})
	}
	l.mu.Unlock()
}

// start makes next the current phase's slice and returns the previous
// phase's observations.
func (l *txnObserver) start(next *[]txn) []txn {
	l.mu.Lock()
	defer l.mu.Unlock()
	var prev []txn
	if l.cur != nil {
		prev = *l.cur
	}
	l.cur = next
	return prev
}

func holdsAndSizes(ts []txn) (holds []time.Duration, sizes []int) {
	for _, t := range ts {
		holds = append(holds, t.hold)
		sizes = append(sizes, t.size)
	}
	return holds, sizes
}

// percentileMS is the q-quantile of ds (nearest rank) in milliseconds; it
// sorts ds.
func percentileMS(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	return float64(percentile(ds, q).Microseconds()) / 1000
}

// percentile is the q-quantile of xs (nearest rank), zero for none; it sorts
// xs.
func percentile[T int | time.Duration](xs []T, q float64) T {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	return xs[min(len(xs)-1, max(0, int(float64(len(xs))*q+0.999999)-1))]
}

// clusterConns is max_connections for a throw-away cluster: the control
// plane's pool (at least 16, four a core: internal/store/postgres), one more
// per client as headroom, and room for the harness's admin connections, a
// psql to look on, and the three superuser slots.
func clusterConns(clients int) int {
	return max(16, 4*runtime.NumCPU()) + clients + 16
}

// serverSettings records the PostgreSQL settings the figures were taken
// under, read from the server itself.
func serverSettings(ctx context.Context, db *store.DB, res *result) error {
	if db.Dialect() != store.Postgres {
		return nil
	}
	return db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('fsync'),
			current_setting('synchronous_commit'), current_setting('max_connections')::int`).
			Scan(&res.PostgresVersion, &res.PostgresFsync, &res.PostgresSyncCommit, &res.PostgresMaxConns)
	})
}

// maxRSSMiB is the process's peak resident set (VmHWM).
func maxRSSMiB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// loadAvg is the 1-minute load average.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f, _, _ := strings.Cut(string(b), " ")
	v, _ := strconv.ParseFloat(f, 64)
	return v
}

// heapSampler tracks the peak of the heap's object bytes, read every 50 ms
// (runtime/metrics does not stop the world).
type heapSampler struct {
	done chan struct{}
	wg   sync.WaitGroup
	peak atomic.Uint64
	once sync.Once
}

const heapMetric = "/memory/classes/heap/objects:bytes"

func startHeapSampler() *heapSampler {
	h := &heapSampler{done: make(chan struct{})}
	h.wg.Go(func() {
		s := []metrics.Sample{{Name: heapMetric}}
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(s)
			if v := s[0].Value.Uint64(); v > h.peak.Load() {
				h.peak.Store(v)
			}
			select {
			case <-h.done:
				return
			case <-t.C:
			}
		}
	})
	return h
}

// stop ends the sampling and returns the peak in MiB; it is safe to call
// twice.
func (h *heapSampler) stop() float64 {
	h.once.Do(func() { close(h.done); h.wg.Wait() })
	return float64(h.peak.Load()) / (1 << 20)
}
