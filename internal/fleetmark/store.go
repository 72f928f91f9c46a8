// Package fleetmark keeps the marks of the objects `better-compute fleet
// apply` manages (FleetConfigService): per object of a tenant or of the
// platform, the spec it last applied and that spec's digest, so that
// `fleet drift` can tell what was changed by hand since.
//
// A mark is bookkeeping beside the object, written by its own API call
// after the change it records; it never changes the object and no other
// module reads it.
package fleetmark

import (
	"context"
	"embed"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Module is the migration module name.
const Module = "fleetmark"

// Migrations returns the module's tables.
func Migrations() store.Migrations { return store.Embedded(Module, migrationsFS) }

// IDPrefix is the marks' id prefix (envelope.NewID).
const IDPrefix = "fmk"

// Mark is a row of fleet_managed.
type Mark struct {
	ID        string
	TenantID  string
	Kind      string
	Name      string
	Digest    string
	SpecJSON  string
	ApplyTime time.Time
	AppliedBy string
}

const columns = `id, tenant_id, kind, name, digest, spec_json, apply_time, applied_by`

type scanner interface{ Scan(...any) error }

func scan(row scanner) (Mark, error) {
	var m Mark
	err := row.Scan(&m.ID, &m.TenantID, &m.Kind, &m.Name, &m.Digest, &m.SpecJSON, &m.ApplyTime, &m.AppliedBy)
	return m, err
}

// Get reads an owner's mark of one object; lock adds a row lock clause.
func Get(ctx context.Context, q store.Querier, tenantID, kind, name, lock string) (Mark, error) {
	return scan(q.QueryRow(ctx, `SELECT `+columns+` FROM fleet_managed WHERE tenant_id = $1 AND kind = $2 AND name = $3`+lock, tenantID, kind, name))
}

// Insert writes a new mark.
func Insert(ctx context.Context, tx store.Tx, m *Mark) error {
	_, err := tx.Exec(ctx, `INSERT INTO fleet_managed (`+columns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
		m.ID, m.TenantID, m.Kind, m.Name, m.Digest, m.SpecJSON, m.ApplyTime, m.AppliedBy)
	return err
}

// Update replaces a mark's spec, digest and who applied it when.
func Update(ctx context.Context, tx store.Tx, m *Mark) error {
	_, err := tx.Exec(ctx, `UPDATE fleet_managed SET digest = $2, spec_json = $3, apply_time = $4, applied_by = $5 WHERE id = $1`,
		m.ID, m.Digest, m.SpecJSON, m.ApplyTime, m.AppliedBy)
	return err
}

// List lists an owner's marks by id after the cursor.
func List(ctx context.Context, q store.Querier, tenantID, after string, limit int) ([]Mark, error) {
	rows, err := q.Query(ctx, `SELECT `+columns+` FROM fleet_managed WHERE tenant_id = $1 AND id > $2 ORDER BY id LIMIT $3`, tenantID, after, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Mark
	for rows.Next() {
		m, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// Delete removes a mark's row.
func Delete(ctx context.Context, tx store.Tx, id string) error {
	_, err := tx.Exec(ctx, `DELETE FROM fleet_managed WHERE id = $1`, id)
	return err
}

// TenantRows lists the tenant's rows of this module, in the order
// TenantRowsDelete removes them: a tenant delete's dry run.
func TenantRows(ctx context.Context, q store.Querier, tenantID string) ([]store.TenantRow, error) {
	return store.TenantRows(q.Query(ctx, `SELECT 'fleet_managed', id FROM fleet_managed WHERE tenant_id = $1 ORDER BY id`, tenantID))
}

// TenantRowsDelete deletes every row TenantRows lists; the tenant delete
// runs it inside its one transaction.
func TenantRowsDelete(ctx context.Context, tx store.Tx, tenantID string) error {
	_, err := tx.Exec(ctx, `DELETE FROM fleet_managed WHERE tenant_id = $1`, tenantID)
	return err
}
