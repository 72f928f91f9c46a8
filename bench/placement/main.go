// Command placement benchmarks GPU placement: how many 1-GPU reservations the
// real create path commits per second with concurrent clients (inline), how
// fast the queued placer drains pending reservations, how many mutations each
// placer transaction carries and how long it holds the writer (BEGIN to
// COMMIT), and the memory the control plane needs to do it over a fleet of N
// synthetic nodes, optionally with a history of ended bookings.
//
// The fleet is written straight into the store with bulk inserts (inventory,
// pool membership, atoms, host resources and capacity rollups, the rows the
// atoms reconciler would write), then reservations go through
// ReservationService.Create (with -count N, arrays of N through
// CreateReservations) over an in-process Connect client: the envelope,
// authorization, snapshot, placement, booking, quota check and audit/outbox
// rows all run as in production. With -json the last line of stdout is one
// JSON object.
//
// With -store postgres and no -postgres-url it runs initdb and a throw-away
// server of its own (fsync and synchronous_commit on), removed at the end.
//
// It must never be imported, and never reach beyond the database (or the
// throw-away cluster) it creates.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

type options struct {
	nodes       int
	store       string
	postgresURL string
	jsonOut     bool
	clients     int
	duration    time.Duration
	gpusPerNode int
	cpusPerNode int
	pending     int
	binding     string
	reconcile   bool
	quota       bool
	cpuProfile  string
	history     int
	count       int
	gang        int
	gangGPUs    int
	linger      time.Duration
}

// result is what the benchmark reports.
type result struct {
	Nodes       int    `json:"nodes"`
	Store       string `json:"store"`
	GPUsPerNode int    `json:"gpus_per_node"`
	CPUsPerNode int    `json:"cpus_per_node"`
	GPUs        int    `json:"gpus"`
	Atoms       int    `json:"atoms"`
	// AtomsFrom is "direct" (rows written by the harness in the
	// reconciler's shapes) or "reconciler".
	AtomsFrom string `json:"atoms_from"`
	// LoadS is the fleet's load and, on PostgreSQL, the ANALYZE after it;
	// HistoryLoadS the -history preload.
	LoadS        float64 `json:"load_s"`
	HistoryLoadS float64 `json:"history_load_s"`
	// HistoryBookings is how many ended bookings the store held when the
	// inline phase began (-history's, plus any ended before).
	HistoryBookings int64 `json:"history_bookings"`

	// PostgreSQL only: "throw-away" (the harness's own cluster) or "url"
	// (-postgres-url), and the settings read from the server.
	PostgresServer     string `json:"postgres_server,omitempty"`
	PostgresVersion    string `json:"postgres_version,omitempty"`
	PostgresFsync      string `json:"postgres_fsync,omitempty"`
	PostgresSyncCommit string `json:"postgres_synchronous_commit,omitempty"`
	PostgresMaxConns   int    `json:"postgres_max_connections,omitempty"`

	// Inline path: concurrent clients creating 1-GPU reservations, one a
	// call (Count 1, Create) or arrays of Count (CreateReservations): the
	// placement fields count reservations, the create latency calls.
	Clients int `json:"clients"`
	Count   int `json:"count"`
	// Gang is the nodes per gang with -gang (Count is the same), each
	// member GangGPUs GPUs, all in one rack; 0 without.
	Gang     int `json:"gang"`
	GangGPUs int `json:"gang_gpus"`
	// LingerUS is -linger in microseconds (0: the default, negative: none).
	LingerUS       int64   `json:"linger_us"`
	Binding        string  `json:"binding"`
	PlacementsPerS float64 `json:"placements_per_s"`
	InlinePlaced   int64   `json:"inline_placed"`
	InlinePending  int64   `json:"inline_pending"`
	InlineFailed   int64   `json:"inline_failed"`
	InlineError    string  `json:"inline_error,omitempty"`
	InlineS        float64 `json:"inline_s"`
	// FirstCreateMS is the untimed create before the clients start: it
	// loads what the engine caches.
	FirstCreateMS float64 `json:"first_create_ms"`
	CreateP50ms   float64 `json:"create_p50_ms"`
	CreateP99ms   float64 `json:"create_p99_ms"`
	CreateMaxms   float64 `json:"create_max_ms"`
	// Lock hold of the inline phase: one sample per placer transaction
	// (Engine.BatchObserved), from BEGIN to COMMIT — the whole time the
	// transaction holds the writer (SQLite) or its row locks (PostgreSQL),
	// for however many creates it carried. Before the placer (issue 9) it
	// was one sample per create, timing placement to the reservation row
	// only. LockHolds is the number of transactions.
	LockHoldP50ms float64 `json:"lock_hold_p50_ms"`
	LockHoldP90ms float64 `json:"lock_hold_p90_ms"`
	LockHoldP99ms float64 `json:"lock_hold_p99_ms"`
	LockHoldMaxms float64 `json:"lock_hold_max_ms"`
	LockHolds     int     `json:"lock_holds"`
	// TxnHold is the same samples under the name the targets use
	// (transaction hold p99 ≤ 5 ms).
	TxnHoldP50ms float64 `json:"txn_hold_p50_ms"`
	TxnHoldP99ms float64 `json:"txn_hold_p99_ms"`
	// BatchP50 and BatchMax are the mutations per placer transaction in the
	// inline phase (a batch that failed and was rerun item by item counts
	// twice).
	BatchP50 int `json:"batch_p50"`
	BatchMax int `json:"batch_max"`

	// Queued path: pending reservations placed by Runner.PlacePending.
	Pending              int     `json:"pending"`
	QueuedPlacementsPerS float64 `json:"queued_placements_per_s"`
	QueuedPlaced         int     `json:"queued_placed"`
	QueuedS              float64 `json:"queued_s"`
	QueuedBatches        int     `json:"queued_batches"`
	// Lock hold of one PlacePending transaction, BEGIN to COMMIT
	// (Engine.BatchObserved): one placer transaction placing up to
	// Runner.Batch (200) pending reservations. QueuedTxnHold is the same
	// samples under the name.
	QueuedLockHoldP50ms float64 `json:"queued_lock_hold_p50_ms"`
	QueuedLockHoldP99ms float64 `json:"queued_lock_hold_p99_ms"`
	QueuedTxnHoldP50ms  float64 `json:"queued_txn_hold_p50_ms"`
	QueuedTxnHoldP99ms  float64 `json:"queued_txn_hold_p99_ms"`

	Replans int64   `json:"replans"`
	RSSMiB  float64 `json:"rss_mib"`
	HeapMiB float64 `json:"heap_mib"`
	// LoadAvg is the machine's 1-minute load average after the inline
	// phase: above the core count, other work shared the CPUs.
	LoadAvg    float64 `json:"load_avg"`
	GoMaxProcs int     `json:"gomaxprocs"`
	Machine    string  `json:"machine"`
	StartedAt  string  `json:"started_at"`
	TotalS     float64 `json:"total_s"`
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := execute(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		log.Fatalf("bench: %v", err)
	}
}

// execute parses args, runs the benchmark and prints its result to stdout;
// progress goes to stderr.
func execute(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o options
	fs := flag.NewFlagSet("placement", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.nodes, "nodes", 1000, "nodes in the synthetic fleet")
	fs.StringVar(&o.store, "store", "sqlite", "sqlite (a temp dir) or postgres (a throw-away cluster, or a fresh database on -postgres-url's server, dropped after)")
	fs.StringVar(&o.postgresURL, "postgres-url", "", "an existing PostgreSQL server for -store postgres; without it the harness runs initdb and its own server (fsync and synchronous_commit on) in a temp dir")
	fs.BoolVar(&o.jsonOut, "json", false, "print the result as one JSON object on the last line")
	fs.IntVar(&o.clients, "clients", 8, "concurrent clients creating reservations")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "how long the clients create (they stop earlier when capacity runs out)")
	fs.IntVar(&o.gpusPerNode, "gpus-per-node", 8, "GPUs per node (NVLink islands of 4, two NUMA nodes)")
	fs.IntVar(&o.cpusPerNode, "cpus-per-node", 16, "CPUs per node (each is an atom row)")
	fs.IntVar(&o.pending, "pending", 2000, "pending reservations the queued placer places (at most half the GPUs)")
	fs.StringVar(&o.binding, "binding", "none", "binding of the reservations: none or kubernetes (node needs an agent)")
	fs.BoolVar(&o.reconcile, "reconcile", false, "derive atoms with the reconciler instead of writing them directly (slow at scale)")
	fs.BoolVar(&o.quota, "quota", false, "give the tenant a GPU quota, so every create sums its usage")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the inline phase to this file")
	fs.IntVar(&o.history, "history", 0, "ended bookings to preload on the fleet's GPU atoms before measuring")
	fs.IntVar(&o.count, "count", 1, "reservations per inline call: above 1, each client books arrays of this many (CreateReservations, all or nothing)")
	fs.IntVar(&o.gang, "gang", 0, "nodes per gang: each client books gangs of this many nodes in one rack (topology.rack, 32 nodes a rack), one reservation a node, instead of -count")
	fs.DurationVar(&o.linger, "linger", 0, "the placer's linger for more work (app.Config.PlacerLinger): 0 its default, negative none")
	fs.IntVar(&o.gangGPUs, "gang-gpus", 0, "GPUs of each gang member (default: -gpus-per-node, whole nodes)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := o.validate(); err != nil {
		return err
	}
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "bench: "+format+"\n", args...) }
	res, err := run(ctx, o, logf)
	if err != nil {
		return err
	}
	if o.jsonOut {
		b, err := json.Marshal(res)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(stdout, string(b))
		return err
	}
	return printSummary(stdout, res)
}

func (o *options) validate() error {
	var errs []error
	if o.nodes < 1 {
		errs = append(errs, fmt.Errorf("-nodes must be at least 1, got %d", o.nodes))
	}
	switch o.store {
	case "sqlite":
	case "postgres":
		if o.postgresURL != "" && !strings.HasPrefix(o.postgresURL, "postgres://") && !strings.HasPrefix(o.postgresURL, "postgresql://") {
			errs = append(errs, fmt.Errorf("-postgres-url must be postgres://... or postgresql://..., got %q", o.postgresURL))
		}
	default:
		errs = append(errs, fmt.Errorf("-store must be sqlite or postgres, got %q", o.store))
	}
	if o.store != "postgres" && o.postgresURL != "" {
		errs = append(errs, errors.New("-postgres-url needs -store postgres"))
	}
	if o.clients < 1 {
		errs = append(errs, fmt.Errorf("-clients must be at least 1, got %d", o.clients))
	}
	if o.duration <= 0 {
		errs = append(errs, fmt.Errorf("-duration must be positive, got %s", o.duration))
	}
	if o.gpusPerNode < 1 || o.gpusPerNode > 64 {
		errs = append(errs, fmt.Errorf("-gpus-per-node must be 1..64, got %d", o.gpusPerNode))
	}
	if o.cpusPerNode < 2 || o.cpusPerNode%2 != 0 || o.cpusPerNode < o.gpusPerNode {
		errs = append(errs, fmt.Errorf("-cpus-per-node must be even and at least -gpus-per-node, got %d", o.cpusPerNode))
	}
	if o.history < 0 {
		errs = append(errs, fmt.Errorf("-history must not be negative, got %d", o.history))
	}
	if o.count < 1 || o.count > 1000 {
		errs = append(errs, fmt.Errorf("-count must be 1..1000, got %d", o.count))
	}
	if o.gang < 0 || o.gang > 32 {
		errs = append(errs, fmt.Errorf("-gang must be 0..32 (a rack's nodes), got %d", o.gang))
	}
	if o.gang > 0 && o.count != 1 {
		errs = append(errs, errors.New("-gang and -count are either or: a gang's count is its nodes"))
	}
	if o.gangGPUs < 0 || o.gangGPUs > o.gpusPerNode {
		errs = append(errs, fmt.Errorf("-gang-gpus must be 0..-gpus-per-node, got %d", o.gangGPUs))
	}
	if o.pending < 0 {
		errs = append(errs, fmt.Errorf("-pending must not be negative, got %d", o.pending))
	}
	if o.binding != "none" && o.binding != "kubernetes" {
		errs = append(errs, fmt.Errorf("-binding must be none or kubernetes, got %q", o.binding))
	}
	return errors.Join(errs...)
}

func printSummary(w io.Writer, r result) error {
	_, err := fmt.Fprintf(w, `placement benchmark: %d nodes × %d GPUs (%d atoms, %s) on %s, %s (load average %.1f)
  load            %.1f s (history: %d ended bookings, preloaded in %.1f s)
  inline          %.0f placements/s (%d placed, %d pending, %d failed in %.1f s; %d clients, %d a call, binding %s)
  create latency  p50 %.2f ms, p99 %.2f ms, max %.0f ms (the first, untimed: %.0f ms)
  transactions    %d, creates per transaction p50 %d, max %d
  txn hold        p50 %.2f ms, p90 %.2f ms, p99 %.2f ms, max %.2f ms (BEGIN…COMMIT)
  queued          %.0f placements/s (%d of %d placed in %.2f s, %d transactions; hold p50 %.1f ms, p99 %.1f ms)
  replans         %d
  memory          max RSS %.0f MiB, peak heap %.0f MiB
`, r.Nodes, r.GPUsPerNode, r.Atoms, r.AtomsFrom, r.Store, r.Machine, r.LoadAvg,
		r.LoadS, r.HistoryBookings, r.HistoryLoadS,
		r.PlacementsPerS, r.InlinePlaced, r.InlinePending, r.InlineFailed, r.InlineS, r.Clients, r.Count, r.Binding,
		r.CreateP50ms, r.CreateP99ms, r.CreateMaxms, r.FirstCreateMS,
		r.LockHolds, r.BatchP50, r.BatchMax,
		r.LockHoldP50ms, r.LockHoldP90ms, r.LockHoldP99ms, r.LockHoldMaxms,
		r.QueuedPlacementsPerS, r.QueuedPlaced, r.Pending, r.QueuedS, r.QueuedBatches, r.QueuedLockHoldP50ms, r.QueuedLockHoldP99ms,
		r.Replans,
		r.RSSMiB, r.HeapMiB)
	if err == nil && r.PostgresServer != "" {
		_, err = fmt.Fprintf(w, "  postgres        %s server %s, fsync %s, synchronous_commit %s, max_connections %d\n",
			r.PostgresServer, r.PostgresVersion, r.PostgresFsync, r.PostgresSyncCommit, r.PostgresMaxConns)
	}
	if err == nil && r.InlineError != "" {
		_, err = fmt.Fprintf(w, "  first failure   %s\n", r.InlineError)
	}
	return err
}
