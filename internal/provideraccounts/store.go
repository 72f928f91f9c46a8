// Package provideraccounts stores a tenant's accounts at the services that
// rent it servers (ProviderAccountService): the provider type, its
// settings, and its credentials only as references to the tenant's sealed
// secrets, checked against the type's manifest (providers.Manifest).
package provideraccounts

import (
	"context"
	"embed"
	"encoding/json"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Module is the migration module name.
const Module = "provideraccounts"

// Migrations returns the module's tables.
func Migrations() store.Migrations { return store.Embedded(Module, migrationsFS) }

// IDPrefix starts an account's id.
const IDPrefix = "pac"

// Account is a row of provider_accounts.
type Account struct {
	ID         string
	TenantID   string
	Name       string
	Type       string
	Settings   map[string]string
	SecretRefs map[string]string
	Endpoint   string
	CreatedBy  string
	CreateTime time.Time
}

const columns = `id, tenant_id, name, type, settings, secret_refs, endpoint, created_by, create_time`

type scanner interface{ Scan(...any) error }

func scan(row scanner) (Account, error) {
	var a Account
	var settings, refs string
	if err := row.Scan(&a.ID, &a.TenantID, &a.Name, &a.Type, &settings, &refs, &a.Endpoint, &a.CreatedBy, &a.CreateTime); err != nil {
		return a, err
	}
	if err := json.Unmarshal([]byte(settings), &a.Settings); err != nil {
		return a, err
	}
	return a, json.Unmarshal([]byte(refs), &a.SecretRefs)
}

func jsonText(m map[string]string) string {
	if m == nil {
		m = map[string]string{}
	}
	b, _ := json.Marshal(m) // a map of strings always encodes
	return string(b)
}

// Get reads a tenant's account by id or name; lock adds a row lock clause.
func Get(ctx context.Context, q store.Querier, tenantID, ref, lock string) (Account, error) {
	col := "name"
	if strings.HasPrefix(ref, IDPrefix+"_") {
		col = "id"
	}
	return scan(q.QueryRow(ctx, `SELECT `+columns+` FROM provider_accounts WHERE tenant_id = $1 AND `+col+` = $2`+lock, tenantID, ref))
}

// ByID reads an account by id, whichever tenant's it is: for the control
// plane's own jobs (a provider pool's converge), never for a request.
func ByID(ctx context.Context, q store.Querier, id string) (Account, error) {
	return scan(q.QueryRow(ctx, `SELECT `+columns+` FROM provider_accounts WHERE id = $1`, id))
}

// Insert creates an account's row; store.ErrUnique when the name is taken.
func Insert(ctx context.Context, tx store.Tx, a *Account) error {
	_, err := tx.Exec(ctx, `INSERT INTO provider_accounts (`+columns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		a.ID, a.TenantID, a.Name, a.Type, jsonText(a.Settings), jsonText(a.SecretRefs), a.Endpoint, a.CreatedBy, a.CreateTime)
	return err
}

// List lists a tenant's accounts after the id after, at most limit.
func List(ctx context.Context, q store.Querier, tenantID, after string, limit int) ([]Account, error) {
	rows, err := q.Query(ctx, `SELECT `+columns+` FROM provider_accounts WHERE tenant_id = $1 AND id > $2 ORDER BY id LIMIT $3`,
		tenantID, after, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Account
	for rows.Next() {
		a, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// Delete removes an account's row.
func Delete(ctx context.Context, tx store.Tx, id string) error {
	_, err := tx.Exec(ctx, `DELETE FROM provider_accounts WHERE id = $1`, id)
	return err
}
