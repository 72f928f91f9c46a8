package sandboxbench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/store"
)

var (
	concurrentFlag = flag.Int("concurrent", 0, "creates at once in BenchmarkConcurrentCreates (default 50 simulated, 2 real guests)")
	nodesFlag      = flag.Int("nodes", 2, "simulated hosts (ignored with BC_GUEST=1: one real host)")
)

// env is where sandboxes run: simulated hosts, or one real bcd.
type env struct {
	cp   *bctest.ControlPlane
	acme *client.Client
	real *bctest.GuestRig
	// poll is how often a wait looks again.
	poll time.Duration
	seq  int
}

func newEnv(b *testing.B) *env {
	b.Helper()
	if os.Getenv("BC_GUEST") != "" {
		g := bctest.StartGuestRig(b, bctest.GuestRigConfig{Net: "10.213.95."})
		return &env{cp: g.CP, acme: g.Acme, real: g, poll: 50 * time.Millisecond}
	}
	cp := bctest.NewControlPlane(b)
	admin := cp.Admin()
	ctx := context.Background()
	must(b, call(admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))))
	must(b, call(admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "default"}))))
	k, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "admin"}))
	must(b, err)
	sim, err := bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		Template: bctest.FakeDaemonConfig{Gateway: cp.GatewayAddr}, Root: b.TempDir(), N: *nodesFlag,
		Token: func(ctx context.Context, _ int) (string, error) {
			tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "default"}))
			return tok.Msg.GetToken(), err
		},
	})
	must(b, err)
	b.Cleanup(sim.Stop)
	e := &env{cp: cp, acme: cp.Client(k.Msg.GetSecret()), poll: 2 * time.Millisecond}
	e.waitFor(b, "the hosts' GPUs", 2*time.Minute, func() bool { return e.count(b, `SELECT COUNT(*) FROM gpus`) == 8**nodesFlag })
	must(b, call(admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "vms",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}}}))))
	must(b, call(admin.Flavors.Create(ctx, connect.NewRequest(&apiv1.CreateFlavorRequest{Name: "small", Vcpus: 1, MemoryMib: 512, DiskGib: 2}))))
	must(b, call(admin.IPPools.Create(ctx, connect.NewRequest(&apiv1.CreateIPPoolRequest{Name: "vms", Cidr: "10.100.0.0/22"}))))
	return e
}

func call[T any](_ T, err error) error { return err }

func must(b testing.TB, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

func (e *env) count(b testing.TB, query string, args ...any) int {
	b.Helper()
	var n int
	must(b, e.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, query, args...).Scan(&n)
	}))
	return n
}

// waitFor polls cond every e.poll up to d: a benchmark measures how long
// things take, so it looks often rather than waiting on events.
func (e *env) waitFor(b testing.TB, what string, d time.Duration, cond func() bool) {
	b.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			b.Fatalf("gave up after %s waiting for %s", d, what)
		}
		time.Sleep(e.poll)
	}
}

// patience is how long one guest may take: TCG boots take minutes on a
// busy machine.
func (e *env) patience() time.Duration {
	if e.real != nil {
		return 10 * time.Minute
	}
	return time.Minute
}

func (e *env) template(b testing.TB, warm int32) string {
	b.Helper()
	e.seq++
	name := fmt.Sprintf("t%d", e.seq)
	must(b, call(e.acme.SandboxTemplates.Create(context.Background(), connect.NewRequest(&apiv1.CreateSandboxTemplateRequest{Tenant: "acme",
		Name: name, Image: "debian-12", Flavor: "small", Pool: "vms", IpPool: "vms", DefaultTtl: durationpb.New(time.Hour),
		MaxTtl: durationpb.New(2 * time.Hour), WarmMin: warm, WarmMax: warm}))))
	return name
}

func (e *env) dropTemplate(b testing.TB, name string) {
	b.Helper()
	must(b, call(e.acme.SandboxTemplates.Delete(context.Background(), connect.NewRequest(&apiv1.DeleteSandboxTemplateRequest{Tenant: "acme", Template: name}))))
}

func (e *env) warmReady(b testing.TB, template string, n int) {
	b.Helper()
	// The periodic sweep would refill within 15 s; the benchmark does
	// not wait for it.
	if err := e.cp.App.Sandboxes.ReconcileWarm(context.Background()); err != nil {
		var nodes []string
		_ = e.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
			rows, err := tx.Query(ctx, `SELECT id, state, liveness FROM nodes`)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var id, st, lv string
				if rows.Scan(&id, &st, &lv) == nil {
					nodes = append(nodes, id+" "+st+"/"+lv)
				}
			}
			return rows.Err()
		})
		b.Fatalf("warm pool refill: %v (nodes: %v)", err, nodes)
	}
	e.waitFor(b, "warm guests", e.patience(), func() bool {
		return e.count(b, `SELECT COUNT(*) FROM sandbox_warm w JOIN instances i ON i.id = w.instance_id JOIN sandbox_templates t ON t.id = w.template_id
			WHERE t.name = $1 AND t.state = 'active' AND i.state = 'running'`, template) >= n
	})
}

// execReady waits until the sandbox runs and its guest answers: a real
// guest runs `true` over SSH; a simulated one's sshd greets.
func (e *env) execReady(b testing.TB, id string) {
	b.Helper()
	must(b, e.execReadyErr(id))
}

// execReadyErr is execReady for other goroutines than the benchmark's.
func (e *env) execReadyErr(id string) error {
	deadline := time.Now().Add(e.patience())
	var sb *apiv1.Sandbox
	for {
		r, err := e.acme.Sandboxes.Get(context.Background(), connect.NewRequest(&apiv1.GetSandboxRequest{Tenant: "acme", Sandbox: id}))
		if err != nil {
			return err
		}
		sb = r.Msg.GetSandbox()
		if sb.GetState() == "failed" || sb.GetState() == "deleted" {
			msg := ""
			if in, err := e.acme.Instances.Get(context.Background(), connect.NewRequest(&apiv1.GetInstanceRequest{Tenant: "acme", Instance: sb.GetInstanceId()})); err == nil {
				msg = in.Msg.GetInstance().GetMessage()
			}
			return fmt.Errorf("sandbox %s is %s: %s", id, sb.GetState(), msg)
		}
		if sb.GetState() == "running" {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox %s still %s after %s", id, sb.GetState(), e.patience())
		}
		time.Sleep(e.poll)
	}
	for {
		err := e.answers(sb)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox %s does not answer: %w", id, err)
		}
		time.Sleep(e.poll)
	}
}

// answers runs `true` in the sandbox the way `sandboxes exec` does: a
// certificate and ticket from the API, the tunnel through the host's
// gateway connection, SSH to the guest pinned by the CA.
func (e *env) answers(sb *apiv1.Sandbox) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t := bctest.GuestTarget{Tenant: "acme", Sandbox: sb.GetId()}
	var (
		res *bctest.GuestExecResult
		err error
	)
	if e.real != nil {
		res, err = e.real.Exec(ctx, t, "true")
	} else {
		// Simulated hosts check the tunnel command's deadline against
		// real time; the control plane's clock is the benchmark's.
		if now := time.Now(); e.cp.Clock.Now().Before(now) {
			e.cp.Clock.Set(now)
		}
		res, err = bctest.GuestExec(ctx, e.acme, e.cp.URL, t, "true")
	}
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("exit %d", res.ExitCode)
	}
	return err
}

func (e *env) create(b testing.TB, template string) *apiv1.Sandbox {
	b.Helper()
	r, err := e.acme.Sandboxes.Create(context.Background(), connect.NewRequest(&apiv1.CreateSandboxRequest{Tenant: "acme", Template: template}))
	must(b, err)
	return r.Msg.GetSandbox()
}

// remove deletes a sandbox and waits until its guest is gone, so the next
// op has the host to itself.
func (e *env) remove(b testing.TB, sb *apiv1.Sandbox) {
	b.Helper()
	must(b, call(e.acme.Sandboxes.Delete(context.Background(), connect.NewRequest(&apiv1.DeleteSandboxRequest{Tenant: "acme", Sandbox: sb.GetId()}))))
	e.waitFor(b, "instance "+sb.GetInstanceId()+" deleted", e.patience(), func() bool {
		return e.count(b, `SELECT COUNT(*) FROM instances WHERE id = $1 AND state = 'deleted'`, sb.GetInstanceId()) == 1
	})
}

// report puts p50 and p99 of the samples on b.
func report(b *testing.B, prefix string, samples []time.Duration) {
	if len(samples) == 0 {
		return
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	q := func(p float64) float64 {
		return float64(s[min(len(s)-1, int(p*float64(len(s))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(q(0.50), prefix+"p50-ms")
	b.ReportMetric(q(0.99), prefix+"p99-ms")
}

// BenchmarkWarmClaim: sandboxes create on a template with a warm guest
// ready → the guest answers. The refill between ops is not timed.
func BenchmarkWarmClaim(b *testing.B) {
	e := newEnv(b)
	t := e.template(b, 1)
	var samples []time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		e.warmReady(b, t, 1)
		b.StartTimer()
		start := time.Now()
		sb := e.create(b, t)
		if sb.GetOrigin() != "warm" {
			b.Fatalf("sandbox %s is %s, not warm", sb.GetId(), sb.GetOrigin())
		}
		e.execReady(b, sb.GetId())
		samples = append(samples, time.Since(start))
		b.StopTimer()
		e.remove(b, sb)
		b.StartTimer()
	}
	b.StopTimer()
	e.dropTemplate(b, t)
	report(b, "", samples)
}

// BenchmarkColdBoot: sandboxes create with no warm pool → SSH ready.
func BenchmarkColdBoot(b *testing.B) {
	e := newEnv(b)
	t := e.template(b, 0)
	var samples []time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		sb := e.create(b, t)
		e.execReady(b, sb.GetId())
		samples = append(samples, time.Since(start))
		b.StopTimer()
		e.remove(b, sb)
		b.StartTimer()
	}
	report(b, "", samples)
}

// BenchmarkSnapshotRestore: on one running sandbox, snapshot (until its
// host answered) → restore → the guest answers again. It reports the
// whole and the restore → exec-ready part.
func BenchmarkSnapshotRestore(b *testing.B) {
	e := newEnv(b)
	t := e.template(b, 0)
	sb := e.create(b, t)
	e.execReady(b, sb.GetId())
	ctx := context.Background()
	var whole, restore []time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		s, err := e.acme.Sandboxes.Snapshot(ctx, connect.NewRequest(&apiv1.SnapshotSandboxRequest{Tenant: "acme", Sandbox: sb.GetId()}))
		must(b, err)
		snap := s.Msg.GetSnapshot().GetId()
		e.waitFor(b, "snapshot "+snap+" ready", e.patience(), func() bool {
			return e.count(b, `SELECT COUNT(*) FROM sandbox_snapshots WHERE id = $1 AND state = 'ready'`, snap) == 1
		})
		rs := time.Now()
		must(b, call(e.acme.Sandboxes.Restore(ctx, connect.NewRequest(&apiv1.RestoreSandboxRequest{Tenant: "acme", Sandbox: sb.GetId(), Snapshot: snap}))))
		e.execReady(b, sb.GetId())
		restore = append(restore, time.Since(rs))
		whole = append(whole, time.Since(start))
	}
	b.StopTimer()
	e.remove(b, sb)
	report(b, "", whole)
	report(b, "restore-", restore)
}

// BenchmarkConcurrentCreates: -concurrent cold creates at once (no warm
// pool) → every guest answers; one op is the whole batch. It reports the
// batch's wall time and each sandbox's create → exec-ready.
func BenchmarkConcurrentCreates(b *testing.B) {
	e := newEnv(b)
	n := *concurrentFlag
	if n == 0 {
		n = 50
		if e.real != nil {
			n = 2
		}
	}
	t := e.template(b, 0)
	var (
		mu      sync.Mutex
		each    []time.Duration
		batches []time.Duration
		errs    []error
	)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		sbs := make([]*apiv1.Sandbox, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := time.Now()
				r, err := e.acme.Sandboxes.Create(context.Background(), connect.NewRequest(&apiv1.CreateSandboxRequest{Tenant: "acme", Template: t}))
				if err == nil {
					sbs[i] = r.Msg.GetSandbox()
					err = e.execReadyErr(sbs[i].GetId())
				}
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					return
				}
				each = append(each, time.Since(s))
			}()
		}
		wg.Wait()
		must(b, errors.Join(errs...))
		batches = append(batches, time.Since(start))
		b.StopTimer()
		for _, sb := range sbs {
			if sb != nil {
				e.remove(b, sb)
			}
		}
		b.StartTimer()
	}
	b.StopTimer()
	report(b, "", each)
	report(b, "batch-", batches)
	b.ReportMetric(float64(n), "sandboxes/op")
}
