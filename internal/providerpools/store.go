// Package providerpools runs the instances of provider pools: pools whose
// policy names a provider account (policy.provider), where every instance
// is a server rented through the provider's API instead of a guest on one
// of the pool's nodes.
//
// The create is two steps, as every call to a provider must be: the
// instance's API transaction records the instance, its provider row and a
// converge job, and nothing else; the job then calls the provider outside
// any transaction and records what it answered. A provider's Create is
// idempotent by the instance id (the server carries it as a label), so a
// job run again after a crash between the call and its commit finds the
// server it made instead of making a second one. The reconciler lists
// every account's servers: a server no live instance owns is deleted (an
// orphan), and a live instance whose server is gone is recreated while it
// never joined or reported lost once it had.
package providerpools

import (
	"context"
	"embed"
	"encoding/json"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// ModuleName is the migration module name.
const ModuleName = "providerpools"

// Migrations returns the module's tables.
func Migrations() store.Migrations { return store.Embedded(ModuleName, migrationsFS) }

// Desired states of a provider instance.
const (
	DesiredRunning = "running"
	DesiredStopped = "stopped"
	DesiredDeleted = "deleted"
)

// Row is a row of provider_instances.
type Row struct {
	InstanceID, TenantID, ProjectID, PoolID, AccountID string
	ServerType, Image, Location                        string
	SSHKeys                                            []string
	ServerID                                           string
	Desired                                            string
	// Power is an action (providers.PowerAction) not yet sent.
	Power       string
	Attempts    int
	LastError   string
	ActiveSince *time.Time
	ActiveUntil *time.Time
	CreateTime  time.Time
	UpdateTime  time.Time
	// Done: the server is deleted and the instance ended; the reconciler
	// still deletes a server that shows up for it.
	Done bool
}

const columns = `instance_id, tenant_id, project_id, pool_id, account_id, server_type, image, location, ssh_keys, server_id,
	desired, power, attempts, last_error, active_since, active_until, create_time, update_time,
	CASE WHEN done THEN 1 ELSE 0 END`

type scanner interface{ Scan(...any) error }

func scan(row scanner) (Row, error) {
	var (
		r    Row
		keys string
		done int
	)
	err := row.Scan(&r.InstanceID, &r.TenantID, &r.ProjectID, &r.PoolID, &r.AccountID, &r.ServerType, &r.Image, &r.Location,
		&keys, &r.ServerID, &r.Desired, &r.Power, &r.Attempts, &r.LastError, &r.ActiveSince, &r.ActiveUntil, &r.CreateTime, &r.UpdateTime,
		&done)
	r.Done = done == 1
	if err == nil {
		err = json.Unmarshal([]byte(keys), &r.SSHKeys)
	}
	return r, err
}

func keysJSON(keys []string) string {
	if keys == nil {
		keys = []string{}
	}
	b, _ := json.Marshal(keys) // strings always encode
	return string(b)
}

// insert records a provider instance.
func insert(ctx context.Context, tx store.Tx, r *Row) error {
	_, err := tx.Exec(ctx, `INSERT INTO provider_instances (instance_id, tenant_id, project_id, pool_id, account_id, server_type,
		image, location, ssh_keys, server_id, desired, power, attempts, last_error, active_since, active_until, create_time, update_time)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)`,
		r.InstanceID, r.TenantID, r.ProjectID, r.PoolID, r.AccountID, r.ServerType, r.Image, r.Location, keysJSON(r.SSHKeys),
		r.ServerID, r.Desired, r.Power, r.Attempts, r.LastError, r.ActiveSince, r.ActiveUntil, r.CreateTime, r.UpdateTime)
	return err
}

// save writes a row's mutable columns; done marks a row the reconciler no
// longer visits (its server is deleted and its instance ended).
func save(ctx context.Context, tx store.Tx, r *Row, done bool) error {
	n, err := tx.Exec(ctx, `UPDATE provider_instances SET server_id = $2, desired = $3, power = $4, attempts = $5, last_error = $6,
		active_since = $7, active_until = $8, update_time = $9, done = $10 WHERE instance_id = $1`,
		r.InstanceID, r.ServerID, r.Desired, r.Power, r.Attempts, r.LastError, r.ActiveSince, r.ActiveUntil, r.UpdateTime, done)
	if err == nil && n == 0 {
		err = store.ErrNotFound
	}
	return err
}

// get reads an instance's provider row; lock adds a row lock clause.
func get(ctx context.Context, q store.Querier, instanceID, lock string) (Row, error) {
	return scan(q.QueryRow(ctx, `SELECT `+columns+` FROM provider_instances WHERE instance_id = $1`+lock, instanceID))
}

// exists reports whether an instance is a provider pool's.
func exists(ctx context.Context, q store.Querier, instanceID string) (bool, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT COUNT(*) FROM provider_instances WHERE instance_id = $1`, instanceID).Scan(&n)
	return n > 0, err
}

// listOpen lists the rows the reconciler still visits.
func listOpen(ctx context.Context, q store.Querier) ([]Row, error) {
	return collect(q.Query(ctx, `SELECT `+columns+` FROM provider_instances WHERE done = $1 ORDER BY instance_id`, false))
}

// listAccount lists every row of an account, ended ones too.
func listAccount(ctx context.Context, q store.Querier, accountID string) ([]Row, error) {
	return collect(q.Query(ctx, `SELECT `+columns+` FROM provider_instances WHERE account_id = $1 ORDER BY instance_id`, accountID))
}

func collect(rows store.Rows, err error) ([]Row, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		r, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// accountsInUse lists the accounts any provider instance was made with,
// ended ones too: an orphan can outlive its instance's row being done.
func accountsInUse(ctx context.Context, q store.Querier) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT DISTINCT account_id FROM provider_instances ORDER BY account_id`)
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

// activeIn reads the metered intervals overlapping [from, closeAt).
func activeIn(ctx context.Context, q store.Querier, from, closeAt time.Time) ([]Row, error) {
	return collect(q.Query(ctx, `SELECT `+columns+` FROM provider_instances
		WHERE active_since IS NOT NULL AND active_since < $1 AND (active_until IS NULL OR active_until > $2)
		ORDER BY instance_id`, closeAt, from))
}

// addToken records a join token minted for an instance's server.
func addToken(ctx context.Context, tx store.Tx, instanceID, tokenID string) error {
	_, err := tx.Exec(ctx, `INSERT INTO provider_instance_tokens (instance_id, token_id) VALUES ($1, $2)`, instanceID, tokenID)
	return err
}

// tokens lists the join tokens minted for an instance's server.
func tokens(ctx context.Context, q store.Querier, instanceID string) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT token_id FROM provider_instance_tokens WHERE instance_id = $1 ORDER BY token_id`, instanceID)
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

// claim takes an instance's lease until until, unless another job holds it
// past now; it reports whether it did.
func claim(ctx context.Context, tx store.Tx, instanceID string, now, until time.Time) (bool, error) {
	n, err := tx.Exec(ctx, `UPDATE provider_instances SET lease_until = $3
		WHERE instance_id = $1 AND (lease_until IS NULL OR lease_until <= $2)`, instanceID, now, until)
	return n == 1, err
}

// release gives an instance's lease back.
func release(ctx context.Context, tx store.Tx, instanceID string) error {
	_, err := tx.Exec(ctx, `UPDATE provider_instances SET lease_until = NULL WHERE instance_id = $1`, instanceID)
	return err
}
