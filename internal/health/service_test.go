package health_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/health"
	"github.com/better-compute/better-compute/internal/store"
)

type fixture struct {
	cp *bctest.ControlPlane
	// keys of acme's roles, and "evil": the admin of tenant other.
	keys map[string]string
	// node is acme's, with gpus; otherNode is other's, with otherGPU.
	node      fleet.Node
	gpus      []string
	otherNode fleet.Node
	otherGPU  string
	// pool is acme's pool "gpus" (no members), otherPool other's.
	pool, otherPool string
}

func (f *fixture) client(role string) *client.Client {
	if role == "platform-admin" {
		return f.cp.Admin()
	}
	return f.cp.Client(f.keys[role])
}

func setup(t *testing.T) *fixture {
	t.Helper()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	f := &fixture{cp: cp, keys: map[string]string{}}
	admin := cp.Admin()
	for _, name := range []string{"acme", "other"} {
		_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: name}))
		require.NoError(t, err)
	}
	for _, role := range []string{"admin", "member", "viewer", "agent"} {
		k, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: role}))
		require.NoError(t, err)
		f.keys[role] = k.Msg.GetSecret()
	}
	k, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "other", Role: "admin"}))
	require.NoError(t, err)
	f.keys["evil"] = k.Msg.GetSecret()
	f.node, f.gpus = f.insertNode(t, "acme", "gpu-1.dc1", 2)
	var og []string
	f.otherNode, og = f.insertNode(t, "other", "gpu-9.dc9", 1)
	f.otherGPU = og[0]
	for tenant, dst := range map[string]*string{"acme": &f.pool, "other": &f.otherPool} {
		p, err := admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: tenant, Name: "gpus",
			Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"B300"}}}}))
		require.NoError(t, err)
		*dst = p.Msg.GetPool().GetId()
	}
	return f
}

// insertNode adds an active node of tenant with n GPUs, as a join and an
// inventory report would, straight through the tables.
func (f *fixture) insertNode(t *testing.T, tenant, name string, n int) (fleet.Node, []string) {
	t.Helper()
	ctx := context.Background()
	tn, err := f.cp.Admin().Tenants.Get(ctx, connect.NewRequest(&apiv1.GetTenantRequest{Tenant: tenant}))
	require.NoError(t, err)
	var (
		node  fleet.Node
		uuids []string
	)
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		now := f.cp.Clock.Now()
		p := &fleet.NodeInsertParams{ID: envelope.NewID(fleet.NodeIDPrefix, now), Name: name, TenantID: tn.Msg.GetTenant().GetId(),
			HardwareKey: "hw-" + name, State: fleet.NodeActive, Liveness: fleet.LivenessReady, CreateTime: now}
		if err := fleet.NodeInsert(ctx, tx, p); err != nil {
			return err
		}
		for i := range n {
			uuid := fmt.Sprintf("GPU-%s-%d", strings.ReplaceAll(name, ".", "-"), i)
			if _, err := tx.Exec(ctx, `INSERT INTO gpus (uuid, node_id, idx, model, memory_mib, pci_bus_id, numa_node, mig_mode, update_time)
				VALUES ($1, $2, $3, 'A100', 81920, $4, 0, 'disabled', $5)`, uuid, p.ID, i, fmt.Sprintf("0000:%02x:00.0", i+1), now); err != nil {
				return err
			}
			uuids = append(uuids, uuid)
		}
		var err error
		node, err = fleet.NodeGet(ctx, tx, "", p.ID)
		return err
	}))
	return node, uuids
}

func (f *fixture) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, query, args...).Scan(&n)
	}))
	return n
}

// written is a fingerprint of everything the health API writes: health
// rows, node conditions, events, and allowed audit rows.
func (f *fixture) written(t *testing.T) string {
	t.Helper()
	return fmt.Sprint(
		f.count(t, `SELECT COUNT(*) FROM health_findings`),
		f.count(t, `SELECT COUNT(*) FROM health_findings WHERE state = 'open'`),
		f.count(t, `SELECT COUNT(*) FROM health_gpus`),
		f.count(t, `SELECT COUNT(*) FROM health_breakers`),
		f.count(t, `SELECT COUNT(*) FROM node_conditions WHERE status = 'true'`),
		f.count(t, `SELECT COUNT(*) FROM node_conditions`),
		f.count(t, `SELECT COUNT(*) FROM events`),
		f.count(t, `SELECT COUNT(*) FROM audit_log WHERE decision = 'allow'`),
	)
}

func requireCode(t *testing.T, err error, code string, msgAndArgs ...any) {
	t.Helper()
	require.Error(t, err, msgAndArgs...)
	require.Equal(t, code, client.Code(err), append([]any{"error: %v", err}, msgAndArgs...)...)
}

func requireViolation(t *testing.T, err error, field string) {
	t.Helper()
	requireCode(t, err, "INVALID_ARGUMENT")
	var fields []string
	for _, v := range client.Detail(err).GetViolations() {
		fields = append(fields, v.GetField())
	}
	require.Contains(t, fields, field, "violations of %v", err)
}

func (f *fixture) quarantine(t *testing.T, gpu string) {
	t.Helper()
	_, err := f.client("admin").Health.QuarantineGpu(context.Background(), connect.NewRequest(&apiv1.QuarantineGpuRequest{
		Tenant: "acme", Gpu: gpu, Reason: "xid storm on the bench"}))
	require.NoError(t, err)
}

// TestHealthStrangers: another tenant's admin is refused on acme's tenant
// and finds none of acme's nodes, GPUs or pools under its own, exactly as
// if they did not exist; nothing is written either way.
func TestHealthStrangers(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.quarantine(t, f.gpus[1])
	ctx := context.Background()
	evil := f.client("evil").Health
	calls := map[string]func(tenant, node, gpu, pool string) error{
		"GetNodeHealth": func(tenant, node, _, _ string) error {
			_, err := evil.GetNodeHealth(ctx, connect.NewRequest(&apiv1.GetNodeHealthRequest{Tenant: tenant, Node: node}))
			return err
		},
		"ListFindings": func(tenant, node, _, _ string) error {
			_, err := evil.ListFindings(ctx, connect.NewRequest(&apiv1.ListFindingsRequest{Tenant: tenant, Node: node}))
			return err
		},
		"ListFindings/pool": func(tenant, _, _, pool string) error {
			_, err := evil.ListFindings(ctx, connect.NewRequest(&apiv1.ListFindingsRequest{Tenant: tenant, Pool: pool}))
			return err
		},
		"ListRemediations": func(tenant, node, _, _ string) error {
			_, err := evil.ListRemediations(ctx, connect.NewRequest(&apiv1.ListRemediationsRequest{Tenant: tenant, Node: node}))
			return err
		},
		"GetPoolHealth": func(tenant, _, _, pool string) error {
			_, err := evil.GetPoolHealth(ctx, connect.NewRequest(&apiv1.GetPoolHealthRequest{Tenant: tenant, Pool: pool}))
			return err
		},
		"QuarantineGpu": func(tenant, _, gpu, _ string) error {
			_, err := evil.QuarantineGpu(ctx, connect.NewRequest(&apiv1.QuarantineGpuRequest{Tenant: tenant, Gpu: gpu, Reason: "mine now"}))
			return err
		},
		"LiftGpu": func(tenant, _, gpu, _ string) error {
			_, err := evil.LiftGpu(ctx, connect.NewRequest(&apiv1.LiftGpuRequest{Tenant: tenant, Gpu: gpu, Reason: "mine now"}))
			return err
		},
		"ResetBreaker": func(tenant, _, _, pool string) error {
			_, err := evil.ResetBreaker(ctx, connect.NewRequest(&apiv1.ResetBreakerRequest{Tenant: tenant, Pool: pool, Reason: "mine now"}))
			return err
		},
	}
	before := f.written(t)
	for name, call := range calls {
		// On acme's tenant: refused before anything is looked at.
		requireCode(t, call("acme", f.node.Name, f.gpus[0], "gpus"), "PERMISSION_DENIED", name)
		requireCode(t, call("acme", f.node.ID, f.gpus[1], f.pool), "PERMISSION_DENIED", name)
		// Under its own tenant, acme's ids are not there — no different
		// from ids that never existed.
		mine := call("other", f.node.ID, f.gpus[1], f.pool)
		requireCode(t, mine, "NOT_FOUND", name)
		if strings.HasSuffix(name, "Gpu") {
			none := call("other", "", "GPU-nope", "")
			requireCode(t, none, "NOT_FOUND", name)
			require.Equal(t, strings.ReplaceAll(mine.Error(), f.gpus[1], "X"), strings.ReplaceAll(none.Error(), "GPU-nope", "X"), name)
		}
	}
	require.Equal(t, before, f.written(t), "a stranger's calls wrote nothing")
	// The other tenant's own GPU, under acme's admin, is missing too.
	_, err := f.client("admin").Health.QuarantineGpu(ctx, connect.NewRequest(&apiv1.QuarantineGpuRequest{Tenant: "acme", Gpu: f.otherGPU, Reason: "r"}))
	requireCode(t, err, "NOT_FOUND")
	require.Equal(t, before, f.written(t))
}

// TestHealthAuthz: the tenant's viewers and members read; quarantine,
// lift and reset are an admin's (the operator's), and a member's attempt
// is refused with an audit row and nothing else written.
func TestHealthAuthz(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	f.quarantine(t, f.gpus[0])
	for _, role := range []string{"viewer", "member", "agent", "admin", "platform-admin"} {
		c := f.client(role).Health
		tenant := "acme"
		_, err := c.GetNodeHealth(ctx, connect.NewRequest(&apiv1.GetNodeHealthRequest{Tenant: tenant, Node: f.node.Name}))
		require.NoError(t, err, role)
		_, err = c.ListFindings(ctx, connect.NewRequest(&apiv1.ListFindingsRequest{Tenant: tenant}))
		require.NoError(t, err, role)
		_, err = c.ListRemediations(ctx, connect.NewRequest(&apiv1.ListRemediationsRequest{Tenant: tenant}))
		require.NoError(t, err, role)
		_, err = c.GetPoolHealth(ctx, connect.NewRequest(&apiv1.GetPoolHealthRequest{Tenant: tenant, Pool: "gpus"}))
		require.NoError(t, err, role)
	}
	// Every tenant's findings are the platform's to list.
	_, err := f.client("admin").Health.ListFindings(ctx, connect.NewRequest(&apiv1.ListFindingsRequest{}))
	requireCode(t, err, "PERMISSION_DENIED")
	all, err := f.client("platform-admin").Health.ListFindings(ctx, connect.NewRequest(&apiv1.ListFindingsRequest{}))
	require.NoError(t, err)
	require.Len(t, all.Msg.GetFindings(), 1)

	before := f.written(t)
	for _, role := range []string{"member", "viewer", "agent"} {
		c := f.client(role).Health
		_, err := c.LiftGpu(ctx, connect.NewRequest(&apiv1.LiftGpuRequest{Tenant: "acme", Gpu: f.gpus[0], Reason: "looks fine to me"}))
		requireCode(t, err, "PERMISSION_DENIED", role)
		_, err = c.QuarantineGpu(ctx, connect.NewRequest(&apiv1.QuarantineGpuRequest{Tenant: "acme", Gpu: f.gpus[1], Reason: "r"}))
		requireCode(t, err, "PERMISSION_DENIED", role)
		_, err = c.ResetBreaker(ctx, connect.NewRequest(&apiv1.ResetBreakerRequest{Tenant: "acme", Pool: "gpus", Reason: "r"}))
		requireCode(t, err, "PERMISSION_DENIED", role)
	}
	require.Equal(t, before, f.written(t), "refusals wrote nothing but their audit rows")
	for _, action := range []string{"gpus.lift", "gpus.quarantine", "pools.resetBreaker"} {
		bctest.WaitFor(t, "the refusals' audit rows for "+action, func() bool {
			return f.count(t, `SELECT COUNT(*) FROM audit_log WHERE action = $1 AND decision = 'deny'`, action) == 3
		})
	}
	// The platform admin is an operator everywhere.
	_, err = f.client("platform-admin").Health.ResetBreaker(ctx, connect.NewRequest(&apiv1.ResetBreakerRequest{Pool: f.pool, Reason: "drill"}))
	require.NoError(t, err)
}

// TestHealthValidation: each bad field is named with its reason, before
// any decision or write.
func TestHealthValidation(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	c := f.client("admin").Health
	long := strings.Repeat("x", 201)
	cases := []struct {
		name, field string
		call        func() error
	}{
		{"quarantine no gpu", "gpu", func() error {
			_, err := c.QuarantineGpu(ctx, connect.NewRequest(&apiv1.QuarantineGpuRequest{Tenant: "acme", Reason: "r"}))
			return err
		}},
		{"quarantine bad gpu", "gpu", func() error {
			_, err := c.QuarantineGpu(ctx, connect.NewRequest(&apiv1.QuarantineGpuRequest{Tenant: "acme", Gpu: "GPU 0; drop", Reason: "r"}))
			return err
		}},
		{"quarantine no reason", "reason", func() error {
			_, err := c.QuarantineGpu(ctx, connect.NewRequest(&apiv1.QuarantineGpuRequest{Tenant: "acme", Gpu: f.gpus[0]}))
			return err
		}},
		{"quarantine blank reason", "reason", func() error {
			_, err := c.QuarantineGpu(ctx, connect.NewRequest(&apiv1.QuarantineGpuRequest{Tenant: "acme", Gpu: f.gpus[0], Reason: "   "}))
			return err
		}},
		{"quarantine long reason", "reason", func() error {
			_, err := c.QuarantineGpu(ctx, connect.NewRequest(&apiv1.QuarantineGpuRequest{Tenant: "acme", Gpu: f.gpus[0], Reason: long}))
			return err
		}},
		{"quarantine bad tenant", "tenant", func() error {
			_, err := c.QuarantineGpu(ctx, connect.NewRequest(&apiv1.QuarantineGpuRequest{Tenant: "Not A Tenant", Gpu: f.gpus[0], Reason: "r"}))
			return err
		}},
		{"lift no reason", "reason", func() error {
			_, err := c.LiftGpu(ctx, connect.NewRequest(&apiv1.LiftGpuRequest{Tenant: "acme", Gpu: f.gpus[0]}))
			return err
		}},
		{"lift long reason", "reason", func() error {
			_, err := c.LiftGpu(ctx, connect.NewRequest(&apiv1.LiftGpuRequest{Tenant: "acme", Gpu: f.gpus[0], Reason: long}))
			return err
		}},
		{"lift no gpu", "gpu", func() error {
			_, err := c.LiftGpu(ctx, connect.NewRequest(&apiv1.LiftGpuRequest{Tenant: "acme", Reason: "r"}))
			return err
		}},
		{"reset no pool", "pool", func() error {
			_, err := c.ResetBreaker(ctx, connect.NewRequest(&apiv1.ResetBreakerRequest{Tenant: "acme", Reason: "r"}))
			return err
		}},
		{"reset no reason", "reason", func() error {
			_, err := c.ResetBreaker(ctx, connect.NewRequest(&apiv1.ResetBreakerRequest{Tenant: "acme", Pool: "gpus"}))
			return err
		}},
		{"reset long reason", "reason", func() error {
			_, err := c.ResetBreaker(ctx, connect.NewRequest(&apiv1.ResetBreakerRequest{Tenant: "acme", Pool: "gpus", Reason: long}))
			return err
		}},
		{"reset pool name without tenant", "pool", func() error {
			_, err := c.ResetBreaker(ctx, connect.NewRequest(&apiv1.ResetBreakerRequest{Pool: "gpus", Reason: "r"}))
			return err
		}},
		{"node health no node", "node", func() error {
			_, err := c.GetNodeHealth(ctx, connect.NewRequest(&apiv1.GetNodeHealthRequest{Tenant: "acme"}))
			return err
		}},
		{"node health bad node", "node", func() error {
			_, err := c.GetNodeHealth(ctx, connect.NewRequest(&apiv1.GetNodeHealthRequest{Tenant: "acme", Node: "Bad Node"}))
			return err
		}},
		{"findings bad state", "state", func() error {
			_, err := c.ListFindings(ctx, connect.NewRequest(&apiv1.ListFindingsRequest{Tenant: "acme", State: "closed"}))
			return err
		}},
		{"findings bad severity", "min_severity", func() error {
			_, err := c.ListFindings(ctx, connect.NewRequest(&apiv1.ListFindingsRequest{Tenant: "acme", MinSeverity: "fatal"}))
			return err
		}},
		{"findings bad page size", "page_size", func() error {
			_, err := c.ListFindings(ctx, connect.NewRequest(&apiv1.ListFindingsRequest{Tenant: "acme", PageSize: -1}))
			return err
		}},
		{"findings bad page token", "page_token", func() error {
			_, err := c.ListFindings(ctx, connect.NewRequest(&apiv1.ListFindingsRequest{Tenant: "acme", PageToken: "garbage"}))
			return err
		}},
		{"remediations bad state", "state", func() error {
			_, err := c.ListRemediations(ctx, connect.NewRequest(&apiv1.ListRemediationsRequest{Tenant: "acme", State: "done"}))
			return err
		}},
		{"pool health no pool", "pool", func() error {
			_, err := c.GetPoolHealth(ctx, connect.NewRequest(&apiv1.GetPoolHealthRequest{Tenant: "acme"}))
			return err
		}},
	}
	before := f.written(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			requireViolation(t, tc.call(), tc.field)
		})
	}
	require.Equal(t, before, f.written(t))
}

// TestHealthQuarantineLift: an operator's quarantine takes the GPU out
// (the node degraded, the condition set, a finding open), a lift puts it
// back (audited, the findings resolved, the condition false), and a lift
// or quarantine with nothing to do is refused with nothing written.
func TestHealthQuarantineLift(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	c := f.client("admin").Health
	gpu := f.gpus[1]

	q, err := c.QuarantineGpu(ctx, connect.NewRequest(&apiv1.QuarantineGpuRequest{Tenant: "acme", Gpu: gpu, Reason: "ECC errors in burn-in"}))
	require.NoError(t, err)
	require.Equal(t, health.GPUQuarantined, q.Msg.GetGpu().GetState())
	require.Equal(t, "gpu.quarantine", q.Msg.GetFinding().GetKind())
	require.Equal(t, f.node.Name, q.Msg.GetFinding().GetNode())

	nh, err := c.GetNodeHealth(ctx, connect.NewRequest(&apiv1.GetNodeHealthRequest{Tenant: "acme", Node: f.node.Name}))
	require.NoError(t, err)
	h := nh.Msg.GetHealth()
	require.Equal(t, "degraded", h.GetStatus())
	require.EqualValues(t, 1, h.GetGpusOut())
	require.EqualValues(t, 2, h.GetGpusTotal())
	require.Len(t, h.GetFindings(), 1)
	require.Len(t, h.GetGpus(), 2)
	require.Equal(t, "ok", h.GetGpus()[0].GetState())
	require.Equal(t, health.GPUQuarantined, h.GetGpus()[1].GetState())
	require.Equal(t, "ECC errors in burn-in", h.GetGpus()[1].GetReason())
	require.Equal(t, 1, f.condition(t, gpu))

	lf, err := c.ListFindings(ctx, connect.NewRequest(&apiv1.ListFindingsRequest{Tenant: "acme", State: "open"}))
	require.NoError(t, err)
	require.Len(t, lf.Msg.GetFindings(), 1)
	require.EqualValues(t, 1, lf.Msg.GetGpusOut())
	require.EqualValues(t, 1, lf.Msg.GetNodesUnhealthy(), "an operator's quarantine is an error-severity finding")

	// Again: already out, refused, nothing written.
	before := f.written(t)
	_, err = c.QuarantineGpu(ctx, connect.NewRequest(&apiv1.QuarantineGpuRequest{Tenant: "acme", Gpu: gpu, Reason: "again"}))
	requireCode(t, err, "FAILED_PRECONDITION")
	_, err = c.LiftGpu(ctx, connect.NewRequest(&apiv1.LiftGpuRequest{Tenant: "acme", Gpu: f.gpus[0], Reason: "never out"}))
	requireCode(t, err, "FAILED_PRECONDITION")
	require.Contains(t, err.Error(), "not quarantined")
	require.Equal(t, before, f.written(t), "refused calls wrote nothing")

	lifted, err := c.LiftGpu(ctx, connect.NewRequest(&apiv1.LiftGpuRequest{Tenant: "acme", Gpu: gpu, Reason: "reseated; burn-in clean"}))
	require.NoError(t, err)
	require.EqualValues(t, 1, lifted.Msg.GetResolvedFindings())
	require.Equal(t, "ok", lifted.Msg.GetGpu().GetState())
	require.Equal(t, 0, f.condition(t, gpu), "the quarantine condition turned false")
	require.Equal(t, 0, f.count(t, `SELECT COUNT(*) FROM health_findings WHERE gpu_uuid = $1 AND state = 'open'`, gpu))
	require.Equal(t, 0, f.count(t, `SELECT COUNT(*) FROM health_gpus WHERE gpu_uuid = $1`, gpu))
	bctest.WaitFor(t, "the lift's audit row", func() bool {
		return f.count(t, `SELECT COUNT(*) FROM audit_log WHERE action = 'gpus.lift' AND decision = 'allow' AND resource_id = $1`, f.node.ID) == 1
	})
	require.Equal(t, 1, f.count(t, `SELECT COUNT(*) FROM events WHERE type = 'gpu.lifted'`))

	nh, err = c.GetNodeHealth(ctx, connect.NewRequest(&apiv1.GetNodeHealthRequest{Tenant: "acme", Node: f.node.ID}))
	require.NoError(t, err)
	require.Equal(t, "ok", nh.Msg.GetHealth().GetStatus())
	require.EqualValues(t, 0, nh.Msg.GetHealth().GetGpusOut())
	require.Empty(t, nh.Msg.GetHealth().GetFindings())

	// RMA over a plain quarantine is allowed; a quarantine over RMA is not.
	f.quarantine(t, gpu)
	_, err = c.QuarantineGpu(ctx, connect.NewRequest(&apiv1.QuarantineGpuRequest{Tenant: "acme", Gpu: gpu, Reason: "send it back", Rma: true}))
	require.NoError(t, err)
	_, err = c.QuarantineGpu(ctx, connect.NewRequest(&apiv1.QuarantineGpuRequest{Tenant: "acme", Gpu: gpu, Reason: "less"}))
	requireCode(t, err, "FAILED_PRECONDITION")
	nh, err = c.GetNodeHealth(ctx, connect.NewRequest(&apiv1.GetNodeHealthRequest{Tenant: "acme", Node: f.node.ID}))
	require.NoError(t, err)
	require.Equal(t, health.GPURMA, nh.Msg.GetHealth().GetGpus()[1].GetState())
}

// condition is 1 when the GPU's quarantine condition is true on its node.
func (f *fixture) condition(t *testing.T, gpu string) int {
	t.Helper()
	return f.count(t, `SELECT COUNT(*) FROM node_conditions WHERE type = $1 AND status = 'true'`, health.ConditionGPUQuarantinedPrefix+gpu)
}

// TestHealthPagination: findings page by id with a cursor bound to the
// filter.
func TestHealthPagination(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	for _, g := range f.gpus {
		f.quarantine(t, g)
	}
	c := f.client("viewer").Health
	p1, err := c.ListFindings(ctx, connect.NewRequest(&apiv1.ListFindingsRequest{Tenant: "acme", PageSize: 1}))
	require.NoError(t, err)
	require.Len(t, p1.Msg.GetFindings(), 1)
	require.NotEmpty(t, p1.Msg.GetNextPageToken())
	p2, err := c.ListFindings(ctx, connect.NewRequest(&apiv1.ListFindingsRequest{Tenant: "acme", PageSize: 1, PageToken: p1.Msg.GetNextPageToken()}))
	require.NoError(t, err)
	require.Len(t, p2.Msg.GetFindings(), 1)
	require.NotEqual(t, p1.Msg.GetFindings()[0].GetId(), p2.Msg.GetFindings()[0].GetId())
	require.Empty(t, p2.Msg.GetNextPageToken())
	require.EqualValues(t, 2, p2.Msg.GetGpusOut())
	_, err = c.ListFindings(ctx, connect.NewRequest(&apiv1.ListFindingsRequest{Tenant: "acme", State: "open", PageSize: 1, PageToken: p1.Msg.GetNextPageToken()}))
	requireViolation(t, err, "page_token")
	// The node filter narrows; a severity above error leaves nothing.
	byNode, err := c.ListFindings(ctx, connect.NewRequest(&apiv1.ListFindingsRequest{Tenant: "acme", Node: f.node.Name, MinSeverity: "critical"}))
	require.NoError(t, err)
	require.Empty(t, byNode.Msg.GetFindings())
}

// TestHealthLiftRejoinsAtoms: on a real (simulated) node in a pool, a
// quarantine takes the GPU's atom out of placement and a lift puts it
// back; GetNodeHealth counts the reservations holding each GPU.
func TestHealthLiftRejoinsAtoms(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	admin := f.client("admin")
	_, err := admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "web"}))
	require.NoError(t, err)
	before := f.count(t, `SELECT COUNT(*) FROM gpus`)
	sim, err := bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		Template: bctest.FakeDaemonConfig{Gateway: f.cp.GatewayAddr}, Root: t.TempDir(), N: 1,
		Token: func(ctx context.Context, _ int) (string, error) {
			tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "web"}))
			return tok.Msg.GetToken(), err
		},
	})
	require.NoError(t, err)
	t.Cleanup(sim.Stop)
	bctest.WaitFor(t, "the node's 8 GPUs", func() bool { return f.count(t, `SELECT COUNT(*) FROM gpus`) == before+8 })
	p, err := admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "h100",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}}}))
	require.NoError(t, err)
	var nodeID, gpu string
	bctest.WaitFor(t, "the node in the pool with its GPU atoms", func() bool {
		return f.count(t, `SELECT COUNT(*) FROM atoms a JOIN node_pools np ON np.node_id = a.node_id
			WHERE np.pool_id = $1 AND a.kind = 'gpu'`, p.Msg.GetPool().GetId()) == 8
	})
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT a.node_id, a.gpu_uuid FROM atoms a JOIN node_pools np ON np.node_id = a.node_id
			WHERE np.pool_id = $1 AND a.kind = 'gpu' ORDER BY a.gpu_index LIMIT 1`, p.Msg.GetPool().GetId()).Scan(&nodeID, &gpu)
	}))
	quarantined := func() bool {
		var q bool
		require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT quarantined FROM atoms WHERE gpu_uuid = $1 AND kind = 'gpu'`, gpu).Scan(&q)
		}))
		return q
	}
	require.False(t, quarantined())

	// A reservation of the whole node holds every GPU, the first one too.
	r, err := admin.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: "acme", Project: "web",
		Pool: "h100", Gpus: 8, Vcpu: 1, MemoryGib: 1, DurationSeconds: 3600}))
	require.NoError(t, err)
	bctest.WaitFor(t, "the reservation's bookings", func() bool {
		return f.count(t, `SELECT COUNT(*) FROM bookings WHERE reservation_id = $1`, r.Msg.GetReservation().GetId()) >= 8
	})
	nh, err := admin.Health.GetNodeHealth(ctx, connect.NewRequest(&apiv1.GetNodeHealthRequest{Tenant: "acme", Node: nodeID}))
	require.NoError(t, err)
	require.EqualValues(t, 8, nh.Msg.GetHealth().GetGpusTotal())
	require.Equal(t, p.Msg.GetPool().GetId(), nh.Msg.GetHealth().GetPoolId())
	for _, g := range nh.Msg.GetHealth().GetGpus() {
		require.EqualValues(t, 1, g.GetReservations(), "GPU %s", g.GetUuid())
	}

	_, err = admin.Health.QuarantineGpu(ctx, connect.NewRequest(&apiv1.QuarantineGpuRequest{Tenant: "acme", Gpu: gpu, Reason: "fan noise"}))
	require.NoError(t, err)
	bctest.WaitFor(t, "the GPU's atom out of placement", quarantined)
	ph, err := admin.Health.GetPoolHealth(ctx, connect.NewRequest(&apiv1.GetPoolHealthRequest{Tenant: "acme", Pool: "h100"}))
	require.NoError(t, err)
	require.EqualValues(t, 1, ph.Msg.GetHealth().GetGpusOut())
	require.EqualValues(t, 8, ph.Msg.GetHealth().GetGpusTotal())
	require.Equal(t, health.BreakerClosed, ph.Msg.GetHealth().GetBreaker())

	_, err = admin.Health.LiftGpu(ctx, connect.NewRequest(&apiv1.LiftGpuRequest{Tenant: "acme", Gpu: gpu, Reason: "fan replaced"}))
	require.NoError(t, err)
	bctest.WaitFor(t, "the GPU's atom back in placement", func() bool { return !quarantined() })
}
