package sandbox

import (
	"context"

	"github.com/better-compute/better-compute/internal/store"
)

// TenantRows lists the tenant's rows of this module (sandbox_warm, sandbox_snapshots, sandboxes, sandbox_templates), in the
// order TenantRowsDelete removes them: a tenant delete's dry run.
func TenantRows(ctx context.Context, q store.Querier, tenantID string) ([]store.TenantRow, error) {
	return store.TenantRows(q.Query(ctx, `SELECT t, k FROM (
		SELECT 0 AS o, 'sandbox_warm' AS t, instance_id AS k FROM sandbox_warm WHERE tenant_id = $1 UNION ALL
		SELECT 1, 'sandbox_snapshots', id FROM sandbox_snapshots WHERE tenant_id = $1 UNION ALL
		SELECT 2, 'sandboxes', id FROM sandboxes WHERE tenant_id = $1 UNION ALL
		SELECT 3, 'sandbox_templates', id FROM sandbox_templates WHERE tenant_id = $1) AS r ORDER BY o, k`, tenantID))
}

// TenantRowsDelete deletes every row TenantRows lists, dependents first;
// the tenant delete runs it inside its one transaction.
func TenantRowsDelete(ctx context.Context, tx store.Tx, tenantID string) error {
	if _, err := tx.Exec(ctx, `DELETE FROM sandbox_warm WHERE tenant_id = $1`, tenantID); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM sandbox_snapshots WHERE tenant_id = $1`, tenantID); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM sandboxes WHERE tenant_id = $1`, tenantID); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM sandbox_templates WHERE tenant_id = $1`, tenantID); err != nil {
		return err
	}
	return nil
}
