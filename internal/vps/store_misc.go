package vps

import (
	"context"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

// privateOnPool lists the tenant's private instances leased from an IP
// pool that hold a guest on a host: those whose peer list is pushed.
func privateOnPool(ctx context.Context, q store.Querier, tenantID, ipPoolID string) ([]Instance, error) {
	return scanInstances(q.Query(ctx, `SELECT `+instanceColumns+` FROM instances WHERE tenant_id = $1 AND ip_pool_id = $2
		AND network_policy = 'private' AND node_id <> '' AND state IN ('booting', 'running', 'stopped') ORDER BY id`, tenantID, ipPoolID))
}

// listHost is a reachable host that holds (or held) instances.
type listHost struct{ id, tenant string }

// reachableHosts lists the ready hosts that hold or held instances.
func reachableHosts(ctx context.Context, q store.Querier) ([]listHost, error) {
	rows, err := q.Query(ctx, `SELECT DISTINCT n.id, n.tenant_id FROM instances i JOIN nodes n ON n.id = i.node_id
		WHERE n.liveness = 'ready' AND i.state IN ('booting', 'running', 'stopped', 'deleting', 'failed', 'lost') ORDER BY n.id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var hosts []listHost
	for rows.Next() {
		var h listHost
		if err := rows.Scan(&h.id, &h.tenant); err != nil {
			return nil, err
		}
		hosts = append(hosts, h)
	}
	return hosts, rows.Err()
}

// sshCAInsert stores the deployment's SSH CA (its key sealed) unless one
// with the id exists: of two replicas creating it at once, the first wins.
func sshCAInsert(ctx context.Context, tx store.Tx, id, publicKey, sealedKey string, now time.Time) error {
	_, err := tx.Exec(ctx, `INSERT INTO ssh_cas (id, public_key, sealed_key, create_time) VALUES ($1, $2, $3, $4)
		ON CONFLICT (id) DO NOTHING`, id, publicKey, sealedKey, now)
	return err
}

// sshCAGet reads the SSH CA's public key and sealed private key.
func sshCAGet(ctx context.Context, q store.Querier, id string) store.Row {
	return q.QueryRow(ctx, `SELECT public_key, sealed_key FROM ssh_cas WHERE id = $1`, id)
}
