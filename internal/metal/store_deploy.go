package metal

import (
	"context"
	"encoding/base64"
	"errors"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

// ramdiskOf returns the node and public key of the ramdisk that joined
// last for a machine's workflow; "" and nil when none did.
func ramdiskOf(ctx context.Context, q store.Querier, machineID, workflowID string) (nodeID string, publicKeyDER []byte, err error) {
	var key string
	err = q.QueryRow(ctx, `SELECT node_id, public_key FROM machine_discovery_tokens
		WHERE machine_id = $1 AND workflow_id = $2 AND used_time IS NOT NULL AND public_key <> ''
		ORDER BY used_time DESC, id DESC LIMIT 1`, machineID, workflowID).Scan(&nodeID, &key)
	if errors.Is(err, store.ErrNotFound) {
		return "", nil, nil
	}
	if err != nil {
		return "", nil, err
	}
	der, err := base64.StdEncoding.DecodeString(key)
	return nodeID, der, err
}

// discoveryDelete deletes a machine's discovery tokens: its ramdisk boot
// ended with the workflow.
func discoveryDelete(ctx context.Context, tx store.Tx, machineID string) error {
	_, err := tx.Exec(ctx, `DELETE FROM machine_discovery_tokens WHERE machine_id = $1`, machineID)
	return err
}

// ramdiskNodes lists the nodes a machine's ramdisks joined as.
func ramdiskNodes(ctx context.Context, q store.Querier, machineID string) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT DISTINCT node_id FROM machine_discovery_tokens WHERE machine_id = $1 AND node_id <> '' ORDER BY node_id`, machineID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// discoveryTokenReplace stores a machine's new discovery token (its secret's
// SHA-256), dropping any unused one of an earlier boot.
func discoveryTokenReplace(ctx context.Context, tx store.Tx, id, secretSHA string, m Machine, now, expire time.Time) error {
	if _, err := tx.Exec(ctx, `DELETE FROM machine_discovery_tokens WHERE machine_id = $1 AND used_time IS NULL`, m.ID); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO machine_discovery_tokens (id, secret_sha256, machine_id, site_id, mac, workflow_id,
		create_time, expire_time) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
		id, secretSHA, m.ID, m.SiteID, m.MAC, m.WorkflowID, now, expire)
	return err
}

// discoveryTokenInsertUsed records, as a used token with the ramdisk's key,
// the join of a ramdisk played in process (JoinedRamdisk).
func discoveryTokenInsertUsed(ctx context.Context, tx store.Tx, id, secretSHA string, m Machine, now time.Time, publicKey string) error {
	_, err := tx.Exec(ctx, `INSERT INTO machine_discovery_tokens (id, secret_sha256, machine_id, site_id, mac, workflow_id,
		create_time, expire_time, used_time, public_key) VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $7, $8)`,
		id, secretSHA, m.ID, m.SiteID, m.MAC, m.WorkflowID, now, publicKey)
	return err
}

// discoveryTokenForUpdate reads a discovery token by its secret's SHA-256,
// locked: id, machine, site, MAC, workflow, expiry, use time, bound CSR and
// node.
func discoveryTokenForUpdate(ctx context.Context, tx store.Tx, secretSHA string) store.Row {
	return tx.QueryRow(ctx, `SELECT id, machine_id, site_id, mac, workflow_id, expire_time, used_time, csr_sha256, node_id
		FROM machine_discovery_tokens WHERE secret_sha256 = $1`+store.ForUpdate(tx), secretSHA)
}

// discoveryTokenUse marks a token used by a join CSR; 0 rows: used already.
func discoveryTokenUse(ctx context.Context, tx store.Tx, id string, now time.Time, csrSHA string) (int64, error) {
	return tx.Exec(ctx, `UPDATE machine_discovery_tokens SET used_time = $2, csr_sha256 = $3 WHERE id = $1 AND used_time IS NULL`,
		id, now, csrSHA)
}

// discoveryTokenJoined records the node and key the token's ramdisk joined as.
func discoveryTokenJoined(ctx context.Context, tx store.Tx, id, nodeID, publicKey string) error {
	_, err := tx.Exec(ctx, `UPDATE machine_discovery_tokens SET node_id = $2, public_key = $3 WHERE id = $1`, id, nodeID, publicKey)
	return err
}
