package audit

import (
	"context"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

// Insert writes audit rows in tx, many in one statement.
func Insert(ctx context.Context, tx store.Tx, entries ...envelope.AuditEntry) error {
	rows := make([][]any, len(entries))
	for i, e := range entries {
		rows[i] = []any{e.ID, e.Time, e.TenantID, e.PrincipalID, e.PrincipalKind, e.Action, e.ResourceType, e.ResourceID, e.Decision, e.RequestID, e.TraceID, e.Result, e.Detail}
	}
	return store.InsertRows(ctx, tx, `INSERT INTO audit_log (id, time, tenant_id, principal_id, principal_kind, action, resource_type, resource_id, decision, request_id, trace_id, result, detail)`, "", rows)
}

// List returns audit rows newest first.
func List(ctx context.Context, q store.Querier, p ListParams) ([]envelope.AuditEntry, error) {
	before := p.Before
	if before == "" {
		before = "~" // sorts after every id
	}
	rows, err := q.Query(ctx, `SELECT id, time, tenant_id, principal_id, principal_kind, action, resource_type, resource_id, decision, request_id, trace_id, result, detail
		FROM audit_log WHERE ($1 OR tenant_id = $2) AND ($3 = '' OR action = $3) AND id < $4 ORDER BY id DESC LIMIT $5`,
		p.AllTenants, p.TenantID, p.Action, before, p.Limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []envelope.AuditEntry
	for rows.Next() {
		var e envelope.AuditEntry
		if err := rows.Scan(&e.ID, &e.Time, &e.TenantID, &e.PrincipalID, &e.PrincipalKind, &e.Action, &e.ResourceType, &e.ResourceID, &e.Decision, &e.RequestID, &e.TraceID, &e.Result, &e.Detail); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}
