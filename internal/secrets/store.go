// Package secrets stores a tenant's named secrets (SecretService): values
// sealed at rest, write-only through the API, versioned per put, and opened
// only in-process for a workload of the same tenant (Open).
package secrets

import (
	"context"
	"embed"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Module is the migration module name.
const Module = "secrets"

// Migrations returns the module's tables.
func Migrations() store.Migrations { return store.Embedded(Module, migrationsFS) }

// IDPrefix is the secrets' id prefix (envelope.NewID).
const IDPrefix = "sec"

// Secret is a row of secrets; Value is sealed.
type Secret struct {
	ID          string
	TenantID    string
	Name        string
	Version     int64
	Value       []byte
	SizeBytes   int64
	Description string
	CreateTime  time.Time
	UpdateTime  time.Time
	// NodeReadable lets the tenant's nodes fetch it (AgentService.FetchSecret).
	NodeReadable bool
}

const columns = `id, tenant_id, name, version, value, size_bytes, description, create_time, update_time, node_readable`

type scanner interface{ Scan(...any) error }

func scan(row scanner) (Secret, error) {
	var s Secret
	err := row.Scan(&s.ID, &s.TenantID, &s.Name, &s.Version, &s.Value, &s.SizeBytes, &s.Description, &s.CreateTime, &s.UpdateTime, &s.NodeReadable)
	return s, err
}

func refColumn(ref string) string {
	if strings.HasPrefix(ref, IDPrefix+"_") {
		return "id"
	}
	return "name"
}

// Get reads an owner's secret (tenant id, "" for the platform) by id or
// name; lock adds a row lock clause (store.ForUpdate).
func Get(ctx context.Context, q store.Querier, tenantID, ref, lock string) (Secret, error) {
	return scan(q.QueryRow(ctx, `SELECT `+columns+` FROM secrets WHERE tenant_id = $1 AND `+refColumn(ref)+` = $2`+lock, tenantID, ref))
}

// Insert creates a secret's row.
func Insert(ctx context.Context, tx store.Tx, s *Secret) error {
	_, err := tx.Exec(ctx, `INSERT INTO secrets (`+columns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
		s.ID, s.TenantID, s.Name, s.Version, s.Value, s.SizeBytes, s.Description, s.CreateTime, s.UpdateTime, s.NodeReadable)
	return err
}

// Update replaces a secret's value, version, description and node grant.
func Update(ctx context.Context, tx store.Tx, s *Secret) error {
	_, err := tx.Exec(ctx, `UPDATE secrets SET version = $2, value = $3, size_bytes = $4, description = $5, update_time = $6, node_readable = $7 WHERE id = $1`,
		s.ID, s.Version, s.Value, s.SizeBytes, s.Description, s.UpdateTime, s.NodeReadable)
	return err
}

// List lists an owner's secrets by id after the cursor.
func List(ctx context.Context, q store.Querier, tenantID, after string, limit int) ([]Secret, error) {
	rows, err := q.Query(ctx, `SELECT `+columns+` FROM secrets WHERE tenant_id = $1 AND id > $2 ORDER BY id LIMIT $3`, tenantID, after, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Secret
	for rows.Next() {
		s, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// Delete removes a secret's row.
func Delete(ctx context.Context, tx store.Tx, id string) error {
	_, err := tx.Exec(ctx, `DELETE FROM secrets WHERE id = $1`, id)
	return err
}

// sealedValue is a secret's id and sealed value: what a reseal reads.
type sealedValue struct {
	ID     string
	Sealed []byte
}

// sealedValues lists every secret's id and sealed value, of every owner.
func sealedValues(ctx context.Context, q store.Querier) ([]sealedValue, error) {
	rows, err := q.Query(ctx, `SELECT id, value FROM secrets ORDER BY id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []sealedValue
	for rows.Next() {
		var v sealedValue
		if err := rows.Scan(&v.ID, &v.Sealed); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// valueReseal replaces a secret's sealed value with the same plaintext
// sealed anew, only while the row still holds old: a put since the read
// wins. It reports whether it replaced it.
func valueReseal(ctx context.Context, tx store.Tx, id string, old, resealed []byte) (bool, error) {
	n, err := tx.Exec(ctx, `UPDATE secrets SET value = $3 WHERE id = $1 AND value = $2`, id, old, resealed)
	return n > 0, err
}
