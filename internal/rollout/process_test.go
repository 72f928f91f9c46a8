package rollout_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/release"
	"github.com/better-compute/better-compute/internal/rollout"
	"github.com/better-compute/better-compute/internal/store"
)

// Versions the real-process test builds from this source.
const (
	procV1  = "v0.9.1-rig"
	procV2  = "v0.9.2-rig"
	procBad = "v0.9.3-rig"
)

// buildBcd builds cmd/bcd as version into dir (stripped: twenty copies
// and their kept previous binaries are on disk at once), with extra
// -X settings.
func buildBcd(t *testing.T, dir, version string, x ...string) string {
	t.Helper()
	out := filepath.Join(dir, "bcd-linux-"+runtime.GOARCH)
	flags := "-s -w -X main.version=" + version
	for _, s := range x {
		flags += " -X " + s
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	b, err := exec.Command("go", "build", "-ldflags", flags, "-o", out, "../../cmd/bcd").CombinedOutput()
	require.NoError(t, err, string(b))
	return out
}

// publish signs the binary at bin as version with key and publishes it
// through ReleaseService, as `release sign` and `releases create` do.
func publish(t *testing.T, c *client.Client, key release.Key, version, bin string) {
	t.Helper()
	m, sboms, err := release.Assemble(version, "v0.0.0", time.Now(), []release.Input{{Platform: "linux-" + runtime.GOARCH, Path: bin}})
	require.NoError(t, err)
	env, err := release.Sign(m, key)
	require.NoError(t, err)
	f, err := os.Open(bin)
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	files := []client.ReleaseFile{{Name: filepath.Base(bin), Content: f}}
	for _, s := range sboms {
		files = append(files, client.ReleaseFile{Name: s.Name, Content: strings.NewReader(string(s.Data))})
	}
	_, err = c.CreateRelease(context.Background(), string(env), files, "")
	require.NoError(t, err)
}

// TestRolloutRealBcds is the acceptance of rollouts: twenty real bcd
// processes (fake hardware) on v1 are upgraded to a signed v2, published
// in the control plane and downloaded from its /downloads, in three
// waves; each process replaces its own executable and re-execs. Then a
// v3 whose fake GPUs come up broken (a finding the health check sees)
// halts in wave 1 and is rolled back; the other nodes never get it. A
// tampered v2 is refused by the control plane and would be by bcd. Slow
// (three builds, twenty processes): BC_RIG=1.
func TestRolloutRealBcds(t *testing.T) {
	if os.Getenv("BC_RIG") != "1" {
		t.Skip("set BC_RIG=1 to roll real bcd processes")
	}
	if runtime.GOOS != "linux" {
		t.Skip("bcd re-execs itself on linux only")
	}
	const n = 20
	ctx := context.Background()
	work := t.TempDir()
	v1 := buildBcd(t, filepath.Join(work, "v1"), procV1)
	v2 := buildBcd(t, filepath.Join(work, "v2"), procV2)
	bad := buildBcd(t, filepath.Join(work, "v3"), procBad,
		"github.com/better-compute/better-compute/internal/agent/hw/fake.buildFault=ecc_uncorrectable:0")

	key, _, err := release.GenerateKey(release.AlgEd25519)
	require.NoError(t, err)
	pub := filepath.Join(work, "release.pub")
	require.NoError(t, os.WriteFile(pub, key.Public.PEM(), 0o644))

	// Nodes download from the control plane's public URL; the test's
	// control plane listens on a port chosen at start, so the public URL
	// is a proxy to it, known before.
	var api atomic.Pointer[url.URL]
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httputil.NewSingleHostReverseProxy(api.Load()).ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	cp := bctest.NewControlPlane(t, func(c *app.Config) {
		c.Roles = []string{app.RoleAPI, app.RoleGateway}
		c.UnreachableAfter, c.LostAfter = 1000*time.Hour, 2000*time.Hour
		c.PublicURL = front.URL
		c.ReleasePubkeys = []string{pub}
	})
	u, err := url.Parse(cp.URL)
	require.NoError(t, err)
	api.Store(u)
	admin := cp.Admin()

	publish(t, admin, key, procV2, v2)
	publish(t, admin, key, procBad, bad)
	// A release whose binary is not the one signed is refused, and
	// nothing of it is kept.
	m, sboms, err := release.Assemble("v0.9.4-rig", "v0.0.0", time.Now(), []release.Input{{Platform: "linux-" + runtime.GOARCH, Path: v2}})
	require.NoError(t, err)
	env, err := release.Sign(m, key)
	require.NoError(t, err)
	tampered, err := os.ReadFile(v2)
	require.NoError(t, err)
	tampered[len(tampered)/2] ^= 0xff
	_, err = admin.CreateRelease(ctx, string(env), []client.ReleaseFile{{Name: filepath.Base(v2), Content: strings.NewReader(string(tampered))},
		{Name: sboms[0].Name, Content: strings.NewReader(string(sboms[0].Data))}}, "")
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "the signed manifest pins")
	_, err = admin.Releases.Get(ctx, connect.NewRequest(&apiv1.GetReleaseRequest{Version: "v0.9.4-rig"}))
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err), "nothing of a refused release is kept")

	_, err = admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "default"}))
	require.NoError(t, err)

	fixture, err := filepath.Abs("../agent/sysfs/testdata/dgx2s")
	require.NoError(t, err)
	exes := make([]string, n)
	for i := range n {
		dir := filepath.Join(work, fmt.Sprintf("node%02d", i))
		exes[i] = filepath.Join(dir, "bin", "bcd")
		require.NoError(t, os.MkdirAll(filepath.Dir(exes[i]), 0o755))
		require.NoError(t, os.MkdirAll(filepath.Join(dir, "cgroup"), 0o755))
		b, err := os.ReadFile(v1)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(exes[i], b, 0o755))
		tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "default"}))
		require.NoError(t, err)
		cmd := exec.Command(exes[i], "--server", cp.GatewayAddr, "--state-dir", filepath.Join(dir, "state"),
			"--hardware", "fake:dgxh100", "--fake-seed", fmt.Sprintf("rollout-rig-%d-%d", os.Getpid(), i),
			"--sysfs-root", fixture, "--cgroup-root", filepath.Join(dir, "cgroup"), "--metrics-listen", "",
			"--log-level", "warn", "--release-pubkey", pub)
		cmd.Env = append(os.Environ(), "BCD_JOIN_TOKEN="+tok.Msg.GetToken())
		logf, err := os.Create(filepath.Join(dir, "bcd.log"))
		require.NoError(t, err)
		cmd.Stdout, cmd.Stderr = logf, logf
		require.NoError(t, cmd.Start())
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait(); _ = logf.Close() }()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			<-exited
			if t.Failed() {
				b, _ := os.ReadFile(logf.Name())
				t.Logf("node%02d log:\n%s", i, b)
			}
		})
	}
	count := func(q string, args ...any) int {
		var c int
		require.NoError(t, cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, q, args...).Scan(&c)
		}))
		return c
	}
	bctest.WaitFor(t, "twenty bcd processes ready on "+procV1, func() bool {
		return count(`SELECT COUNT(*) FROM nodes WHERE liveness = 'ready' AND agent_version = $1`, procV1) == n
	})
	pl, err := admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "h100",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}}}))
	require.NoError(t, err)
	bctest.WaitFor(t, "the nodes in the pool", func() bool {
		return count(`SELECT COUNT(*) FROM node_pools WHERE pool_id = $1`, pl.Msg.GetPool().GetId()) == n
	})

	get := func(id string) *apiv1.Rollout {
		r, err := admin.Rollouts.Get(ctx, connect.NewRequest(&apiv1.GetRolloutRequest{Id: id}))
		require.NoError(t, err)
		return r.Msg.GetRollout()
	}
	// drive runs the controller until done. The control plane's clock
	// follows real time (the processes' deadlines are real), and moves
	// ahead only while no node is upgrading: to a soak's end or the next
	// wave.
	drive := func(id, what string, done func(*apiv1.Rollout) bool) *apiv1.Rollout {
		var last *apiv1.Rollout
		bctest.WaitFor(t, what, func() bool {
			cp.Clock.CatchUp()
			_, err := cp.App.Rollouts.Control(ctx)
			require.NoError(t, err)
			last = get(id)
			if done(last) {
				return true
			}
			if last.GetState() == rollout.StateRunning && last.GetNodeStates()[rollout.NodeUpgrading] == 0 {
				if last.GetNodeStates()[rollout.NodeSoaking] > 0 {
					cp.Clock.Advance(time.Minute)
				} else if strings.HasPrefix(last.GetMessage(), "wave ") {
					cp.Clock.Advance(5 * time.Minute)
				}
			}
			return false
		})
		return last
	}

	cr, err := admin.Rollouts.Create(ctx, connect.NewRequest(&apiv1.CreateRolloutRequest{Release: procV2, Pool: "h100",
		Waves: []string{"1", "50%", "100%"}, MaxUnavailable: 4, PauseBetween: durationpb.New(5 * time.Minute),
		Soak: durationpb.New(time.Minute)}))
	require.NoError(t, err)
	r := cr.Msg.GetRollout()
	require.Equal(t, []int32{1, 9, 10}, r.GetWaveNodes())
	r = drive(r.GetId(), "the rollout of "+procV2+" to complete", func(r *apiv1.Rollout) bool { return r.GetState() != rollout.StateRunning })
	require.Equal(t, rollout.StateCompleted, r.GetState(), r.GetMessage())
	require.Equal(t, n, count(`SELECT COUNT(*) FROM nodes WHERE liveness = 'ready' AND agent_version = $1`, procV2))
	require.Equal(t, n, count(`SELECT COUNT(*) FROM commands WHERE kind = 'daemon.upgrade' AND state = 'succeeded'`))
	want, err := os.ReadFile(v2)
	require.NoError(t, err)
	old, err := os.ReadFile(v1)
	require.NoError(t, err)
	for i, exe := range exes {
		got, err := os.ReadFile(exe)
		require.NoError(t, err)
		require.True(t, string(got) == string(want), "node%02d runs the signed %s binary", i, procV2)
		prev, err := os.ReadFile(exe + ".prev")
		require.NoError(t, err)
		require.True(t, string(prev) == string(old), "node%02d keeps %s", i, procV1)
	}

	// The broken release: wave 1's node comes back with a GPU finding, the
	// rollout halts and rolls that node back to v2; nobody else gets v3.
	cr, err = admin.Rollouts.Create(ctx, connect.NewRequest(&apiv1.CreateRolloutRequest{Release: procBad, Pool: "h100",
		Waves: []string{"1", "50%", "100%"}, MaxUnavailable: 4, PauseBetween: durationpb.New(5 * time.Minute),
		Soak: durationpb.New(time.Minute)}))
	require.NoError(t, err)
	r = drive(cr.Msg.GetRollout().GetId(), "the rollout of "+procBad+" to halt and roll back", func(r *apiv1.Rollout) bool {
		return r.GetState() != rollout.StateRunning && r.GetState() != rollout.StateHalted
	})
	require.Equal(t, rollout.StateRolledBack, r.GetState(), r.GetMessage())
	require.Contains(t, r.GetMessage(), "health finding")
	for _, rn := range r.GetNodes() {
		if rn.GetWave() > 0 {
			require.Equal(t, rollout.NodePending, rn.GetState(), "later waves untouched")
		}
	}
	bctest.WaitFor(t, "every node back on "+procV2, func() bool {
		return count(`SELECT COUNT(*) FROM nodes WHERE liveness = 'ready' AND agent_version = $1`, procV2) == n
	})
	require.Equal(t, 1, count(`SELECT COUNT(*) FROM commands WHERE kind = 'daemon.upgrade' AND params LIKE $1`, "%"+procBad+"%"))
	require.Equal(t, 1, count(`SELECT COUNT(*) FROM commands WHERE kind = 'daemon.rollback' AND state = 'succeeded'`))
	for i, exe := range exes {
		got, err := os.ReadFile(exe)
		require.NoError(t, err)
		require.True(t, string(got) == string(want), "node%02d is back on (or never left) the signed %s binary", i, procV2)
	}
}
