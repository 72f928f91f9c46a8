package fleet

// SQL over trust_anchors.

import (
	"context"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

// TrustAnchorIDPrefix prefixes trust anchor ids.
const TrustAnchorIDPrefix = "tra"

// TrustAnchor is a row of trust_anchors: what a tenant trusts to vouch for
// its machines at join.
type TrustAnchor struct {
	ID              string
	TenantID        string
	Name            string
	Attestor        string
	CertificatesPEM string
	EKPublicSHA256  string
	CloudAccount    string
	CloudRegion     string
	CreatedBy       string
	CreateTime      time.Time
}

const trustAnchorColumns = `id, tenant_id, name, attestor, certificates_pem, ek_public_sha256, cloud_account, cloud_region, created_by, create_time`

func scanTrustAnchor(row scanner) (TrustAnchor, error) {
	var a TrustAnchor
	err := row.Scan(&a.ID, &a.TenantID, &a.Name, &a.Attestor, &a.CertificatesPEM, &a.EKPublicSHA256, &a.CloudAccount, &a.CloudRegion, &a.CreatedBy, &a.CreateTime)
	return a, err
}

// TrustAnchorInsert creates a trust anchor (store.ErrUnique when the
// tenant has one of that name).
func TrustAnchorInsert(ctx context.Context, tx store.Tx, a *TrustAnchor) error {
	_, err := tx.Exec(ctx, `INSERT INTO trust_anchors (id, tenant_id, name, attestor, certificates_pem, ek_public_sha256, cloud_account, cloud_region, created_by, create_time)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
		a.ID, a.TenantID, a.Name, a.Attestor, a.CertificatesPEM, a.EKPublicSHA256, a.CloudAccount, a.CloudRegion, a.CreatedBy, a.CreateTime)
	return err
}

// TrustAnchorGet reads a tenant's trust anchor by id or name
// (store.ErrNotFound when absent).
func TrustAnchorGet(ctx context.Context, q store.Querier, tenantID, ref string) (TrustAnchor, error) {
	return scanTrustAnchor(q.QueryRow(ctx, `SELECT `+trustAnchorColumns+` FROM trust_anchors
		WHERE tenant_id = $1 AND (id = $2 OR name = $2)`, tenantID, ref))
}

// TrustAnchorListParams filter a trust anchor listing.
type TrustAnchorListParams struct {
	TenantID string
	// Attestor, when set, lists that attestor's anchors only.
	Attestor string
	After    string
	Limit    int
}

// TrustAnchorList lists a tenant's trust anchors by id.
func TrustAnchorList(ctx context.Context, q store.Querier, p *TrustAnchorListParams) ([]TrustAnchor, error) {
	rows, err := q.Query(ctx, `SELECT `+trustAnchorColumns+` FROM trust_anchors
		WHERE tenant_id = $1 AND ($2 = '' OR attestor = $2) AND id > $3 ORDER BY id LIMIT $4`,
		p.TenantID, p.Attestor, p.After, p.Limit)
	return collect(rows, err, scanTrustAnchor)
}

// TrustAnchorDelete deletes a tenant's trust anchor; it reports whether it
// did.
func TrustAnchorDelete(ctx context.Context, tx store.Tx, tenantID, id string) (bool, error) {
	n, err := tx.Exec(ctx, `DELETE FROM trust_anchors WHERE tenant_id = $1 AND id = $2`, tenantID, id)
	return n == 1, err
}
