package provision

import (
	"context"

	"github.com/better-compute/better-compute/internal/store"
)

const tenantWorkflows = `SELECT id FROM provision_workflows WHERE tenant_id = $1`

// TenantRows lists the tenant's workflows with their steps and attempts, in
// the order TenantRowsDelete removes them: a tenant delete's dry run.
func TenantRows(ctx context.Context, q store.Querier, tenantID string) ([]store.TenantRow, error) {
	return store.TenantRows(q.Query(ctx, `SELECT t, k FROM (
		SELECT 0 AS o, 'provision_attempts' AS t, idempotency_key AS k FROM provision_attempts
			WHERE step_id IN (SELECT id FROM provision_steps WHERE workflow_id IN (`+tenantWorkflows+`)) UNION ALL
		SELECT 1, 'provision_steps', id FROM provision_steps WHERE workflow_id IN (`+tenantWorkflows+`) UNION ALL
		SELECT 2, 'provision_workflows', id FROM provision_workflows WHERE tenant_id = $1) AS r ORDER BY o, k`, tenantID))
}

// TenantRowsDelete deletes every row TenantRows lists, dependents first;
// the tenant delete runs it inside its one transaction.
func TenantRowsDelete(ctx context.Context, tx store.Tx, tenantID string) error {
	for _, q := range []string{
		`DELETE FROM provision_attempts WHERE step_id IN (SELECT id FROM provision_steps WHERE workflow_id IN (` + tenantWorkflows + `))`,
		`DELETE FROM provision_steps WHERE workflow_id IN (` + tenantWorkflows + `)`,
		`DELETE FROM provision_workflows WHERE tenant_id = $1`,
	} {
		if _, err := tx.Exec(ctx, q, tenantID); err != nil {
			return err
		}
	}
	return nil
}

// TenantLiveWorkflows lists the tenant's workflows still pending, running
// or paused: a tenant delete waits for them (abort them first), so no
// machine is left half provisioned by a workflow nobody owns.
func TenantLiveWorkflows(ctx context.Context, q store.Querier, tenantID string) ([]string, error) {
	return store.Strings(q.Query(ctx, `SELECT id FROM provision_workflows
		WHERE tenant_id = $1 AND state IN ('pending', 'running', 'paused') ORDER BY id`, tenantID))
}
