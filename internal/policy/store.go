package policy

import (
	"context"

	"github.com/better-compute/better-compute/internal/store"
)

// PolicyList lists a tenant's policies by id after the cursor.
func PolicyList(ctx context.Context, q store.Querier, tenantID, after string, limit int) ([]Policy, error) {
	rows, err := q.Query(ctx, `SELECT tenant_id, id, text, update_time FROM tenant_policies
		WHERE tenant_id = $1 AND id > $2 ORDER BY id LIMIT $3`, tenantID, after, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Policy
	for rows.Next() {
		var p Policy
		if err := rows.Scan(&p.TenantID, &p.ID, &p.Text, &p.UpdateTime); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// PolicyGet reads one policy.
func PolicyGet(ctx context.Context, q store.Querier, tenantID, id string) (Policy, error) {
	var p Policy
	err := q.QueryRow(ctx, `SELECT tenant_id, id, text, update_time FROM tenant_policies WHERE tenant_id = $1 AND id = $2`,
		tenantID, id).Scan(&p.TenantID, &p.ID, &p.Text, &p.UpdateTime)
	return p, err
}

// PolicyUpsert creates or replaces a policy.
func PolicyUpsert(ctx context.Context, tx store.Tx, p Policy) error {
	_, err := tx.Exec(ctx, `INSERT INTO tenant_policies (tenant_id, id, text, update_time) VALUES ($1, $2, $3, $4)
		ON CONFLICT (tenant_id, id) DO UPDATE SET text = excluded.text, update_time = excluded.update_time`,
		p.TenantID, p.ID, p.Text, p.UpdateTime)
	return err
}
