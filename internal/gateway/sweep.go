package gateway

import (
	"context"
	"time"

	"github.com/riverqueue/river"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/store"
)

// expireBatch bounds the commands one sweep expires; the next sweep takes
// the rest.
const expireBatch = 1000

// SweepLiveness marks ready nodes without a heartbeat for UnreachableAfter
// unreachable (event node.unreachable) and nodes without one for LostAfter
// lost (event node.lost), by compute_now(). It is level-triggered: running
// it twice changes nothing more.
func (g *Gateway) SweepLiveness(ctx context.Context) (unreachable, lost int, err error) {
	err = g.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		u, l, err := fleet.NodeSweepLiveness(ctx, tx, g.cfg.UnreachableAfter, g.cfg.LostAfter)
		if err != nil {
			return err
		}
		unreachable, lost = len(u), len(l)
		if err := g.stateChanged(ctx, tx, u); err != nil {
			return err
		}
		if err := g.nodeEvents(ctx, tx, "node.unreachable", u, nil); err != nil {
			return err
		}
		if h := g.cfg.Hooks; h != nil && len(l) > 0 {
			ids := make([]string, len(l))
			for i, n := range l {
				ids[i] = n.ID
			}
			if err := h.NodesLost(ctx, tx, ids); err != nil {
				return err
			}
		}
		return g.nodeEvents(ctx, tx, "node.lost", l, nil)
	})
	return unreachable, lost, err
}

// SweepCommands expires open commands past their deadline (event
// command.expired) and wakes their sessions, which tell the agent to stop
// them.
func (g *Gateway) SweepCommands(ctx context.Context) (int, error) {
	var expired []fleet.Command
	err := g.cfg.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		if expired, err = fleet.CommandExpire(ctx, tx, expireBatch); err != nil {
			return err
		}
		now := g.cfg.Clock.Now()
		evs := make([]envelope.Event, 0, len(expired))
		woken := map[string]bool{}
		for _, c := range expired {
			evs = append(evs, envelope.Event{
				Type: "command.expired", TenantID: c.TenantID, ResourceType: "Command", ResourceID: c.ID, Time: now,
				Data: map[string]any{"node_id": c.NodeID, "seq": c.Seq, "kind": c.Kind},
			})
			if !woken[c.NodeID] {
				woken[c.NodeID] = true
				g.NotifyCommand(tx, c.NodeID)
			}
		}
		if len(evs) == 0 {
			return nil
		}
		if g.cfg.CommandsExpired != nil {
			if err := g.cfg.CommandsExpired(ctx, tx, expired); err != nil {
				return err
			}
		}
		return g.cfg.Recorder.InsertEvents(ctx, tx, evs)
	})
	if err == nil {
		for _, c := range expired {
			g.metrics.commandFinished(c.Kind, fleet.CommandExpired)
		}
	}
	return len(expired), err
}

// LivenessSweepArgs is the periodic job that runs SweepLiveness.
type LivenessSweepArgs struct{}

// Kind implements river.JobArgs.
func (LivenessSweepArgs) Kind() string { return "gateway.liveness_sweep" }

// CommandSweepArgs is the periodic job that runs SweepCommands.
type CommandSweepArgs struct{}

// Kind implements river.JobArgs.
func (CommandSweepArgs) Kind() string { return "gateway.command_sweep" }

type livenessWorker struct {
	river.WorkerDefaults[LivenessSweepArgs]
	g *Gateway
}

func (w *livenessWorker) Work(ctx context.Context, _ *river.Job[LivenessSweepArgs]) error {
	u, l, err := w.g.SweepLiveness(ctx)
	if u+l > 0 {
		w.g.log.Info("liveness sweep", "unreachable", u, "lost", l)
	}
	return err
}

func (w *livenessWorker) Timeout(*river.Job[LivenessSweepArgs]) time.Duration { return time.Minute }

type commandWorker struct {
	river.WorkerDefaults[CommandSweepArgs]
	g *Gateway
}

func (w *commandWorker) Work(ctx context.Context, _ *river.Job[CommandSweepArgs]) error {
	n, err := w.g.SweepCommands(ctx)
	if n > 0 {
		w.g.log.Info("command sweep", "expired", n)
	}
	return err
}

func (w *commandWorker) Timeout(*river.Job[CommandSweepArgs]) time.Duration { return time.Minute }

// AddWorkers registers the sweep workers.
func (g *Gateway) AddWorkers(workers *river.Workers) {
	river.AddWorker(workers, &livenessWorker{g: g})
	river.AddWorker(workers, &commandWorker{g: g})
}

// PeriodicJobs are the sweeps, every LivenessInterval; River runs periodic
// jobs on the elected leader only, so one replica sweeps per tick.
func (g *Gateway) PeriodicJobs() []*river.PeriodicJob {
	// Unique by args and period: a tick never piles up behind a slow sweep.
	opts := &river.InsertOpts{MaxAttempts: 1, UniqueOpts: river.UniqueOpts{ByArgs: true, ByPeriod: g.cfg.LivenessInterval}}
	return []*river.PeriodicJob{
		river.NewPeriodicJob(river.PeriodicInterval(g.cfg.LivenessInterval),
			func() (river.JobArgs, *river.InsertOpts) { return LivenessSweepArgs{}, opts }, nil),
		river.NewPeriodicJob(river.PeriodicInterval(g.cfg.LivenessInterval),
			func() (river.JobArgs, *river.InsertOpts) { return CommandSweepArgs{}, opts }, nil),
	}
}
