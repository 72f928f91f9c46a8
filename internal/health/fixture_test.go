package health_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/bench/fleetload"
	"github.com/better-compute/better-compute/client"
	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/health"
	"github.com/better-compute/better-compute/internal/store"
)

// fleetFixture is a control plane without the worker role (the test
// drives the reconciler) over a synthetic fleet of one tenant's pool.
type fleetFixture struct {
	cp      *bctest.ControlPlane
	admin   *client.Client
	db      *store.DB
	hm      *health.Module
	poolID  string
	nodeIDs []string
	gpusOf  map[string][]string
}

func newFleet(t *testing.T, nodes int, policy *apiv1.PoolPolicy) *fleetFixture {
	t.Helper()
	ctx := context.Background()
	cp := bctest.NewControlPlane(t, func(c *app.Config) {
		c.Roles = []string{app.RoleAPI, app.RoleGateway}
		c.UnreachableAfter, c.LostAfter = 1000*time.Hour, 2000*time.Hour
	})
	f := &fleetFixture{cp: cp, admin: cp.Admin(), db: cp.App.DB, hm: cp.App.Health, gpusOf: map[string][]string{}}
	_, err := f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	prj, err := f.admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "default"}))
	require.NoError(t, err)
	pl, err := f.admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "h100",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}}, Policy: policy}))
	require.NoError(t, err)
	f.poolID = pl.Msg.GetPool().GetId()
	require.NoError(t, fleetload.LoadSyntheticFleet(ctx, f.db, fleetload.SyntheticFleet{Nodes: nodes, GPUsPerNode: 8, CPUsPerNode: 64,
		TenantID: prj.Msg.GetProject().GetTenantId(), ProjectID: prj.Msg.GetProject().GetId(), PoolID: f.poolID, Now: cp.Clock.Now(), NamePrefix: "sim"}))
	require.NoError(t, f.db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		rows, err := tx.Query(ctx, `SELECT g.node_id, g.uuid FROM gpus g JOIN node_pools np ON np.node_id = g.node_id
			WHERE np.pool_id = $1 ORDER BY g.node_id, g.idx`, f.poolID)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var n, u string
			if err := rows.Scan(&n, &u); err != nil {
				return err
			}
			if len(f.gpusOf[n]) == 0 {
				f.nodeIDs = append(f.nodeIDs, n)
			}
			f.gpusOf[n] = append(f.gpusOf[n], u)
		}
		return rows.Err()
	}))
	require.Len(t, f.nodeIDs, nodes, "every synthetic node joined the pool")
	return f
}

// report hands the module a node's status report, as the gateway does.
func (f *fleetFixture) report(t *testing.T, nodeID string, events, findings []*agentv1.HealthEvent, complete bool) {
	t.Helper()
	require.NoError(t, f.db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return f.hm.Report(ctx, tx, nodeID, events, findings, complete)
	}))
}

func (f *fleetFixture) xid(t *testing.T, nodeID, gpu string, code int64) {
	t.Helper()
	f.report(t, nodeID, []*agentv1.HealthEvent{{Kind: "gpu.xid", Device: gpu, Code: code, Message: "test"}}, nil, false)
}

func (f *fleetFixture) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, f.db.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, query, args...).Scan(&n)
	}))
	return n
}

func (f *fleetFixture) reconcile(t *testing.T) {
	t.Helper()
	_, err := f.hm.Reconcile(context.Background())
	require.NoError(t, err)
}

// ackDrains plays the agents acknowledging their node.drain commands.
func (f *fleetFixture) ackDrains(t *testing.T) {
	t.Helper()
	require.NoError(t, f.db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE nodes SET state = 'drained' WHERE state = 'draining'`)
		return err
	}))
}

func (f *fleetFixture) remediations(t *testing.T, states ...string) []health.Remediation {
	t.Helper()
	rs, err := listRemediations(context.Background(), f.db, states...)
	require.NoError(t, err)
	return rs
}

func nodeState(t *testing.T, f *fleetFixture, nodeID string) string {
	t.Helper()
	var s string
	require.NoError(t, f.db.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT state FROM nodes WHERE id = $1`, nodeID).Scan(&s)
	}))
	return s
}

func nodeAndGPU(ctx context.Context, t *testing.T, tx store.Tx, uuid string) (fleet.Node, health.GPURef) {
	t.Helper()
	g, err := health.GPUByUUID(ctx, tx, uuid)
	require.NoError(t, err)
	n, err := fleet.NodeGet(ctx, tx, "", g.NodeID)
	require.NoError(t, err)
	return n, g
}
