package profiles

import (
	"context"

	"github.com/better-compute/better-compute/internal/store"
)

// TenantRows lists the tenant's profile documents, in the order
// TenantRowsDelete removes them: a tenant delete's dry run.
func TenantRows(ctx context.Context, q store.Querier, tenantID string) ([]store.TenantRow, error) {
	return store.TenantRows(q.Query(ctx, `SELECT t, k FROM (
		SELECT 0 AS o, 'profiles' AS t, id AS k FROM profiles WHERE tenant_id = $1) AS r ORDER BY o, k`, tenantID))
}

// TenantRowsDelete deletes every row TenantRows lists; the tenant delete
// runs it inside its one transaction (after metal, whose machines name
// the profiles).
func TenantRowsDelete(ctx context.Context, tx store.Tx, tenantID string) error {
	_, err := tx.Exec(ctx, `DELETE FROM profiles WHERE tenant_id = $1`, tenantID)
	return err
}
