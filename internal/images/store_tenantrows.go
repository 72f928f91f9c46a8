package images

import (
	"context"

	"github.com/better-compute/better-compute/internal/store"
)

// TenantRows lists the tenant's rows of this module (image_refs, signer_keys, images), in the
// order TenantRowsDelete removes them: a tenant delete's dry run.
func TenantRows(ctx context.Context, q store.Querier, tenantID string) ([]store.TenantRow, error) {
	return store.TenantRows(q.Query(ctx, `SELECT t, k FROM (
		SELECT 0 AS o, 'image_refs' AS t, image_id AS k FROM image_refs WHERE tenant_id = $1 UNION ALL
		SELECT 1, 'signer_keys', id FROM signer_keys WHERE tenant_id = $1 UNION ALL
		SELECT 2, 'images', id FROM images WHERE tenant_id = $1) AS r ORDER BY o, k`, tenantID))
}

// TenantRowsDelete deletes every row TenantRows lists, dependents first;
// the tenant delete runs it inside its one transaction.
func TenantRowsDelete(ctx context.Context, tx store.Tx, tenantID string) error {
	if _, err := tx.Exec(ctx, `DELETE FROM image_refs WHERE tenant_id = $1`, tenantID); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM signer_keys WHERE tenant_id = $1`, tenantID); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM images WHERE tenant_id = $1`, tenantID); err != nil {
		return err
	}
	return nil
}

// TenantImagesInUse lists the tenant's images another tenant's guests still
// refer to (a public image in use elsewhere): a tenant delete waits until
// they no longer do, rather than pull an image from under another tenant.
func TenantImagesInUse(ctx context.Context, q store.Querier, tenantID string) ([]string, error) {
	return store.Strings(q.Query(ctx, `SELECT DISTINCT i.id FROM images i JOIN image_refs r ON r.image_id = i.id
		WHERE i.tenant_id = $1 AND r.tenant_id <> $1 ORDER BY i.id`, tenantID))
}
