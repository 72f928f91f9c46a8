package budget

import (
	"context"

	"github.com/better-compute/better-compute/internal/store"
)

// TenantRows lists the tenant's rows of this module (its budget and the
// thresholds it reached), in the order TenantRowsDelete removes them: a
// tenant delete's dry run.
func TenantRows(ctx context.Context, q store.Querier, tenantID string) ([]store.TenantRow, error) {
	return store.TenantRows(q.Query(ctx, `SELECT t, k FROM (
		SELECT 0 AS o, 'budget_thresholds' AS t, bt.budget_id AS k FROM budget_thresholds bt
			JOIN budgets b ON b.id = bt.budget_id WHERE b.tenant_id = $1
		UNION ALL
		SELECT 1 AS o, 'budgets' AS t, id AS k FROM budgets WHERE tenant_id = $1) AS r ORDER BY o, k`, tenantID))
}

// TenantRowsDelete deletes every row TenantRows lists, dependents first;
// the tenant delete runs it inside its one transaction.
func TenantRowsDelete(ctx context.Context, tx store.Tx, tenantID string) error {
	if _, err := tx.Exec(ctx, `DELETE FROM budget_thresholds WHERE budget_id IN (SELECT id FROM budgets WHERE tenant_id = $1)`, tenantID); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `DELETE FROM budgets WHERE tenant_id = $1`, tenantID)
	return err
}
