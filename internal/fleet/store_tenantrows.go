package fleet

import (
	"context"

	"github.com/better-compute/better-compute/internal/store"
)

// TenantRows lists the tenant's rows of this module (commands, join_requests, join_tokens, nodes, trust_anchors), in the
// order TenantRowsDelete removes them: a tenant delete's dry run.
func TenantRows(ctx context.Context, q store.Querier, tenantID string) ([]store.TenantRow, error) {
	return store.TenantRows(q.Query(ctx, `SELECT t, k FROM (
		SELECT 0 AS o, 'commands' AS t, id AS k FROM commands WHERE tenant_id = $1 UNION ALL
		SELECT 1, 'join_requests', id FROM join_requests WHERE tenant_id = $1 UNION ALL
		SELECT 2, 'join_tokens', id FROM join_tokens WHERE tenant_id = $1 UNION ALL
		SELECT 3, 'nodes', id FROM nodes WHERE tenant_id = $1 UNION ALL
		SELECT 4, 'trust_anchors', id FROM trust_anchors WHERE tenant_id = $1) AS r ORDER BY o, k`, tenantID))
}

// TenantRowsDelete deletes every row TenantRows lists, dependents first;
// the tenant delete runs it inside its one transaction.
func TenantRowsDelete(ctx context.Context, tx store.Tx, tenantID string) error {
	if _, err := tx.Exec(ctx, `DELETE FROM commands WHERE tenant_id = $1`, tenantID); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM join_requests WHERE tenant_id = $1`, tenantID); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM join_tokens WHERE tenant_id = $1`, tenantID); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM nodes WHERE tenant_id = $1`, tenantID); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM trust_anchors WHERE tenant_id = $1`, tenantID); err != nil {
		return err
	}
	return nil
}
