package rollout_test

import (
	"context"
	"fmt"
	"strings"
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

// releases is the release store the tests publish to: signed manifests
// by version.
type releases map[string]rollout.Release

func (r releases) Get(_ context.Context, _ store.Querier, version string) (rollout.Release, error) {
	rel, ok := r[version]
	if !ok {
		return rollout.Release{}, fmt.Errorf("release %s: %w", version, rollout.ErrReleaseNotFound)
	}
	return rel, nil
}

func sign(t *testing.T, key release.Key, version string) rollout.Release {
	t.Helper()
	sum := strings.Repeat("ab", 32)
	m := release.Manifest{Schema: release.Schema, Version: version, MinControlPlaneVersion: "v0.1.0", CreatedAt: time.Now().UTC().Truncate(time.Second)}
	for _, p := range []string{"linux-amd64", "linux-arm64"} {
		name := "bcd-" + p
		m.Binaries = append(m.Binaries, release.Binary{Platform: p, Name: name, SHA256: sum, Size: 1 << 20,
			SBOM: release.File{Name: release.SBOMName(name), SHA256: sum, Size: 1024}})
	}
	env, err := release.Sign(m, key)
	require.NoError(t, err)
	return rollout.Release{Version: version, Manifest: env, Platforms: []string{"linux-amd64", "linux-arm64"}}
}

const (
	oldVersion  = "v1.0.0"
	goodVersion = "v1.1.0"
	sickVersion = "v1.2.0" // reports a health finding once back
	goneVersion = "v1.3.0" // never comes back
)

type fixture struct {
	cp     *bctest.ControlPlane
	admin  *client.Client
	sim    *bctest.FleetSim
	poolID string
	// tenantAdmin is the admin key of the nodes' tenant.
	tenantAdmin *client.Client
}

// newFixture runs a control plane without the worker role (the test runs
// the controller) and n fake daemons on oldVersion in acme's pool h100.
func newFixture(t *testing.T, n int) *fixture {
	t.Helper()
	ctx := context.Background()
	cp := bctest.NewControlPlane(t, func(c *app.Config) {
		c.Roles = []string{app.RoleAPI, app.RoleGateway}
		c.UnreachableAfter, c.LostAfter = 1000*time.Hour, 2000*time.Hour
		c.PublicURL = "https://cp.example"
	})
	key, _, err := release.GenerateKey("ed25519")
	require.NoError(t, err)
	cp.App.Rollouts.SetReleases(releases{goodVersion: sign(t, key, goodVersion), sickVersion: sign(t, key, sickVersion),
		goneVersion: sign(t, key, goneVersion)})
	f := &fixture{cp: cp, admin: cp.Admin()}
	_, err = f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	_, err = f.admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "default"}))
	require.NoError(t, err)
	k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "admin"}))
	require.NoError(t, err)
	f.tenantAdmin = cp.Client(k.Msg.GetSecret())
	f.sim, err = bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		Template: bctest.FakeDaemonConfig{Gateway: cp.GatewayAddr, Version: oldVersion, ReleaseKeys: []release.PublicKey{key.Public},
			BadVersions: map[string]bctest.BadVersion{sickVersion: bctest.VersionFinding, goneVersion: bctest.VersionGone}},
		Root: t.TempDir(), N: n,
		Token: func(ctx context.Context, i int) (string, error) {
			tok, err := f.admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "default"}))
			return tok.Msg.GetToken(), err
		},
	})
	require.NoError(t, err)
	t.Cleanup(f.sim.Stop)
	bctest.WaitFor(t, "the nodes' GPUs", func() bool { return f.count(t, `SELECT COUNT(*) FROM gpus`) == 8*n })
	pl, err := f.admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "h100",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}}}))
	require.NoError(t, err)
	f.poolID = pl.Msg.GetPool().GetId()
	bctest.WaitFor(t, "the nodes in the pool", func() bool {
		return f.count(t, `SELECT COUNT(*) FROM node_pools WHERE pool_id = $1`, f.poolID) == n
	})
	bctest.WaitFor(t, "every node ready on "+oldVersion, func() bool {
		return f.count(t, `SELECT COUNT(*) FROM nodes WHERE liveness = 'ready' AND agent_version = $1`, oldVersion) == n
	})
	return f
}

func (f *fixture) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, q, args...).Scan(&n)
	}))
	return n
}

func (f *fixture) create(t *testing.T, version string, waves ...string) *apiv1.Rollout {
	t.Helper()
	r, err := f.admin.Rollouts.Create(context.Background(), connect.NewRequest(&apiv1.CreateRolloutRequest{Release: version, Pool: "h100",
		Waves: waves, MaxUnavailable: 2, PauseBetween: durationpb.New(10 * time.Minute), Soak: durationpb.New(2 * time.Minute)}))
	require.NoError(t, err)
	return r.Msg.GetRollout()
}

func (f *fixture) get(t *testing.T, id string) *apiv1.Rollout {
	t.Helper()
	r, err := f.admin.Rollouts.Get(context.Background(), connect.NewRequest(&apiv1.GetRolloutRequest{Id: id}))
	require.NoError(t, err)
	return r.Msg.GetRollout()
}

// drive runs the controller until done says so. Time moves only while no
// node is upgrading (so no upgrade's deadline passes on the sim clock):
// to a soaking node's end of soak, or to the next wave's start.
func (f *fixture) drive(t *testing.T, id, what string, done func(r *apiv1.Rollout) bool) *apiv1.Rollout {
	t.Helper()
	var last *apiv1.Rollout
	bctest.WaitFor(t, what, func() bool {
		_, err := f.cp.App.Rollouts.Control(context.Background())
		require.NoError(t, err)
		last = f.get(t, id)
		if done(last) {
			return true
		}
		if last.GetState() == rollout.StateRunning && last.GetNodeStates()[rollout.NodeUpgrading] == 0 {
			if last.GetNodeStates()[rollout.NodeSoaking] > 0 {
				f.cp.Clock.Advance(2 * time.Minute)
			} else if strings.HasPrefix(last.GetMessage(), "wave ") {
				f.cp.Clock.Advance(10 * time.Minute)
			}
		}
		return false
	})
	return last
}

func (f *fixture) events(t *testing.T, id string) []string {
	t.Helper()
	var out []string
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		rows, err := tx.Query(ctx, `SELECT type FROM events WHERE resource_id = $1 ORDER BY seq`, id)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				return err
			}
			out = append(out, s)
		}
		return rows.Err()
	}))
	return out
}

func nodesIn(r *apiv1.Rollout, wave int) []*apiv1.RolloutNode {
	var out []*apiv1.RolloutNode
	for _, n := range r.GetNodes() {
		if int(n.GetWave()) == wave {
			out = append(out, n)
		}
	}
	return out
}

// TestRolloutCompletes: three waves (1, 50%, 100% of 4 nodes) upgrade
// every node, each back on the release before the next wave starts.
func TestRolloutCompletes(t *testing.T) {
	f := newFixture(t, 4)
	r := f.create(t, goodVersion, "1", "50%", "100%")
	require.Equal(t, []int32{1, 1, 2}, r.GetWaveNodes())
	require.Equal(t, rollout.StateRunning, r.GetState())
	require.Len(t, r.GetNodes(), 4)
	for i := 1; i < 4; i++ {
		require.Less(t, r.GetNodes()[i-1].GetNode(), r.GetNodes()[i].GetNode(), "nodes by name")
	}
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM audit_log WHERE action = 'rollouts.create' AND resource_id = $1`, r.GetId()))

	r = f.drive(t, r.GetId(), "the rollout to complete", func(r *apiv1.Rollout) bool { return r.GetState() == rollout.StateCompleted })
	require.Equal(t, int32(4), r.GetNodeStates()[rollout.NodeDone])
	require.Equal(t, 4, f.count(t, `SELECT COUNT(*) FROM nodes WHERE agent_version = $1 AND liveness = 'ready'`, goodVersion))
	require.Equal(t, 4, f.count(t, `SELECT COUNT(*) FROM commands WHERE kind = 'daemon.upgrade' AND state = 'succeeded'`))
	var params string
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT params FROM commands WHERE kind = 'daemon.upgrade' LIMIT 1`).Scan(&params)
	}))
	require.Contains(t, params, `https://cp.example/downloads/bcd/`+goodVersion+`/linux-`)
	require.Contains(t, params, `"rollout":"`+r.GetId()+`"`)
	require.Equal(t, []string{"rollout.created",
		"rollout.wave_started", "rollout.wave_completed", "rollout.wave_started", "rollout.wave_completed",
		"rollout.wave_started", "rollout.wave_completed", "rollout.completed"}, f.events(t, r.GetId()))
	for _, n := range r.GetNodes() {
		require.Equal(t, oldVersion, n.GetFromVersion())
	}

	// The pool is free again: another rollout (to the same version: the
	// nodes answer at once, restarting nothing) may start.
	r2 := f.create(t, goodVersion, "100%")
	r2 = f.drive(t, r2.GetId(), "the no-op rollout to complete", func(r *apiv1.Rollout) bool { return r.GetState() == rollout.StateCompleted })
	require.Equal(t, int32(4), r2.GetNodeStates()[rollout.NodeDone])
}

// TestRolloutHaltsOnHealthFinding: the first wave's node comes back on a
// bad release and reports a finding: the rollout halts, the node rolls
// back to its previous version, later waves are never touched.
func TestRolloutHaltsOnHealthFinding(t *testing.T) {
	f := newFixture(t, 3)
	r := f.create(t, sickVersion, "1", "100%")
	r = f.drive(t, r.GetId(), "the rollout to halt", func(r *apiv1.Rollout) bool { return r.GetState() != rollout.StateRunning })
	require.Equal(t, rollout.StateHalted, r.GetState(), r.GetMessage())
	require.Contains(t, r.GetMessage(), "health finding")
	r = f.drive(t, r.GetId(), "the wave to roll back", func(r *apiv1.Rollout) bool { return r.GetState() == rollout.StateRolledBack })
	first := nodesIn(r, 0)
	require.Len(t, first, 1)
	require.Equal(t, rollout.NodeFailed, first[0].GetState())
	require.NotEmpty(t, first[0].GetRollbackCommandId())
	for _, n := range nodesIn(r, 1) {
		require.Equal(t, rollout.NodePending, n.GetState(), "later waves untouched")
		require.Empty(t, n.GetCommandId())
	}
	require.Equal(t, 3, f.count(t, `SELECT COUNT(*) FROM nodes WHERE agent_version = $1`, oldVersion), "every node on the old version")
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM commands WHERE kind = 'daemon.upgrade'`))
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM commands WHERE kind = 'daemon.rollback' AND state = 'succeeded'`))
	evs := f.events(t, r.GetId())
	require.Contains(t, evs, "rollout.halted")
	require.Equal(t, "rollout.rolled_back", evs[len(evs)-1])
}

// TestRolloutHaltsOnNodeNotBack: a node that never returns from its
// upgrade halts the rollout once revert_after and the margin pass; bcd
// restores its previous binary by itself, and the rollback completes.
func TestRolloutHaltsOnNodeNotBack(t *testing.T) {
	f := newFixture(t, 2)
	r := f.create(t, goneVersion, "1", "100%")
	first := r.GetNodes()[0]
	bctest.WaitFor(t, "the first node to go away", func() bool {
		_, err := f.cp.App.Rollouts.Control(context.Background())
		require.NoError(t, err)
		return f.count(t, `SELECT COUNT(*) FROM nodes WHERE id = $1 AND liveness <> 'ready'`, first.GetNodeId()) == 1
	})
	_, err := f.cp.App.Rollouts.Control(context.Background())
	require.NoError(t, err)
	require.Equal(t, rollout.StateRunning, f.get(t, r.GetId()).GetState(), "not halted before the deadline")
	f.cp.Clock.Advance(rollout.DefaultRevertAfter + 2*time.Minute)
	_, err = f.cp.App.Rollouts.Control(context.Background())
	require.NoError(t, err)
	r = f.get(t, r.GetId())
	require.Equal(t, rollout.StateHalted, r.GetState())
	require.Contains(t, r.GetMessage(), "not back")

	// bcd's own revert: the node starts again on the version it ran.
	var d *bctest.FakeDaemon
	for _, x := range f.sim.Daemons {
		if x.Version() == goneVersion {
			d = x
		}
	}
	require.NotNil(t, d)
	nd, err := d.RestartWith(func(c *bctest.FakeDaemonConfig) { c.Version = c.PreviousVersion })
	require.NoError(t, err)
	t.Cleanup(func() { _ = nd.Stop() })
	r = f.drive(t, r.GetId(), "the rollback to complete", func(r *apiv1.Rollout) bool { return r.GetState() == rollout.StateRolledBack })
	require.Equal(t, rollout.NodePending, nodesIn(r, 1)[0].GetState())
}

// TestRolloutPauseResumeAbort: a paused rollout sends nothing; resumed it
// goes on; aborted it stops where it is, rolling nothing back.
func TestRolloutPauseResumeAbort(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, 3)
	r := f.create(t, goodVersion, "1", "100%")
	p, err := f.admin.Rollouts.Pause(ctx, connect.NewRequest(&apiv1.PauseRolloutRequest{Id: r.GetId()}))
	require.NoError(t, err)
	require.Equal(t, rollout.StatePaused, p.Msg.GetRollout().GetState())
	_, err = f.cp.App.Rollouts.Control(ctx)
	require.NoError(t, err)
	require.Equal(t, 0, f.count(t, `SELECT COUNT(*) FROM commands WHERE kind = 'daemon.upgrade'`), "paused: nothing sent")
	_, err = f.admin.Rollouts.Pause(ctx, connect.NewRequest(&apiv1.PauseRolloutRequest{Id: r.GetId()}))
	require.Equal(t, "FAILED_PRECONDITION", client.Code(err))

	_, err = f.admin.Rollouts.Resume(ctx, connect.NewRequest(&apiv1.ResumeRolloutRequest{Id: r.GetId()}))
	require.NoError(t, err)
	r = f.drive(t, r.GetId(), "the first wave to complete", func(r *apiv1.Rollout) bool { return r.GetCurrentWave() == 1 })
	a, err := f.admin.Rollouts.Abort(ctx, connect.NewRequest(&apiv1.AbortRolloutRequest{Id: r.GetId()}))
	require.NoError(t, err)
	require.Equal(t, rollout.StateAborted, a.Msg.GetRollout().GetState())
	f.cp.Clock.Advance(time.Hour)
	_, err = f.cp.App.Rollouts.Control(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM commands WHERE kind = 'daemon.upgrade'`), "aborted: the second wave is never sent")
	require.Equal(t, 0, f.count(t, `SELECT COUNT(*) FROM commands WHERE kind = 'daemon.rollback'`), "abort rolls nothing back")
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM nodes WHERE agent_version = $1`, goodVersion))
	_, err = f.admin.Rollouts.Resume(ctx, connect.NewRequest(&apiv1.ResumeRolloutRequest{Id: r.GetId()}))
	require.Equal(t, "FAILED_PRECONDITION", client.Code(err))
	require.Equal(t, []string{"rollout.created", "rollout.paused", "rollout.resumed", "rollout.wave_started", "rollout.wave_completed",
		"rollout.aborted"}, f.events(t, r.GetId()))

	l, err := f.admin.Rollouts.List(ctx, connect.NewRequest(&apiv1.ListRolloutsRequest{Pool: "h100", State: rollout.StateAborted}))
	require.NoError(t, err)
	require.Len(t, l.Msg.GetRollouts(), 1)
}

// TestRolloutRefusals: bad requests are refused with the field, nothing
// is written; a tenant's key (even its admin's) is denied every call.
func TestRolloutRefusals(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, 1)
	for _, tc := range []struct {
		req   *apiv1.CreateRolloutRequest
		field string
	}{
		{&apiv1.CreateRolloutRequest{Pool: "h100", Waves: []string{"100%"}}, "release"},
		{&apiv1.CreateRolloutRequest{Release: "v9.9.9", Pool: "h100", Waves: []string{"100%"}}, "release"},
		{&apiv1.CreateRolloutRequest{Release: goodVersion, Pool: "nope", Waves: []string{"100%"}}, "pool"},
		{&apiv1.CreateRolloutRequest{Release: goodVersion, Pool: "h100"}, "waves"},
		{&apiv1.CreateRolloutRequest{Release: goodVersion, Pool: "h100", Waves: []string{"50%", "10%"}}, "waves"},
		{&apiv1.CreateRolloutRequest{Release: goodVersion, Pool: "h100", Waves: []string{"1", "50%"}}, "waves"},
		{&apiv1.CreateRolloutRequest{Release: goodVersion, Pool: "h100", Waves: []string{"100%"}, MaxUnavailable: -1}, "max_unavailable"},
		{&apiv1.CreateRolloutRequest{Release: goodVersion, Pool: "h100", Waves: []string{"100%"}, Soak: durationpb.New(-time.Second)}, "soak"},
		{&apiv1.CreateRolloutRequest{Release: goodVersion, Pool: "h100", Waves: []string{"100%"}, RevertAfter: durationpb.New(time.Second)}, "revert_after"},
		{&apiv1.CreateRolloutRequest{Release: goodVersion, Pool: "h100", Waves: []string{"100%"}, PauseBetween: durationpb.New(1500 * time.Millisecond)}, "pause_between"},
	} {
		_, err := f.admin.Rollouts.Create(ctx, connect.NewRequest(tc.req))
		require.Equal(t, "INVALID_ARGUMENT", client.Code(err), tc.field)
		require.Contains(t, err.Error(), tc.field)
	}
	require.Equal(t, 0, f.count(t, `SELECT COUNT(*) FROM rollouts`), "nothing written")

	r := f.create(t, goodVersion, "100%")
	_, err := f.admin.Rollouts.Create(ctx, connect.NewRequest(&apiv1.CreateRolloutRequest{Release: goodVersion, Pool: f.poolID, Waves: []string{"100%"}}))
	require.Equal(t, "FAILED_PRECONDITION", client.Code(err), "one active rollout per pool")
	require.Contains(t, err.Error(), "already has an active rollout")

	// The nodes' own tenant admin may neither start, read nor stop one.
	c := f.tenantAdmin
	_, err = c.Rollouts.Create(ctx, connect.NewRequest(&apiv1.CreateRolloutRequest{Release: goodVersion, Pool: f.poolID, Waves: []string{"100%"}}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err))
	_, err = c.Rollouts.Get(ctx, connect.NewRequest(&apiv1.GetRolloutRequest{Id: r.GetId()}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err))
	_, err = c.Rollouts.List(ctx, connect.NewRequest(&apiv1.ListRolloutsRequest{}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err))
	_, err = c.Rollouts.Pause(ctx, connect.NewRequest(&apiv1.PauseRolloutRequest{Id: r.GetId()}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err))
	_, err = c.Rollouts.Abort(ctx, connect.NewRequest(&apiv1.AbortRolloutRequest{Id: r.GetId()}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err))
	require.Equal(t, rollout.StateRunning, f.get(t, r.GetId()).GetState())
	_, err = f.admin.Rollouts.Get(ctx, connect.NewRequest(&apiv1.GetRolloutRequest{Id: "rol_nope"}))
	require.NotNil(t, err)
}
