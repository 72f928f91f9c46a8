package pool

import (
	"context"

	"github.com/better-compute/better-compute/internal/store"
)

// TenantRows lists the tenant's pools and the offers to it and of its pools
// (another tenant's access to a pool that goes), in the order
// TenantRowsDelete removes them: a tenant delete's dry run.
func TenantRows(ctx context.Context, q store.Querier, tenantID string) ([]store.TenantRow, error) {
	return store.TenantRows(q.Query(ctx, `SELECT t, k FROM (
		SELECT 0 AS o, 'pool_offers' AS t, pool_id || '/' || tenant_id AS k FROM pool_offers
			WHERE tenant_id = $1 OR pool_id IN (SELECT id FROM pools WHERE tenant_id = $1) UNION ALL
		SELECT 1, 'pools', id FROM pools WHERE tenant_id = $1) AS r ORDER BY o, k`, tenantID))
}

// TenantRowsDelete deletes every row TenantRows lists, dependents first;
// the tenant delete runs it inside its one transaction.
func TenantRowsDelete(ctx context.Context, tx store.Tx, tenantID string) error {
	if _, err := tx.Exec(ctx, `DELETE FROM pool_offers WHERE tenant_id = $1 OR pool_id IN (SELECT id FROM pools WHERE tenant_id = $1)`, tenantID); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM pools WHERE tenant_id = $1`, tenantID); err != nil {
		return err
	}
	return nil
}
