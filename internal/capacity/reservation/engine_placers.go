package reservation

import (
	"context"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/trace"

	"github.com/better-compute/better-compute/internal/capacity/placer"
	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/store"
)

// NewEngine returns an engine whose pools' placers load from and commit to
// db. The caller sets the engine's other fields before it runs.
func NewEngine(db *store.DB, clk clock.Clock, tp trace.TracerProvider) *Engine {
	e := &Engine{placers: placer.Placers{DB: db, Clock: clk, Tracing: tp}}
	// The atoms reconciler wakes the pools it changed and tells their
	// placers which nodes moved.
	e.Reconciler.Wake = e.WakePools
	e.Reconciler.NodeChanged = e.placers.NodeChanged
	return e
}

// What follows is all of the placers that callers outside this package use:
// the engine keeps them its own rather than lending them whole.

// Stop stops every placer of this replica (placer.Placers.Stop).
func (e *Engine) Stop() { e.placers.Stop() }

// SetItemByItem makes every placer batch run item by item, as the fallback
// after a failed batch does (placer.Placers.ItemByItem); tests only. Set it
// before the first reservation.
func (e *Engine) SetItemByItem(on bool) { e.placers.ItemByItem = on }

// ReplicaID is this replica's id in the pools' owner rows.
func (e *Engine) ReplicaID() string { return e.placers.ReplicaID() }

// SetForwardClient sets the mutual-TLS client that forwards mutations to the
// replica placing their pool.
func (e *Engine) SetForwardClient(c *http.Client) { e.placers.SetForwardClient(c) }

// SetURL records where peers reach this replica to forward to it.
func (e *Engine) SetURL(url string) { e.placers.SetURL(url) }

// Claim claims a pool's placer for this replica when nobody holds it, and
// says whether it is here or at which URL (placer.Placers.Claim).
func (e *Engine) Claim(ctx context.Context, poolID string) (here bool, url string, err error) {
	return e.placers.Claim(ctx, poolID)
}

// Forward sends a mutation to the replica at url, which places its pool,
// with the caller's credentials (placer.Forward).
func Forward[Req, Res any](ctx context.Context, e *Engine, url, procedure string, req *connect.Request[Req]) (*connect.Response[Res], error) {
	return placer.Forward[Req, Res](ctx, &e.placers, url, procedure, req)
}

// ObserveBatches observes each placer transaction: the mutations it carried
// and its hold, BEGIN to COMMIT (benchmarks). Set it before the engine runs.
func (e *Engine) ObserveBatches(fn func(size int, hold time.Duration)) { e.placers.BatchObserved = fn }

// ObserveSubmits observes each mutation submitted to a placer here: its
// wait for an answer, and the answer (metrics). Set it before the engine
// runs.
func (e *Engine) ObserveSubmits(fn func(wait time.Duration, err error)) {
	e.placers.SubmitObserved = fn
}

// SetLinger sets how long a placer may wait for more work when its queue
// is short (see placer.Placers.Linger): 0 takes placer.DefaultLinger,
// negative turns it off. Set it before the engine runs.
func (e *Engine) SetLinger(d time.Duration) {
	switch {
	case d == 0:
		d = placer.DefaultLinger
	case d < 0:
		d = 0
	}
	e.placers.Linger = d
}

// RunQueuesWhereOwned makes each placer of this replica run its pool's queue
// (rn.TickPool and rn.PlacePending every tick): with several replicas on one
// database a pool's queue is its owner's to run. Call it before the runner
// starts.
func (rn *Runner) RunQueuesWhereOwned() {
	e := rn.Engine
	e.placers.PendingEvery = rn.TickEvery()
	e.placers.PendingPass = func(poolID string) {
		if err := rn.TickPool(context.Background(), poolID); err != nil {
			rn.Log.Warn("ticking a pool", "pool", poolID, "err", err)
		}
		if _, err := rn.PlacePending(context.Background(), poolID); err != nil {
			rn.Log.Warn("placing a pool's queue", "pool", poolID, "err", err)
		}
	}
}

// Cached returns the index of a pool this replica places, or nil.
func (e *Engine) Cached(poolID string) *placer.Index { return e.placers.Cached(poolID) }

// Placing reports whether this replica runs the pool's placer.
func (e *Engine) Placing(poolID string) bool { return e.placers.Placing(poolID) }

// Replans, Submitted and Deltas count placements retried after a lost race,
// mutations submitted to placers here, and index catch-ups by delta (for
// benchmarks and tests).
func (e *Engine) Replans() int64   { return e.placers.Replans() }
func (e *Engine) Submitted() int64 { return e.placers.Submitted() }
func (e *Engine) Deltas() int64    { return e.placers.Deltas() }
