package reservation

import (
	"context"
	"errors"
)

// tryLock takes the pool's advisory lock on this replica's lock session,
// opening one if there is none (or the last one died, dropping every lock
// it held: the placers find out at their next batch).
func (e *Engine) tryLock(ctx context.Context, c *cluster, poolID string) (bool, error) {
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

func (e *Engine) unlock(ctx context.Context, c *cluster, poolID string) error {
	if c.lockConn == nil {
		return nil
	}
	_, err := c.lockConn.Exec(ctx, `SELECT pg_advisory_unlock($1, hashtext($2))`, int32(placerLockClass), poolID)
	return err
}
