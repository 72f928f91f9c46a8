package pool_test

import (
	"context"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

type fixture struct {
	cp    *bctest.ControlPlane
	admin *client.Client // platform admin
	keys  map[string]*client.Client
}

func setup(t *testing.T) *fixture {
	t.Helper()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	f := &fixture{cp: cp, admin: cp.Admin(), keys: map[string]*client.Client{}}
	for _, name := range []string{"acme", "other"} {
		_, err := f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: name}))
		require.NoError(t, err)
	}
	for _, role := range []string{"admin", "member", "viewer", "agent"} {
		k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: role}))
		require.NoError(t, err)
		f.keys[role] = cp.Client(k.Msg.GetSecret())
	}
	k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "other", Role: "admin"}))
	require.NoError(t, err)
	f.keys["evil"] = cp.Client(k.Msg.GetSecret())
	return f
}

func (f *fixture) count(t *testing.T) int {
	t.Helper()
	resp, err := f.admin.Pools.List(context.Background(), connect.NewRequest(&apiv1.ListPoolsRequest{IncludeArchived: true}))
	require.NoError(t, err)
	return len(resp.Msg.GetPools())
}

func TestPoolLifecycle(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	c := f.keys["admin"]

	created, err := c.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{
		Tenant: "acme", Name: "h100",
		Selector: []*apiv1.SelectorRequirement{
			{Key: "gpu.model", Operator: "In", Values: []string{"H100"}},
			{Key: "spot", Operator: "DoesNotExist"},
		},
		Policy: &apiv1.PoolPolicy{
			PerGpu:      &apiv1.PerGpuShare{Vcpu: 8, MemoryGib: 64},
			HostReserve: &apiv1.HostReserve{Vcpu: 2, MemoryGib: 16},
			GpuSharing:  "timeslice", SlotsPerGpu: 4, MaxPending: 10, MinDurationSeconds: 60, MaxDurationSeconds: 86400,
		},
	}))
	require.NoError(t, err)
	p := created.Msg.GetPool()
	require.Equal(t, "h100", p.GetName())
	require.Equal(t, "active", p.GetState())
	require.Len(t, p.GetSelector(), 2)
	require.Equal(t, "timeslice", p.GetPolicy().GetGpuSharing())
	require.Equal(t, int32(4), p.GetPolicy().GetSlotsPerGpu())
	require.Equal(t, int32(64), p.GetPolicy().GetPerGpu().GetMemoryGib())
	require.Equal(t, int64(90*24*3600), p.GetPolicy().GetStartHorizonSeconds(), "the default horizon shows")

	_, err = c.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "h100"}))
	require.Equal(t, "ALREADY_EXISTS", client.Code(err))
	// The same name in another tenant is fine.
	_, err = f.keys["evil"].Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "other", Name: "h100"}))
	require.NoError(t, err)

	for _, role := range []string{"admin", "member", "viewer", "agent"} {
		for _, ref := range []string{"h100", p.GetId()} {
			got, err := f.keys[role].Pools.Get(ctx, connect.NewRequest(&apiv1.GetPoolRequest{Tenant: "acme", Pool: ref}))
			require.NoError(t, err, role)
			require.Equal(t, p.GetId(), got.Msg.GetPool().GetId())
		}
		list, err := f.keys[role].Pools.List(ctx, connect.NewRequest(&apiv1.ListPoolsRequest{Tenant: "acme"}))
		require.NoError(t, err, role)
		require.Len(t, list.Msg.GetPools(), 1)
	}
	_, err = f.keys["member"].Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "m"}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err))

	// Update the policy only: the selector stays.
	up, err := c.Pools.Update(ctx, connect.NewRequest(&apiv1.UpdatePoolRequest{Tenant: "acme", Pool: "h100",
		Policy: &apiv1.PoolPolicy{GpuSharing: "exclusive", SingleTenant: true}}))
	require.NoError(t, err)
	require.Len(t, up.Msg.GetPool().GetSelector(), 2)
	require.True(t, up.Msg.GetPool().GetPolicy().GetSingleTenant())
	require.Equal(t, int32(0), up.Msg.GetPool().GetPolicy().GetSlotsPerGpu())
	// Update the selector only: the policy stays.
	up, err = c.Pools.Update(ctx, connect.NewRequest(&apiv1.UpdatePoolRequest{Tenant: "acme", Pool: p.GetId(),
		Selector: &apiv1.PoolSelector{Requirements: []*apiv1.SelectorRequirement{{Key: "gpu", Operator: "Exists"}}}}))
	require.NoError(t, err)
	require.Len(t, up.Msg.GetPool().GetSelector(), 1)
	require.True(t, up.Msg.GetPool().GetPolicy().GetSingleTenant())

	// Archive is idempotent; an archived pool refuses updates and leaves the
	// default listing.
	for range 2 {
		ar, err := c.Pools.Archive(ctx, connect.NewRequest(&apiv1.ArchivePoolRequest{Tenant: "acme", Pool: "h100"}))
		require.NoError(t, err)
		require.Equal(t, "archived", ar.Msg.GetPool().GetState())
		require.NotNil(t, ar.Msg.GetPool().GetArchiveTime())
	}
	_, err = c.Pools.Update(ctx, connect.NewRequest(&apiv1.UpdatePoolRequest{Tenant: "acme", Pool: "h100",
		Policy: &apiv1.PoolPolicy{SingleTenant: false}}))
	require.Equal(t, "FAILED_PRECONDITION", client.Code(err))
	list, err := c.Pools.List(ctx, connect.NewRequest(&apiv1.ListPoolsRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Empty(t, list.Msg.GetPools())
	list, err = c.Pools.List(ctx, connect.NewRequest(&apiv1.ListPoolsRequest{Tenant: "acme", IncludeArchived: true}))
	require.NoError(t, err)
	require.Len(t, list.Msg.GetPools(), 1)
}

func TestPoolValidation(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	c := f.keys["admin"]
	ok := []*apiv1.SelectorRequirement{{Key: "gpu", Operator: "Exists"}}
	tests := []struct {
		field string
		req   *apiv1.CreatePoolRequest
	}{
		{"name", &apiv1.CreatePoolRequest{Tenant: "acme", Name: "H100"}},
		{"name", &apiv1.CreatePoolRequest{Tenant: "acme"}},
		{"tenant", &apiv1.CreatePoolRequest{Name: "p"}},
		{"selector[1].values", &apiv1.CreatePoolRequest{Tenant: "acme", Name: "p", Selector: append(ok, &apiv1.SelectorRequirement{Key: "zone", Operator: "In"})}},
		{"selector[0].values", &apiv1.CreatePoolRequest{Tenant: "acme", Name: "p", Selector: []*apiv1.SelectorRequirement{{Key: "gpu", Operator: "Exists", Values: []string{"x"}}}}},
		{"selector[0].operator", &apiv1.CreatePoolRequest{Tenant: "acme", Name: "p", Selector: []*apiv1.SelectorRequirement{{Key: "gpu", Operator: "Gt"}}}},
		{"selector[0].key", &apiv1.CreatePoolRequest{Tenant: "acme", Name: "p", Selector: []*apiv1.SelectorRequirement{{Key: "bad key", Operator: "Exists"}}}},
		{"policy.slots_per_gpu", &apiv1.CreatePoolRequest{Tenant: "acme", Name: "p", Policy: &apiv1.PoolPolicy{GpuSharing: "timeslice"}}},
		{"policy.slots_per_gpu", &apiv1.CreatePoolRequest{Tenant: "acme", Name: "p", Policy: &apiv1.PoolPolicy{GpuSharing: "mps", SlotsPerGpu: 49}}},
		{"policy.slots_per_gpu", &apiv1.CreatePoolRequest{Tenant: "acme", Name: "p", Policy: &apiv1.PoolPolicy{SlotsPerGpu: 2}}},
		{"policy.gpu_sharing", &apiv1.CreatePoolRequest{Tenant: "acme", Name: "p", Policy: &apiv1.PoolPolicy{GpuSharing: "shared"}}},
		{"policy.per_gpu.vcpu", &apiv1.CreatePoolRequest{Tenant: "acme", Name: "p", Policy: &apiv1.PoolPolicy{PerGpu: &apiv1.PerGpuShare{Vcpu: -1}}}},
		{"policy.host_reserve.memory_gib", &apiv1.CreatePoolRequest{Tenant: "acme", Name: "p", Policy: &apiv1.PoolPolicy{HostReserve: &apiv1.HostReserve{MemoryGib: -1}}}},
		{"policy.max_pending", &apiv1.CreatePoolRequest{Tenant: "acme", Name: "p", Policy: &apiv1.PoolPolicy{MaxPending: -2}}},
		{"policy.max_duration_seconds", &apiv1.CreatePoolRequest{Tenant: "acme", Name: "p", Policy: &apiv1.PoolPolicy{MaxDurationSeconds: 31 * 24 * 3600}}},
		{"policy.min_duration_seconds", &apiv1.CreatePoolRequest{Tenant: "acme", Name: "p", Policy: &apiv1.PoolPolicy{MinDurationSeconds: 7200, MaxDurationSeconds: 3600}}},
		{"policy.start_horizon_seconds", &apiv1.CreatePoolRequest{Tenant: "acme", Name: "p", Policy: &apiv1.PoolPolicy{StartHorizonSeconds: -1}}},
		{"policy.start_horizon_seconds", &apiv1.CreatePoolRequest{Tenant: "acme", Name: "p", Policy: &apiv1.PoolPolicy{StartHorizonSeconds: 367 * 24 * 3600}}},
	}
	for _, tt := range tests {
		_, err := c.Pools.Create(ctx, connect.NewRequest(tt.req))
		require.Equal(t, "INVALID_ARGUMENT", client.Code(err), tt.field)
		var fields []string
		for _, v := range client.Detail(err).GetViolations() {
			fields = append(fields, v.GetField())
		}
		require.Contains(t, fields, tt.field, "%v", err)
	}
	require.Equal(t, 0, f.count(t), "nothing was written")

	_, err := c.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "p"}))
	require.NoError(t, err)
	_, err = c.Pools.Update(ctx, connect.NewRequest(&apiv1.UpdatePoolRequest{Tenant: "acme", Pool: "p"}))
	require.Equal(t, "INVALID_ARGUMENT", client.Code(err))
	_, err = c.Pools.Update(ctx, connect.NewRequest(&apiv1.UpdatePoolRequest{Tenant: "acme", Pool: "p",
		Policy: &apiv1.PoolPolicy{GpuSharing: "mig", SlotsPerGpu: 7}}))
	require.Equal(t, "INVALID_ARGUMENT", client.Code(err))
	got, err := c.Pools.Get(ctx, connect.NewRequest(&apiv1.GetPoolRequest{Tenant: "acme", Pool: "p"}))
	require.NoError(t, err)
	require.Equal(t, "exclusive", got.Msg.GetPool().GetPolicy().GetGpuSharing())
}

func TestPoolCrossTenant(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	p, err := f.keys["admin"].Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "h100"}))
	require.NoError(t, err)
	id := p.Msg.GetPool().GetId()
	evil := f.keys["evil"]
	refused := []string{"PERMISSION_DENIED", "NOT_FOUND"}

	_, err = evil.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "x"}))
	require.Contains(t, refused, client.Code(err))
	_, err = evil.Pools.List(ctx, connect.NewRequest(&apiv1.ListPoolsRequest{Tenant: "acme"}))
	require.Contains(t, refused, client.Code(err))
	_, err = evil.Pools.List(ctx, connect.NewRequest(&apiv1.ListPoolsRequest{}))
	require.Contains(t, refused, client.Code(err))
	for _, tenant := range []string{"acme", "other"} {
		_, err = evil.Pools.Get(ctx, connect.NewRequest(&apiv1.GetPoolRequest{Tenant: tenant, Pool: id}))
		require.Contains(t, refused, client.Code(err), tenant)
		_, err = evil.Pools.Update(ctx, connect.NewRequest(&apiv1.UpdatePoolRequest{Tenant: tenant, Pool: id, Policy: &apiv1.PoolPolicy{SingleTenant: true}}))
		require.Contains(t, refused, client.Code(err), tenant)
		_, err = evil.Pools.Archive(ctx, connect.NewRequest(&apiv1.ArchivePoolRequest{Tenant: tenant, Pool: id}))
		require.Contains(t, refused, client.Code(err), tenant)
	}
	got, err := f.admin.Pools.Get(ctx, connect.NewRequest(&apiv1.GetPoolRequest{Tenant: "acme", Pool: id}))
	require.NoError(t, err)
	require.Equal(t, "active", got.Msg.GetPool().GetState())
	require.False(t, got.Msg.GetPool().GetPolicy().GetSingleTenant())
	require.Equal(t, 1, f.count(t))
}
