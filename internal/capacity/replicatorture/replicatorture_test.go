package replicatorture_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/cli"
	"github.com/better-compute/better-compute/internal/pki"
)

// The replica torture test (issue 21) plays the reservation torture test's
// operations against two real `serve` processes on one PostgreSQL
// database: simulated nodes (the real agent over mTLS) split between the
// two gateways, eight clients on both APIs creating (some with host memory
// and hugepages), extending, releasing and previewing, a controller that
// drains, undrains, quarantines GPUs (a fatal XID from the node) and stops
// and restarts nodes, and every few rounds the replica that owns the
// busiest pool's placer killed with SIGKILL and started again. After every
// round it reads the shared database in one snapshot and checks:
//
//   - no two bookings of one atom (GPU or CPU) overlap, and none is left
//     without its reservation;
//   - no reservation took a quarantined GPU, or a drained or stopped node,
//     in a round after the change committed (one that took it in the
//     change's own round may have been placed first);
//   - no host's memory or 1 GiB hugepages are over-committed at any
//     instant;
//   - no quota (a project's, the tenant's) is exceeded at any instant;
//   - every acknowledged create exists exactly once: every reservation is
//     named by exactly one idempotency record, and an acknowledged key's
//     record names the reservation its caller was told of;
//   - every caller was answered or refused with a documented code (a
//     replica that is down refuses with UNAVAILABLE).
//
// BC_REPLICA_TORTURE_SEED replays a seed (the operations each client and
// the controller pick; their interleaving, and which replica the kills
// find owning a pool, are the machine's); BC_REPLICA_TORTURE_OPS or -ops N
// sets the number of client operations.

// serveEnv makes the test binary run the CLI instead of the tests: the
// replicas are this binary re-executed as `better-compute serve`, so the
// test needs no separate build.
const serveEnv = "BC_REPLICA_TORTURE_SERVE"

var opsFlag = flag.Int("ops", 0, "client operations the replica torture test plays (default BC_REPLICA_TORTURE_OPS, else 400)")

func TestMain(m *testing.M) {
	if os.Getenv(serveEnv) != "" {
		os.Exit(cli.Main(os.Args[1:]))
	}
	os.Exit(m.Run())
}

const (
	defaultSeed = 21
	defaultOps  = 400
	clients     = 8
	nodes       = 6
	// killEvery is how many rounds pass between kills.
	killEvery = 5
	// maxQuarantined bounds the GPUs the controller takes out, so a long
	// soak keeps capacity to place on.
	maxQuarantined = 8
	projectLimit   = 16 // GPUs project research may hold at once
	tenantLimit    = 40 // GPUs tenant acme may hold at once (the fleet has 48)
)

func TestReplicaTorture(t *testing.T) {
	if os.Getenv(bctest.PostgresURLEnv) == "" {
		t.Skip("the replica torture test needs PostgreSQL: set " + bctest.PostgresURLEnv + " (several serve processes share one database)")
	}
	if testing.Short() {
		// CI's race pass (-short) would play it a second time, with every
		// replica under the race detector; its PostgreSQL pass runs it.
		t.Skip("the replica torture test runs without -short (two serve processes, killed in turn)")
	}
	ops := defaultOps
	if s := os.Getenv("BC_REPLICA_TORTURE_OPS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err, "BC_REPLICA_TORTURE_OPS")
		ops = n
	}
	if *opsFlag > 0 {
		ops = *opsFlag
	}
	seed := uint64(defaultSeed)
	if s := os.Getenv("BC_REPLICA_TORTURE_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "BC_REPLICA_TORTURE_SEED")
		seed = n
	}
	t.Logf("seed %d, %d operations (replay with BC_REPLICA_TORTURE_SEED=%d BC_REPLICA_TORTURE_OPS=%d)", seed, ops, seed, ops)
	began := time.Now()
	e := setup(t, seed)
	t.Logf("two replicas and %d nodes up in %s", nodes, time.Since(began).Round(time.Millisecond))
	e.run(ops)
	t.Logf("seed %d: %d operations in %d rounds, %d kills, in %s; outcomes: %s", seed, ops, e.round, e.kills,
		time.Since(began).Round(time.Millisecond), e.summary())
	for _, r := range e.replicas {
		// What the replicas logged as errors, for the record: a request
		// cut off by a kill ends in one without being a caller's answer.
		b, err := os.ReadFile(r.log.Name())
		require.NoError(t, err)
		var errs []string
		for line := range strings.Lines(string(b)) {
			if strings.Contains(line, "level=ERROR") {
				errs = append(errs, strings.TrimSpace(line))
			}
		}
		t.Logf("replica %d: %d starts, %d error lines%s", r.idx, r.all, len(errs), sample(errs, 3))
		// Under -race the replicas are race-built too; a SIGKILLed one never
		// exits with the detector's status, so its report is read here.
		require.NotContains(t, string(b), "WARNING: DATA RACE", "replica %d's log:\n%s", r.idx, tail(r.log.Name(), 20000))
	}
}

// sample lists up to n of lines, indented.
func sample(lines []string, n int) string {
	var b strings.Builder
	for _, l := range lines[:min(n, len(lines))] {
		b.WriteString("\n\t" + l)
	}
	return b.String()
}

// replica is one `serve` process; restarting it keeps its ports and state
// directory.
type replica struct {
	idx int
	// api, gateway and peer (the replica listener other replicas forward
	// to over mutual TLS) are host:port.
	api, gateway, peer string
	dir, dbURL         string
	secret             string
	log                *os.File
	mu                 sync.Mutex
	cmd                *exec.Cmd
	exited             chan struct{}
	all                int // starts so far
}

func (r *replica) url() string { return "http://" + r.api }

// peerURL is what the replica advertises in placer_owners.
func (r *replica) peerURL() string { return "https://" + r.peer }

// freeAddr picks a free loopback port below the kernel's ephemeral range
// (32768 and up), so that an outgoing connection elsewhere on the machine
// cannot take it while its replica is down between a kill and a restart.
func freeAddr(t *testing.T) string {
	t.Helper()
	for range 1000 {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", 20000+rand.IntN(12000)))
		if err != nil {
			continue
		}
		addr := ln.Addr().String()
		require.NoError(t, ln.Close())
		return addr
	}
	t.Fatal("no free port in 20000-31999")
	return ""
}

// start runs the process and waits until its API answers /readyz (the
// gateway binds before the API serves).
func (r *replica) start(t *testing.T) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "serve", "--roles", "api,gateway,worker",
		"--database-url", r.dbURL, "--listen", r.api, "--gateway-listen", r.gateway, "--replica-listen", r.peer,
		"--state-dir", r.dir, "--bootstrap-key-file", filepath.Join(r.dir, "admin.key"),
		// Liveness fast enough that a killed replica's nodes turn
		// unreachable, and some lost, within a few rounds.
		"--heartbeat-interval", "1s", "--unreachable-after", "3s", "--lost-after", "12s",
		"--request-rate", "0", "--max-streams", "0", "--shutdown-timeout", "1s", "--log-level", "warn")
	cmd.Env = append(os.Environ(), serveEnv+"=1", pki.SecretEnv+"="+r.secret)
	cmd.Stdout, cmd.Stderr = r.log, r.log
	fmt.Fprintf(r.log, "--- start %d\n", r.all)
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	r.mu.Lock()
	r.cmd, r.exited = cmd, exited
	r.all++
	r.mu.Unlock()
	bctest.WaitFor(t, fmt.Sprintf("replica %d to be ready", r.idx), func() bool {
		select {
		case <-exited:
			t.Fatalf("replica %d exited while starting:\n%s", r.idx, tail(r.log.Name(), 4000))
		default:
		}
		res, err := http.Get(r.url() + "/readyz")
		if err != nil {
			return false
		}
		_ = res.Body.Close()
		return res.StatusCode == http.StatusOK
	})
}

// kill ends the process with SIGKILL and waits for it to be gone.
func (r *replica) kill() {
	r.mu.Lock()
	cmd, exited := r.cmd, r.exited
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exited
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = append([]byte("…"), b[len(b)-n:]...)
	}
	return string(b)
}

// node is one simulated node and the replica whose gateway it talks to.
type node struct {
	id, name string
	gpus     []string
	replica  int
	cfg      bctest.FakeDaemonConfig
	d        *bctest.FakeDaemon // nil while stopped
}

type env struct {
	t        *testing.T
	seed     uint64
	replicas []*replica
	adminKey string
	db       *pgxpool.Pool
	nodes    []*node
	research string // project id
	tenant   string // tenant id

	mu sync.Mutex
	// acked maps each acknowledged create's idempotency key to the
	// reservation its caller was told of; ids lists them in order.
	acked map[string]string
	ids   []string
	// Rounds in which the controller drained, stopped (liveness) or
	// quarantined (GPU uuid) something, kept while it lasts.
	drainedIn, stoppedIn, quarantinedIn map[string]int
	// holdingSince is the round at whose check a reservation was first
	// seen holding atoms on its node ("rsv@node").
	holdingSince map[string]int
	outcomes     map[string]int
	recent       []string
	failures     []string
	round, kills int
}

func setup(t *testing.T, seed uint64) *env {
	t.Helper()
	ctx := context.Background()
	dbURL := bctest.NewStoreConfig(t, nil).URL
	secret, err := pki.GenerateSecret()
	require.NoError(t, err)
	root := t.TempDir()
	e := &env{t: t, seed: seed, acked: map[string]string{}, drainedIn: map[string]int{}, stoppedIn: map[string]int{},
		quarantinedIn: map[string]int{}, holdingSince: map[string]int{}, outcomes: map[string]int{}}
	for i := range 2 {
		dir := filepath.Join(root, fmt.Sprintf("replica-%d", i))
		require.NoError(t, os.MkdirAll(dir, 0o700))
		logf, err := os.Create(filepath.Join(root, fmt.Sprintf("replica-%d.log", i)))
		require.NoError(t, err)
		r := &replica{idx: i, api: freeAddr(t), gateway: freeAddr(t), peer: freeAddr(t), dir: dir, dbURL: dbURL, secret: secret, log: logf}
		e.replicas = append(e.replicas, r)
		t.Cleanup(func() { r.kill(); _ = logf.Close() })
		// One at a time: the first creates the platform and its key.
		r.start(t)
	}
	key, err := os.ReadFile(filepath.Join(e.replicas[0].dir, "admin.key"))
	require.NoError(t, err)
	e.adminKey = strings.TrimSpace(string(key))
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	e.db = pool

	admin := e.client(0)
	tn, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	e.tenant = tn.Msg.GetTenant().GetId()
	for _, name := range []string{"default", "research"} {
		p, err := admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: name}))
		require.NoError(t, err)
		if name == "research" {
			e.research = p.Msg.GetProject().GetId()
		}
	}
	for _, pl := range []struct{ name, model string }{{"h100", "H100"}, {"a100", "A100"}} {
		_, err := admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: pl.name,
			Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{pl.model}}}}))
		require.NoError(t, err)
	}
	for _, q := range []*apiv1.SetQuotaRequest{{Tenant: "acme", Project: "research", Gpus: proto.Int32(projectLimit)}, {Tenant: "acme", Gpus: proto.Int32(tenantLimit)}} {
		_, err := admin.Quotas.Set(ctx, connect.NewRequest(q))
		require.NoError(t, err)
	}

	// Nodes: two H100 hosts to one A100 host, alternating between the
	// replicas' gateways; each joins through its own.
	profiles := []string{"dgxh100", "dgxh100", "dgxa100"}
	var wg sync.WaitGroup
	errs := make([]error, nodes)
	e.nodes = make([]*node, nodes)
	for i := range nodes {
		n := &node{name: fmt.Sprintf("sim-%d", i), replica: i % 2}
		n.cfg = bctest.FakeDaemonConfig{Gateway: e.replicas[n.replica].gateway, StateDir: filepath.Join(root, n.name),
			Profile: profiles[i%len(profiles)], Seed: fmt.Sprintf("replicatorture/%d", i)}
		e.nodes[i] = n
		wg.Go(func() {
			d, err := bctest.NewFakeDaemon(n.cfg)
			if err != nil {
				errs[i] = err
				return
			}
			// Two racks, for gangs.
			tok, err := e.client(n.replica).JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "default", TtlSeconds: 600,
				Labels: map[string]string{"topology.rack": fmt.Sprintf("r%d", i%2)}}))
			if err == nil {
				err = d.Join(ctx, tok.Msg.GetToken())
			}
			if err != nil {
				errs[i] = errors.Join(fmt.Errorf("node %d: join: %w", i, err), d.Close())
				return
			}
			d.Start()
			n.d = d
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, n := range e.nodes {
			if n.d != nil {
				_ = n.d.Stop()
			}
		}
	})
	require.NoError(t, errors.Join(errs...))
	for _, n := range e.nodes {
		n.id = n.d.NodeID()
	}
	bctest.WaitFor(t, "every node ready, in a pool, with its GPUs as atoms", func() bool {
		var ready, pooled, gpus int
		err := e.db.QueryRow(ctx, `SELECT (SELECT COUNT(*) FROM nodes WHERE liveness = 'ready' AND state = 'active'),
			(SELECT COUNT(*) FROM node_pools WHERE pool_id <> ''), (SELECT COUNT(*) FROM atoms WHERE kind = 'gpu')`).Scan(&ready, &pooled, &gpus)
		return err == nil && ready == nodes && pooled == nodes && gpus == 8*nodes
	})
	for _, n := range e.nodes {
		rows, err := e.db.Query(ctx, `SELECT uuid FROM gpus WHERE node_id = $1 ORDER BY idx`, n.id)
		require.NoError(t, err)
		n.gpus, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.Len(t, n.gpus, 8, "node %s", n.name)
	}
	require.Empty(t, e.check(), "the fleet as set up")
	return e
}

// client returns an admin client of replica i.
func (e *env) client(i int) *client.Client { return client.New(e.replicas[i].url(), e.adminKey) }

// run plays ops client operations in rounds of one per client, with one
// controller operation and, every killEvery rounds, a kill of the busiest
// pool's owner alongside; the invariants are checked after each round.
func (e *env) run(ops int) {
	t := e.t
	rngs := make([]*rand.Rand, clients)
	for i := range rngs {
		rngs[i] = rand.New(rand.NewPCG(e.seed, uint64(i)))
	}
	ctl := rand.New(rand.NewPCG(e.seed, clients))
	for done := 0; done < ops; {
		e.round++
		n := min(clients, ops-done)
		kill := e.round%killEvery == 0
		finished := make(chan struct{})
		go func() {
			var wg sync.WaitGroup
			for c := range n {
				wg.Go(func() { e.step(c, rngs[c]) })
			}
			wg.Go(func() { e.control(ctl, kill) })
			if kill {
				wg.Go(e.killBusiest)
			}
			wg.Wait()
			close(finished)
		}()
		// Every caller is answered or refused: a call that hangs holds the
		// round until the test's deadline, and fails it there.
		bctest.Receive(t, fmt.Sprintf("round %d: every client answered", e.round), finished)
		if t.Failed() {
			// A wait in the round gave up (its goroutine reported why).
			t.Fatalf("seed %d, round %d: stopped\n%s", e.seed, e.round, e.context())
		}
		done += n
		if len(e.failures) > 0 {
			t.Fatalf("seed %d, round %d: unexpected answers:\n%s\n%s", e.seed, e.round, strings.Join(e.failures, "\n"), e.context())
		}
		if v := e.check(); len(v) > 0 {
			t.Fatalf("seed %d, round %d: invariants broken:\n%s\n%s", e.seed, e.round, strings.Join(v, "\n"), e.context())
		}
	}
}

func (e *env) context() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "last operations:\n%s\n", strings.Join(e.recent, "\n"))
	for _, r := range e.replicas {
		fmt.Fprintf(&b, "replica %d (%s) log:\n%s\n", r.idx, r.url(), tail(r.log.Name(), 6000))
	}
	return b.String()
}

func (e *env) summary() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range e.outcomes {
			if !yield(k) {
				return
			}
		}
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, e.outcomes[k])
	}
	return strings.Join(parts, " ")
}

func (e *env) note(who, op, outcome, detail string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.outcomes[op+"/"+outcome]++
	e.recent = append(e.recent, fmt.Sprintf("r%d %s %s %s %s", e.round, who, op, outcome, detail))
	if len(e.recent) > 4*clients {
		e.recent = e.recent[len(e.recent)-4*clients:]
	}
}

func (e *env) fail(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.failures = append(e.failures, fmt.Sprintf(format, args...))
}

// answer classifies an API answer: the refusals the API documents, and
// UNAVAILABLE from a replica that is down or whose pool is changing hands,
// are outcomes; anything else (INTERNAL, UNKNOWN, a constraint the
// database enforced) fails the test.
func (e *env) answer(who, op, detail string, to int, err error) bool {
	code := client.Code(err)
	if code == "" {
		code = "OK"
	}
	msg := ""
	if err != nil {
		msg = " " + err.Error()
	}
	// connect-go reads a connection reset as the client going away
	// (CANCELED); on this side of the wire it is the replica dying under
	// the call, which refuses it as a network failure would. Only for the
	// test's own connection: a replica that answers CANCELED itself (its
	// forward to a dying owner) fails the test.
	if code == "CANCELED" && strings.Contains(msg, `"`+e.replicas[to].url()+`/`) {
		code = "UNAVAILABLE"
	}
	e.note(who, op, code, detail+msg)
	switch code {
	case "OK":
		return true
	case "NO_CAPACITY", "QUOTA_EXCEEDED", "FAILED_PRECONDITION", "CONFLICT", "INVALID_ARGUMENT", "NOT_FOUND", "UNAVAILABLE":
		if strings.Contains(msg, "violates a constraint") {
			e.fail("%s %s %s: a database constraint refused it: %v", who, op, detail, err)
		}
	default:
		e.fail("%s %s %s: %s: %v", who, op, detail, code, err)
	}
	return false
}

func (e *env) pickReservation(rng *rand.Rand) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.ids) == 0 {
		return ""
	}
	n := len(e.ids)
	return e.ids[max(0, n-1-rng.IntN(min(n, 40)))]
}

// step is one client operation; client c talks to replica c%2.
func (e *env) step(c int, rng *rand.Rand) {
	who := fmt.Sprintf("c%d@%d", c, c%2)
	api := e.client(c % 2)
	ctx := context.Background()
	switch k := rng.IntN(100); {
	case k < 5:
		e.createMany(c, rng, false)
	case k < 10:
		e.createMany(c, rng, true)
	case k < 45:
		e.create(c, rng)
	case k < 60:
		id := e.pickReservation(rng)
		if id == "" {
			return
		}
		_, err := api.Reservations.Extend(ctx, connect.NewRequest(&apiv1.ExtendReservationRequest{
			Tenant: "acme", Reservation: id, ExtendSeconds: int64(60 * (1 + rng.IntN(120)))}))
		e.answer(who, "extend", id, c%2, err)
	case k < 80:
		id := e.pickReservation(rng)
		if id == "" {
			return
		}
		_, err := api.Reservations.Release(ctx, connect.NewRequest(&apiv1.ReleaseReservationRequest{Tenant: "acme", Reservation: id}))
		e.answer(who, "release", id, c%2, err)
	default:
		req := randomRequest(rng)
		res, err := api.Reservations.Preview(ctx, connect.NewRequest(&apiv1.PreviewReservationRequest{Request: req}))
		if e.answer(who, "preview", fmt.Sprintf("%s %d GPUs", req.GetPool(), req.GetGpus()), c%2, err) && res.Msg.GetFeasible() {
			if got := len(res.Msg.GetPlacement().GetAtoms()); got != int(req.GetGpus()) {
				e.fail("%s preview of %d GPUs offers %d atoms", who, req.GetGpus(), got)
			}
		}
	}
}

func randomRequest(rng *rand.Rand) *apiv1.CreateReservationRequest {
	req := &apiv1.CreateReservationRequest{Tenant: "acme", Project: []string{"default", "research"}[rng.IntN(2)],
		Pool: "h100", Gpus: int32(1 + rng.IntN(4)), DurationSeconds: int64(10*60 + rng.IntN(3*3600)), Binding: "none"}
	if rng.IntN(3) == 0 {
		req.Pool = "a100"
	}
	if rng.IntN(6) == 0 {
		req.Gpus = 8
	}
	// Some bind on the node: the placer's replica sends the agent its
	// allocation through whichever gateway holds the node's session.
	if rng.IntN(5) == 0 {
		req.Binding = "node"
	}
	if rng.IntN(4) == 0 {
		req.StartTime = timestamppb.New(time.Now().Add(time.Duration(1+rng.IntN(180)) * time.Minute))
	}
	// Host memory and hugepages, enough that a node's run out before its
	// GPUs do (a sim host has about 2 TiB and 32 1 GiB pages).
	if rng.IntN(3) == 0 {
		req.MemoryGib = int32(128 * (1 + rng.IntN(8)))
	}
	if rng.IntN(4) == 0 {
		req.Hugepages_1Gi = int32(4 * (1 + rng.IntN(4)))
	}
	return req
}

// create sends a create with an idempotency key, and retries it with the
// same key on the other replica, then this one, while it is refused as
// UNAVAILABLE: whatever answers, the key creates one reservation at most.
func (e *env) create(c int, rng *rand.Rand) {
	req := randomRequest(rng)
	key := client.NewIdempotencyKey()
	detail := fmt.Sprintf("%s/%s %d GPUs mem=%d hp=%d key=%s", req.GetPool(), req.GetProject(), req.GetGpus(), req.GetMemoryGib(), req.GetHugepages_1Gi(), key)
	for attempt := range 3 {
		i := (c + attempt) % 2
		r := connect.NewRequest(req)
		r.Header().Set(client.HeaderIdempotencyKey, key)
		res, err := e.client(i).Reservations.Create(context.Background(), r)
		if !e.answer(fmt.Sprintf("c%d@%d", c, i), "create", detail, i, err) {
			if code := client.Code(err); code == "UNAVAILABLE" || code == "CANCELED" {
				continue
			}
			return
		}
		id := res.Msg.GetReservation().GetId()
		e.mu.Lock()
		defer e.mu.Unlock()
		if old, ok := e.acked[key]; ok && old != id {
			e.failures = append(e.failures, fmt.Sprintf("key %s acknowledged as %s and as %s", key, old, id))
		}
		e.acked[key] = id
		e.ids = append(e.ids, id)
		return
	}
}

// createMany books an array (or a gang, one member per node in one rack)
// with an idempotency key, retried as create retries: whatever answers,
// the key books its members once, all of a gang or none.
func (e *env) createMany(c int, rng *rand.Rand, gang bool) {
	req := randomRequest(rng)
	msg := &apiv1.CreateReservationsRequest{Template: req, Count: int32(2 + rng.IntN(3))}
	op := "array"
	if gang {
		op, req.Pool, req.MemoryGib, req.Hugepages_1Gi = "gang", "h100", 0, 0
		msg.Count, msg.Gang = 2, &apiv1.Gang{Topology: "rack"}
	} else if rng.IntN(2) == 0 {
		msg.MinCount = 1
	}
	key := client.NewIdempotencyKey()
	detail := fmt.Sprintf("%s/%s %d×%d GPUs key=%s", req.GetPool(), req.GetProject(), msg.GetCount(), req.GetGpus(), key)
	for attempt := range 3 {
		i := (c + attempt) % 2
		r := connect.NewRequest(msg)
		r.Header().Set(client.HeaderIdempotencyKey, key)
		res, err := e.client(i).Reservations.CreateReservations(context.Background(), r)
		if !e.answer(fmt.Sprintf("c%d@%d", c, i), op, detail, i, err) {
			if code := client.Code(err); code == "UNAVAILABLE" || code == "CANCELED" {
				continue
			}
			return
		}
		var ids []string
		nodes := map[string]bool{}
		for _, m := range res.Msg.GetReservations() {
			ids = append(ids, m.GetId())
			nodes[m.GetPlacement().GetNodeId()] = true
		}
		if gang && (len(ids) != 2 || len(nodes) != 2) {
			e.fail("gang %s answered %d members on %d nodes", detail, len(ids), len(nodes))
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		if old, ok := e.acked[key]; ok && old != strings.Join(ids, ",") {
			e.failures = append(e.failures, fmt.Sprintf("key %s acknowledged as %s and as %s", key, old, strings.Join(ids, ",")))
		}
		e.acked[key] = strings.Join(ids, ",")
		e.ids = append(e.ids, ids...)
		return
	}
}

// control is the round's fleet change: drain, undrain, quarantine a GPU
// (the node reports a fatal XID; its gateway records the condition), stop
// a node (its agent says goodbye: unreachable at once) or start it again.
// Quarantine waits for the condition to commit, and stop for the node to
// leave ready, so each change's round is the round it committed in.
func (e *env) control(rng *rand.Rand, kill bool) {
	t := e.t
	ctx := context.Background()
	n := e.nodes[rng.IntN(len(e.nodes))]
	to := rng.IntN(2)
	api := e.client(to)
	switch k := rng.IntN(100); {
	case k < 25:
		_, err := api.Nodes.Drain(ctx, connect.NewRequest(&apiv1.DrainNodeRequest{Tenant: "acme", Node: n.id, Reason: "torture"}))
		if e.answer("ctl", "drain", n.name, to, err) {
			e.mu.Lock()
			if _, ok := e.drainedIn[n.id]; !ok {
				e.drainedIn[n.id] = e.round
			}
			e.mu.Unlock()
		}
	case k < 50:
		// Forget the drain first: a placement after the undrain commits
		// is allowed, and one before it is still refused by the node.
		e.mu.Lock()
		delete(e.drainedIn, n.id)
		e.mu.Unlock()
		_, err := api.Nodes.Undrain(ctx, connect.NewRequest(&apiv1.UndrainNodeRequest{Tenant: "acme", Node: n.id}))
		e.answer("ctl", "undrain", n.name, to, err)
	case k < 70:
		e.mu.Lock()
		few := len(e.quarantinedIn) < maxQuarantined
		e.mu.Unlock()
		// Not in a kill round: the node's session may be the one cut off,
		// and the event would wait for its replica to come back.
		if kill || !few || n.d == nil {
			return
		}
		g := n.gpus[rng.IntN(len(n.gpus))]
		n.d.ReportHealthEvent(&agentv1.HealthEvent{Kind: "gpu.xid", Device: g, Code: 79, Message: "GPU has fallen off the bus"})
		bctest.WaitFor(t, "the quarantine of "+g+" to commit", func() bool {
			var on bool
			err := e.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM node_conditions WHERE node_id = $1 AND type = $2 AND status = 'true')`,
				n.id, "GpuQuarantined/"+g).Scan(&on)
			return err == nil && on
		})
		e.mu.Lock()
		if _, ok := e.quarantinedIn[g]; !ok {
			e.quarantinedIn[g] = e.round
		}
		e.mu.Unlock()
		e.note("ctl", "quarantine", "OK", g)
	case n.d != nil:
		if err := n.d.Stop(); err != nil {
			e.fail("stop node %s: %v", n.name, err)
			return
		}
		n.d = nil
		bctest.WaitFor(t, "node "+n.name+" to leave ready", func() bool {
			var liveness string
			err := e.db.QueryRow(ctx, `SELECT liveness FROM nodes WHERE id = $1`, n.id).Scan(&liveness)
			return err == nil && liveness != "ready"
		})
		e.mu.Lock()
		e.stoppedIn[n.id] = e.round
		e.mu.Unlock()
		e.note("ctl", "stop-node", "OK", n.name)
	default:
		e.mu.Lock()
		delete(e.stoppedIn, n.id)
		e.mu.Unlock()
		d, err := bctest.NewFakeDaemon(n.cfg)
		if err != nil {
			e.fail("restart node %s: %v", n.name, err)
			return
		}
		d.Start()
		n.d = d
		e.note("ctl", "start-node", "OK", n.name)
	}
}

// killBusiest kills, with SIGKILL, the replica whose placer owns the pool
// with the most live reservations (the first replica when no pool has an
// owner yet), and starts it again on the same ports.
func (e *env) killBusiest() {
	t := e.t
	ctx := context.Background()
	var pool, url string
	err := e.db.QueryRow(ctx, `SELECT p.name, o.url FROM placer_owners o JOIN pools p ON p.id = o.pool_id
		ORDER BY (SELECT COUNT(*) FROM reservations r WHERE r.pool_id = o.pool_id AND r.state IN ('pending', 'placed', 'binding', 'active')) DESC, p.name
		LIMIT 1`).Scan(&pool, &url)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		e.fail("find the busiest pool's owner: %v", err)
		return
	}
	victim := e.replicas[0]
	for _, r := range e.replicas {
		if r.peerURL() == url {
			victim = r
		}
	}
	victim.kill()
	e.note("kill", "kill", "OK", fmt.Sprintf("replica %d (owner of %q at %s)", victim.idx, pool, url))
	e.mu.Lock()
	e.kills++
	e.mu.Unlock()
	victim.start(t)
}

// check reads the shared database in one snapshot and returns every broken
// invariant.
func (e *env) check() []string {
	ctx := context.Background()
	tx, err := e.db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return []string{"begin the check: " + err.Error()}
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var v []string
	// strs runs a query whose rows are one string each: each row found is
	// a violation.
	strs := func(what, query string, args ...any) {
		rows, err := tx.Query(ctx, query, args...)
		if err != nil {
			v = append(v, what+": "+err.Error())
			return
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			v = append(v, what+": "+err.Error())
		}
		for _, s := range got {
			v = append(v, what+": "+s)
		}
	}
	strs("overlapping bookings of one GPU", `SELECT a.atom || ': ' || a.reservation_id || ' [' || a.starts_at || ', ' || a.ends_at || ') and ' ||
			b.reservation_id || ' [' || b.starts_at || ', ' || b.ends_at || ')'
		FROM bookings a JOIN bookings b ON a.atom = b.atom AND a.id < b.id AND a.starts_at < b.ends_at AND b.starts_at < a.ends_at`)
	strs("overlapping bookings of one CPU", `SELECT a.node_id || ' cpus ' || GREATEST(a.cpu_lo, b.cpu_lo) || ': ' || a.reservation_id || ' and ' || b.reservation_id
		FROM cpu_bookings a JOIN cpu_bookings b ON a.node_id = b.node_id AND a.id < b.id AND a.cpu_lo < b.cpu_hi AND b.cpu_lo < a.cpu_hi
			AND a.starts_at < b.ends_at AND b.starts_at < a.ends_at`)
	strs("booking without its reservation", `SELECT k.id || ' of ' || k.reservation_id FROM bookings k
		LEFT JOIN reservations r ON r.id = k.reservation_id WHERE r.id IS NULL`)
	// The most a host holds is reached at the start of one of the
	// reservations it holds.
	strs("host over-committed", `SELECT r.node_id || ' at ' || r.starts_at || ': ' || SUM(o.memory_gib) || ' of ' || h.memory_gib || ' GiB, ' ||
			SUM(o.hugepages_1gi) || ' of ' || h.hugepages_1gi || ' 1Gi hugepages'
		FROM reservations r
		JOIN reservations o ON o.node_id = r.node_id AND o.state IN ('placed', 'binding', 'active') AND o.starts_at <= r.starts_at AND o.ends_at > r.starts_at
		JOIN host_resources h ON h.node_id = r.node_id
		WHERE r.state IN ('placed', 'binding', 'active')
		GROUP BY r.id, r.node_id, r.starts_at, h.memory_gib, h.hugepages_1gi
		HAVING SUM(o.memory_gib) > h.memory_gib OR SUM(o.hugepages_1gi) > h.hugepages_1gi`)
	// A quota counts the live reservations of its scope (pending too) at
	// every instant; the most is reached at one of their starts.
	for _, q := range []struct {
		scope string
		limit int
		where string
		args  []any
	}{{"project research", projectLimit, "tenant_id = $1 AND project_id = $2", []any{e.tenant, e.research}}, {"tenant acme", tenantLimit, "tenant_id = $1", []any{e.tenant}}} {
		live := q.where + " AND state IN ('pending', 'placed', 'binding', 'active')"
		strs("quota of "+q.scope+" exceeded", `SELECT r.starts_at || ': ' || SUM(o.gpus) || ' GPUs, limit `+strconv.Itoa(q.limit)+`'
			FROM (SELECT * FROM reservations WHERE `+live+`) r
			JOIN (SELECT * FROM reservations WHERE `+live+`) o ON o.starts_at <= r.starts_at AND o.ends_at > r.starts_at
			GROUP BY r.id, r.starts_at HAVING SUM(o.gpus) > `+strconv.Itoa(q.limit), q.args...)
	}

	// Exactly once: every reservation is named by one idempotency record
	// (every create carries a key), and an acknowledged key's names the
	// reservation its caller was told of.
	rows, err := tx.Query(ctx, `SELECT key, procedure, response FROM idempotency_keys
		WHERE procedure LIKE '%ReservationService/Create' OR procedure LIKE '%ReservationService/CreateReservations'`)
	if err != nil {
		return append(v, "read idempotency records: "+err.Error())
	}
	byKey := map[string]string{}
	namedBy := map[string][]string{}
	for rows.Next() {
		var key, procedure string
		var body []byte
		if err := rows.Scan(&key, &procedure, &body); err != nil {
			rows.Close()
			return append(v, "read idempotency records: "+err.Error())
		}
		// An array's or gang's record names all its members, in order.
		var ids []string
		if strings.HasSuffix(procedure, "/CreateReservations") {
			var res apiv1.CreateReservationsResponse
			if err := proto.Unmarshal(body, &res); err != nil {
				v = append(v, fmt.Sprintf("idempotency record %s: %v", key, err))
				continue
			}
			for _, r := range res.GetReservations() {
				ids = append(ids, r.GetId())
			}
		} else {
			var res apiv1.CreateReservationResponse
			if err := proto.Unmarshal(body, &res); err != nil {
				v = append(v, fmt.Sprintf("idempotency record %s: %v", key, err))
				continue
			}
			ids = []string{res.GetReservation().GetId()}
		}
		byKey[key] = strings.Join(ids, ",")
		for _, id := range ids {
			namedBy[id] = append(namedBy[id], key)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return append(v, "read idempotency records: "+err.Error())
	}
	type rsv struct{ id, state, node string }
	rows, err = tx.Query(ctx, `SELECT id, state, COALESCE(node_id, '') FROM reservations`)
	if err != nil {
		return append(v, "read reservations: "+err.Error())
	}
	rs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (rsv, error) {
		var r rsv
		return r, row.Scan(&r.id, &r.state, &r.node)
	})
	if err != nil {
		return append(v, "read reservations: "+err.Error())
	}
	exists := map[string]bool{}
	for _, r := range rs {
		exists[r.id] = true
		if keys := namedBy[r.id]; len(keys) != 1 {
			v = append(v, fmt.Sprintf("reservation %s (%s) is named by %d create keys %v: not created exactly once", r.id, r.state, len(keys), keys))
		}
	}
	// Node and atom facts for the placement checks.
	type nodeRow struct{ state, liveness string }
	nodeOf := map[string]nodeRow{}
	rows, err = tx.Query(ctx, `SELECT id, state, liveness FROM nodes`)
	if err != nil {
		return append(v, "read nodes: "+err.Error())
	}
	for rows.Next() {
		var id string
		var n nodeRow
		if err := rows.Scan(&id, &n.state, &n.liveness); err != nil {
			rows.Close()
			return append(v, "read nodes: "+err.Error())
		}
		nodeOf[id] = n
	}
	rows.Close()
	type held struct{ rsv, node, atom string }
	rows, err = tx.Query(ctx, `SELECT r.id, r.node_id, a.gpu_uuid FROM reservations r JOIN bookings k ON k.reservation_id = r.id
		JOIN atoms a ON a.id = k.atom WHERE a.quarantined AND r.state IN ('placed', 'binding', 'active')`)
	if err != nil {
		return append(v, "read quarantined holders: "+err.Error())
	}
	onQuarantined, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (held, error) {
		var h held
		return h, row.Scan(&h.rsv, &h.node, &h.atom)
	})
	if err != nil {
		return append(v, "read quarantined holders: "+err.Error())
	}

	e.mu.Lock()
	defer e.mu.Unlock()
	for key, id := range e.acked {
		gone := ""
		for _, member := range strings.Split(id, ",") {
			if !exists[member] {
				gone = member
			}
		}
		switch got, ok := byKey[key]; {
		case gone != "":
			v = append(v, fmt.Sprintf("acknowledged create %s (key %s) is gone", gone, key))
		case !ok:
			v = append(v, fmt.Sprintf("acknowledged create %s (key %s) has no idempotency record", id, key))
		case got != id:
			v = append(v, fmt.Sprintf("key %s was acknowledged as %s but created %s", key, id, got))
		}
	}
	for _, r := range rs {
		key := r.id + "@" + r.node
		holding := r.state == "placed" || r.state == "binding" || r.state == "active"
		if !holding {
			delete(e.holdingSince, key)
			continue
		}
		if _, ok := e.holdingSince[key]; !ok {
			e.holdingSince[key] = e.round
		}
		since := e.holdingSince[key]
		n := nodeOf[r.node]
		// A change of round k allows a placement seen at round k's check
		// (it may have come first) and none later.
		if k, ok := e.drainedIn[r.node]; ok && n.state != "active" && since > k {
			v = append(v, fmt.Sprintf("%s took its atoms on drained node %s in round %d, after the drain committed in round %d", r.id, r.node, since, k))
		}
		if k, ok := e.stoppedIn[r.node]; ok && n.liveness != "ready" && since > k {
			v = append(v, fmt.Sprintf("%s took its atoms on node %s (%s) in round %d, after it was stopped in round %d", r.id, r.node, n.liveness, since, k))
		}
	}
	for _, h := range onQuarantined {
		if k, ok := e.quarantinedIn[h.atom]; ok && e.holdingSince[h.rsv+"@"+h.node] > k {
			v = append(v, fmt.Sprintf("%s took GPU %s in round %d, after its quarantine committed in round %d", h.rsv, h.atom, e.holdingSince[h.rsv+"@"+h.node], k))
		}
	}
	return v
}
