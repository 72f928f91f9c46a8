package vps

import (
	"context"
	"time"

	"github.com/better-compute/better-compute/internal/fleet"
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

// reachableHosts lists the ready hosts that hold or held instances: the
// hosts from instances, their liveness and tenant from the fleet's store.
func reachableHosts(ctx context.Context, q store.Querier) ([]listHost, error) {
	ids, err := store.Strings(q.Query(ctx, `SELECT DISTINCT node_id FROM instances
		WHERE node_id <> '' AND state IN ('booting', 'running', 'stopped', 'deleting', 'failed', 'lost') ORDER BY node_id`))
	if err != nil {
		return nil, err
	}
	nodes, err := fleet.NodeStatusList(ctx, q, ids)
	if err != nil {
		return nil, err
	}
	var hosts []listHost
	for _, n := range nodes {
		if n.Liveness == fleet.LivenessReady {
			hosts = append(hosts, listHost{id: n.ID, tenant: n.TenantID})
		}
	}
	return hosts, nil
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

// sshCAsSealed lists every SSH CA's id and sealed key (base64).
func sshCAsSealed(ctx context.Context, q store.Querier) (ids, sealedKeys []string, err error) {
	rows, err := q.Query(ctx, `SELECT id, sealed_key FROM ssh_cas ORDER BY id`)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var id, sealed string
		if err := rows.Scan(&id, &sealed); err != nil {
			return nil, nil, err
		}
		ids, sealedKeys = append(ids, id), append(sealedKeys, sealed)
	}
	return ids, sealedKeys, rows.Err()
}

// sshCAReseal replaces an SSH CA's sealed key with the same key sealed
// anew, only while the row still holds old. It reports whether it did.
func sshCAReseal(ctx context.Context, tx store.Tx, id, old, resealed string) (bool, error) {
	n, err := tx.Exec(ctx, `UPDATE ssh_cas SET sealed_key = $3 WHERE id = $1 AND sealed_key = $2`, id, old, resealed)
	return n > 0, err
}
