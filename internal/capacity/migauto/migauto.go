package migauto

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/riverqueue/river"

	"github.com/better-compute/better-compute/internal/capacity/atoms"
	"github.com/better-compute/better-compute/internal/capacity/migplan"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/store"
)

// KindMIGConfigure is the node command that repartitions one GPU.
const KindMIGConfigure = "gpu.mig.configure"

// CreatedBy is who the repartitioner's commands are from.
const CreatedBy = "system:mig-repartitioner"

// Defaults of Repartitioner.
const (
	DefaultInterval      = time.Minute
	DefaultFreezeTimeout = 15 * time.Minute
	DefaultWindow        = 15 * time.Minute
)

// Repartitioner is one round of MIG that follows demand over every pool
// with mig: auto.
type Repartitioner struct {
	DB *store.DB
	// Reconciler freezes and thaws GPUs (the reservation engine's, so the
	// pools' placers hear of it).
	Reconciler *atoms.Reconciler
	// Commands sends (and signs) node commands in the caller's
	// transaction.
	Commands reservation.CommandSender
	// MaxMoves caps the GPUs one pool repartitions a round; zero means
	// migplan.DefaultMaxMoves.
	MaxMoves int
	// FreezeTimeout is how long a GPU may stay frozen for a layout that
	// does not show; zero means DefaultFreezeTimeout.
	FreezeTimeout time.Duration
	// Window is how far back a refused create no round has answered yet
	// counts as demand; zero means DefaultWindow.
	Window time.Duration
	Log    *slog.Logger
}

// Result is what a round did.
type Result struct {
	Pools, Moved, Busy, Thawed int
}

// Round runs one pass over the active pools with mig: auto.
func (r *Repartitioner) Round(ctx context.Context) (Result, error) {
	var res Result
	var pools []pool.Pool
	if err := r.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		after := ""
		for {
			ps, err := pool.List(ctx, tx, &pool.ListParams{After: after, Limit: 500})
			if err != nil {
				return err
			}
			for _, p := range ps {
				if pool.Proto(p).GetPolicy().GetMig() == pool.MIGAuto {
					pools = append(pools, p)
				}
			}
			if len(ps) < 500 {
				return nil
			}
			after = ps[len(ps)-1].ID
		}
	}); err != nil {
		return res, fmt.Errorf("migauto: list pools: %w", err)
	}
	// Refusals older than any window are history.
	if err := r.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return reservation.MIGRefusalPrune(ctx, tx, r.DB.Clock().Now().Add(-time.Hour-cmp.Or(r.Window, DefaultWindow)))
	}); err != nil {
		return res, fmt.Errorf("migauto: prune refusals: %w", err)
	}
	var errs []error
	for _, p := range pools {
		res.Pools++
		if err := r.pool(ctx, p, &res); err != nil {
			errs = append(errs, fmt.Errorf("migauto: pool %s: %w", p.ID, err))
		}
	}
	return res, errors.Join(errs...)
}

// pool runs one pool's round: thaw what did not land in time, then move
// idle GPUs toward what the queue asks.
func (r *Repartitioner) pool(ctx context.Context, p pool.Pool, res *Result) error {
	now := r.DB.Clock().Now()
	var gpus []atoms.MIGGPU
	var demand []reservation.MIGDemand
	var refused []reservation.MIGRefusal
	if err := r.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		if gpus, err = atoms.PoolMIGGPUs(ctx, tx, p.ID, now); err != nil {
			return err
		}
		if demand, err = reservation.PendingMIGDemand(ctx, tx, p.ID); err != nil {
			return err
		}
		refused, err = reservation.MIGRefusalList(ctx, tx, p.ID, now.Add(-cmp.Or(r.Window, DefaultWindow)))
		for _, f := range refused {
			demand = append(demand, reservation.MIGDemand{Model: f.Model, Profile: f.Profile, Count: f.Count})
		}
		return err
	}); err != nil {
		return err
	}
	timeout := cmp.Or(r.FreezeTimeout, DefaultFreezeTimeout)
	params := migplan.Params{MaxMoves: r.MaxMoves}
	byUUID := map[string]atoms.MIGGPU{}
	for _, g := range gpus {
		if g.Target != "" && now.Sub(g.PendingSince) > timeout {
			if err := r.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
				return r.Reconciler.ThawGPU(ctx, tx, g.NodeID, g.UUID)
			}); err != nil {
				return err
			}
			res.Thawed++
			r.log().Warn("MIG change did not land; GPU thawed", "pool", p.ID, "node", g.NodeID, "gpu", g.UUID, "layout", g.Target)
			continue // its state shows next round
		}
		if migplan.Layouts(g.Model) == nil {
			continue
		}
		byUUID[g.UUID] = g
		params.GPUs = append(params.GPUs, migplan.GPU{UUID: g.UUID, Model: g.Model, Layout: g.Layout,
			Idle: !g.Booked, Frozen: g.Pending || g.Quarantined, Free: freeOf(g)})
	}
	for _, d := range demand {
		params.Demand = append(params.Demand, migplan.Demand{Model: d.Model, Profile: d.Profile, Count: d.Count})
	}
	for _, m := range migplan.Propose(params) {
		g := byUUID[m.UUID]
		err := r.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			if err := r.Reconciler.FreezeGPU(ctx, tx, g.NodeID, g.UUID, m.To, now); err != nil {
				return err
			}
			profiles := make([]any, len(m.To))
			for i, p := range m.To {
				profiles[i] = p
			}
			_, err := r.Commands.Send(ctx, tx, reservation.Command{
				TenantID: g.TenantID, NodeID: g.NodeID, Kind: KindMIGConfigure,
				Params:         map[string]any{"gpu": g.UUID, "profiles": profiles},
				IdempotencyKey: fmt.Sprintf("mig/%s/%d", g.UUID, now.UnixNano()),
				CreatedBy:      CreatedBy, TTL: timeout, Time: now,
			})
			return err
		})
		if errors.Is(err, atoms.ErrGPUBusy) {
			res.Busy++ // booked since the read: left as it is
			continue
		}
		if err != nil {
			return err
		}
		res.Moved++
		r.log().Info("MIG repartition", "pool", p.ID, "node", g.NodeID, "gpu", g.UUID, "from", migplan.Key(m.From), "to", migplan.Key(m.To))
	}
	if len(refused) == 0 {
		return nil
	}
	// A refusal is a one-shot signal: this round answered it (with moves,
	// or found it met), so the next one does not answer it again once the
	// refused request came back and booked what was made for it.
	return r.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return reservation.MIGRefusalConsume(ctx, tx, p.ID, refused)
	})
}

// freeOf is the free instances of a GPU: all of them when nothing books
// it; none counted when something does (the planner only moves idle GPUs,
// and a busy GPU's free instances already serve the queue through the
// placer, so the queue is what they could not serve).
func freeOf(g atoms.MIGGPU) map[string]int {
	if g.Booked {
		return map[string]int{}
	}
	return nil
}

func (r *Repartitioner) log() *slog.Logger {
	if r.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Log
}

// RepartitionArgs runs one Round.
type RepartitionArgs struct{}

// Kind is the job kind.
func (RepartitionArgs) Kind() string { return "capacity.mig_repartition" }

type worker struct {
	river.WorkerDefaults[RepartitionArgs]
	r *Repartitioner
}

func (w *worker) Work(ctx context.Context, _ *river.Job[RepartitionArgs]) error {
	_, err := w.r.Round(ctx)
	return err
}

func (w *worker) Timeout(*river.Job[RepartitionArgs]) time.Duration { return 5 * time.Minute }

// AddWorkers registers the job's worker.
func (r *Repartitioner) AddWorkers(workers *river.Workers) { river.AddWorker(workers, &worker{r: r}) }

// PeriodicJobs runs a round every interval (zero: DefaultInterval) on the
// leader; rounds do not pile up.
func (r *Repartitioner) PeriodicJobs(interval time.Duration) []*river.PeriodicJob {
	every := cmp.Or(interval, DefaultInterval)
	opts := &river.InsertOpts{MaxAttempts: 1, UniqueOpts: river.UniqueOpts{ByArgs: true, ByPeriod: every}}
	return []*river.PeriodicJob{river.NewPeriodicJob(river.PeriodicInterval(every),
		func() (river.JobArgs, *river.InsertOpts) { return RepartitionArgs{}, opts }, nil)}
}
