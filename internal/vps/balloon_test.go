package vps_test

import (
	"context"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/vps"
)

// TestFlavorBalloon: a ballooning flavor's fields and the refusals of
// what cannot balloon, each naming its field and writing nothing; another
// tenant does not see the flavor.
func TestFlavorBalloon(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	create := func(req *apiv1.CreateFlavorRequest) (*apiv1.Flavor, error) {
		res, err := f.acme.Flavors.Create(ctx, connect.NewRequest(req))
		if err != nil {
			return nil, err
		}
		return res.Msg.GetFlavor(), nil
	}
	before := f.rows(t)
	for _, c := range []struct {
		name          string
		req           *apiv1.CreateFlavorRequest
		field, reason string
	}{
		{"hugepages", &apiv1.CreateFlavorRequest{Name: "b", Vcpus: 1, MemoryMib: 2048, DiskGib: 1, Hugepages: true, Balloon: true},
			"balloon", "hugepage-backed memory cannot be ballooned"},
		{"gpus", &apiv1.CreateFlavorRequest{Name: "b", Vcpus: 1, MemoryMib: 2048, DiskGib: 1, Gpus: 1, Balloon: true},
			"balloon", "GPU passthrough pins"},
		{"floor without balloon", &apiv1.CreateFlavorRequest{Name: "b", Vcpus: 1, MemoryMib: 2048, DiskGib: 1, MinMemoryMib: 1024},
			"min_memory_mib", "without balloon"},
		{"floor over memory", &apiv1.CreateFlavorRequest{Name: "b", Vcpus: 1, MemoryMib: 2048, DiskGib: 1, Balloon: true, MinMemoryMib: 4096},
			"min_memory_mib", "between 128 MiB and memory_mib (2048)"},
		{"floor too small", &apiv1.CreateFlavorRequest{Name: "b", Vcpus: 1, MemoryMib: 2048, DiskGib: 1, Balloon: true, MinMemoryMib: 64},
			"min_memory_mib", "between 128 MiB"},
	} {
		_, err := create(c.req)
		refused(t, err, "INVALID_ARGUMENT", c.field, c.reason)
	}
	require.Equal(t, before, f.rows(t), "nothing written")

	fl, err := create(&apiv1.CreateFlavorRequest{Name: "elastic", Vcpus: 2, MemoryMib: 8192, DiskGib: 10, Balloon: true, MinMemoryMib: 2048})
	require.NoError(t, err)
	require.True(t, fl.GetBalloon())
	require.Equal(t, int64(2048), fl.GetMinMemoryMib())
	got, err := f.acme.Flavors.Get(ctx, connect.NewRequest(&apiv1.GetFlavorRequest{Flavor: "elastic"}))
	require.NoError(t, err)
	require.True(t, got.Msg.GetFlavor().GetBalloon())
	require.Equal(t, int64(2048), got.Msg.GetFlavor().GetMinMemoryMib())

	// Another tenant's admin does not see it.
	_, err = f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "globex"}))
	require.NoError(t, err)
	k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "globex", Role: "admin"}))
	require.NoError(t, err)
	globex := f.cp.Client(k.Msg.GetSecret())
	_, err = globex.Flavors.Get(ctx, connect.NewRequest(&apiv1.GetFlavorRequest{Flavor: fl.GetId()}))
	refused(t, err, "NOT_FOUND", "", "not found")
}

// TestPoolMemoryOvercommit: policy.memory_overcommit is checked with its
// field; in a pool that overcommits 2x an instance of a ballooning flavor
// books half its memory, so two fit on a host where one did before, and
// its instance.create carries the balloon floor. A flavor that does not
// balloon still books all of its memory.
func TestPoolMemoryOvercommit(t *testing.T) {
	t.Parallel()
	h := setupHosts(t, 1)
	ctx := context.Background()
	update := func(v string, provider *apiv1.ProviderPolicy) error {
		_, err := h.admin.Pools.Update(ctx, connect.NewRequest(&apiv1.UpdatePoolRequest{Tenant: "acme", Pool: "gpu",
			Policy: &apiv1.PoolPolicy{MemoryOvercommit: v, Provider: provider}}))
		return err
	}
	for _, c := range []struct{ v, reason string }{
		{"0.5", "between 1 (no overcommit) and 2"},
		{"2.5", "between 1 (no overcommit) and 2"},
		{"1.333", "at most 2 decimals"},
		{"lots", "decimal ratio"},
		{"-1", "decimal ratio"},
	} {
		refused(t, update(c.v, nil), "INVALID_ARGUMENT", "policy.memory_overcommit", c.reason)
	}
	refused(t, update("1.5", &apiv1.ProviderPolicy{Account: "hz", ServerType: "cx22", Image: "debian-12"}),
		"INVALID_ARGUMENT", "policy.memory_overcommit", "provider pool")
	// Another tenant's admin cannot touch acme's pool.
	_, err := h.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "globex"}))
	require.NoError(t, err)
	k, err := h.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "globex", Role: "admin"}))
	require.NoError(t, err)
	_, err = h.cp.Client(k.Msg.GetSecret()).Pools.Update(ctx, connect.NewRequest(&apiv1.UpdatePoolRequest{Tenant: "acme", Pool: "gpu",
		Policy: &apiv1.PoolPolicy{MemoryOvercommit: "2"}}))
	require.Error(t, err)
	require.Contains(t, []string{"NOT_FOUND", "PERMISSION_DENIED"}, client.Code(err))

	// The simulated host has about 2 TiB: one 1200 GiB guest fits, two do
	// not.
	const bigMiB = 1200 << 10
	for _, fl := range []*apiv1.CreateFlavorRequest{
		{Tenant: "acme", Name: "big", Vcpus: 2, MemoryMib: bigMiB, DiskGib: 10, Balloon: true},
		{Tenant: "acme", Name: "bigplain", Vcpus: 2, MemoryMib: bigMiB, DiskGib: 10},
	} {
		_, err := h.admin.Flavors.Create(ctx, connect.NewRequest(fl))
		require.NoError(t, err)
	}
	boot := func(name, flavor string) (*apiv1.Instance, error) {
		res, err := h.acme.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: name,
			Flavor: flavor, Image: "debian-12", IpPool: "dev"}))
		if err != nil {
			return nil, err
		}
		return res.Msg.GetInstance(), nil
	}
	first, err := boot("a1", "big")
	require.NoError(t, err)
	_, err = boot("a2", "big")
	require.Equal(t, "NO_CAPACITY", client.Code(err), "%v", err)
	require.Equal(t, 1, h.count(t, `SELECT COUNT(*) FROM reservations WHERE id = $1 AND memory_gib = 1200`, first.GetReservationId()))

	require.NoError(t, update("2", nil))
	second, err := boot("a2", "big")
	require.NoError(t, err)
	require.Equal(t, 1, h.count(t, `SELECT COUNT(*) FROM reservations WHERE id = $1 AND memory_gib = 600`, second.GetReservationId()))
	waitState(t, h.acme, "a2", vps.StateRunning)
	p, _, ok := h.sim.Daemons[0].Hypervisor().Guest(vps.HostID(second.GetId()))
	require.True(t, ok)
	require.Equal(t, bigMiB, p.MemoryMiB)
	require.Equal(t, bigMiB/2, p.BalloonFloorMiB, "the floor is the booked memory")
	// A flavor that does not balloon books all of its memory, even here.
	_, err = boot("a3", "bigplain")
	require.Equal(t, "NO_CAPACITY", client.Code(err), "%v", err)
}
