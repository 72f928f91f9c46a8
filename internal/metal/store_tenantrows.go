package metal

import (
	"context"

	"github.com/better-compute/better-compute/internal/store"
)

// A tenant's metal rows: its sites and machines with what hangs off them
// (discovery tokens, dispatches, boots, site leases and drivers), and every
// machine lease it is party to, as the machine's owner or as the lessee.
// site_image_fetches name a site agent's node, not a site, and expire on
// their own.
const (
	tenantSites    = `SELECT id FROM sites WHERE tenant_id = $1`
	tenantMachines = `SELECT id FROM machines WHERE tenant_id = $1`
	tenantLeases   = `SELECT id FROM machine_leases WHERE owner_tenant_id = $1 OR lessee_tenant_id = $1`
)

// TenantRows lists the tenant's rows of this module, in the order
// TenantRowsDelete removes them: a tenant delete's dry run.
func TenantRows(ctx context.Context, q store.Querier, tenantID string) ([]store.TenantRow, error) {
	return store.TenantRows(q.Query(ctx, `SELECT t, k FROM (
		SELECT 0 AS o, 'machine_lease_evidence' AS t, lease_id || '/' || step AS k FROM machine_lease_evidence WHERE lease_id IN (`+tenantLeases+`) UNION ALL
		SELECT 1, 'machine_leases', id FROM machine_leases WHERE owner_tenant_id = $1 OR lessee_tenant_id = $1 UNION ALL
		SELECT 2, 'machine_discovery_tokens', id FROM machine_discovery_tokens WHERE machine_id IN (`+tenantMachines+`) UNION ALL
		SELECT 3, 'site_dispatches', idempotency_key FROM site_dispatches WHERE site_id IN (`+tenantSites+`) UNION ALL
		SELECT 4, 'site_machine_boots', machine_id FROM site_machine_boots WHERE machine_id IN (`+tenantMachines+`) UNION ALL
		SELECT 5, 'machines', id FROM machines WHERE tenant_id = $1 UNION ALL
		SELECT 6, 'site_agent_drivers', site_id || '/' || node_id || '/' || name FROM site_agent_drivers WHERE site_id IN (`+tenantSites+`) UNION ALL
		SELECT 7, 'site_boot_leases', site_id FROM site_boot_leases WHERE site_id IN (`+tenantSites+`) UNION ALL
		SELECT 8, 'sites', id FROM sites WHERE tenant_id = $1) AS r ORDER BY o, k`, tenantID))
}

// TenantRowsDelete deletes every row TenantRows lists, dependents first;
// the tenant delete runs it inside its one transaction.
func TenantRowsDelete(ctx context.Context, tx store.Tx, tenantID string) error {
	for _, q := range []string{
		`DELETE FROM machine_lease_evidence WHERE lease_id IN (` + tenantLeases + `)`,
		`DELETE FROM machine_leases WHERE owner_tenant_id = $1 OR lessee_tenant_id = $1`,
		`DELETE FROM machine_discovery_tokens WHERE machine_id IN (` + tenantMachines + `)`,
		`DELETE FROM site_dispatches WHERE site_id IN (` + tenantSites + `)`,
		`DELETE FROM site_machine_boots WHERE machine_id IN (` + tenantMachines + `)`,
		`DELETE FROM machines WHERE tenant_id = $1`,
		`DELETE FROM site_agent_drivers WHERE site_id IN (` + tenantSites + `)`,
		`DELETE FROM site_boot_leases WHERE site_id IN (` + tenantSites + `)`,
		`DELETE FROM sites WHERE tenant_id = $1`,
	} {
		if _, err := tx.Exec(ctx, q, tenantID); err != nil {
			return err
		}
	}
	return nil
}

// TenantLiveLeases lists the machine leases the tenant is party to that are
// not returned yet: a lessee's deployed machine, or an owner's machine lent
// out. A tenant delete waits for them (release the lease first).
func TenantLiveLeases(ctx context.Context, q store.Querier, tenantID string) ([]string, error) {
	return store.Strings(q.Query(ctx, `SELECT id FROM machine_leases
		WHERE (owner_tenant_id = $1 OR lessee_tenant_id = $1) AND state <> 'returned' ORDER BY id`, tenantID))
}
