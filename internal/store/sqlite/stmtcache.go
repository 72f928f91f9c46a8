package sqlite

import (
	"context"
	"database/sql"
	"sync"
)

// stmtCache keeps statements prepared, so a query run again skips SQLite's
// parser (a quarter of a write's CPU without it). A query is prepared on
// the pool the first time it is seen, after the transaction that saw it
// ends: the writer pool has one connection, and preparing while a
// transaction holds it would wait for that very transaction.
type stmtCache struct {
	db      *sql.DB
	mu      sync.Mutex
	stmts   map[string]*sql.Stmt
	pending map[string]struct{}
}

// maxCachedStmts bounds the cache; queries beyond it (built with a varying
// number of placeholders, say) run unprepared.
const maxCachedStmts = 1024

func newStmtCache(db *sql.DB) *stmtCache {
	return &stmtCache{db: db, stmts: map[string]*sql.Stmt{}, pending: map[string]struct{}{}}
}

// get returns the prepared statement of query, or nil when there is none
// yet (query is then prepared at the next flush).
func (c *stmtCache) get(query string) *sql.Stmt {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.stmts[query]; ok {
		return s
	}
	if len(c.stmts)+len(c.pending) < maxCachedStmts {
		c.pending[query] = struct{}{}
	}
	return nil
}

// flush prepares the queries seen since the last flush. Call it with no
// transaction of this pool open on the calling goroutine.
func (c *stmtCache) flush(ctx context.Context) {
	c.mu.Lock()
	if len(c.pending) == 0 {
		c.mu.Unlock()
		return
	}
	queries := make([]string, 0, len(c.pending))
	for q := range c.pending {
		queries = append(queries, q)
	}
	clear(c.pending)
	c.mu.Unlock()
	for _, q := range queries {
		s, err := c.db.PrepareContext(ctx, q)
		if err != nil {
			continue // it runs unprepared; the error shows when it runs
		}
		c.mu.Lock()
		if _, dup := c.stmts[q]; dup {
			c.mu.Unlock()
			_ = s.Close()
			continue
		}
		c.stmts[q] = s
		c.mu.Unlock()
	}
}

func (c *stmtCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for q, s := range c.stmts {
		_ = s.Close()
		delete(c.stmts, q)
	}
}
