package envelope

import (
	"context"

	"github.com/better-compute/better-compute/internal/store"
)

// confirmationUse spends an approved confirmation inside the mutation's
// transaction, so it lets exactly one replay through.
func confirmationUse(ctx context.Context, tx store.Tx, id string) error {
	n, err := tx.Exec(ctx, `UPDATE confirmations SET state = 'used'
		WHERE id = $1 AND state = 'approved' AND expire_time > compute_now()`, id)
	if err != nil {
		return err
	}
	if n != 1 {
		return Errorf(CodeConfirmationNotUsable, "confirmation %s was already used or has expired", id)
	}
	return nil
}

func scanConfirmation(row interface{ Scan(...any) error }) (Confirmation, error) {
	var c Confirmation
	err := row.Scan(&c.ID, &c.TenantID, &c.Action, &c.ResourceType, &c.ResourceID, &c.PrincipalID, &c.RequestHash, &c.State, &c.ApprovedBy, &c.CreateTime, &c.ExpireTime)
	return c, err
}

// ConfirmationGet reads one confirmation.
func ConfirmationGet(ctx context.Context, q store.Querier, id string) (Confirmation, error) {
	return scanConfirmation(q.QueryRow(ctx, `SELECT `+confirmationColumns+` FROM confirmations WHERE id = $1`, id))
}

// ConfirmationList lists a tenant's confirmations, oldest first.
func ConfirmationList(ctx context.Context, q store.Querier, p ConfirmationListParams) ([]Confirmation, error) {
	rows, err := q.Query(ctx, `SELECT `+confirmationColumns+` FROM confirmations
		WHERE tenant_id = $1 AND id > $2 AND ($3 = '' OR state = $3) ORDER BY id LIMIT $4`, p.TenantID, p.After, p.State, p.Limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Confirmation
	for rows.Next() {
		c, err := scanConfirmation(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// ConfirmationApprove marks a pending confirmation approved by approver.
func ConfirmationApprove(ctx context.Context, tx store.Tx, id, approver string) error {
	n, err := tx.Exec(ctx, `UPDATE confirmations SET state = 'approved', approved_by = $2
		WHERE id = $1 AND state = 'pending' AND expire_time > compute_now()`, id, approver)
	if err != nil {
		return err
	}
	if n != 1 {
		return Errorf(CodeFailedPrecondition, "confirmation %s is not pending (already approved, used or expired)", id)
	}
	return nil
}

// ConfirmationExpire marks a confirmation expired if its deadline passed.
func ConfirmationExpire(ctx context.Context, tx store.Tx, id string) (bool, error) {
	n, err := tx.Exec(ctx, `UPDATE confirmations SET state = 'expired'
		WHERE id = $1 AND state IN ('pending', 'approved') AND expire_time <= compute_now()`, id)
	return n == 1, err
}

// confirmationInsert records a confirmation a caller must have approved.
func confirmationInsert(ctx context.Context, tx store.Tx, c Confirmation) error {
	_, err := tx.Exec(ctx, `INSERT INTO confirmations (id, tenant_id, action, resource_type, resource_id, principal_id, request_hash, state, approved_by, create_time, expire_time)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, '', $9, $10)`,
		c.ID, c.TenantID, c.Action, c.ResourceType, c.ResourceID, c.PrincipalID, c.RequestHash, c.State, c.CreateTime, c.ExpireTime)
	return err
}
