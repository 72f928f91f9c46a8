package health

import (
	"context"

	"github.com/better-compute/better-compute/internal/store"
)

// TenantRows lists the tenant's rows of this module (health_remediations, health_findings, health_gpus, health_breakers), in the
// order TenantRowsDelete removes them: a tenant delete's dry run.
func TenantRows(ctx context.Context, q store.Querier, tenantID string) ([]store.TenantRow, error) {
	return store.TenantRows(q.Query(ctx, `SELECT t, k FROM (
		SELECT 0 AS o, 'health_remediations' AS t, id AS k FROM health_remediations WHERE tenant_id = $1 UNION ALL
		SELECT 1, 'health_findings', id FROM health_findings WHERE tenant_id = $1 UNION ALL
		SELECT 2, 'health_gpus', gpu_uuid FROM health_gpus WHERE tenant_id = $1 UNION ALL
		SELECT 3, 'health_breakers', pool_id FROM health_breakers WHERE tenant_id = $1) AS r ORDER BY o, k`, tenantID))
}

// TenantRowsDelete deletes every row TenantRows lists, dependents first;
// the tenant delete runs it inside its one transaction.
func TenantRowsDelete(ctx context.Context, tx store.Tx, tenantID string) error {
	if _, err := tx.Exec(ctx, `DELETE FROM health_remediations WHERE tenant_id = $1`, tenantID); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM health_findings WHERE tenant_id = $1`, tenantID); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM health_gpus WHERE tenant_id = $1`, tenantID); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM health_breakers WHERE tenant_id = $1`, tenantID); err != nil {
		return err
	}
	return nil
}
