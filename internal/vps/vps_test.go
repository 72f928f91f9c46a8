package vps_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vps"
)

type fixture struct {
	cp    *bctest.ControlPlane
	admin *client.Client
	// acme is acme's admin, acmeKey its API key.
	acme    *client.Client
	acmeKey string
}

// setup starts a control plane with tenant acme and an admin key of it.
func setup(t testing.TB) *fixture {
	t.Helper()
	cp := bctest.NewControlPlane(t)
	f := &fixture{cp: cp, admin: cp.Admin()}
	ctx := context.Background()
	_, err := f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "admin"}))
	require.NoError(t, err)
	f.acme, f.acmeKey = cp.Client(k.Msg.GetSecret()), k.Msg.GetSecret()
	return f
}

func (f *fixture) count(t testing.TB, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, query, args...).Scan(&n)
	}))
	return n
}

// rows counts what a refused request must not have written.
func (f *fixture) rows(t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, tbl := range []string{"flavors", "ip_pools", "ip_leases", "events"} {
		out[tbl] = f.count(t, `SELECT COUNT(*) FROM `+tbl)
	}
	return out
}

func (f *fixture) audited(t *testing.T, action, result string) int {
	t.Helper()
	return f.count(t, `SELECT COUNT(*) FROM audit_log WHERE action = $1 AND result = $2`, action, result)
}

// refused checks a refusal: its machine code, the field it names and a
// word of its reason.
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

// TestFlavors: platform and tenant flavors, what each sees, and the checks.
func TestFlavors(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	create := func(c *client.Client, req *apiv1.CreateFlavorRequest) (*apiv1.Flavor, error) {
		res, err := c.Flavors.Create(ctx, connect.NewRequest(req))
		if err != nil {
			return nil, err
		}
		return res.Msg.GetFlavor(), nil
	}
	// The platform's flavor: the platform admin's own scope.
	plat, err := create(f.admin, &apiv1.CreateFlavorRequest{Name: "small", Vcpus: 2, MemoryMib: 2048, DiskGib: 20})
	require.NoError(t, err)
	require.Empty(t, plat.GetTenantId())
	own, err := create(f.acme, &apiv1.CreateFlavorRequest{Name: "gpu-pinned", Vcpus: 16, MemoryMib: 65536, DiskGib: 200, Gpus: 1,
		GpuModel: "H100", NumaAffine: true, Pinned: true, Hugepages: true})
	require.NoError(t, err)
	require.NotEmpty(t, own.GetTenantId())
	require.True(t, own.GetPinned() && own.GetHugepages() && own.GetNumaAffine())

	// acme sees its own and the platform's; the platform sees its own.
	list, err := f.acme.Flavors.List(ctx, connect.NewRequest(&apiv1.ListFlavorsRequest{}))
	require.NoError(t, err)
	require.Len(t, list.Msg.GetFlavors(), 2)
	list, err = f.admin.Flavors.List(ctx, connect.NewRequest(&apiv1.ListFlavorsRequest{}))
	require.NoError(t, err)
	require.Len(t, list.Msg.GetFlavors(), 1)
	// A page at a time: one flavor, then the other, then no token.
	page, err := f.acme.Flavors.List(ctx, connect.NewRequest(&apiv1.ListFlavorsRequest{PageSize: 1}))
	require.NoError(t, err)
	require.Len(t, page.Msg.GetFlavors(), 1)
	require.NotEmpty(t, page.Msg.GetNextPageToken())
	next, err := f.acme.Flavors.List(ctx, connect.NewRequest(&apiv1.ListFlavorsRequest{PageSize: 1, PageToken: page.Msg.GetNextPageToken()}))
	require.NoError(t, err)
	require.Len(t, next.Msg.GetFlavors(), 1)
	require.NotEqual(t, page.Msg.GetFlavors()[0].GetId(), next.Msg.GetFlavors()[0].GetId())
	require.Empty(t, next.Msg.GetNextPageToken(), "the last page")
	got, err := f.acme.Flavors.Get(ctx, connect.NewRequest(&apiv1.GetFlavorRequest{Flavor: "small"}))
	require.NoError(t, err)
	require.Equal(t, plat.GetId(), got.Msg.GetFlavor().GetId())

	t.Run("bad sizes", func(t *testing.T) {
		before := f.rows(t)
		_, err := create(f.acme, &apiv1.CreateFlavorRequest{Name: "bad", Vcpus: 0, MemoryMib: 1025, DiskGib: 0, Gpus: -1, Hugepages: true})
		refused(t, err, "INVALID_ARGUMENT", "vcpus", "between 1 and")
		refused(t, err, "INVALID_ARGUMENT", "memory_mib", "multiple of 2 MiB")
		refused(t, err, "INVALID_ARGUMENT", "disk_gib", "between 1 and")
		refused(t, err, "INVALID_ARGUMENT", "gpus", "between 0 and")
		_, err = create(f.acme, &apiv1.CreateFlavorRequest{Name: "bad", Vcpus: 1, MemoryMib: 512, DiskGib: 1, GpuModel: "H100"})
		refused(t, err, "INVALID_ARGUMENT", "gpu_model", "without GPUs")
		// Refused before any decision: not even an audit row.
		require.Equal(t, before, f.rows(t))
		require.Equal(t, 0, f.count(t, `SELECT COUNT(*) FROM audit_log WHERE action = 'flavors.create' AND result <> 'OK'`))
	})
	t.Run("duplicate name", func(t *testing.T) {
		before := f.rows(t)
		_, err := create(f.acme, &apiv1.CreateFlavorRequest{Name: "gpu-pinned", Vcpus: 1, MemoryMib: 512, DiskGib: 1})
		refused(t, err, "ALREADY_EXISTS", "", `a flavor named "gpu-pinned" already exists in tenant acme`)
		require.Equal(t, before, f.rows(t))
		require.Equal(t, 1, f.audited(t, "flavors.create", "ALREADY_EXISTS"))
	})
	t.Run("a tenant cannot delete the platform's flavor", func(t *testing.T) {
		before := f.rows(t)
		_, err := f.acme.Flavors.Delete(ctx, connect.NewRequest(&apiv1.DeleteFlavorRequest{Flavor: "small"}))
		refused(t, err, "NOT_FOUND", "", `flavor "small" not found`)
		require.Equal(t, before, f.rows(t))
		// A miss is no refusal: it leaves no audit row, as for reads.
		require.Equal(t, 0, f.audited(t, "flavors.delete", "NOT_FOUND"))
	})

	_, err = f.acme.Flavors.Delete(ctx, connect.NewRequest(&apiv1.DeleteFlavorRequest{Flavor: own.GetId()}))
	require.NoError(t, err)
	_, err = f.acme.Flavors.Get(ctx, connect.NewRequest(&apiv1.GetFlavorRequest{Flavor: "gpu-pinned"}))
	refused(t, err, "NOT_FOUND", "", "flavor")
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM events WHERE type = 'flavor.deleted'`))
}

// TestIPPoolBadInput: each bad pool is refused with its field and reason
// before any decision, and writes nothing (no audit row either).
func TestIPPoolBadInput(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	for _, tt := range []struct {
		name          string
		req           *apiv1.CreateIPPoolRequest
		field, reason string
	}{
		{"no cidr", &apiv1.CreateIPPoolRequest{}, "cidr", "is required"},
		{"not a cidr", &apiv1.CreateIPPoolRequest{Cidr: "10.0.0.0/33"}, "cidr", "must be an IPv4 network"},
		{"host bits", &apiv1.CreateIPPoolRequest{Cidr: "10.0.0.1/24"}, "cidr", "did you mean 10.0.0.0/24"},
		{"ipv6", &apiv1.CreateIPPoolRequest{Cidr: "fd00::/64"}, "cidr", "must be IPv4"},
		{"too small", &apiv1.CreateIPPoolRequest{Cidr: "10.0.0.0/31"}, "cidr", "must be a /8 to a /30"},
		{"gateway outside", &apiv1.CreateIPPoolRequest{Cidr: "10.0.0.0/24", Gateway: "10.0.1.1"}, "gateway", "must be an address of 10.0.0.0/24"},
		{"gateway is broadcast", &apiv1.CreateIPPoolRequest{Cidr: "10.0.0.0/24", Gateway: "10.0.0.255"}, "gateway", "not its network or broadcast"},
		{"range holds the gateway", &apiv1.CreateIPPoolRequest{Cidr: "10.0.0.0/24", RangeStart: "10.0.0.1", RangeEnd: "10.0.0.9"}, "range_start", "contains the gateway 10.0.0.1"},
		{"range reversed", &apiv1.CreateIPPoolRequest{Cidr: "10.0.0.0/24", RangeStart: "10.0.0.9", RangeEnd: "10.0.0.5"}, "range_end", "must not come before range_start"},
		{"bad dns", &apiv1.CreateIPPoolRequest{Cidr: "10.0.0.0/24", Dns: []string{"1.1.1.1", "resolver"}}, "dns[1]", "must be an IP address"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := f.rows(t)
			tt.req.Tenant, tt.req.Name = "acme", "lan"
			_, err := f.admin.IPPools.Create(ctx, connect.NewRequest(tt.req))
			refused(t, err, "INVALID_ARGUMENT", tt.field, tt.reason)
			require.Equal(t, before, f.rows(t))
			require.Equal(t, 0, f.count(t, `SELECT COUNT(*) FROM audit_log WHERE action = 'ipPools.create'`))
		})
	}
}

// TestIPPoolLeases: defaults, leases up to exhaustion (RESOURCE_EXHAUSTED
// naming the field, nothing written), release and reuse, and a pool with
// leases that cannot be deleted.
func TestIPPoolLeases(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()

	// Defaults: the first host is the gateway, the rest is the range.
	res, err := f.acme.IPPools.Create(ctx, connect.NewRequest(&apiv1.CreateIPPoolRequest{Name: "lan", Cidr: "10.20.0.0/24",
		Dns: []string{"10.20.0.53", "2001:4860:4860::8888"}, Network: "dc1/br0"}))
	require.NoError(t, err)
	p := res.Msg.GetIpPool()
	require.Equal(t, "10.20.0.1", p.GetGateway())
	require.Equal(t, "10.20.0.2", p.GetRangeStart())
	require.Equal(t, "10.20.0.254", p.GetRangeEnd())
	require.EqualValues(t, 253, p.GetSize())
	_, err = f.acme.IPPools.Create(ctx, connect.NewRequest(&apiv1.CreateIPPoolRequest{Name: "lan", Cidr: "10.21.0.0/24"}))
	refused(t, err, "ALREADY_EXISTS", "", `an ip pool named "lan" already exists`)

	// A small range: .10 to .12 with the gateway at .1.
	res, err = f.acme.IPPools.Create(ctx, connect.NewRequest(&apiv1.CreateIPPoolRequest{Name: "tiny", Cidr: "10.30.0.0/28",
		RangeStart: "10.30.0.10", RangeEnd: "10.30.0.12"}))
	require.NoError(t, err)
	tiny := res.Msg.GetIpPool()
	require.EqualValues(t, 3, tiny.GetSize())

	lease := func(holder string) (vps.IPLease, error) {
		var l vps.IPLease
		err := f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) (err error) {
			l, _, err = vps.LeaseAllocate(ctx, tx, f.cp.Clock.Now(), tiny.GetId(), holder, "02:00:00:00:00:01", "ip_pool")
			return err
		})
		return l, err
	}
	release := func(holder string) bool {
		var ok bool
		require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) (err error) {
			ok, err = vps.LeaseRelease(ctx, tx, tiny.GetId(), holder)
			return err
		}))
		return ok
	}
	for i, want := range []string{"10.30.0.10", "10.30.0.11", "10.30.0.12"} {
		l, err := lease(fmt.Sprintf("inst_%d", i))
		require.NoError(t, err)
		require.Equal(t, want, l.Address)
	}
	again, err := lease("inst_1")
	require.NoError(t, err)
	require.Equal(t, "10.30.0.11", again.Address, "a holder keeps its lease")

	before := f.rows(t)
	_, err = lease("inst_9")
	var ee *envelope.Error
	require.ErrorAs(t, err, &ee)
	require.Equal(t, envelope.CodeResourceExhaustedLimit, ee.Code)
	require.Equal(t, "ip_pool", ee.Violations[0].Field)
	require.Contains(t, ee.Message, "ip pool tiny is exhausted: all 3 addresses of 10.30.0.0/28 are leased")
	require.Equal(t, before, f.rows(t))

	got, err := f.acme.IPPools.Get(ctx, connect.NewRequest(&apiv1.GetIPPoolRequest{IpPool: "tiny"}))
	require.NoError(t, err)
	require.EqualValues(t, 3, got.Msg.GetIpPool().GetLeased())
	leases, err := f.acme.IPPools.ListLeases(ctx, connect.NewRequest(&apiv1.ListIPLeasesRequest{IpPool: "tiny"}))
	require.NoError(t, err)
	require.Len(t, leases.Msg.GetLeases(), 3)
	require.Equal(t, "inst_0", leases.Msg.GetLeases()[0].GetHolder())

	_, err = f.acme.IPPools.Delete(ctx, connect.NewRequest(&apiv1.DeleteIPPoolRequest{IpPool: "tiny"}))
	refused(t, err, "FAILED_PRECONDITION", "", "still has 3 lease(s)")
	require.Equal(t, 1, f.audited(t, "ipPools.delete", "FAILED_PRECONDITION"))

	// The middle address comes back and is the next one leased.
	require.True(t, release("inst_1"))
	require.False(t, release("inst_1"), "a second release finds nothing")
	l, err := lease("inst_3")
	require.NoError(t, err)
	require.Equal(t, "10.30.0.11", l.Address)

	for _, h := range []string{"inst_0", "inst_2", "inst_3"} {
		require.True(t, release(h))
	}
	_, err = f.acme.IPPools.Delete(ctx, connect.NewRequest(&apiv1.DeleteIPPoolRequest{IpPool: "tiny"}))
	require.NoError(t, err)
	list, err := f.acme.IPPools.List(ctx, connect.NewRequest(&apiv1.ListIPPoolsRequest{}))
	require.NoError(t, err)
	require.Len(t, list.Msg.GetIpPools(), 1)
}

// TestIPPoolConcurrentLeases: many holders lease from one pool at once;
// each gets its own address and the pool never hands out more than it has.
func TestIPPoolConcurrentLeases(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	res, err := f.acme.IPPools.Create(ctx, connect.NewRequest(&apiv1.CreateIPPoolRequest{Name: "lan", Cidr: "10.40.0.0/29"}))
	require.NoError(t, err)
	pool := res.Msg.GetIpPool()
	require.EqualValues(t, 5, pool.GetSize())

	const holders = 8
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		got       = map[string]string{}
		exhausted int
	)
	for i := range holders {
		wg.Go(func() {
			var l vps.IPLease
			err := f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) (err error) {
				l, _, err = vps.LeaseAllocate(ctx, tx, f.cp.Clock.Now(), pool.GetId(), fmt.Sprintf("inst_%d", i), "", "ip_pool")
				return err
			})
			mu.Lock()
			defer mu.Unlock()
			var ee *envelope.Error
			switch {
			case err == nil:
				got[l.Address] = l.Holder
			case errors.As(err, &ee) && ee.Code == envelope.CodeResourceExhaustedLimit:
				exhausted++
			default:
				t.Errorf("lease %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	require.Len(t, got, 5, "every address leased once: %v", got)
	require.Equal(t, holders-5, exhausted)
	require.Equal(t, 5, f.count(t, `SELECT COUNT(*) FROM ip_leases WHERE pool_id = $1`, pool.GetId()))
	byID, err := f.acme.IPPools.Get(ctx, connect.NewRequest(&apiv1.GetIPPoolRequest{IpPool: pool.GetId()}))
	require.NoError(t, err)
	require.EqualValues(t, 5, byID.Msg.GetIpPool().GetLeased())
}

// TestIPPoolCreateReplays: a create retried with its Idempotency-Key
// returns the first pool and writes no second one.
func TestIPPoolCreateReplays(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	create := func() *apiv1.IPPool {
		req := connect.NewRequest(&apiv1.CreateIPPoolRequest{Name: "lan", Cidr: "10.50.0.0/24"})
		req.Header().Set("Idempotency-Key", "create-lan-1")
		res, err := f.acme.IPPools.Create(ctx, req)
		require.NoError(t, err)
		return res.Msg.GetIpPool()
	}
	first := create()
	require.Equal(t, first.GetId(), create().GetId())
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM ip_pools`))
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM events WHERE type = 'ip_pool.created'`))
}
