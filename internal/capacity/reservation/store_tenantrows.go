package reservation

import (
	"context"

	"github.com/better-compute/better-compute/internal/store"
)

// A tenant's capacity rows beside its reservations: the placer's state of
// its nodes (atoms, host resources, pool membership) and of its pools
// (deltas, versions, owners, MIG refusals), which only its pools and nodes
// produce.
const (
	tenantNodes = `SELECT node_id FROM node_pools WHERE tenant_id = $1`
	tenantPools = `SELECT id FROM pools WHERE tenant_id = $1`
)

// TenantRows lists the tenant's rows of this package, in the order
// TenantRowsDelete removes them: a tenant delete's dry run.
func TenantRows(ctx context.Context, q store.Querier, tenantID string) ([]store.TenantRow, error) {
	return store.TenantRows(q.Query(ctx, `SELECT t, k FROM (
		SELECT 0 AS o, 'reservations' AS t, id AS k FROM reservations WHERE tenant_id = $1 UNION ALL
		SELECT 1, 'atoms', id FROM atoms WHERE node_id IN (`+tenantNodes+`) UNION ALL
		SELECT 2, 'host_resources', node_id FROM host_resources WHERE node_id IN (`+tenantNodes+`) UNION ALL
		SELECT 3, 'node_pools', node_id FROM node_pools WHERE tenant_id = $1 UNION ALL
		SELECT 4, 'capacity_deltas', CAST(id AS TEXT) FROM capacity_deltas WHERE pool_id IN (`+tenantPools+`) UNION ALL
		SELECT 5, 'pool_versions', pool_id FROM pool_versions WHERE pool_id IN (`+tenantPools+`) UNION ALL
		SELECT 6, 'placer_owners', pool_id FROM placer_owners WHERE pool_id IN (`+tenantPools+`) UNION ALL
		SELECT 7, 'mig_refusals', pool_id || '/' || model || '/' || profile FROM mig_refusals WHERE pool_id IN (`+tenantPools+`)) AS r ORDER BY o, k`, tenantID))
}

// TenantRowsDelete deletes every row TenantRows lists; the tenant delete
// runs it inside its one transaction, after TenantLiveReservations found
// nothing live.
func TenantRowsDelete(ctx context.Context, tx store.Tx, tenantID string) error {
	for _, q := range []string{
		`DELETE FROM reservations WHERE tenant_id = $1`,
		`DELETE FROM atoms WHERE node_id IN (` + tenantNodes + `)`,
		`DELETE FROM host_resources WHERE node_id IN (` + tenantNodes + `)`,
		`DELETE FROM node_pools WHERE tenant_id = $1`,
		`DELETE FROM capacity_deltas WHERE pool_id IN (` + tenantPools + `)`,
		`DELETE FROM pool_versions WHERE pool_id IN (` + tenantPools + `)`,
		`DELETE FROM placer_owners WHERE pool_id IN (` + tenantPools + `)`,
		`DELETE FROM mig_refusals WHERE pool_id IN (` + tenantPools + `)`,
	} {
		if _, err := tx.Exec(ctx, q, tenantID); err != nil {
			return err
		}
	}
	return nil
}

// TenantLiveReservations lists the reservations that still hold or await
// capacity and are the tenant's, or sit in its pools (another tenant's
// booking of a pool it offered): a tenant delete waits for them to end
// (release or cancel them first), so no host keeps running work nobody
// owns and no tenant loses a booking to another's delete.
func TenantLiveReservations(ctx context.Context, q store.Querier, tenantID string) ([]string, error) {
	return store.Strings(q.Query(ctx, `SELECT id FROM reservations
		WHERE (tenant_id = $1 OR pool_id IN (`+tenantPools+`))
		AND state NOT IN ('released', 'expired', 'failed', 'canceled') ORDER BY id`, tenantID))
}
