package console

import (
	"context"
	"embed"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Module is the migration module name.
const Module = "console"

// Migrations returns the module's table (console_sessions).
func Migrations() store.Migrations { return store.Embedded(Module, migrationsFS) }

// sessionRow is a row of console_sessions; APIKey is sealed.
type sessionRow struct {
	IDHash      string
	APIKey      []byte
	PrincipalID string
	CSRFToken   string
	CreateTime  time.Time
	ExpireTime  time.Time
}

// sessionInsert stores a new session.
func sessionInsert(ctx context.Context, tx store.Tx, s *sessionRow) error {
	_, err := tx.Exec(ctx, `INSERT INTO console_sessions (id_hash, api_key, principal_id, csrf_token, create_time, expire_time)
		VALUES ($1, $2, $3, $4, $5, $6)`, s.IDHash, s.APIKey, s.PrincipalID, s.CSRFToken, s.CreateTime, s.ExpireTime)
	return err
}

// sessionGet reads a session by its id hash; store.ErrNotFound when there
// is none. Expiry is the caller's to check, against the injected clock.
func sessionGet(ctx context.Context, q store.Querier, idHash string) (sessionRow, error) {
	var s sessionRow
	err := q.QueryRow(ctx, `SELECT id_hash, api_key, principal_id, csrf_token, create_time, expire_time
		FROM console_sessions WHERE id_hash = $1`, idHash).
		Scan(&s.IDHash, &s.APIKey, &s.PrincipalID, &s.CSRFToken, &s.CreateTime, &s.ExpireTime)
	return s, err
}

// sessionDelete removes a session (sign-out, expiry, a key the API no
// longer accepts).
func sessionDelete(ctx context.Context, tx store.Tx, idHash string) error {
	_, err := tx.Exec(ctx, `DELETE FROM console_sessions WHERE id_hash = $1`, idHash)
	return err
}

// sessionDeleteExpired removes every session that expired before now.
func sessionDeleteExpired(ctx context.Context, tx store.Tx, now time.Time) (int64, error) {
	return tx.Exec(ctx, `DELETE FROM console_sessions WHERE expire_time <= $1`, now)
}
