package providerpools_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/bctest/hcloudemu"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/capacity/usage"
	"github.com/better-compute/better-compute/internal/providerpools"
	"github.com/better-compute/better-compute/internal/providers"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vps"
)

// noWorkers runs the control plane without the worker role: the test runs
// the provider pools' jobs itself (Converge, Reconcile), one step at a
// time, instead of waiting for River to.
func noWorkers(c *app.Config) { c.Roles = []string{app.RoleAPI, app.RoleGateway} }

type fixture struct {
	cp      *bctest.ControlPlane
	emu     *hcloudemu.Server
	admin   *client.Client
	acme    *client.Client
	acmeKey string
	globex  *client.Client
}

func setup(t *testing.T) *fixture {
	t.Helper()
	emu := hcloudemu.New(t)
	cp := bctest.NewControlPlane(t, noWorkers)
	f := &fixture{cp: cp, emu: emu, admin: cp.Admin()}
	ctx := context.Background()
	for _, n := range []string{"acme", "globex"} {
		_, err := f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: n}))
		require.NoError(t, err)
		_, err = f.admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: n, Name: "default"}))
		require.NoError(t, err)
	}
	key := func(tenant string) string {
		k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: tenant, Role: "admin"}))
		require.NoError(t, err)
		return k.Msg.GetSecret()
	}
	f.acmeKey = key("acme")
	f.acme, f.globex = cp.Client(f.acmeKey), cp.Client(key("globex"))
	_, err := f.acme.Secrets.Put(ctx, connect.NewRequest(&apiv1.PutSecretRequest{Tenant: "acme", Name: "hc-token", Value: []byte(emu.Token())}))
	require.NoError(t, err)
	// The emulator's endpoint is a loopback URL: only the platform admin
	// may point an account there.
	_, err = f.admin.ProviderAccounts.Create(ctx, connect.NewRequest(&apiv1.CreateProviderAccountRequest{Tenant: "acme", Name: "hc",
		Type: "hetzner-cloud", Endpoint: emu.Endpoint(), SecretRefs: map[string]string{"token": "secret://hc-token"}}))
	require.NoError(t, err)
	_, err = f.acme.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "hcloud-fsn",
		Policy: &apiv1.PoolPolicy{Provider: &apiv1.ProviderPolicy{Account: "hc", ServerType: "cx22", Image: "ubuntu-24.04", Location: "fsn1"}}}))
	require.NoError(t, err)
	return f
}

func (f *fixture) create(t *testing.T, name string) *apiv1.Instance {
	t.Helper()
	res, err := f.acme.Instances.Create(context.Background(), connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: name,
		Pool: "hcloud-fsn", SshKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHh0ZXN0a2V5Zm9ydGhlcHJvdmlkZXJwb29sdGVzdHM1 t@x"}}))
	require.NoError(t, err)
	return res.Msg.GetInstance()
}

func (f *fixture) get(t *testing.T, id string) *apiv1.Instance {
	t.Helper()
	res, err := f.acme.Instances.Get(context.Background(), connect.NewRequest(&apiv1.GetInstanceRequest{Tenant: "acme", Instance: id}))
	require.NoError(t, err)
	return res.Msg.GetInstance()
}

func (f *fixture) events(t *testing.T, typ string) int {
	t.Helper()
	var n int
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM events WHERE type = $1`, typ).Scan(&n)
	}))
	return n
}

// provider is the account's provider as the control plane builds it: the
// test's hand at the provider behind the control plane's back.
func (f *fixture) provider(t *testing.T) providers.Provider {
	t.Helper()
	fac, ok := providers.Lookup("hetzner-cloud")
	require.True(t, ok)
	p, err := fac.New(providers.Config{Endpoint: f.emu.Endpoint(), Credentials: map[string]string{"token": f.emu.Token()},
		ControlPlaneID: f.cp.PKI.TrustDomain()})
	require.NoError(t, err)
	return p
}

func refused(t *testing.T, err error, code, field, reason string) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, code, client.Code(err), "err: %v", err)
	d := client.Detail(err)
	if field == "" {
		require.Contains(t, d.GetMessage(), reason)
		return
	}
	for _, v := range d.GetViolations() {
		if v.GetField() == field {
			require.Contains(t, v.GetReason(), reason)
			return
		}
	}
	t.Fatalf("no violation of %s in %v", field, d.GetViolations())
}

// TestProviderPool: an instance of a Hetzner Cloud provider pool is a
// server made through the API outside the create's transaction, whose
// cloud-init carries a join token; the simulated bcd joins with it and the
// instance runs, metered; stop, start and delete reach the provider, and
// the emulator's server list is empty after. Another tenant sees none of
// it and cannot use the account or the pool.
func TestProviderPool(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	pp := f.cp.App.ProviderPools

	// Bad input names the field and writes nothing.
	for _, c := range []struct {
		mut           func(*apiv1.CreateInstanceRequest)
		field, reason string
	}{
		{func(r *apiv1.CreateInstanceRequest) { r.Flavor = "small" }, "flavor", "give no flavor"},
		{func(r *apiv1.CreateInstanceRequest) { r.IpPool = "lan" }, "ip_pool", "provider's addresses"},
		{func(r *apiv1.CreateInstanceRequest) { r.UserData = "#cloud-config\n" }, "user_data", "give no user data"},
		{func(r *apiv1.CreateInstanceRequest) {
			r.Volumes = []*apiv1.InstanceVolumeSpec{{Name: "data", SizeGib: 10}}
		}, "volumes", "give no volumes"},
	} {
		req := &apiv1.CreateInstanceRequest{Tenant: "acme", Name: "bad", Pool: "hcloud-fsn"}
		c.mut(req)
		_, err := f.acme.Instances.Create(ctx, connect.NewRequest(req))
		refused(t, err, "INVALID_ARGUMENT", c.field, c.reason)
	}
	require.Zero(t, f.events(t, "instance.created"))
	// A pool must name an account of its own tenant.
	_, err := f.globex.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "globex", Name: "steal",
		Policy: &apiv1.PoolPolicy{Provider: &apiv1.ProviderPolicy{Account: "hc", ServerType: "cx22", Image: "ubuntu-24.04"}}}))
	refused(t, err, "INVALID_ARGUMENT", "policy.provider.account", "no provider account")
	_, err = f.acme.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "nothing",
		Policy: &apiv1.PoolPolicy{Provider: &apiv1.ProviderPolicy{Account: "hc"}}}))
	refused(t, err, "INVALID_ARGUMENT", "policy.provider.server_type", "is required")
	// Another tenant cannot create in acme's provider pool: to globex it
	// is no pool at all, so its create is a guest's, refused for want of
	// its own IP pool, and nothing names acme's pool.
	_, err = f.globex.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "globex", Name: "x", Pool: "hcloud-fsn"}))
	require.Error(t, err)
	require.NotContains(t, err.Error(), "provider")
	require.Zero(t, f.events(t, "instance.created"))

	in := f.create(t, "web")
	require.Equal(t, vps.StatePending, in.GetState())
	require.Zero(t, f.emu.Servers(), "the create's transaction calls no provider")

	require.NoError(t, pp.Converge(ctx, in.GetId()))
	srv, ok := f.emu.Find(vps.HostID(in.GetId()))
	require.True(t, ok)
	require.Equal(t, in.GetId(), srv.Labels[providers.InstanceLabel])
	require.Equal(t, "cx22", srv.ServerType)
	require.Equal(t, "ubuntu-24.04", srv.Image)
	got := f.get(t, in.GetId())
	require.Equal(t, vps.StateBooting, got.GetState())
	require.Equal(t, fmt.Sprint(srv.ID), got.GetProviderServerId())
	require.NotEmpty(t, got.GetAddress())

	// The server's bcd joins with the token in its user data.
	token, ok := providerpools.TokenFromCloudInit(srv.UserData)
	require.True(t, ok, "user data: %s", srv.UserData)
	require.Contains(t, srv.UserData, "--server "+f.cp.GatewayAddr)
	d, err := bctest.NewFakeDaemon(bctest.FakeDaemonConfig{StateDir: t.TempDir(), Gateway: f.cp.GatewayAddr, Clock: f.cp.Clock})
	require.NoError(t, err)
	require.NoError(t, d.Join(ctx, token))
	n, err := pp.Reconcile(ctx)
	require.NoError(t, err)
	require.LessOrEqual(t, n, 1, "the periodic reconcile (on wall time) may have run first")
	got = f.get(t, in.GetId())
	require.Equal(t, vps.StateRunning, got.GetState())
	require.NotEmpty(t, got.GetNodeName())
	// The node is acme's, labelled with the instance, in no pool.
	nodes, err := f.acme.Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Len(t, nodes.Msg.GetNodes(), 1)
	require.Equal(t, in.GetId(), nodes.Msg.GetNodes()[0].GetLabels()[providers.InstanceLabel])
	require.Empty(t, nodes.Msg.GetNodes()[0].GetPool())

	// globex sees nothing of it.
	_, err = f.globex.Instances.Get(ctx, connect.NewRequest(&apiv1.GetInstanceRequest{Tenant: "globex", Instance: in.GetId()}))
	require.Equal(t, "NOT_FOUND", client.Code(err))
	_, err = f.globex.Instances.Delete(ctx, connect.NewRequest(&apiv1.DeleteInstanceRequest{Tenant: "globex", Instance: in.GetId()}))
	require.Equal(t, "NOT_FOUND", client.Code(err))

	// Stop and start reach the provider.
	_, err = f.acme.Instances.Stop(ctx, connect.NewRequest(&apiv1.StopInstanceRequest{Tenant: "acme", Instance: in.GetId()}))
	require.NoError(t, err)
	require.NoError(t, pp.Converge(ctx, in.GetId()))
	srv, _ = f.emu.Find(vps.HostID(in.GetId()))
	require.Equal(t, "off", srv.Status)
	require.Equal(t, vps.StateStopped, f.get(t, in.GetId()).GetState())
	_, err = f.acme.Instances.Start(ctx, connect.NewRequest(&apiv1.StartInstanceRequest{Tenant: "acme", Instance: in.GetId()}))
	require.NoError(t, err)
	require.NoError(t, pp.Converge(ctx, in.GetId()))
	require.Equal(t, vps.StateRunning, f.get(t, in.GetId()).GetState())

	// Metered from the join: two closed hours of instance.cx22.hours.
	f.cp.Clock.Advance(2 * time.Hour)
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := usage.Rollup(ctx, tx, f.cp.Clock.Now(), nil, providerpools.Intervals)
		return err
	}))
	var hours float64
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COALESCE(SUM(quantity), 0) FROM usage_windows WHERE reservation_id = $1 AND metric = $2`,
			in.GetId(), usage.InstanceMetric("cx22")).Scan(&hours)
	}))
	require.InDelta(t, 1.0, hours, 1.0, "at least one closed hour")
	require.Greater(t, hours, 0.9)

	_, err = f.acme.Instances.Delete(ctx, connect.NewRequest(&apiv1.DeleteInstanceRequest{Tenant: "acme", Instance: in.GetId()}))
	require.NoError(t, err)
	require.Equal(t, vps.StateDeleting, f.get(t, in.GetId()).GetState())
	require.NoError(t, pp.Converge(ctx, in.GetId()))
	require.Equal(t, vps.StateDeleted, f.get(t, in.GetId()).GetState())
	require.Zero(t, f.emu.Servers(), "the emulator's server list is empty")
}

// TestProviderPoolChurn: 100 creates against a provider that rate-limits
// and loses an answer, with the control plane cut off mid-way (PostgreSQL:
// killed, and a new replica takes over), end with one server per instance;
// the reconciler deletes a server no instance owns and replaces one that
// vanished before its bcd joined; deleting them all empties the account.
func TestProviderPoolChurn(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	const n = 100
	ids := make([]string, n)
	for i := range ids {
		ids[i] = f.create(t, fmt.Sprintf("w%03d", i)).GetId()
	}
	f.emu.RateLimitNext(40)
	f.emu.LoseNextCreate()

	// Round one is cut off once a third of the servers exist: calls in
	// flight lose their answers, and commits after them never happen.
	cut, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	work := make(chan string)
	pp := f.cp.App.ProviderPools
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				_ = pp.Converge(cut, id) // refusals and cut calls are retried below
				if f.emu.Servers() >= n/3 {
					cancel()
				}
			}
		}()
	}
	for _, id := range ids {
		select {
		case work <- id:
		case <-cut.Done():
		}
	}
	close(work)
	wg.Wait()
	cancel()
	if f.cp.ReplicaURL != "" {
		f.cp.Kill(t)
		f.cp = f.cp.NewReplica(t, noWorkers)
		f.acme = f.cp.Client(f.acmeKey)
		pp = f.cp.App.ProviderPools
	}
	// A cut job's lease runs out.
	f.cp.Clock.Advance(providerpools.LeaseDuration + time.Minute)

	// Then every instance converges, each retried as River would.
	booting := func() int {
		c := 0
		for _, id := range ids {
			if f.get(t, id).GetState() == vps.StateBooting {
				c++
			}
		}
		return c
	}
	for round := 0; round < 20 && booting() < n; round++ {
		// A refusal (a rate limit's snooze) is tried again next round.
		convergeAll(ctx, pp, f.with(t, ids, vps.StatePending))
	}
	require.Equal(t, n, booting(), "every instance has its server")
	require.Equal(t, n, f.emu.Servers(), "no instance has two")
	seen := map[string]bool{}
	for _, id := range ids {
		in := f.get(t, id)
		require.False(t, seen[in.GetProviderServerId()], "server %s is two instances'", in.GetProviderServerId())
		seen[in.GetProviderServerId()] = true
		srv, ok := f.emu.Find(vps.HostID(id))
		require.True(t, ok)
		require.Equal(t, in.GetProviderServerId(), fmt.Sprint(srv.ID))
	}

	// An orphan (a server of this control plane no instance owns) is
	// deleted; a server gone before its bcd joined is made again.
	p := f.provider(t)
	_, err := p.Create(ctx, providers.CreateRequest{InstanceID: "ins_orphan0000000000000000", Name: "orphan", ServerType: "cx22",
		Image: "ubuntu-24.04", Location: "fsn1"})
	require.NoError(t, err)
	require.NoError(t, p.Delete(ctx, ids[7]))
	_, err = f.cp.App.ProviderPools.Reconcile(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, f.events(t, "provider.server_orphan_deleted"))
	require.Equal(t, vps.StatePending, f.get(t, ids[7]).GetState())
	require.Equal(t, 1, f.events(t, "instance.server_recreating"))
	require.NoError(t, pp.Converge(ctx, ids[7]))
	require.Equal(t, vps.StateBooting, f.get(t, ids[7]).GetState())
	require.Equal(t, n, f.emu.Servers())

	for _, id := range ids {
		_, err := f.acme.Instances.Delete(ctx, connect.NewRequest(&apiv1.DeleteInstanceRequest{Tenant: "acme", Instance: id}))
		require.NoError(t, err)
	}
	for round := 0; round < 5 && f.emu.Servers() > 0; round++ {
		convergeAll(ctx, pp, f.with(t, ids, vps.StateDeleting))
	}
	require.Zero(t, f.emu.Servers(), "no orphan is left")
	for _, id := range ids {
		require.Equal(t, vps.StateDeleted, f.get(t, id).GetState())
	}
}

// with lists the instances of ids in state.
func (f *fixture) with(t *testing.T, ids []string, state string) []string {
	t.Helper()
	var out []string
	for _, id := range ids {
		if f.get(t, id).GetState() == state {
			out = append(out, id)
		}
	}
	return out
}

// convergeAll converges ids on eight workers, as River's would: a
// provider's create waits on its action, so one at a time is slow.
func convergeAll(ctx context.Context, pp *providerpools.Module, ids []string) {
	work := make(chan string)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				_ = pp.Converge(ctx, id)
			}
		}()
	}
	for _, id := range ids {
		work <- id
	}
	close(work)
	wg.Wait()
}
