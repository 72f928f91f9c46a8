package health_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/bench/fleetload"
	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/gpuhealth"
	"github.com/better-compute/better-compute/internal/health"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/store"
)

// simFleet is the fleet simulation's shape.
type simFleet struct {
	nodes, gpus  int
	hours        int
	xidsPerKGPUh float64 // background XIDs per hour per 1,000 GPUs
	burstAt      time.Duration
	burstNodes   int // nodes hit by the correlated burst (XID 79)
	resetAt      time.Duration
	bookedShare  float64
	failShare    float64 // remediation workflows that fail
	seed         uint64
}

// xidMix is the background stream: mostly XIDs that are recorded
// (application faults: 13, 31, 43), then the seed's actionable ones.
var xidMix = []struct {
	code   int64
	weight int
}{{13, 25}, {31, 15}, {43, 10}, {48, 10}, {63, 15}, {64, 5}, {79, 10}, {95, 10}}

// TestFleetSimHealth runs the health reconciler over a simulated fleet of
// 1,000 nodes × 8 GPUs on a SimClock for a day: a background stream of
// XIDs and one correlated burst (a bad driver: XID 79 on 15 % of the nodes
// within five minutes). Every remediation stays within the pool's budget,
// the breaker trips on the burst and on nothing else, no reservation keeps a
// GPU taken out of service, and it prints GPU-hours lost, time to
// remediate and capacity out at peak (docs/benchmarks.md).
//
// The fleet is rows (fleetload.LoadSyntheticFleet), not agents: the agents'
// part — acknowledging a drain, running a reset or a reboot — is played
// here through the same calls the gateway makes when they report.
//
// The whole day of 1,000 nodes takes two minutes of a two-core machine, so
// it runs with BC_FLEETSIM=full (CI's PostgreSQL pass sets it); otherwise
// the same mix plays on 200 nodes for 8 hours, with the burst at hour 4.
func TestFleetSimHealth(t *testing.T) {
	s := simFleet{nodes: 200, gpus: 8, hours: 8, xidsPerKGPUh: 6, burstAt: 4 * time.Hour, burstNodes: 30,
		resetAt: 5 * time.Hour, bookedShare: 0.25, failShare: 0.05, seed: 25}
	if os.Getenv("BC_FLEETSIM") == "full" {
		s.nodes, s.hours, s.burstAt, s.resetAt, s.burstNodes, s.xidsPerKGPUh = 1000, 24, 12*time.Hour, 14*time.Hour, 150, 3
	}
	t.Logf("fleet sim: %d nodes × %d GPUs for %d h (BC_FLEETSIM=full: 1,000 nodes for 24 h)", s.nodes, s.gpus, s.hours)
	runFleetSim(t, s)
}

func runFleetSim(t *testing.T, s simFleet) {
	ctx := context.Background()
	cp := bctest.NewControlPlane(t, func(c *app.Config) {
		// No worker: the simulation drives the reconciler and the
		// workflows itself, step by step on the SimClock.
		c.Roles = []string{app.RoleAPI, app.RoleGateway}
		c.UnreachableAfter, c.LostAfter = 1000*time.Hour, 2000*time.Hour
	})
	clk := cp.Clock
	admin := cp.Admin()
	db := cp.App.DB
	_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	prj, err := admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "default"}))
	require.NoError(t, err)
	pl, err := admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "h100",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}},
		Policy:   &apiv1.PoolPolicy{OnNodeLost: "replace"}}))
	require.NoError(t, err)
	poolID := pl.Msg.GetPool().GetId()
	require.NoError(t, fleetload.LoadSyntheticFleet(ctx, db, fleetload.SyntheticFleet{Nodes: s.nodes, GPUsPerNode: s.gpus, CPUsPerNode: 64,
		TenantID: prj.Msg.GetProject().GetTenantId(), ProjectID: prj.Msg.GetProject().GetId(), PoolID: poolID, Now: clk.Now(), NamePrefix: "sim"}))
	var nodeIDs []string
	require.NoError(t, db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		rows, err := tx.Query(ctx, `SELECT node_id FROM node_pools WHERE pool_id = $1 ORDER BY node_id`, poolID)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				return err
			}
			nodeIDs = append(nodeIDs, id)
		}
		return rows.Err()
	}))
	require.Len(t, nodeIDs, s.nodes, "every synthetic node joined the pool")
	gpusOf := map[string][]string{}
	require.NoError(t, db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		rows, err := tx.Query(ctx, `SELECT node_id, uuid FROM gpus ORDER BY node_id, idx`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var n, u string
			if err := rows.Scan(&n, &u); err != nil {
				return err
			}
			gpusOf[n] = append(gpusOf[n], u)
		}
		return rows.Err()
	}))

	// The failure stream and the workload, fixed by the seed.
	rng := rand.New(rand.NewPCG(s.seed, 1))
	// The workload: reservations of two GPUs for one to eight hours,
	// topped up every hour to a quarter of the GPUs booked, so the ones on
	// a GPU that goes bad have somewhere to move and drains end.
	booked := 0
	topUp := func() {
		want := int(float64(s.nodes*s.gpus) * s.bookedShare)
		have := bookedGPUs(t, db, clk.Now())
		for range max(0, want-have) / 2 {
			_, err := admin.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Gpus: 2,
				Binding: "none", DurationSeconds: int64(1+rng.IntN(8)) * 3600}))
			require.NoError(t, err)
			booked++
		}
	}
	type failure struct {
		at         time.Duration
		node, gpu  string
		code       int64
		correlated bool
	}
	var stream []failure
	total := 0
	for _, x := range xidMix {
		total += x.weight
	}
	perHour := s.xidsPerKGPUh * float64(s.nodes*s.gpus) / 1000
	for at := time.Duration(0); at < time.Duration(s.hours)*time.Hour; {
		at += time.Duration(rng.ExpFloat64() / perHour * float64(time.Hour))
		n := nodeIDs[rng.IntN(len(nodeIDs))]
		w := rng.IntN(total)
		code := xidMix[0].code
		for _, x := range xidMix {
			if w < x.weight {
				code = x.code
				break
			}
			w -= x.weight
		}
		stream = append(stream, failure{at: at, node: n, gpu: gpusOf[n][rng.IntN(s.gpus)], code: code})
	}
	for _, i := range rng.Perm(len(nodeIDs))[:s.burstNodes] {
		n := nodeIDs[i]
		stream = append(stream, failure{at: s.burstAt + time.Duration(rng.IntN(300))*time.Second, node: n, gpu: gpusOf[n][rng.IntN(s.gpus)],
			code: 79, correlated: true})
	}
	sort.Slice(stream, func(i, j int) bool { return stream[i].at < stream[j].at })

	start := clk.Now()
	engine := cp.App.Metal.Engine
	hm := cp.App.Health
	var (
		gpuMinutesOut, peakOut int
		maxUsed, budget        int
		tripAt                 time.Duration
		trips                  int
		next                   int
		finishAt               = map[string]time.Duration{} // workflow → when its node reports done
		failWF                 = map[string]bool{}
	)
	step := time.Minute
	for now := time.Duration(0); now <= time.Duration(s.hours)*time.Hour; now += step {
		clk.Set(start.Add(now))
		if now%time.Hour == 0 {
			topUp()
		}
		// The nodes report what broke since the last step.
		for ; next < len(stream) && stream[next].at <= now; next++ {
			f := stream[next]
			ev := &agentv1.HealthEvent{Kind: gpuhealth.KindXID, Device: f.gpu, Code: f.code, Message: "simulated"}
			require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
				return hm.Report(ctx, tx, f.node, []*agentv1.HealthEvent{ev}, nil, false)
			}))
		}
		if now == s.resetAt {
			require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
				_, err := hm.ResetBreaker(ctx, tx, poolID, "", "sim:operator", "the driver was rolled back")
				return err
			}))
		}
		_, err := hm.Reconcile(ctx)
		require.NoError(t, err)
		// The agents acknowledge their drains (as the gateway records a
		// node.drain that succeeded).
		require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE nodes SET state = 'drained' WHERE state = 'draining'`)
			return err
		}))
		_, err = hm.Reconcile(ctx)
		require.NoError(t, err)
		// Workflows: dispatch what is due, and finish the steps whose
		// simulated run time has passed (a reset five minutes, a reboot
		// fifteen), a few failing.
		rems, err := listRemediations(ctx, db, health.RemRunning)
		require.NoError(t, err)
		for _, r := range rems {
			if _, ok := finishAt[r.WorkflowID]; !ok {
				require.NoError(t, engine.Reconcile(ctx, r.WorkflowID))
				d := 5 * time.Minute
				if r.Action == gpuhealth.ActionReboot {
					d = 15 * time.Minute
				}
				finishAt[r.WorkflowID] = now + d
				failWF[r.WorkflowID] = rng.Float64() < s.failShare
				continue
			}
			if now < finishAt[r.WorkflowID] {
				continue
			}
			require.NoError(t, finishStep(ctx, db, engine, r, failWF[r.WorkflowID]))
		}
		// Invariants, every step.
		st := poolStatus(t, db, poolID, clk.Now())
		budget = st.Budget
		maxUsed = max(maxUsed, st.BudgetUsed)
		require.LessOrEqual(t, st.BudgetUsed, st.Budget, "at %s: remediations within the disruption budget", now)
		if st.Breaker.State == health.BreakerOpen && tripAt == 0 {
			tripAt = now
		}
		trips = int(st.Breaker.Trips)
		out := gpusOut(t, db)
		gpuMinutesOut += out
		peakOut = max(peakOut, out)
		require.Zero(t, bookingsOnBadGPUs(t, db, clk.Now()), "at %s: no reservation keeps a GPU taken out of service", now)
	}
	require.Equal(t, 1, trips, "the breaker trips once")
	require.GreaterOrEqual(t, tripAt, s.burstAt, "the breaker trips on the burst and not before it")
	require.Less(t, tripAt, s.burstAt+15*time.Minute, "the breaker trips within the burst's window")

	// Figures.
	var ttr []time.Duration
	ends := map[string]int{}
	all, err := listRemediations(ctx, db)
	require.NoError(t, err)
	for _, r := range all {
		ends[r.State]++
		if r.EndTime != nil && (r.State == health.RemSucceeded || r.State == health.RemEscalated) {
			ttr = append(ttr, r.EndTime.Sub(r.CreateTime))
		}
	}
	slices.Sort(ttr)
	pct := func(p float64) time.Duration {
		if len(ttr) == 0 {
			return 0
		}
		return ttr[min(len(ttr)-1, int(p*float64(len(ttr))))]
	}
	t.Logf("fleet %d nodes × %d GPUs, %d h, %d failures (%d in the burst), %d reservations of 2 GPUs for 1-8 h",
		s.nodes, s.gpus, s.hours, len(stream), s.burstNodes, booked)
	t.Logf("remediations: %v; budget %d, most at once %d; breaker tripped at %s (burst at %s), reset at %s",
		ends, budget, maxUsed, tripAt, s.burstAt, s.resetAt)
	t.Logf("GPU-hours lost %.1f (%.2f %% of %d GPU-hours); capacity out at peak %d GPUs (%.1f %%)",
		float64(gpuMinutesOut)/60, 100*float64(gpuMinutesOut)/60/float64(s.nodes*s.gpus*s.hours), s.nodes*s.gpus*s.hours,
		peakOut, 100*float64(peakOut)/float64(s.nodes*s.gpus))
	t.Logf("time to remediate (queued → done) p50 %s, p99 %s over %d", pct(0.5), pct(0.99), len(ttr))
}

// finishStep plays the node reporting its remediation command done: the
// command's row ends and the step completes, in one transaction, as the
// gateway records a command update.
func finishStep(ctx context.Context, db *store.DB, e *provision.Engine, r health.Remediation, fail bool) error {
	return db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id, idempotency_key, state FROM commands WHERE node_id = $1 AND idempotency_key LIKE 'step:' || $2 || ':%'`,
			r.NodeID, r.WorkflowID)
		if err != nil {
			return err
		}
		type cmd struct{ id, key, state string }
		var cs []cmd
		for rows.Next() {
			var c cmd
			if err := rows.Scan(&c.id, &c.key, &c.state); err != nil {
				rows.Close()
				return err
			}
			cs = append(cs, c)
		}
		rows.Close()
		for _, c := range cs {
			if c.state != fleet.CommandPending && c.state != fleet.CommandRunning {
				continue
			}
			state, res := fleet.CommandSucceeded, provision.Result{}
			if fail {
				state, res.Error = fleet.CommandFailed, "simulated: the GPU did not come back"
			}
			if _, err := fleet.CommandUpdate(ctx, tx, &fleet.CommandUpdateParams{ID: c.id, FromState: c.state, State: state}); err != nil {
				return err
			}
			key := c.key[len(health.StepKeyPrefix):]
			if err := e.CompleteTx(ctx, tx, key, res); err != nil {
				return fmt.Errorf("complete %s: %w", key, err)
			}
		}
		return nil
	})
}

func listRemediations(ctx context.Context, db *store.DB, states ...string) ([]health.Remediation, error) {
	var rs []health.Remediation
	err := db.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		rs, err = health.RemediationList(ctx, tx, health.RemediationsQuery{States: states})
		return err
	})
	return rs, err
}

func poolStatus(t *testing.T, db *store.DB, poolID string, now time.Time) health.PoolStatus {
	t.Helper()
	var st health.PoolStatus
	require.NoError(t, db.Read(context.Background(), func(ctx context.Context, tx store.Tx) (err error) {
		st, err = health.PoolStatusOf(ctx, tx, poolID, now)
		return err
	}))
	return st
}

// gpusOut counts the GPUs out of service: quarantined or marked for RMA,
// plus every GPU of a node drained for a remediation.
func gpusOut(t *testing.T, db *store.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		var quarantined, drained int
		if err := tx.QueryRow(ctx, `SELECT COUNT(*) FROM health_gpus`).Scan(&quarantined); err != nil {
			return err
		}
		err := tx.QueryRow(ctx, `SELECT COUNT(*) FROM health_remediations r JOIN gpus g ON g.node_id = r.node_id
			LEFT JOIN health_gpus h ON h.gpu_uuid = g.uuid WHERE r.state IN ('draining', 'running') AND h.gpu_uuid IS NULL`).Scan(&drained)
		n = quarantined + drained
		return err
	}))
	return n
}

// bookedGPUs counts the GPUs booked now.
func bookedGPUs(t *testing.T, db *store.DB, now time.Time) int {
	t.Helper()
	var n int
	require.NoError(t, db.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM bookings b JOIN atoms a ON a.id = b.atom
			WHERE a.kind = 'gpu' AND b.starts_at <= $1 AND b.ends_at > $1`, now).Scan(&n)
	}))
	return n
}

// bookingsOnBadGPUs counts the bookings in effect on GPUs out of service.
func bookingsOnBadGPUs(t *testing.T, db *store.DB, now time.Time) int {
	t.Helper()
	var n int
	require.NoError(t, db.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM bookings b JOIN atoms a ON a.id = b.atom JOIN health_gpus h ON h.gpu_uuid = a.gpu_uuid
			WHERE b.starts_at <= $1 AND b.ends_at > $1`, now).Scan(&n)
	}))
	return n
}
