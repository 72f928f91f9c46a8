package tenancy

import (
	"context"
	"errors"

	"github.com/better-compute/better-compute/internal/store"
)

// Active reports whether a tenant's principals may act: false for a tenant
// that no longer exists. Tenants have no suspended state in this branch
// yet; the tenant lifecycle (suspend, delete) answers false for a
// suspended tenant here too, and callers that issue credentials (workload
// tokens) ask it.
func Active(ctx context.Context, q store.Querier, tenantID string) (bool, error) {
	_, err := TenantGet(ctx, q, tenantID)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}
