// Command placement benchmarks GPU placement: how many 1-GPU reservations the
// real create path commits per second with concurrent clients (inline), how
// fast the queued placer drains pending reservations, how long the placement
// section of a write holds the writer, and the memory the control plane needs
// to do it over a fleet of N synthetic nodes.
//
// The fleet is written straight into the store with bulk inserts (inventory,
// pool membership, atoms, host resources and capacity rollups, the rows the
// atoms reconciler would write), then reservations go through
// ReservationService.Create over an in-process Connect client: the envelope,
// authorization, snapshot, placement, booking, quota check and audit/outbox
// rows all run as in production. With -json the last line of stdout is one
// JSON object.
//
// It must never be imported, and never reach beyond the database it creates.
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
	AtomsFrom string  `json:"atoms_from"`
	LoadS     float64 `json:"load_s"`

	// Inline path: concurrent clients creating 1-GPU reservations.
	Clients        int     `json:"clients"`
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
	// Lock hold of the inline creates: the placement section of each
	// create's write transaction (Engine.LockHold).
	LockHoldP50ms float64 `json:"lock_hold_p50_ms"`
	LockHoldP90ms float64 `json:"lock_hold_p90_ms"`
	LockHoldP99ms float64 `json:"lock_hold_p99_ms"`
	LockHoldMaxms float64 `json:"lock_hold_max_ms"`
	LockHolds     int     `json:"lock_holds"`

	// Queued path: pending reservations placed by Runner.PlacePending.
	Pending              int     `json:"pending"`
	QueuedPlacementsPerS float64 `json:"queued_placements_per_s"`
	QueuedPlaced         int     `json:"queued_placed"`
	QueuedS              float64 `json:"queued_s"`
	QueuedBatches        int     `json:"queued_batches"`
	// Lock hold of one PlacePending transaction (a batch).
	QueuedLockHoldP50ms float64 `json:"queued_lock_hold_p50_ms"`
	QueuedLockHoldP99ms float64 `json:"queued_lock_hold_p99_ms"`

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
	fs.StringVar(&o.store, "store", "sqlite", "sqlite (a temp dir) or postgres (a fresh database on -postgres-url's server, dropped after)")
	fs.StringVar(&o.postgresURL, "postgres-url", os.Getenv("BC_TEST_POSTGRES_URL"), "PostgreSQL server for -store postgres (default $BC_TEST_POSTGRES_URL)")
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
		if !strings.HasPrefix(o.postgresURL, "postgres://") && !strings.HasPrefix(o.postgresURL, "postgresql://") {
			errs = append(errs, errors.New("-store postgres needs -postgres-url postgres://... (or BC_TEST_POSTGRES_URL)"))
		}
	default:
		errs = append(errs, fmt.Errorf("-store must be sqlite or postgres, got %q", o.store))
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
  load            %.1f s
  inline          %.0f placements/s (%d placed, %d pending, %d failed in %.1f s; %d clients, binding %s)
  create latency  p50 %.2f ms, p99 %.2f ms, max %.0f ms (the first, untimed: %.0f ms)
  lock hold       p50 %.2f ms, p90 %.2f ms, p99 %.2f ms, max %.2f ms (%d writes)
  queued          %.0f placements/s (%d of %d placed in %.2f s, %d transactions; lock hold p50 %.1f ms, p99 %.1f ms)
  replans         %d
  memory          max RSS %.0f MiB, peak heap %.0f MiB
`, r.Nodes, r.GPUsPerNode, r.Atoms, r.AtomsFrom, r.Store, r.Machine, r.LoadAvg,
		r.LoadS,
		r.PlacementsPerS, r.InlinePlaced, r.InlinePending, r.InlineFailed, r.InlineS, r.Clients, r.Binding,
		r.CreateP50ms, r.CreateP99ms, r.CreateMaxms, r.FirstCreateMS,
		r.LockHoldP50ms, r.LockHoldP90ms, r.LockHoldP99ms, r.LockHoldMaxms, r.LockHolds,
		r.QueuedPlacementsPerS, r.QueuedPlaced, r.Pending, r.QueuedS, r.QueuedBatches, r.QueuedLockHoldP50ms, r.QueuedLockHoldP99ms,
		r.Replans,
		r.RSSMiB, r.HeapMiB)
	if err == nil && r.InlineError != "" {
		_, err = fmt.Fprintf(w, "  first failure   %s\n", r.InlineError)
	}
	return err
}
