package vps

import (
	"context"

	"github.com/better-compute/better-compute/internal/store"
)

// TenantRows lists the tenant's rows of this module (ssh_tickets, volumes, instances, ip_pools, flavors), in the
// order TenantRowsDelete removes them: a tenant delete's dry run.
func TenantRows(ctx context.Context, q store.Querier, tenantID string) ([]store.TenantRow, error) {
	return store.TenantRows(q.Query(ctx, `SELECT t, k FROM (
		SELECT 0 AS o, 'ssh_tickets' AS t, id_hash AS k FROM ssh_tickets WHERE tenant_id = $1 UNION ALL
		SELECT 1, 'volumes', id FROM volumes WHERE tenant_id = $1 UNION ALL
		SELECT 2, 'instances', id FROM instances WHERE tenant_id = $1 UNION ALL
		SELECT 3, 'ip_pools', id FROM ip_pools WHERE tenant_id = $1 UNION ALL
		SELECT 4, 'flavors', id FROM flavors WHERE tenant_id = $1) AS r ORDER BY o, k`, tenantID))
}

// TenantRowsDelete deletes every row TenantRows lists, dependents first;
// the tenant delete runs it inside its one transaction.
func TenantRowsDelete(ctx context.Context, tx store.Tx, tenantID string) error {
	if _, err := tx.Exec(ctx, `DELETE FROM ssh_tickets WHERE tenant_id = $1`, tenantID); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM volumes WHERE tenant_id = $1`, tenantID); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM instances WHERE tenant_id = $1`, tenantID); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM ip_pools WHERE tenant_id = $1`, tenantID); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM flavors WHERE tenant_id = $1`, tenantID); err != nil {
		return err
	}
	return nil
}
