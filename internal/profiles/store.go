package profiles

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Module is the migration module name.
const Module = "profiles"

// Migrations returns the module's tables.
func Migrations() store.Migrations { return store.Embedded(Module, migrationsFS) }

// IDPrefix starts a tenant profile's id; BuiltinIDPrefix a built-in's,
// which sorts before it so a list pages through the built-ins first.
const (
	IDPrefix        = "prf"
	BuiltinIDPrefix = "prb"
)

// Stored is a tenant's profile, a row of profiles (or a built-in, with no
// tenant).
type Stored struct {
	ID          string
	TenantID    string
	Name        string
	Kind        string
	Description string
	Version     int
	Document    string
	Format      string
	Driver      string
	Expansion   provision.Profile
	Builtin     bool
	CreatedBy   string
	CreateTime  time.Time
	UpdateTime  time.Time
}

// FromDocument is the row a parsed document makes.
func FromDocument(d Document, text, format string) Stored {
	if format == "" {
		format = FormatYAML
	}
	return Stored{Name: d.Name, Kind: d.Kind, Description: d.Description, Document: text, Format: strings.ToLower(format),
		Driver: d.Driver, Expansion: d.Profile}
}

// BuiltinStored lists the built-in profiles as rows.
func BuiltinStored() []Stored {
	ds, err := builtins()
	if err != nil {
		return nil
	}
	out := make([]Stored, 0, len(ds))
	for _, d := range ds {
		b, _ := builtinFS.ReadFile("builtin/" + d.Name + ".yaml")
		s := FromDocument(d, string(b), FormatYAML)
		s.ID, s.Version, s.Builtin, s.CreatedBy = BuiltinIDPrefix+"_"+d.Name, 1, true, "system"
		out = append(out, s)
	}
	return out
}

const columns = `id, tenant_id, name, kind, description, version, document, format, driver, expansion, created_by, create_time, update_time`

func scan(row store.Row) (Stored, error) {
	var s Stored
	var exp string
	if err := row.Scan(&s.ID, &s.TenantID, &s.Name, &s.Kind, &s.Description, &s.Version, &s.Document, &s.Format, &s.Driver, &exp,
		&s.CreatedBy, &s.CreateTime, &s.UpdateTime); err != nil {
		return s, err
	}
	s.CreateTime, s.UpdateTime = s.CreateTime.UTC(), s.UpdateTime.UTC()
	if err := json.Unmarshal([]byte(exp), &s.Expansion); err != nil {
		return s, fmt.Errorf("profile %s: expansion: %w", s.ID, err)
	}
	return s, nil
}

// Get reads a tenant's profile by id or name; lock adds a row lock clause.
func Get(ctx context.Context, q store.Querier, tenantID, ref, lock string) (Stored, error) {
	col := "name"
	if strings.HasPrefix(ref, IDPrefix+"_") {
		col = "id"
	}
	return scan(q.QueryRow(ctx, `SELECT `+columns+` FROM profiles WHERE tenant_id = $1 AND `+col+` = $2`+lock, tenantID, ref))
}

// Insert writes a new profile; store.ErrUnique when its name is taken.
func Insert(ctx context.Context, tx store.Tx, s *Stored) error {
	exp, err := json.Marshal(s.Expansion)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO profiles (`+columns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)`,
		s.ID, s.TenantID, s.Name, s.Kind, s.Description, s.Version, s.Document, s.Format, s.Driver, string(exp), s.CreatedBy,
		s.CreateTime, s.UpdateTime)
	return err
}

// Update writes a profile's new version.
func Update(ctx context.Context, tx store.Tx, s *Stored) error {
	exp, err := json.Marshal(s.Expansion)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE profiles SET kind = $2, description = $3, version = $4, document = $5, format = $6, driver = $7,
		expansion = $8, update_time = $9 WHERE id = $1`,
		s.ID, s.Kind, s.Description, s.Version, s.Document, s.Format, s.Driver, string(exp), s.UpdateTime)
	return err
}

// List lists a tenant's profiles after the id after, at most limit.
func List(ctx context.Context, q store.Querier, tenantID, after string, limit int) ([]Stored, error) {
	rows, err := q.Query(ctx, `SELECT `+columns+` FROM profiles WHERE tenant_id = $1 AND id > $2 ORDER BY id LIMIT $3`,
		tenantID, after, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Stored
	for rows.Next() {
		s, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// Delete removes a profile's row.
func Delete(ctx context.Context, tx store.Tx, id string) error {
	_, err := tx.Exec(ctx, `DELETE FROM profiles WHERE id = $1`, id)
	return err
}
