package placer

import (
	"context"
	"errors"

	"github.com/better-compute/better-compute/internal/store"
)

// tryLock takes the pool's advisory lock on this replica's lock session,
// opening one if there is none (or the last one died, dropping every lock
// it held: the placers find out at their next batch).
func (e *Placers) tryLock(ctx context.Context, c *cluster, poolID string) (bool, error) {
	for attempt := 0; attempt < 2; attempt++ {
		if c.lockConn == nil {
			conn, err := e.DB.PgxPool().Acquire(ctx)
			if err != nil {
				return false, err
			}
			c.lockConn = conn
		}
		var got bool
		err := c.lockConn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, hashtext($2))`, int32(placerLockClass), poolID).Scan(&got)
		if err == nil {
			return got, nil
		}
		// A dead session: drop it and open another.
		c.lockConn.Release()
		c.lockConn = nil
	}
	return false, errors.New("placer: cannot open a session for pool locks")
}

func (e *Placers) unlock(ctx context.Context, c *cluster, poolID string) error {
	if c.lockConn == nil {
		return nil
	}
	_, err := c.lockConn.Exec(ctx, `SELECT pg_advisory_unlock($1, hashtext($2))`, int32(placerLockClass), poolID)
	return err
}

// ownerSet records this replica as the pool's placer.
func ownerSet(ctx context.Context, tx store.Tx, poolID, replicaID, url string) error {
	_, err := tx.Exec(ctx, `INSERT INTO placer_owners (pool_id, replica_id, url, since) VALUES ($1, $2, $3, compute_now())
		ON CONFLICT (pool_id) DO UPDATE SET replica_id = excluded.replica_id, url = excluded.url, since = excluded.since`,
		poolID, replicaID, url)
	return err
}

// ownerGet reads the replica that places the pool and its API URL.
func ownerGet(ctx context.Context, q store.Querier, poolID string) (url, replicaID string, err error) {
	err = q.QueryRow(ctx, `SELECT url, replica_id FROM placer_owners WHERE pool_id = $1`, poolID).Scan(&url, &replicaID)
	return url, replicaID, err
}
