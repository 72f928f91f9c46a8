package placer

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/better-compute/better-compute/internal/store"
)

// tryLock takes the pool's advisory lock on this replica's lock session,
// opening one if there is none. A session found dead dropped every lock it
// held: every placer of this replica is retired first (each batch's epoch
// check would stop them too), then a new session is opened. The caller
// holds claimMu.
func (e *Placers) tryLock(ctx context.Context, c *cluster, poolID string) (bool, error) {
	for attempt := 0; attempt < 2; attempt++ {
		if c.lockConn == nil {
			conn, err := e.DB.PgxPool().Acquire(ctx)
			if err != nil {
				return false, err
			}
			c.lockConn = conn
			c.watchStop = make(chan struct{})
			go e.watchLocks(conn, c.watchStop)
		}
		var got bool
		err := c.lockConn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, hashtext($2))`, int32(placerLockClass), poolID).Scan(&got)
		if err == nil {
			return got, nil
		}
		if ctx.Err() != nil {
			return false, err
		}
		// A dead session: its locks are gone.
		e.dropLockSession(c, c.lockConn)
	}
	return false, errors.New("placer: cannot open a session for pool locks")
}

// lockPing is how often the lock session is checked: a session that died
// retires this replica's placers within about this long, not at their
// next batch.
const lockPing = 2 * time.Second

// watchLocks pings the lock session until stop closes; a failed ping drops
// the session and retires every placer.
func (e *Placers) watchLocks(conn *pgxpool.Conn, stop chan struct{}) {
	t := time.NewTicker(lockPing)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		e.claimMu.Lock()
		c := e.cluster
		if c == nil || c.lockConn != conn {
			e.claimMu.Unlock()
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), lockPing)
		err := conn.Ping(ctx)
		cancel()
		if err != nil {
			e.dropLockSession(c, conn)
			e.claimMu.Unlock()
			return
		}
		e.claimMu.Unlock()
	}
}

// dropLockSession forgets a lock session that died and retires every
// placer it held pools for. The caller holds claimMu.
func (e *Placers) dropLockSession(c *cluster, conn *pgxpool.Conn) {
	if c.lockConn != conn {
		return
	}
	if c.watchStop != nil {
		close(c.watchStop)
		c.watchStop = nil
	}
	// Closed, not returned to the pool: the session may hold locks.
	_ = conn.Conn().Close(context.Background())
	conn.Release()
	c.lockConn = nil
	e.retireAll()
}

func (e *Placers) unlock(ctx context.Context, c *cluster, poolID string) error {
	if c.lockConn == nil {
		return nil
	}
	_, err := c.lockConn.Exec(ctx, `SELECT pg_advisory_unlock($1, hashtext($2))`, int32(placerLockClass), poolID)
	return err
}

// ownerSet records this replica as the pool's placer at the next epoch,
// which it returns.
func ownerSet(ctx context.Context, tx store.Tx, poolID, replicaID, url string) (int64, error) {
	var epoch int64
	err := tx.QueryRow(ctx, `INSERT INTO placer_owners (pool_id, replica_id, url, since, epoch) VALUES ($1, $2, $3, compute_now(), 1)
		ON CONFLICT (pool_id) DO UPDATE SET replica_id = excluded.replica_id, url = excluded.url, since = excluded.since,
			epoch = placer_owners.epoch + 1
		RETURNING epoch`,
		poolID, replicaID, url).Scan(&epoch)
	return epoch, err
}

// ownerGet reads the replica that places the pool, its API URL and the
// epoch of its claim; forShare locks the row until the transaction ends
// (a batch's fence).
func ownerGet(ctx context.Context, q store.Tx, poolID string, forShare bool) (url, replicaID string, epoch int64, err error) {
	lock := ""
	if forShare {
		lock = store.ForShare(q)
	}
	err = q.QueryRow(ctx, `SELECT url, replica_id, epoch FROM placer_owners WHERE pool_id = $1`+lock, poolID).Scan(&url, &replicaID, &epoch)
	return url, replicaID, epoch, err
}
