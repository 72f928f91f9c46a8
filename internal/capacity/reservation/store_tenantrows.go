package reservation

import (
	"context"

	"github.com/better-compute/better-compute/internal/store"
)

// TenantRows lists the tenant's rows of this module (reservations, node_pools), in the
// order TenantRowsDelete removes them: a tenant delete's dry run.
func TenantRows(ctx context.Context, q store.Querier, tenantID string) ([]store.TenantRow, error) {
	return store.TenantRows(q.Query(ctx, `SELECT t, k FROM (
		SELECT 0 AS o, 'reservations' AS t, id AS k FROM reservations WHERE tenant_id = $1 UNION ALL
		SELECT 1, 'node_pools', node_id FROM node_pools WHERE tenant_id = $1) AS r ORDER BY o, k`, tenantID))
}

// TenantRowsDelete deletes every row TenantRows lists, dependents first;
// the tenant delete runs it inside its one transaction.
func TenantRowsDelete(ctx context.Context, tx store.Tx, tenantID string) error {
	if _, err := tx.Exec(ctx, `DELETE FROM reservations WHERE tenant_id = $1`, tenantID); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM node_pools WHERE tenant_id = $1`, tenantID); err != nil {
		return err
	}
	return nil
}

// TenantLiveReservations lists the tenant's reservations that still hold
// or await capacity: a tenant delete waits for them to end (release or
// cancel them first), so no host keeps running work nobody owns.
func TenantLiveReservations(ctx context.Context, q store.Querier, tenantID string) ([]string, error) {
	return store.Strings(q.Query(ctx, `SELECT id FROM reservations WHERE tenant_id = $1
		AND state NOT IN ('released', 'expired', 'failed', 'canceled') ORDER BY id`, tenantID))
}
