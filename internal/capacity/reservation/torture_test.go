package reservation_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/capacity/booking"
	"github.com/better-compute/better-compute/internal/capacity/quota"
	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/capacity/views"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
)

// The torture test drives the whole capacity spine — API, engine, queued
// placer, tick, reconciler and fleet hooks — with random operations from
// concurrent clients, and checks the invariants of the booking model between
// every round of operations. A round is one operation per client, run
// concurrently; the invariants are read in one consistent snapshot after the
// round (and the background jobs keep running throughout).
//
// BC_TORTURE_SEED replays a seed (the operations each client picks; their
// interleaving is the scheduler's); BC_TORTURE_OPS overrides the number of
// operations (10,000, or 2,000 under -short); BC_TORTURE_VERBOSE adds an
// example to each outcome of the summary.
//
// Known bugs each have a small test of their own (TestTortureBug…, below);
// the torture test steps around them — counting what it excused in the
// summary (raced-…, WAKE_DEADLOCK, COMMAND_COLLISION) — so that it goes on
// to find others.

const (
	tortureClients = 8
	tortureNodes   = 12
	gpusPerNode    = 8
	cpusPerNUMA    = 16
	tortureModel   = "NVIDIA H100 80GB HBM3"
	tortureMemMiB  = 81559
)

func TestTorture(t *testing.T) {
	t.Parallel()
	// 2,000 operations by default, so `go test ./...` stays well inside its
	// 10-minute limit on a busy two-core machine; CI plays 10,000 on each
	// store with BC_TORTURE_OPS.
	ops := 2000
	if s := os.Getenv("BC_TORTURE_OPS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err, "BC_TORTURE_OPS")
		ops = n
	}
	seed := rand.Uint64()
	if s := os.Getenv("BC_TORTURE_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "BC_TORTURE_SEED")
		seed = n
	}
	began := time.Now()
	e := setupTorture(t, seed)
	t.Logf("torture: seed %d (replay with BC_TORTURE_SEED=%d), %d operations, %s", seed, seed, ops, bctest.Dialect())
	e.run(ops)
	e.finish()
	t.Logf("torture: %d operations on %s in %s (%s of it checking %d rounds); outcomes: %s", ops, bctest.Dialect(),
		time.Since(began).Round(time.Millisecond), e.checking.Round(time.Millisecond), e.round, e.summary())
}

// torture is the fixture and the model the checker keeps beside the store.
type torture struct {
	t     *testing.T
	seed  uint64
	cp    *bctest.ControlPlane
	admin *client.Client
	db    *store.DB
	log   *syncBuffer

	tenantID   string
	projects   []string          // names
	projectIDs map[string]string // name -> id
	pools      []tPool
	nodes      []tNode

	mu sync.Mutex
	// ids are the reservations created so far; createdAt is the start each
	// was created with.
	ids       []string
	createdAt map[string]time.Time
	// extendedTo is the end each successful extension asked for.
	extendedTo map[string]time.Time
	// extendedNow are the reservations extended in this round.
	extendedNow []string
	// Rounds in which each node was last drained, lost or moved to
	// another pool (or none), and each GPU quarantined: a reservation
	// first seen holding atoms after such a round must not sit there. One
	// placed in that very round may: the known race
	// TestTortureBugCreateUsesStaleSnapshot shows, counted in raced.
	drainedIn, lostIn, movedIn, quarantinedIn map[string]int
	poolOf                                    map[string]string
	// holdingSince is the round after which the checker first saw a
	// reservation hold its atoms on its node.
	holdingSince map[string]int
	raced        map[string]bool // "what/reservation"

	// setNow are the quotas set in this round; baseline is, per quota, the
	// reservations that existed at the check after its last Set: a lowered
	// limit may leave them above it, and only they may be.
	setNow   []string
	baseline map[string]map[string]bool
	outcomes map[string]int
	// samples keeps the first detail of each outcome, for the summary.
	samples  map[string]string
	recent   []string
	failures []string
	// internals are the API's INTERNAL answers of the round.
	internals []string
	round     int
	checking  time.Duration
}

type tPool struct{ name, id string }

type tNode struct {
	id, name, zone, rack string
	gpus                 []string
}

// syncBuffer collects the control plane's error log for failure reports.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.b.Len() > 1<<20 {
		return len(p), nil
	}
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func setupTorture(t *testing.T, seed uint64, opts ...bctest.ControlPlaneOption) *torture {
	t.Helper()
	logs := &syncBuffer{}
	cp := bctest.NewControlPlane(t, append([]bctest.ControlPlaneOption{func(c *app.Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelError}))
		// The woken placer still runs in the background, without polling
		// SQLite's single writer twenty times a second.
		c.JobPoll = 250 * time.Millisecond
	}}, opts...)...)
	e := &torture{t: t, seed: seed, cp: cp, admin: cp.Admin(), db: cp.App.DB, log: logs,
		projectIDs: map[string]string{}, createdAt: map[string]time.Time{}, extendedTo: map[string]time.Time{},
		drainedIn: map[string]int{}, lostIn: map[string]int{}, movedIn: map[string]int{}, quarantinedIn: map[string]int{},
		poolOf: map[string]string{}, holdingSince: map[string]int{}, raced: map[string]bool{},
		baseline: map[string]map[string]bool{}, outcomes: map[string]int{}, samples: map[string]string{}}
	ctx := context.Background()
	tn, err := e.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	e.tenantID = tn.Msg.GetTenant().GetId()
	for _, name := range []string{"default", "research", "prod"} {
		p, err := e.admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: name}))
		require.NoError(t, err)
		e.projects = append(e.projects, name)
		e.projectIDs[name] = p.Msg.GetProject().GetId()
	}
	for _, pl := range []struct {
		name  string
		zones []string
		lost  string
	}{{"main", []string{"a", "b"}, "replace"}, {"alt", []string{"c"}, "release"}} {
		p, err := e.admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: pl.name,
			Selector: zoneSelector(pl.zones...), Policy: poolPolicy(0, pl.lost)}))
		require.NoError(t, err)
		e.pools = append(e.pools, tPool{name: pl.name, id: p.Msg.GetPool().GetId()})
	}
	for i := range tortureNodes {
		e.nodes = append(e.nodes, e.addNode(t, i))
	}
	require.Empty(t, e.check(), "the fleet as set up")
	return e
}

func zoneSelector(zones ...string) []*apiv1.SelectorRequirement {
	return []*apiv1.SelectorRequirement{{Key: "zone", Operator: "In", Values: zones}}
}

// poolPolicy keeps CPU bookings few: one vCPU and 8 GiB per GPU.
func poolPolicy(maxPending int32, onNodeLost string) *apiv1.PoolPolicy {
	return &apiv1.PoolPolicy{PerGpu: &apiv1.PerGpuShare{Vcpu: 1, MemoryGib: 8}, MaxPending: maxPending, OnNodeLost: onNodeLost}
}

// addNode writes a node as the gateway would after its first inventory —
// nodes, gpus, nvlinks, numa_nodes, node_resources — and reconciles it.
// Node i sits in zone a, b or c; its NVLink topology is one island of 8,
// two of 4, or none, by i.
func (e *torture) addNode(t *testing.T, i int) tNode {
	t.Helper()
	ctx := context.Background()
	n := tNode{id: envelope.NewID("nod", e.cp.Clock.Now()), name: fmt.Sprintf("gpu-%02d", i), zone: []string{"a", "b", "c"}[i%3]}
	for g := range gpusPerNode {
		n.gpus = append(n.gpus, fmt.Sprintf("GPU-%08x-%04x-4000-8000-%012x", i, g, i*gpusPerNode+g))
	}
	n.rack = fmt.Sprintf("r%d", i/4)
	labels := fmt.Sprintf(`{"zone":%q,"topology.rack":%q}`, n.zone, n.rack)
	require.NoError(t, e.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO nodes (id, name, tenant_id, project_id, labels, hardware_key, state, liveness,
				capabilities, create_time, update_time)
			VALUES ($1, $2, $3, $4, $5, $6, 'active', 'ready', '["devices.limits","binding.kubernetes"]', compute_now(), compute_now())`,
			n.id, n.name, e.tenantID, e.projectIDs["default"], labels, "hw-"+n.id); err != nil {
			return err
		}
		for g, uuid := range n.gpus {
			if _, err := tx.Exec(ctx, `INSERT INTO gpus (uuid, node_id, idx, model, memory_mib, pci_bus_id, numa_node, mig_mode, update_time)
				VALUES ($1, $2, $3, $4, $5, $6, $7, 'disabled', compute_now())`,
				uuid, n.id, g, tortureModel, tortureMemMiB, fmt.Sprintf("00000000:%02X:00.0", 0x18+g), g*2/gpusPerNode); err != nil {
				return err
			}
		}
		for g, uuid := range n.gpus {
			link := 0
			for p, peer := range n.gpus {
				linked := false
				switch i % 3 {
				case 0:
					linked = p != g
				case 1:
					linked = p != g && p/4 == g/4
				}
				if !linked {
					continue
				}
				if _, err := tx.Exec(ctx, `INSERT INTO nvlinks (node_id, gpu_uuid, peer_uuid, link) VALUES ($1, $2, $3, $4)`,
					n.id, uuid, peer, link); err != nil {
					return err
				}
				link++
			}
		}
		for numa := range 2 {
			lo := numa * cpusPerNUMA
			if _, err := tx.Exec(ctx, `INSERT INTO numa_nodes (node_id, numa_id, cpus, memory_mib, hugepages_2mi, hugepages_1gi)
				VALUES ($1, $2, $3, $4, 0, 8)`, n.id, numa, fmt.Sprintf("%d-%d", lo, lo+cpusPerNUMA-1), 256*1024); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO node_resources (node_id, cpu_model, sockets, cores, threads, memory_mib,
				hugepages_2mi_total, hugepages_1gi_total, update_time)
			VALUES ($1, 'Intel(R) Xeon(R) Platinum 8480C', 2, $2, $3, $4, 0, 16, compute_now())`,
			n.id, cpusPerNUMA, 2*cpusPerNUMA, 512*1024); err != nil {
			return err
		}
		return e.cp.App.Capacity.Hooks().NodeChanged(ctx, tx, n.id)
	}))
	return n
}

// run plays ops operations in rounds of one per client, checking the
// invariants after each round.
func (e *torture) run(ops int) {
	t := e.t
	rngs := make([]*rand.Rand, tortureClients)
	for i := range rngs {
		rngs[i] = rand.New(rand.NewPCG(e.seed, uint64(i)))
	}
	for done := 0; done < ops; {
		e.round++
		n := min(tortureClients, ops-done)
		var wg sync.WaitGroup
		for c := range n {
			wg.Go(func() { e.step(c, rngs[c]) })
		}
		wg.Wait()
		done += n
		if len(e.internals) > 0 {
			if !e.wakeDeadlocksOnly() {
				e.failures = append(e.failures, e.internals...)
			}
			e.internals = nil
		}
		if len(e.failures) > 0 {
			t.Fatalf("seed %d, round %d: unexpected errors:\n%s\n%s", e.seed, e.round, strings.Join(e.failures, "\n"), e.context())
		}
		began := time.Now()
		v := e.check()
		e.checking += time.Since(began)
		if len(v) > 0 {
			t.Fatalf("seed %d, round %d: invariants broken:\n%s\n%s", e.seed, e.round, strings.Join(v, "\n"), e.context())
		}
	}
}

// context is what a failure report adds: the last operations and the
// control plane's errors.
func (e *torture) context() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	logs := e.log.String()
	if len(logs) > 8000 {
		logs = "…" + logs[len(logs)-8000:]
	}
	return fmt.Sprintf("last operations:\n%s\ncontrol plane errors:\n%s", strings.Join(e.recent, "\n"), logs)
}

func (e *torture) summary() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k := range e.raced {
		what, _, _ := strings.Cut(k, "/")
		e.outcomes["raced-"+what]++
	}
	keys := make([]string, 0, len(e.outcomes))
	for k := range e.outcomes {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, e.outcomes[k])
		if s := e.samples[k]; s != "" && os.Getenv("BC_TORTURE_VERBOSE") != "" {
			parts[i] += " (" + s + ")\n"
		}
	}
	return strings.Join(parts, " ")
}

// note records an operation's outcome.
func (e *torture) note(c int, op, outcome, detail string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.outcomes[op+"/"+outcome]++
	if _, ok := e.samples[op+"/"+outcome]; !ok && outcome != "OK" {
		e.samples[op+"/"+outcome] = detail
	}
	e.recent = append(e.recent, fmt.Sprintf("r%d c%d %s %s %s", e.round, c, op, outcome, detail))
	if len(e.recent) > 3*tortureClients {
		e.recent = e.recent[len(e.recent)-3*tortureClients:]
	}
}

// mark records that something happened to key in this round.
func (e *torture) mark(m map[string]int, key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	m[key] = e.round
}

func (e *torture) fail(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.failures = append(e.failures, fmt.Sprintf(format, args...))
}

// apiOutcome classifies an API error: refusals the API documents are
// outcomes, anything else fails the test.
func (e *torture) apiOutcome(c int, op, detail string, err error) bool {
	code := client0(err)
	e.note(c, op, code, detail+" "+errText(err))
	switch code {
	case "OK":
		return true
	case "NO_CAPACITY", "QUOTA_EXCEEDED", "FAILED_PRECONDITION", "CONFLICT", "INVALID_ARGUMENT":
		if strings.Contains(err.Error(), "violates a constraint") {
			e.fail("%s %s: a database constraint refused it: %v", op, detail, err)
		}
	case "INTERNAL":
		// Judged after the round from the control plane's log: see
		// wakeDeadlocksOnly.
		e.mu.Lock()
		e.internals = append(e.internals, fmt.Sprintf("%s %s: %v", op, detail, err))
		e.mu.Unlock()
	default:
		e.fail("%s %s: %s: %v", op, detail, code, err)
	}
	return false
}

func client0(err error) string { return cmp.Or(client.Code(err), "OK") }

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// runnerOutcome classifies an error of the engine's own transactions: a
// lost race (CONFLICT: the reservation moved under it) rolls the
// transaction back and is retried by its job; anything else fails.
func (e *torture) runnerOutcome(c int, op, detail string, err error) {
	if err == nil {
		e.note(c, op, "OK", detail)
		return
	}
	code := envelope.AsError(err).Code
	switch {
	case isWakeDeadlock(err.Error()):
		code = "WAKE_DEADLOCK"
	case isCommandCollision(err.Error()):
		code = "COMMAND_COLLISION"
	}
	e.note(c, op, string(code), detail+" "+err.Error())
	if code != envelope.CodeConflict && code != "WAKE_DEADLOCK" && code != "COMMAND_COLLISION" {
		e.fail("%s %s: %v", op, detail, err)
	}
}

// isWakeDeadlock tells the PostgreSQL deadlock between unique wake jobs
// (TestTortureBugWakeDeadlockIsInternal) from any other error, so that the
// torture test goes on past that known bug and still fails on others.
func isWakeDeadlock(s string) bool {
	return strings.Contains(s, "jobs: insert capacity.place_pending") && strings.Contains(s, "SQLSTATE 40P01")
}

// isCommandCollision tells two ticks that send one command (the known bug
// TestTortureBugConcurrentTicksCollide) from any other error.
func isCommandCollision(s string) bool {
	return strings.Contains(s, "send allocation.") && strings.Contains(s, "commands_node_idempotency")
}

// wakeDeadlocksOnly reports whether every INTERNAL answer the control plane
// logged so far is the known wake deadlock.
func (e *torture) wakeDeadlocksOnly() bool {
	for _, line := range strings.Split(e.log.String(), "\n") {
		if strings.Contains(line, "code=INTERNAL") && !isWakeDeadlock(line) {
			return false
		}
	}
	return true
}

func (e *torture) pickReservation(rng *rand.Rand) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.ids) == 0 {
		return ""
	}
	// Recent reservations are the live ones, mostly.
	n := len(e.ids)
	return e.ids[max(0, n-1-rng.IntN(min(n, 40)))]
}

type weighted struct {
	w  int
	fn func(int, *rand.Rand)
}

func (e *torture) step(c int, rng *rand.Rand) {
	ops := []weighted{
		{30, e.opCreate}, {4, e.opPreview}, {8, e.opExtend}, {10, e.opRelease}, {6, e.opCancel},
		{1, e.opNodeLost}, {2, e.opNodeRecover}, {2, e.opDrain}, {2, e.opUndrain},
		{2, e.opQuarantine}, {2, e.opUnquarantine}, {3, e.opQuota}, {2, e.opPool},
		{6, e.opTick}, {4, e.opPlacePending}, {3, e.opArray}, {3, e.opGang},
	}
	total := 0
	for _, o := range ops {
		total += o.w
	}
	k := rng.IntN(total)
	for _, o := range ops {
		if k < o.w {
			o.fn(c, rng)
			return
		}
		k -= o.w
	}
}

func (e *torture) randomRequest(rng *rand.Rand) *apiv1.CreateReservationRequest {
	req := &apiv1.CreateReservationRequest{
		Tenant: "acme", Project: e.projects[rng.IntN(len(e.projects))], Pool: e.pools[min(rng.IntN(10)/7, 1)].name,
		Gpus: int32(1 + rng.IntN(8)), DurationSeconds: int64(10*60 + rng.IntN(3*3600)), Binding: reservation.BindingNone,
	}
	switch k := rng.IntN(20); {
	case k < 8:
		req.Binding = reservation.BindingKubernetes
	case k == 8:
		// No agent answers: it binds until Tick times it out.
		req.Binding = reservation.BindingNode
	}
	if rng.IntN(4) == 0 {
		req.StartTime = timestamppb.New(e.cp.Clock.Now().Add(time.Duration(1+rng.IntN(180)) * time.Minute))
	}
	if rng.IntN(10) == 0 {
		req.Model = "H100"
	}
	if rng.IntN(8) == 0 {
		req.Vcpu = int32(rng.IntN(5))
	}
	return req
}

func (e *torture) opCreate(c int, rng *rand.Rand) {
	req := e.randomRequest(rng)
	res, err := e.admin.Reservations.Create(context.Background(), connect.NewRequest(req))
	detail := fmt.Sprintf("%s/%s %d GPUs %ds %s", req.GetPool(), req.GetProject(), req.GetGpus(), req.GetDurationSeconds(), req.GetBinding())
	if !e.apiOutcome(c, "create", detail, err) {
		return
	}
	r := res.Msg.GetReservation()
	e.note(c, "create", "="+r.GetState(), r.GetId())
	e.mu.Lock()
	e.ids = append(e.ids, r.GetId())
	e.createdAt[r.GetId()] = r.GetStartTime().AsTime()
	e.mu.Unlock()
}

// opArray books an array: all count members placed now, or at least
// min_count when set, or none; never pending.
func (e *torture) opArray(c int, rng *rand.Rand) {
	req := e.randomRequest(rng)
	count := int32(2 + rng.IntN(4))
	var minCount int32
	if rng.IntN(2) == 0 {
		minCount = 1 + rng.Int32N(count)
	}
	res, err := e.admin.Reservations.CreateReservations(context.Background(), connect.NewRequest(&apiv1.CreateReservationsRequest{
		Template: req, Count: count, MinCount: minCount}))
	detail := fmt.Sprintf("%s/%s %d×%d GPUs min %d", req.GetPool(), req.GetProject(), count, req.GetGpus(), minCount)
	if !e.apiOutcome(c, "array", detail, err) {
		return
	}
	rs := res.Msg.GetReservations()
	if need := cmp.Or(minCount, count); len(rs) < int(need) || len(rs) > int(count) {
		e.fail("array %s answered %d reservations", detail, len(rs))
	}
	e.record(c, "array", rs)
}

// opGang books a gang in pool main: one member per node, all in one rack
// (or anywhere in the pool), all placed now or none.
func (e *torture) opGang(c int, rng *rand.Rand) {
	req := e.randomRequest(rng)
	// Small members, so that some gangs fit a busy fleet.
	req.Pool, req.Vcpu, req.Gpus = "main", 0, int32(1+rng.IntN(4))
	nodes := int32(2 + rng.IntN(2))
	topology := "rack"
	if rng.IntN(4) == 0 {
		topology = ""
	}
	res, err := e.admin.Reservations.CreateReservations(context.Background(), connect.NewRequest(&apiv1.CreateReservationsRequest{
		Template: req, Count: nodes, Gang: &apiv1.Gang{Topology: topology}}))
	detail := fmt.Sprintf("%d nodes × %d GPUs %q", nodes, req.GetGpus(), topology)
	if !e.apiOutcome(c, "gang", detail, err) {
		return
	}
	rs := res.Msg.GetReservations()
	if len(rs) != int(nodes) {
		e.fail("gang %s answered %d reservations", detail, len(rs))
	}
	seen, racks := map[string]bool{}, map[string]bool{}
	for _, r := range rs {
		node := r.GetPlacement().GetNodeId()
		if seen[node] {
			e.fail("gang %s put two members on node %s", detail, node)
		}
		seen[node] = true
		for _, n := range e.nodes {
			if n.id == node {
				racks[n.rack] = true
			}
		}
	}
	if topology == "rack" && (len(racks) != 1 || !racks[res.Msg.GetGangDomain()]) {
		e.fail("gang %s in domain %q spans racks %v", detail, res.Msg.GetGangDomain(), racks)
	}
	e.record(c, "gang", rs)
}

// record notes reservations an array or gang answered: placed now, never
// pending.
func (e *torture) record(c int, op string, rs []*apiv1.Reservation) {
	for _, r := range rs {
		if r.GetState() == reservation.StatePending {
			e.fail("%s member %s is pending: an array is placed now or refused", op, r.GetId())
		}
		e.note(c, op, "="+r.GetState(), r.GetId())
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range rs {
		e.ids = append(e.ids, r.GetId())
		e.createdAt[r.GetId()] = r.GetStartTime().AsTime()
	}
}

func (e *torture) opPreview(c int, rng *rand.Rand) {
	req := e.randomRequest(rng)
	res, err := e.admin.Reservations.Preview(context.Background(), connect.NewRequest(&apiv1.PreviewReservationRequest{Request: req}))
	if e.apiOutcome(c, "preview", fmt.Sprintf("%s %d GPUs", req.GetPool(), req.GetGpus()), err) && res.Msg.GetFeasible() {
		if n := len(res.Msg.GetPlacement().GetAtoms()); n != int(req.GetGpus()) {
			e.fail("preview of %d GPUs offers %d atoms", req.GetGpus(), n)
		}
	}
}

func (e *torture) opExtend(c int, rng *rand.Rand) {
	id := e.pickReservation(rng)
	if id == "" {
		return
	}
	res, err := e.admin.Reservations.Extend(context.Background(), connect.NewRequest(&apiv1.ExtendReservationRequest{
		Tenant: "acme", Reservation: id, ExtendSeconds: int64(60 * (1 + rng.IntN(180)))}))
	if !e.apiOutcome(c, "extend", id, err) {
		return
	}
	end := res.Msg.GetReservation().GetEndTime().AsTime()
	e.mu.Lock()
	defer e.mu.Unlock()
	if end.After(e.extendedTo[id]) {
		e.extendedTo[id] = end
	}
	e.extendedNow = append(e.extendedNow, id)
}

func (e *torture) opRelease(c int, rng *rand.Rand) {
	id := e.pickReservation(rng)
	if id == "" {
		return
	}
	_, err := e.admin.Reservations.Release(context.Background(), connect.NewRequest(&apiv1.ReleaseReservationRequest{Tenant: "acme", Reservation: id}))
	e.apiOutcome(c, "release", id, err)
}

func (e *torture) opCancel(c int, rng *rand.Rand) {
	id := e.pickReservation(rng)
	if id == "" {
		return
	}
	_, err := e.admin.Reservations.Cancel(context.Background(), connect.NewRequest(&apiv1.CancelReservationRequest{Tenant: "acme", Reservation: id}))
	e.apiOutcome(c, "cancel", id, err)
}

func (e *torture) write(fn func(ctx context.Context, tx store.Tx) error) error {
	return e.db.Write(context.Background(), fn)
}

// opNodeLost does what the liveness sweep does: the node is lost and the
// hook runs in the same transaction.
func (e *torture) opNodeLost(c int, rng *rand.Rand) {
	n := e.nodes[rng.IntN(len(e.nodes))]
	var k int64
	err := e.write(func(ctx context.Context, tx store.Tx) error {
		var err error
		k, err = tx.Exec(ctx, `UPDATE nodes SET liveness = 'lost', update_time = compute_now() WHERE id = $1 AND liveness <> 'lost'`, n.id)
		if err != nil || k == 0 {
			return err
		}
		return e.cp.App.Capacity.Hooks().NodesLost(ctx, tx, []string{n.id})
	})
	if err == nil && k > 0 {
		e.mark(e.lostIn, n.id)
	}
	e.runnerOutcome(c, "node-lost", n.name, err)
}

func (e *torture) opNodeRecover(c int, rng *rand.Rand) {
	n := e.nodes[rng.IntN(len(e.nodes))]
	e.mu.Lock()
	delete(e.lostIn, n.id)
	e.mu.Unlock()
	err := e.write(func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE nodes SET liveness = 'ready', update_time = compute_now() WHERE id = $1`, n.id); err != nil {
			return err
		}
		return e.cp.App.Capacity.Hooks().NodeChanged(ctx, tx, n.id)
	})
	e.runnerOutcome(c, "node-recover", n.name, err)
}

func (e *torture) opDrain(c int, rng *rand.Rand) {
	n := e.nodes[rng.IntN(len(e.nodes))]
	var was string
	err := e.write(func(ctx context.Context, tx store.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT state FROM nodes WHERE id = $1`, n.id).Scan(&was); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE nodes SET state = 'draining', update_time = compute_now() WHERE id = $1`, n.id)
		return err
	})
	if err == nil && was != "draining" {
		e.mark(e.drainedIn, n.id)
	}
	e.runnerOutcome(c, "drain", n.name, err)
}

func (e *torture) opUndrain(c int, rng *rand.Rand) {
	n := e.nodes[rng.IntN(len(e.nodes))]
	e.mu.Lock()
	delete(e.drainedIn, n.id)
	e.mu.Unlock()
	err := e.write(func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE nodes SET state = 'active', update_time = compute_now() WHERE id = $1`, n.id); err != nil {
			return err
		}
		return e.cp.App.Capacity.Hooks().NodeChanged(ctx, tx, n.id)
	})
	e.runnerOutcome(c, "undrain", n.name, err)
}

// opQuarantine does what the gateway does on a fatal XID. The model's
// record changes inside the transaction, after its write: the writes of a
// quarantine and an unquarantine of one node serialize in the database,
// and recording before or after the commit could record them in the
// other order (a quarantine recorded after a later unquarantine cleared
// it, blaming a reservation that took the GPU while it was healthy).
func (e *torture) opQuarantine(c int, rng *rand.Rand) {
	n := e.nodes[rng.IntN(len(e.nodes))]
	g := n.gpus[rng.IntN(len(n.gpus))]
	mine := false
	err := e.write(func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO node_conditions (node_id, type, status, reason, message, update_time)
			VALUES ($1, $2, 'true', 'Xid79', 'GPU has fallen off the bus', compute_now())
			ON CONFLICT (node_id, type) DO UPDATE SET status = 'true', update_time = excluded.update_time`, n.id, "GpuQuarantined/"+g); err != nil {
			return err
		}
		if err := e.cp.App.Capacity.Hooks().NodeChanged(ctx, tx, n.id); err != nil {
			return err
		}
		e.mu.Lock()
		if _, ok := e.quarantinedIn[g]; !ok {
			e.quarantinedIn[g], mine = e.round, true
		}
		e.mu.Unlock()
		return nil
	})
	if err != nil && mine {
		e.mu.Lock()
		delete(e.quarantinedIn, g)
		e.mu.Unlock()
	}
	e.runnerOutcome(c, "quarantine", g, err)
}

func (e *torture) opUnquarantine(c int, rng *rand.Rand) {
	n := e.nodes[rng.IntN(len(e.nodes))]
	err := e.write(func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE node_conditions SET status = 'false', update_time = compute_now()
			WHERE node_id = $1 AND type LIKE 'GpuQuarantined/%' AND status = 'true'`, n.id); err != nil {
			return err
		}
		if err := e.cp.App.Capacity.Hooks().NodeChanged(ctx, tx, n.id); err != nil {
			return err
		}
		e.mu.Lock()
		for _, g := range n.gpus {
			delete(e.quarantinedIn, g)
		}
		e.mu.Unlock()
		return nil
	})
	e.runnerOutcome(c, "unquarantine", n.name, err)
}

func (e *torture) opQuota(c int, rng *rand.Rand) {
	req := &apiv1.SetQuotaRequest{Tenant: "acme"}
	if k := rng.IntN(len(e.projects) + 1); k < len(e.projects) {
		req.Project = e.projects[k]
	}
	if rng.IntN(2) > 0 {
		g := int32(8 + rng.IntN(96))
		req.Gpus = &g
	}
	if rng.IntN(5) == 0 {
		h := float64(500 + rng.IntN(20000))
		req.GpuHours = &h
	}
	res, err := e.admin.Quotas.Set(context.Background(), connect.NewRequest(req))
	detail := fmt.Sprintf("project=%q gpus=%v hours=%v", req.GetProject(), fmtOpt(req.Gpus), fmtOpt(req.GpuHours))
	if !e.apiOutcome(c, "quota", detail, err) {
		return
	}
	e.mu.Lock()
	e.setNow = append(e.setNow, res.Msg.GetQuota().GetId())
	e.mu.Unlock()
}

func fmtOpt[T any](p *T) string {
	if p == nil {
		return "unlimited"
	}
	return fmt.Sprint(*p)
}

func (e *torture) opPool(c int, rng *rand.Rand) {
	k := rng.IntN(len(e.pools))
	p := e.pools[k]
	req := &apiv1.UpdatePoolRequest{Tenant: "acme", Pool: p.name}
	// Selectors that take more, fewer or others' nodes; some overlap the
	// other pool's, which leaves the shared nodes in neither.
	selectors := [][]string{{"a", "b"}, {"a"}, {"b"}, {"a", "b", "c"}}
	if k == 1 {
		selectors = [][]string{{"c"}, {"b", "c"}, {"c"}}
	}
	if rng.IntN(3) > 0 {
		req.Selector = &apiv1.PoolSelector{Requirements: zoneSelector(selectors[rng.IntN(len(selectors))]...)}
	}
	if req.Selector == nil || rng.IntN(2) == 0 {
		req.Policy = poolPolicy([]int32{0, 3, 30, -1}[rng.IntN(4)], []string{"release", "replace"}[rng.IntN(2)])
	}
	_, err := e.admin.Pools.Update(context.Background(), connect.NewRequest(req))
	if e.apiOutcome(c, "pool", fmt.Sprintf("%s selector=%v policy=%v", p.name, req.GetSelector().GetRequirements(), req.GetPolicy()), err) {
		// A node may leave a pool and come back within the round, which
		// the checks on either side cannot see.
		for _, n := range e.nodes {
			e.mark(e.movedIn, n.id)
		}
	}
}

func (e *torture) opTick(c int, rng *rand.Rand) {
	d := time.Duration(1+rng.IntN(40)) * time.Minute
	e.cp.Clock.Advance(d)
	e.runnerOutcome(c, "tick", "+"+d.String(), e.cp.App.Capacity.Tick(context.Background()))
}

func (e *torture) opPlacePending(c int, rng *rand.Rand) {
	p := e.pools[rng.IntN(len(e.pools))]
	n, err := e.cp.App.Capacity.PlacePending(context.Background(), p.id)
	e.runnerOutcome(c, "place-pending", fmt.Sprintf("%s placed %d", p.name, n), err)
}

// finish lets every window end and checks that the fleet is whole again.
func (e *torture) finish() {
	t := e.t
	ctx := context.Background()
	e.cp.Clock.Advance(31 * 24 * time.Hour)
	for range 20 {
		require.NoError(t, e.cp.App.Capacity.Tick(ctx))
	}
	v := e.check()
	require.Empty(t, v, "seed %d: after every window ended", e.seed)
	require.NoError(t, e.snapshotRead(ctx, func(q store.Querier) error {
		rs, err := reservation.List(ctx, q, &reservation.ListParams{Limit: 1 << 30})
		if err != nil {
			return err
		}
		for _, r := range rs {
			require.NotContains(t, []string{reservation.StatePending, reservation.StatePlaced, reservation.StateBinding, reservation.StateActive},
				r.State, "seed %d: %s outlived every window", e.seed, r.ID)
		}
		rows, err := views.Stored(ctx, q, "")
		if err != nil {
			return err
		}
		for _, r := range rows {
			require.Zero(t, r.Booked, "seed %d: %s still booked", e.seed, r.Key)
		}
		return nil
	}))
}

// pgQuerier reads PostgreSQL in one REPEATABLE READ transaction, so that
// the checks see one snapshot while the background jobs write.
type pgQuerier struct{ tx pgx.Tx }

func (p pgQuerier) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	tag, err := p.tx.Exec(ctx, query, args...)
	return tag.RowsAffected(), err
}

func (p pgQuerier) Query(ctx context.Context, query string, args ...any) (store.Rows, error) {
	r, err := p.tx.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgRows{r}, nil
}

func (p pgQuerier) QueryRow(ctx context.Context, query string, args ...any) store.Row {
	return p.tx.QueryRow(ctx, query, args...)
}

type pgRows struct{ r pgx.Rows }

func (r pgRows) Next() bool             { return r.r.Next() }
func (r pgRows) Scan(dest ...any) error { return r.r.Scan(dest...) }
func (r pgRows) Err() error             { return r.r.Err() }
func (r pgRows) Close() error {
	r.r.Close()
	return r.r.Err()
}

// snapshotRead runs fn over one consistent snapshot: SQLite's read
// transaction is one; PostgreSQL's default READ COMMITTED is not.
func (e *torture) snapshotRead(ctx context.Context, fn func(q store.Querier) error) error {
	if pool := e.db.PgxPool(); pool != nil {
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		return fn(pgQuerier{tx})
	}
	return e.db.Read(ctx, func(ctx context.Context, tx store.Tx) error { return fn(tx) })
}

// readGangs checks, in the checker's snapshot, that every gang committed
// whole: as many reservation.created events carry its id as its size, and
// each member's row exists.
func readGangs(ctx context.Context, q store.Querier, rs []reservation.Reservation) ([]string, error) {
	exists := make(map[string]bool, len(rs))
	for i := range rs {
		exists[rs[i].ID] = true
	}
	rows, err := q.Query(ctx, `SELECT resource_id, data FROM events WHERE type = 'reservation.created'`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	members, size := map[string][]string{}, map[string]int{}
	for rows.Next() {
		var id, data string
		if err := rows.Scan(&id, &data); err != nil {
			return nil, err
		}
		var d struct {
			Gang string `json:"gang"`
			Size int    `json:"gang_size"`
		}
		if err := json.Unmarshal([]byte(data), &d); err != nil {
			return nil, err
		}
		if d.Gang != "" {
			members[d.Gang] = append(members[d.Gang], id)
			size[d.Gang] = d.Size
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var v []string
	for g, ids := range members {
		if len(ids) != size[g] {
			v = append(v, fmt.Sprintf("gang %s: %d of its %d members written", g, len(ids), size[g]))
		}
		for _, id := range ids {
			if !exists[id] {
				v = append(v, fmt.Sprintf("gang %s: member %s has no reservation row", g, id))
			}
		}
	}
	return v, nil
}

// world is what the checker reads in one snapshot.
type world struct {
	rs       []reservation.Reservation
	byID     map[string]*reservation.Reservation
	bookings []tBooking
	byRsv    map[string][]tBooking
	atoms    map[string]tAtom
	nodes    map[string]tNodeRow
	quotas   []quota.Quota
	rollups  []string
	// gangs are violations of "a gang is all placed or none": a gang
	// whose members' reservation.created events, or reservation rows, do
	// not number its size.
	gangs []string
}

type tBooking struct {
	id, rsv, atom string
	start, end    time.Time
}

type tAtom struct {
	node, kind  string
	quarantined bool
}

type tNodeRow struct{ state, liveness, pool string }

func (e *torture) read() (*world, error) {
	ctx := context.Background()
	w := &world{byID: map[string]*reservation.Reservation{}, byRsv: map[string][]tBooking{}, atoms: map[string]tAtom{}, nodes: map[string]tNodeRow{}}
	err := e.snapshotRead(ctx, func(q store.Querier) error {
		var err error
		if w.rs, err = reservation.List(ctx, q, &reservation.ListParams{Limit: 1 << 30}); err != nil {
			return err
		}
		if w.gangs, err = readGangs(ctx, q, w.rs); err != nil {
			return err
		}
		rows, err := q.Query(ctx, `SELECT id, reservation_id, atom, starts_at, ends_at FROM bookings`)
		if err != nil {
			return err
		}
		for rows.Next() {
			var b tBooking
			if err := rows.Scan(&b.id, &b.rsv, &b.atom, &b.start, &b.end); err != nil {
				rows.Close()
				return err
			}
			b.start, b.end = b.start.UTC(), b.end.UTC()
			w.bookings = append(w.bookings, b)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		// CPU ranges, as the per-CPU atoms the invariants speak.
		rows, err = q.Query(ctx, `SELECT id, reservation_id, node_id, cpu_lo, cpu_hi, starts_at, ends_at FROM cpu_bookings`)
		if err != nil {
			return err
		}
		for rows.Next() {
			var b tBooking
			var node string
			var lo, hi int
			if err := rows.Scan(&b.id, &b.rsv, &node, &lo, &hi, &b.start, &b.end); err != nil {
				rows.Close()
				return err
			}
			b.start, b.end = b.start.UTC(), b.end.UTC()
			for c := lo; c < hi; c++ {
				b.atom = node + "/cpu/" + strconv.Itoa(c)
				w.bookings = append(w.bookings, b)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		rows, err = q.Query(ctx, `SELECT id, node_id, kind, quarantined FROM atoms`)
		if err != nil {
			return err
		}
		for rows.Next() {
			var id string
			var a tAtom
			if err := rows.Scan(&id, &a.node, &a.kind, &a.quarantined); err != nil {
				rows.Close()
				return err
			}
			w.atoms[id] = a
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		rows, err = q.Query(ctx, `SELECT n.id, n.state, n.liveness, COALESCE(np.pool_id, '') FROM nodes n
			LEFT JOIN node_pools np ON np.node_id = n.id`)
		if err != nil {
			return err
		}
		for rows.Next() {
			var id string
			var n tNodeRow
			if err := rows.Scan(&id, &n.state, &n.liveness, &n.pool); err != nil {
				rows.Close()
				return err
			}
			w.nodes[id] = n
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if w.quotas, err = quota.List(ctx, q, &quota.ListParams{Limit: 1000}); err != nil {
			return err
		}
		w.rollups, err = views.Check(ctx, q)
		return err
	})
	for i := range w.rs {
		w.byID[w.rs[i].ID] = &w.rs[i]
	}
	for _, b := range w.bookings {
		w.byRsv[b.rsv] = append(w.byRsv[b.rsv], b)
	}
	return w, err
}

func holding(state string) bool {
	return state == reservation.StatePlaced || state == reservation.StateBinding || state == reservation.StateActive ||
		state == reservation.StateReleasing
}

func live(state string) bool { return state == reservation.StatePending || holding(state) }

// check reads the world and returns every broken invariant. It also moves
// the model on: the quota baselines of the quotas set in the round.
func (e *torture) check() []string {
	w, err := e.read()
	if err != nil {
		return []string{"read the world: " + err.Error()}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, id := range e.extendedNow {
		// An extension is checked against every quota as it stood then.
		for _, b := range e.baseline {
			delete(b, id)
		}
	}
	e.extendedNow = nil
	for _, q := range e.setNow {
		b := map[string]bool{}
		for _, r := range w.rs {
			b[r.ID] = true
		}
		e.baseline[q] = b
	}
	e.setNow = nil
	for id, n := range w.nodes {
		if old, ok := e.poolOf[id]; ok && old != n.pool {
			e.movedIn[id] = e.round
		}
		e.poolOf[id] = n.pool
	}
	for i := range w.rs {
		r := &w.rs[i]
		key := r.ID + "@" + r.NodeID
		if !holding(r.State) {
			delete(e.holdingSince, key)
		} else if _, ok := e.holdingSince[key]; !ok {
			e.holdingSince[key] = e.round
		}
	}

	var v []string
	v = append(v, checkOverlaps(w)...)
	v = append(v, e.checkQuotas(w)...)
	for _, m := range w.rollups {
		v = append(v, "rollup: "+m)
	}
	v = append(v, e.checkBookingLifetimes(w)...)
	v = append(v, w.gangs...)
	v = append(v, e.checkHolders(w)...)
	for id, end := range e.extendedTo {
		if r := w.byID[id]; r != nil && live(r.State) && r.EndsAt.Before(end) && !e.overwritten(r, end) {
			v = append(v, fmt.Sprintf("lost extension: %s (%s) was extended to %s but ends %s", id, r.State, end, r.EndsAt))
		}
	}
	return v
}

// overwritten reports, on PostgreSQL, a reservation whose extension to end
// (its bookings' end too) a concurrent tick, placer or node loss undid by
// saving the row it had read before: the known race
// TestTortureBugTickOverwritesExtension shows. It is counted in raced. On
// SQLite, with one writer, it cannot happen and is never excused.
func (e *torture) overwritten(r *reservation.Reservation, end time.Time) bool {
	to, ok := e.extendedTo[r.ID]
	if e.db.Dialect() != store.Postgres || !ok || end.After(to) || !r.EndsAt.Before(to) {
		return false
	}
	e.raced["overwritten/"+r.ID] = true
	return true
}

// checkOverlaps: no two bookings of one atom overlap. Sorted by start, each
// booking must start at or after the latest end before it.
func checkOverlaps(w *world) []string {
	byAtom := map[string][]tBooking{}
	for _, b := range w.bookings {
		byAtom[b.atom] = append(byAtom[b.atom], b)
	}
	var v []string
	for atom, bs := range byAtom {
		slices.SortFunc(bs, func(a, b tBooking) int { return a.start.Compare(b.start) })
		var last tBooking
		for i, b := range bs {
			if i > 0 && b.start.Before(last.end) {
				v = append(v, fmt.Sprintf("overlap on %s: %s [%s, %s) of %s and %s [%s, %s) of %s", atom,
					last.id, last.start, last.end, last.rsv, b.id, b.start, b.end, b.rsv))
			}
			if i == 0 || b.end.After(last.end) {
				last = b
			}
		}
	}
	return v
}

// inScope is the quota package's scope: tenant, project, pool, and the model
// placed on (else the one asked for).
func inScope(q quota.Quota, r *reservation.Reservation) bool {
	model := r.GPUModel
	if model == "" {
		model = r.Model
	}
	return r.TenantID == q.TenantID && (q.ProjectID == "" || r.ProjectID == q.ProjectID) &&
		(q.PoolID == "" || r.PoolID == q.PoolID) && (q.Model == "" || strings.ToUpper(model) == q.Model)
}

// checkQuotas: at every instant, the GPUs a quota's scope holds stay within
// its limit, and the GPU-hours booked in all too — unless every reservation
// that makes up the excess predates the quota's last Set (a lowered limit
// does not take back what was granted). The GPUs are counted twice: over the
// live states the quota package counts (pending included) and over the
// states that hold atoms.
func (e *torture) checkQuotas(w *world) []string {
	var v []string
	for _, q := range w.quotas {
		base := e.baseline[q.ID]
		if q.GPUs != quota.Unlimited {
			for _, variant := range []struct {
				name string
				in   func(string) bool
			}{{"live", live}, {"holding", holding}} {
				var rs []*reservation.Reservation
				for i := range w.rs {
					r := &w.rs[i]
					// The queued placer moves a waiting reservation's window
					// to now without a quota check (the bug
					// TestTortureBugPendingShiftExceedsQuota shows); such a
					// reservation is left out here so that the rest is still
					// checked.
					shifted := r.State == reservation.StatePending && !r.StartsAt.Equal(e.createdAt[r.ID])
					if variant.in(r.State) && inScope(q, r) && !shifted {
						rs = append(rs, r)
					}
				}
				for _, at := range rs {
					t := at.StartsAt
					use, fresh, all := 0, 0, []string{}
					for _, r := range rs {
						if !r.StartsAt.After(t) && r.EndsAt.After(t) {
							use += r.GPUs
							mark := ""
							if !base[r.ID] {
								fresh++
								mark = "*"
							}
							all = append(all, fmt.Sprintf("%s%s(%s %d GPUs [%s, %s) created %s)", mark, r.ID, r.State, r.GPUs,
								r.StartsAt.Format(time.TimeOnly), r.EndsAt.Format(time.TimeOnly), r.CreateTime.Format(time.TimeOnly)))
						}
					}
					if use > q.GPUs && fresh > 0 {
						v = append(v, fmt.Sprintf("quota %s (%s) allows %d GPUs; %s reservations hold %d at %s (* granted after the limit): %s",
							q.ID, q.Scope(), q.GPUs, variant.name, use, t, strings.Join(all, ", ")))
						break
					}
				}
			}
		}
		if q.GPUHours != quota.Unlimited {
			var hours float64
			var fresh []string
			for i := range w.rs {
				r := &w.rs[i]
				if r.State == reservation.StateFailed || r.State == reservation.StateCanceled || !inScope(q, r) {
					continue
				}
				hours += float64(r.GPUs) * r.EndsAt.Sub(r.StartsAt).Hours()
				if !base[r.ID] {
					fresh = append(fresh, r.ID)
				}
			}
			if hours > q.GPUHours+1e-6 && len(fresh) > 0 {
				v = append(v, fmt.Sprintf("quota %s (%s) allows %.2f GPU-hours; %.2f booked, %d reservations granted after the limit",
					q.ID, q.Scope(), q.GPUHours, hours, len(fresh)))
			}
		}
	}
	return v
}

// checkBookingLifetimes: no booking outlives its reservation — none ends
// after the reservation's end, none of an ended reservation runs past the
// moment it ended (a booking released before it began keeps its first
// microsecond), and a pending reservation holds none.
func (e *torture) checkBookingLifetimes(w *world) []string {
	var v []string
	for _, b := range w.bookings {
		r := w.byID[b.rsv]
		switch {
		case r != nil && e.overwritten(r, b.end):
			// The known race: see overwritten.
		case r == nil:
			v = append(v, fmt.Sprintf("booking %s of %s: no such reservation", b.id, b.rsv))
			continue
		case b.end.After(r.EndsAt):
			v = append(v, fmt.Sprintf("booking %s of %s (%s) ends %s, after the reservation's end %s", b.id, r.ID, r.State, b.end, r.EndsAt))
		case r.State == reservation.StatePending:
			v = append(v, fmt.Sprintf("booking %s [%s, %s) of %s: a pending reservation holds nothing", b.id, b.start, b.end, r.ID))
		case !live(r.State):
			ended := r.UpdateTime.UTC().Truncate(booking.Resolution)
			if floor := b.start.Add(booking.Resolution); ended.Before(floor) {
				ended = floor
			}
			if b.end.After(ended) {
				v = append(v, fmt.Sprintf("booking %s [%s, %s) of %s outlives it: %s at %s", b.id, b.start, b.end, r.ID, r.State, r.UpdateTime))
			}
		}
	}
	return v
}

// checkHolders: every reservation that holds atoms names a node that exists
// and is not lost, its atoms exist on that node, each booked for it over its
// whole window, it books nothing else, its conditions say it holds them, and
// it was not placed on a node after the node's drain.
func (e *torture) checkHolders(w *world) []string {
	var v []string
	for i := range w.rs {
		r := &w.rs[i]
		held := condition(r, reservation.CondDevicesHeld)
		if !holding(r.State) {
			// A requeued reservation keeps a stale DevicesHeld=true:
			// TestRequeueClearsDevicesHeld shows that bug on its own.
			if lost := condition(r, reservation.CondNodeLost); lost != nil && lost.Status == "true" {
				continue
			}
			if held != nil && held.Status == "true" {
				v = append(v, fmt.Sprintf("%s is %s yet its condition DevicesHeld says %s (%s: %s)", r.ID, r.State, held.Status, held.Reason, held.Message))
			}
			continue
		}
		if held == nil || held.Status != "true" {
			v = append(v, fmt.Sprintf("%s is %s without DevicesHeld=true", r.ID, r.State))
		}
		n, ok := w.nodes[r.NodeID]
		switch {
		case r.NodeID == "":
			v = append(v, fmt.Sprintf("%s is %s on no node", r.ID, r.State))
			continue
		case !ok:
			v = append(v, fmt.Sprintf("%s is %s on node %s, which does not exist", r.ID, r.State, r.NodeID))
			continue
		}
		since := e.holdingSince[r.ID+"@"+r.NodeID]
		// after says whether r took its atoms after what happened in round
		// k, with the race of that very round counted apart.
		after := func(what string, k int, ok bool) bool {
			switch {
			case !ok || since < k:
				return false
			case since == k:
				e.raced[what+"/"+r.ID] = true
				return false
			}
			return true
		}
		if k, ok := e.lostIn[r.NodeID]; n.liveness == "lost" && (!ok || since != k) {
			v = append(v, fmt.Sprintf("%s is %s on node %s (%s), which is lost (since round %d; %s holds since round %d)",
				r.ID, r.State, r.NodeID, r.Placement.NodeName, k, r.ID, since))
		} else if ok && since == k {
			e.raced["lost/"+r.ID] = true
		}
		if k, ok := e.drainedIn[r.NodeID]; n.state == "draining" && after("draining", k, ok) {
			v = append(v, fmt.Sprintf("%s took its atoms on %s in round %d, after the node's drain in round %d", r.ID, r.Placement.NodeName, since, k))
		}
		if k, ok := e.movedIn[r.NodeID]; n.pool != r.PoolID && after("moved", k, ok) {
			v = append(v, fmt.Sprintf("%s of pool %s took its atoms on %s in round %d, after the node moved to pool %q in round %d",
				r.ID, r.PoolID, r.Placement.NodeName, since, n.pool, k))
		}
		for _, a := range r.Placement.Atoms {
			if k, ok := e.quarantinedIn[a]; w.atoms[a].quarantined && after("quarantined", k, ok) {
				v = append(v, fmt.Sprintf("%s took GPU %s on %s in round %d, after its quarantine in round %d", r.ID, a, r.Placement.NodeName, since, k))
			}
		}
		want := map[string]bool{}
		for _, a := range r.Placement.Atoms {
			want[a] = true
		}
		for _, c := range r.Placement.CPUs {
			want[r.NodeID+"/cpu/"+strconv.Itoa(c)] = true
		}
		if len(r.Placement.Atoms) != r.GPUs+r.Slots {
			v = append(v, fmt.Sprintf("%s asks %d GPUs and holds %d atoms", r.ID, r.GPUs+r.Slots, len(r.Placement.Atoms)))
		}
		covered := map[string]bool{}
		for _, b := range w.byRsv[r.ID] {
			if !want[b.atom] {
				v = append(v, fmt.Sprintf("%s books %s, not in its placement", r.ID, b.atom))
				continue
			}
			if !b.start.After(r.StartsAt) && !b.end.Before(r.EndsAt) {
				covered[b.atom] = true
			}
		}
		for a := range want {
			at, ok := w.atoms[a]
			switch {
			case !ok:
				v = append(v, fmt.Sprintf("%s holds atom %s, which does not exist", r.ID, a))
			case at.node != r.NodeID:
				v = append(v, fmt.Sprintf("%s on %s holds atom %s of node %s", r.ID, r.NodeID, a, at.node))
			}
			if !covered[a] {
				v = append(v, fmt.Sprintf("%s (%s [%s, %s)) has no booking of %s over its window", r.ID, r.State, r.StartsAt, r.EndsAt, a))
			}
		}
	}
	return v
}

func condition(r *reservation.Reservation, typ string) *reservation.Condition {
	for i := range r.Conditions {
		if r.Conditions[i].Type == typ {
			return &r.Conditions[i]
		}
	}
	return nil
}

// TestTortureReleaseInFirstMicrosecond guards a bug the torture test met:
// end() cut the window when now.After(StartsAt), comparing the untruncated
// now, then stored now.Truncate(µs), which equals StartsAt; the
// reservations_window CHECK refused the row and Release answered CONFLICT
// "changed concurrently; retry", which no retry fixed while the clock stood
// (NodesLost failed the same way, rolling back the liveness sweep).
func TestTortureReleaseInFirstMicrosecond(t *testing.T) {
	t.Parallel()
	e := setupTorture(t, 1)
	ctx := context.Background()
	e.cp.Clock.Set(e.cp.Clock.Now().Truncate(time.Microsecond).Add(500 * time.Nanosecond))
	res, err := e.admin.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{
		Tenant: "acme", Project: "default", Pool: "main", Gpus: 1, Binding: reservation.BindingNone}))
	require.NoError(t, err)
	require.Equal(t, reservation.StateActive, res.Msg.GetReservation().GetState())
	rel, err := e.admin.Reservations.Release(ctx, connect.NewRequest(&apiv1.ReleaseReservationRequest{
		Tenant: "acme", Reservation: res.Msg.GetReservation().GetId()}))
	require.NoError(t, err, "release in the first microsecond of the window")
	require.Equal(t, reservation.StateReleased, rel.Msg.GetReservation().GetState())
}

// TestTortureBugRequeueClearsDevicesHeld: a node is lost under a reservation
// of a pool that replaces (on_node_lost: replace). requeue deletes its
// bookings and puts it back to pending, but leaves the condition
// DevicesHeld=true (reason Booked) that held() set; it stays true while the
// reservation waits, and after it expires or is canceled, since end() only
// clears it for a reservation that holds.
func TestTortureBugRequeueClearsDevicesHeld(t *testing.T) {
	t.Parallel()
	e := setupTorture(t, 1)
	ctx := context.Background()
	res, err := e.admin.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{
		Tenant: "acme", Project: "default", Pool: "main", Gpus: 8, Binding: reservation.BindingNone}))
	require.NoError(t, err)
	id := res.Msg.GetReservation().GetId()
	// Take every other node of the pool out, so that it cannot land again.
	e.loseOnlyNode(t, res.Msg.GetReservation().GetPlacement().GetNodeId())
	got, err := e.admin.Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "acme", Reservation: id}))
	require.NoError(t, err)
	r := got.Msg.GetReservation()
	require.Equal(t, reservation.StatePending, r.GetState(), "requeued")
	require.Empty(t, r.GetPlacement().GetAtoms())
	for _, c := range r.GetConditions() {
		if c.GetType() == reservation.CondDevicesHeld {
			require.NotEqual(t, "true", c.GetStatus(), "a requeued reservation holds no devices: %v", c)
		}
	}
}

// TestTortureBugPendingShiftExceedsQuota: the quota package counts a
// pending reservation's GPUs over its window, and checks a booking against
// that. The queued placer moves a pending reservation's window to now
// (keeping its length) whenever it runs, with no quota check unless it
// places it; the window moves onto bookings granted while it did not
// overlap them, and the scope's usage exceeds the limit.
//
// research may hold 8 GPUs. P (8 GPUs, now..+1h) waits: pool alt is full. F
// (8 GPUs, +3h..+4h) does not overlap P and is granted. The placer runs
// every 50 minutes and moves P each time; at +2h30 P is +2h30..+3h30, and
// over +3h..+3h30 research holds 16.
func TestTortureBugPendingShiftExceedsQuota(t *testing.T) {
	t.Parallel()
	e := setupTorture(t, 1)
	ctx := context.Background()
	create := func(project, pool string, start time.Duration, d time.Duration) *apiv1.Reservation {
		t.Helper()
		req := &apiv1.CreateReservationRequest{Tenant: "acme", Project: project, Pool: pool, Gpus: 8,
			DurationSeconds: int64(d / time.Second), Binding: reservation.BindingNone}
		if start > 0 {
			req.StartTime = timestamppb.New(e.cp.Clock.Now().Add(start))
		}
		res, err := e.admin.Reservations.Create(ctx, connect.NewRequest(req))
		require.NoError(t, err)
		return res.Msg.GetReservation()
	}
	for range 4 { // alt's four nodes, 8 GPUs each
		require.Equal(t, reservation.StateActive, create("prod", "alt", 0, 5*time.Hour).GetState())
	}
	limit := int32(8)
	_, err := e.admin.Quotas.Set(ctx, connect.NewRequest(&apiv1.SetQuotaRequest{Tenant: "acme", Project: "research", Gpus: &limit}))
	require.NoError(t, err)
	p := create("research", "alt", 0, time.Hour)
	require.Equal(t, reservation.StatePending, p.GetState())
	f := create("research", "main", 3*time.Hour, time.Hour)
	require.Equal(t, reservation.StatePlaced, f.GetState())

	// The placer runs (here from the tick) more often than P lasts, so P
	// never expires: it moves.
	for range 3 {
		e.cp.Clock.Advance(50 * time.Minute)
		require.NoError(t, e.cp.App.Capacity.Tick(ctx))
	}
	var moved reservation.Reservation
	var use int32
	require.NoError(t, e.db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		if moved, err = reservation.Get(ctx, tx, "", p.GetId()); err != nil {
			return err
		}
		at := f.GetStartTime().AsTime()
		eff, err := quota.Effect(ctx, tx, quota.Charge{TenantID: e.tenantID, ProjectID: e.projectIDs["research"], PoolID: e.pools[0].id,
			Start: at, End: at.Add(time.Microsecond)})
		if err != nil {
			return err
		}
		for _, u := range eff.GetUses() {
			use = max(use, u.GetGpusUsed())
		}
		return nil
	}))
	// A window is moved only when it is placed: unplaced, P keeps its own
	// window and expires at its end.
	require.Contains(t, []string{reservation.StatePending, reservation.StateExpired}, moved.State)
	require.LessOrEqual(t, use, limit, "research's GPUs at %s, once P moved to [%s, %s)",
		f.GetStartTime().AsTime(), moved.StartsAt, moved.EndsAt)
}

// TestTortureBugWakeDeadlockIsInternal (PostgreSQL): waking a pool's queued
// placer inserts a unique River job in the caller's transaction, and a
// transaction that wakes two pools (a tick, a node loss, a reconcile)
// locks their job keys in whatever order it meets them. Two such
// transactions deadlock; PostgreSQL aborts one, and the error reaches
// store.DB.Write as "jobs: insert capacity.place_pending: … deadlock
// detected (SQLSTATE 40P01)" — raw from pgx, never classified as
// store.ErrSerialization — so Write does not retry it and the API answers
// INTERNAL (the torture test met it on Release).
func TestTortureBugWakeDeadlockIsInternal(t *testing.T) {
	t.Parallel()
	if bctest.Dialect() != store.Postgres {
		t.Skip("PostgreSQL only: SQLite has one writer, so two wakes never interleave")
	}
	e := setupTorture(t, 1)
	ctx := context.Background()
	eng := e.cp.App.Capacity.Engine
	first := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	var once [2]sync.Once
	wake := func(i int, pools ...string) error {
		return e.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			if err := eng.WakePools(ctx, tx, pools[:1]); err != nil {
				return err
			}
			once[i].Do(func() { close(first[i]) })
			select {
			case <-first[1-i]:
			case <-time.After(10 * time.Second):
			}
			return eng.WakePools(ctx, tx, pools[1:])
		})
	}
	errs := make(chan error, 2)
	go func() { errs <- wake(0, e.pools[0].id, e.pools[1].id) }()
	go func() { errs <- wake(1, e.pools[1].id, e.pools[0].id) }()
	for range 2 {
		err := <-errs
		require.NoError(t, err, "a deadlock is a serialization failure the store retries; classified: %v", errors.Is(err, store.ErrSerialization))
	}
}

// gate runs a hook once, just before the decision of the next mutation with
// a given action: between the mutation's reads (the envelope's Draft) and
// its write transaction.
type gate struct {
	iam.Authorizer
	mu     sync.Mutex
	before map[string]func()
}

func (g *gate) Authorize(ctx context.Context, req iam.Request) (iam.Decision, error) {
	g.mu.Lock()
	fn := g.before[req.Action]
	delete(g.before, req.Action)
	g.mu.Unlock()
	if fn != nil {
		fn()
	}
	return g.Authorizer.Authorize(ctx, req)
}

func (g *gate) arm(action string, fn func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.before[action] = fn
}

func gateOption(g *gate) bctest.ControlPlaneOption {
	return func(c *app.Config) {
		prev := c.WrapAuthorizer
		c.WrapAuthorizer = func(inner iam.Authorizer) iam.Authorizer {
			if prev != nil {
				inner = prev(inner)
			}
			g.Authorizer = inner
			return g
		}
	}
}

// TestTortureBugCreateUsesStaleSnapshot: Create places on the pool index
// (once a snapshot) read before its write transaction and books the plan it
// chose there; the booking transaction replans only when the bookings'
// exclusion constraint or host memory refuses the plan, or (book's node
// check) when the node is no longer active and ready. A GPU quarantined, or
// a node taken out of the pool (its labels changed, or the selector), in
// between is booked all the same. The lost and draining cases pass since
// book() checks the node (on PostgreSQL that check still races:
// TestTortureBugBookingRacesNodeLoss); the torture test meets the others as
// a create and the change in one round (counted as raced-quarantined and
// raced-moved).
func TestTortureBugCreateUsesStaleSnapshot(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// spoil makes every node of pool main unusable for a new booking.
		spoil func(ctx context.Context, tx store.Tx, e *torture, n tNode) error
	}{
		{"lost", func(ctx context.Context, tx store.Tx, e *torture, n tNode) error {
			if _, err := tx.Exec(ctx, `UPDATE nodes SET liveness = 'lost' WHERE id = $1`, n.id); err != nil {
				return err
			}
			return e.cp.App.Capacity.Hooks().NodesLost(ctx, tx, []string{n.id})
		}},
		{"draining", func(ctx context.Context, tx store.Tx, e *torture, n tNode) error {
			_, err := tx.Exec(ctx, `UPDATE nodes SET state = 'draining' WHERE id = $1`, n.id)
			return err
		}},
		{"quarantined", func(ctx context.Context, tx store.Tx, e *torture, n tNode) error {
			for _, g := range n.gpus {
				if _, err := tx.Exec(ctx, `INSERT INTO node_conditions (node_id, type, status, reason, message, update_time)
					VALUES ($1, $2, 'true', 'Xid79', 'GPU has fallen off the bus', compute_now())`, n.id, "GpuQuarantined/"+g); err != nil {
					return err
				}
			}
			return e.cp.App.Capacity.Hooks().NodeChanged(ctx, tx, n.id)
		}},
		{"left the pool", func(ctx context.Context, tx store.Tx, e *torture, n tNode) error {
			if _, err := tx.Exec(ctx, `UPDATE nodes SET labels = '{"zone":"z"}' WHERE id = $1`, n.id); err != nil {
				return err
			}
			return e.cp.App.Capacity.Hooks().NodeChanged(ctx, tx, n.id)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := &gate{before: map[string]func(){}}
			e := setupTorture(t, 1, gateOption(g))
			ctx := context.Background()
			g.arm("reservations.create", func() {
				require.NoError(t, e.write(func(ctx context.Context, tx store.Tx) error {
					for _, n := range e.nodes {
						if n.zone == "a" || n.zone == "b" {
							if err := tc.spoil(ctx, tx, e, n); err != nil {
								return err
							}
						}
					}
					return nil
				}))
			})
			res, err := e.admin.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{
				Tenant: "acme", Project: "default", Pool: "main", Gpus: 1, Binding: reservation.BindingKubernetes}))
			if err != nil {
				require.Equal(t, "NO_CAPACITY", client.Code(err), "%v", err)
				return
			}
			r := res.Msg.GetReservation()
			require.Equal(t, reservation.StatePending, r.GetState(), "no node of pool main was usable when the booking was written; placed on %s",
				r.GetPlacement().GetNodeName())
		})
	}
}

// waitForLockWaiters waits until n PostgreSQL backends wait for a lock.
func waitForLockWaiters(t *testing.T, db *store.DB, n int, locktype ...string) {
	t.Helper()
	ctx := context.Background()
	bctest.WaitFor(t, fmt.Sprintf("%d backends waiting for a lock", n), func() bool {
		var waiting int
		require.NoError(t, db.PgxPool().QueryRow(ctx, `SELECT COUNT(*) FROM pg_locks WHERE NOT granted AND ($1 = '' OR locktype = $1)`,
			strings.Join(locktype, "")).Scan(&waiting))
		return waiting >= n
	})
}

// lockNode holds a node's row lock (what sending it a command takes) until
// the returned func is called.
func lockNode(t *testing.T, db *store.DB, nodeID string) func() {
	t.Helper()
	ctx := context.Background()
	tx, err := db.PgxPool().Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM nodes WHERE id = $1 FOR UPDATE`, nodeID)
	require.NoError(t, err)
	return func() { _ = tx.Rollback(ctx) }
}

// TestTortureBugTickOverwritesExtension (PostgreSQL): Tick reads the
// reservations it will move with a plain SELECT and saves each one whole —
// every mutable column, guarded only by its state. An extension committed
// between the two (it locks the row, moves the bookings' end and the
// reservation's, and keeps the state) is undone: the reservation ends at its
// old end while its bookings hold the atoms until the new one, and the
// caller was told it was extended. PlacePending and NodesLost save the same
// way. Here the tick is held on R0's node (it sends R0 allocation.bind
// first) while R is extended.
func TestTortureBugTickOverwritesExtension(t *testing.T) {
	t.Parallel()
	if bctest.Dialect() != store.Postgres {
		t.Skip("PostgreSQL only: SQLite has one writer, so a tick never interleaves with an extension")
	}
	e := setupTorture(t, 1, func(c *app.Config) { c.CapacityTick = time.Hour })
	ctx := context.Background()
	start := timestamppb.New(e.cp.Clock.Now().Add(10 * time.Minute))
	create := func(binding string) *apiv1.Reservation {
		res, err := e.admin.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: "acme", Project: "default",
			Pool: "main", Gpus: 1, StartTime: start, DurationSeconds: 3600, Binding: binding}))
		require.NoError(t, err)
		require.Equal(t, reservation.StatePlaced, res.Msg.GetReservation().GetState())
		return res.Msg.GetReservation()
	}
	r0, r := create(reservation.BindingNode), create(reservation.BindingNone)
	e.cp.Clock.Advance(15 * time.Minute)

	unlock := lockNode(t, e.db, r0.GetPlacement().GetNodeId())
	tick := make(chan error, 1)
	go func() { tick <- e.cp.App.Capacity.Tick(ctx) }()
	waitForLockWaiters(t, e.db, 1)
	// The tick holds the rows it moves: the extension waits for it, and
	// then extends what the tick wrote.
	type extended struct {
		res *connect.Response[apiv1.ExtendReservationResponse]
		err error
	}
	extc := make(chan extended, 1)
	go func() {
		res, err := e.admin.Reservations.Extend(ctx, connect.NewRequest(&apiv1.ExtendReservationRequest{
			Tenant: "acme", Reservation: r.GetId(), ExtendSeconds: 3600}))
		extc <- extended{res, err}
	}()
	// The extension is decided, then queued behind the tick in the pool's
	// placer (it no longer waits on a row lock, so there is no second lock
	// waiter to see): once decided, let the tick go.
	bctest.WaitFor(t, "the extension to be decided", func() bool { return e.cp.Authz.CallsFor("reservations.extend") >= 1 })
	unlock()
	require.NoError(t, <-tick)
	x := <-extc
	require.NoError(t, x.err)
	ext := x.res

	want := ext.Msg.GetReservation().GetEndTime().AsTime()
	require.NoError(t, e.db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		got, err := reservation.Get(ctx, tx, "", r.GetId())
		require.NoError(t, err)
		bs, err := booking.BookingsOf(ctx, tx, r.GetId())
		require.NoError(t, err)
		for _, b := range bs {
			require.Equal(t, want, b.EndsAt, "the extension moved the booking")
		}
		require.Equal(t, reservation.StateActive, got.State)
		require.Equal(t, want, got.EndsAt, "the tick that started it kept the extension")
		return nil
	}))
}

// TestTortureBugConcurrentTicksCollide (PostgreSQL): two ticks that read the
// same reservation both send its command — allocation.bind on start or
// timeout, allocation.release on expiry — with the same idempotency key.
// The second fails on the commands_node_idempotency unique index, and its
// whole batch (up to 500 reservations) rolls back with ALREADY_EXISTS,
// instead of losing the race as a CONFLICT or skipping the reservation the
// first tick moved.
func TestTortureBugConcurrentTicksCollide(t *testing.T) {
	t.Parallel()
	if bctest.Dialect() != store.Postgres {
		t.Skip("PostgreSQL only: SQLite has one writer, so two ticks never interleave")
	}
	e := setupTorture(t, 1, func(c *app.Config) { c.CapacityTick = time.Hour })
	ctx := context.Background()
	res, err := e.admin.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: "acme", Project: "default",
		Pool: "main", Gpus: 1, StartTime: timestamppb.New(e.cp.Clock.Now().Add(10 * time.Minute)), DurationSeconds: 3600,
		Binding: reservation.BindingNode}))
	require.NoError(t, err)
	e.cp.Clock.Advance(15 * time.Minute)

	unlock := lockNode(t, e.db, res.Msg.GetReservation().GetPlacement().GetNodeId())
	submitted := e.cp.App.Capacity.Engine.Submitted()
	ticks := make(chan error, 2)
	for range 2 {
		go func() { ticks <- e.cp.App.Capacity.Tick(ctx) }()
	}
	// Both ticks reach the pool's placer, which runs them one after the
	// other (in one batch or two): one waits on the node's row lock, the
	// other behind it.
	bctest.WaitFor(t, "both ticks to reach the placer", func() bool { return e.cp.App.Capacity.Engine.Submitted()-submitted >= 2 })
	waitForLockWaiters(t, e.db, 1)
	unlock()
	for range 2 {
		if err := <-ticks; err != nil {
			require.Equal(t, envelope.CodeConflict, envelope.AsError(err).Code, "a tick that lost the race: %v", err)
		}
	}
}

// TestTortureConcurrentReconcileKeepsRollups (PostgreSQL) guards a bug the
// torture test met: the reconciler read a node's membership and atoms
// without a lock, wrote node_pools, and wrote the rollup deltas from what
// it had read. Two reconciles of one node at once (a label change and a
// device event here; two pool updates in the torture test) each took the
// node out of the pool they read and put it in the pool they computed; the
// last to commit also overwrote the membership the first wrote, computed
// from labels it could not see yet. The rollups then differed from their
// recomputation for good, and the node sat in the wrong pool until the next
// reconcile. reconcileLock (a per-tenant advisory lock) now orders them.
func TestTortureConcurrentReconcileKeepsRollups(t *testing.T) {
	t.Parallel()
	if bctest.Dialect() != store.Postgres {
		t.Skip("PostgreSQL only: SQLite has one writer, so two reconciles never interleave")
	}
	e := setupTorture(t, 1)
	ctx := context.Background()
	n := e.nodes[0] // zone a: pool main
	moved, blocked := make(chan struct{}), make(chan struct{})
	var once sync.Once
	relabel := make(chan error, 1)
	go func() {
		relabel <- e.write(func(ctx context.Context, tx store.Tx) error {
			if _, err := tx.Exec(ctx, `UPDATE nodes SET labels = '{"zone":"c"}' WHERE id = $1`, n.id); err != nil {
				return err
			}
			if err := e.cp.App.Capacity.Hooks().NodeChanged(ctx, tx, n.id); err != nil {
				return err
			}
			once.Do(func() { close(moved) })
			<-blocked
			return nil
		})
	}()
	<-moved
	device := make(chan error, 1)
	go func() {
		device <- e.write(func(ctx context.Context, tx store.Tx) error {
			return e.cp.App.Capacity.Hooks().NodeChanged(ctx, tx, n.id)
		})
	}()
	waitForLockWaiters(t, e.db, 1)
	close(blocked)
	require.NoError(t, <-relabel)
	require.NoError(t, <-device)

	require.NoError(t, e.db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		var poolID string
		require.NoError(t, tx.QueryRow(ctx, `SELECT pool_id FROM node_pools WHERE node_id = $1`, n.id).Scan(&poolID))
		mismatches, err := views.Check(ctx, tx)
		require.NoError(t, err)
		require.Empty(t, mismatches, "the rollups after two concurrent reconciles of %s", n.name)
		require.Equal(t, e.pools[1].id, poolID, "%s is labelled zone=c: pool alt", n.name)
		return nil
	}))
}

// TestTortureBugBookingRacesNodeLoss (PostgreSQL): book() checks that the
// chosen node is active and ready with a plain SELECT, so under READ
// COMMITTED the liveness sweep can mark the node lost and run NodesLost —
// which finds no reservation on it yet — between that check and the
// booking's commit. The reservation then holds a lost node's GPUs (active,
// for kubernetes and none bindings) until its window ends: nothing runs
// NodesLost for that node again. A share lock on the node row (SELECT … FOR
// SHARE) would order the two. Here the create is held at its last step
// (its events insert) while every node is lost.
func TestTortureBugBookingRacesNodeLoss(t *testing.T) {
	t.Parallel()
	if bctest.Dialect() != store.Postgres {
		t.Skip("PostgreSQL only: on SQLite the write transactions take turns")
	}
	e := setupTorture(t, 1, func(c *app.Config) { c.CapacityTick = time.Hour })
	ctx := context.Background()
	hold, err := e.db.PgxPool().Begin(ctx)
	require.NoError(t, err)
	// Every transaction that records events inserts them last, just before
	// commit: a table lock that refuses inserts holds the create there.
	_, err = hold.Exec(ctx, `LOCK TABLE events IN EXCLUSIVE MODE`)
	require.NoError(t, err)
	created := make(chan *connect.Response[apiv1.CreateReservationResponse], 1)
	go func() {
		res, err := e.admin.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{
			Tenant: "acme", Project: "default", Pool: "main", Gpus: 1, Binding: reservation.BindingKubernetes}))
		// Another writer may have been the events waiter: then the sweep
		// ran first and the create finds every node lost, which is as
		// right an answer as a booking the sweep releases.
		if err != nil {
			assert.Equal(t, "NO_CAPACITY", client.Code(err), "%v", err)
		}
		created <- res
	}()
	waitForLockWaiters(t, e.db, 1, "relation")
	// The booking holds its node's row (FOR SHARE): the sweep's update waits
	// for the booking to commit, and its NodesLost then sees it.
	swept := make(chan error, 1)
	go func() {
		swept <- e.write(func(ctx context.Context, tx store.Tx) error {
			for _, n := range e.nodes {
				if _, err := tx.Exec(ctx, `UPDATE nodes SET liveness = 'lost' WHERE id = $1`, n.id); err != nil {
					return err
				}
				if err := e.cp.App.Capacity.Hooks().NodesLost(ctx, tx, []string{n.id}); err != nil {
					return err
				}
			}
			return nil
		})
	}()
	// Either the sweep waits behind the booking (two lock waiters) or it
	// ran first (the create found nothing usable): go on when either shows.
	var sweepErr error
	sweepDone := false
	bctest.WaitFor(t, "the sweep to finish or to wait behind the booking", func() bool {
		select {
		case sweepErr = <-swept:
			sweepDone = true
			return true
		default:
		}
		var waiting int
		require.NoError(t, e.db.PgxPool().QueryRow(ctx, `SELECT COUNT(*) FROM pg_locks WHERE NOT granted`).Scan(&waiting))
		return waiting >= 2
	})
	require.NoError(t, hold.Rollback(ctx))
	if !sweepDone {
		sweepErr = <-swept
	}
	require.NoError(t, sweepErr)
	res := <-created
	if res == nil {
		return // refused: nothing was booked on a lost node
	}
	r := res.Msg.GetReservation()
	got, err := e.admin.Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "acme", Reservation: r.GetId()}))
	require.NoError(t, err)
	require.False(t, holding(got.Msg.GetReservation().GetState()), "%s is %s on %s, which was lost before it committed",
		r.GetId(), got.Msg.GetReservation().GetState(), r.GetPlacement().GetNodeName())
}

// TestTortureBugReleaseBeforeStartCharged: the quota package charges a
// released reservation gpus × (ends_at − starts_at) GPU-hours — "a release
// cuts the window short, so only the hours held stay charged" — but end()
// cuts the window only once it has begun. A reservation released before its
// start keeps its whole window and is charged all of it, though it held
// nothing; canceled, the same reservation is charged nothing.
func TestTortureBugReleaseBeforeStartCharged(t *testing.T) {
	t.Parallel()
	e := setupTorture(t, 1)
	ctx := context.Background()
	hours := 100.0
	q, err := e.admin.Quotas.Set(ctx, connect.NewRequest(&apiv1.SetQuotaRequest{Tenant: "acme", Project: "research", GpuHours: &hours}))
	require.NoError(t, err)
	res, err := e.admin.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: "acme", Project: "research",
		Pool: "main", Gpus: 8, StartTime: timestamppb.New(e.cp.Clock.Now().Add(time.Hour)), DurationSeconds: 3600,
		Binding: reservation.BindingNone}))
	require.NoError(t, err)
	require.Equal(t, reservation.StatePlaced, res.Msg.GetReservation().GetState())
	_, err = e.admin.Reservations.Release(ctx, connect.NewRequest(&apiv1.ReleaseReservationRequest{Tenant: "acme",
		Reservation: res.Msg.GetReservation().GetId()}))
	require.NoError(t, err)
	got, err := e.admin.Quotas.Get(ctx, connect.NewRequest(&apiv1.GetQuotaRequest{Tenant: "acme", Quota: q.Msg.GetQuota().GetId()}))
	require.NoError(t, err)
	// The window keeps its first microsecond (a window is never empty).
	require.InDelta(t, 0, got.Msg.GetQuota().GetGpuHoursUsed(), 1e-6, "GPU-hours of a reservation released before it started")
}

// TestRequeueResetsBindAttempts: a reservation whose node is lost after a
// bind was sent goes back to pending with no bind attempts counted, so the
// next placement gets every attempt; the next bind's idempotency key names
// the new placement, so it is a new command, not the old one replayed.
func TestRequeueResetsBindAttempts(t *testing.T) {
	t.Parallel()
	e := setupTorture(t, 1)
	ctx := context.Background()
	res, err := e.admin.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{
		Tenant: "acme", Project: "default", Pool: "main", Gpus: 8, Binding: reservation.BindingNode}))
	require.NoError(t, err)
	require.Equal(t, reservation.StateBinding, res.Msg.GetReservation().GetState())
	id := res.Msg.GetReservation().GetId()
	attempts := func() (n int) {
		require.NoError(t, e.write(func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT bind_attempts FROM reservations WHERE id = $1`, id).Scan(&n)
		}))
		return n
	}
	require.Equal(t, 1, attempts())
	e.loseOnlyNode(t, res.Msg.GetReservation().GetPlacement().GetNodeId())
	got, err := e.admin.Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "acme", Reservation: id}))
	require.NoError(t, err)
	require.Equal(t, reservation.StatePending, got.Msg.GetReservation().GetState(), "requeued")
	require.Zero(t, attempts(), "a requeued reservation starts its binds afresh")
}

// loseOnlyNode drains every other node and loses this one, as the liveness
// sweep does (the hook in the same transaction): what it held must be placed
// again, and cannot land anywhere yet.
func (e *torture) loseOnlyNode(t *testing.T, nodeID string) {
	t.Helper()
	require.NoError(t, e.write(func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE nodes SET state = 'draining' WHERE id <> $1`, nodeID); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE nodes SET liveness = 'lost' WHERE id = $1`, nodeID); err != nil {
			return err
		}
		return e.cp.App.Capacity.Hooks().NodesLost(ctx, tx, []string{nodeID})
	}))
}
