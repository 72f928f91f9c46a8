package tenancy

import (
	"cmp"
	"context"
	"embed"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/store/dirversion"
)

//go:embed migrations
var migrationsFS embed.FS

// Migrations returns the module's tables.
func Migrations() store.Migrations {
	return store.Embedded("tenancy", migrationsFS)
}

// PlatformTenantID is not a tenant: platform-level rows use the empty id.
const PlatformTenantID = ""

// Tenant is an organization.
type Tenant struct {
	ID          string
	Name        string
	DisplayName string
	// State is TenantActive or TenantSuspended.
	State      string
	CreateTime time.Time
}

// Tenant states (docs/tenants.md).
const (
	TenantActive    = "active"
	TenantSuspended = "suspended"
)

// Project groups a tenant's resources.
type Project struct {
	ID          string
	TenantID    string
	Name        string
	DisplayName string
	CreateTime  time.Time
}

// TenantInsert creates a tenant. Like every write to tenants and projects
// it moves the directory version on first, in tx (dirversion.Bump), so no
// replica's cache answers from before it.
func TenantInsert(ctx context.Context, tx store.Tx, t Tenant) error {
	if err := dirversion.Bump(ctx, tx); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO tenants (id, name, display_name, state, create_time) VALUES ($1, $2, $3, $4, $5)`,
		t.ID, t.Name, t.DisplayName, cmp.Or(t.State, TenantActive), t.CreateTime)
	return err
}

// TenantGet resolves a tenant by id (tnt_…) or name.
func TenantGet(ctx context.Context, q store.Querier, ref string) (Tenant, error) {
	col := "name"
	if strings.HasPrefix(ref, "tnt_") {
		col = "id"
	}
	var t Tenant
	err := q.QueryRow(ctx, `SELECT id, name, display_name, state, create_time FROM tenants WHERE `+col+` = $1`, ref).
		Scan(&t.ID, &t.Name, &t.DisplayName, &t.State, &t.CreateTime)
	return t, err
}

// TenantList lists tenants by id after the cursor. When only is set, just
// that tenant is listed (a tenant principal sees itself).
func TenantList(ctx context.Context, q store.Querier, after, only string, limit int) ([]Tenant, error) {
	rows, err := q.Query(ctx, `SELECT id, name, display_name, state, create_time FROM tenants
		WHERE id > $1 AND ($2 = '' OR id = $2) ORDER BY id LIMIT $3`, after, only, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Tenant
	for rows.Next() {
		var t Tenant
		if err := rows.Scan(&t.ID, &t.Name, &t.DisplayName, &t.State, &t.CreateTime); err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// TenantSetState moves a tenant to state (moving the directory version on,
// so every replica's next request sees it); it reports whether the tenant
// exists.
func TenantSetState(ctx context.Context, tx store.Tx, id, state string) (bool, error) {
	if err := dirversion.Bump(ctx, tx); err != nil {
		return false, err
	}
	n, err := tx.Exec(ctx, `UPDATE tenants SET state = $2 WHERE id = $1`, id, state)
	return n == 1, err
}

// TenantDelete deletes the tenant row itself, the cascade's last step (and
// its projects, which only the tenancy module owns).
func TenantDelete(ctx context.Context, tx store.Tx, id string) error {
	if err := dirversion.Bump(ctx, tx); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM projects WHERE tenant_id = $1`, id); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `DELETE FROM tenants WHERE id = $1`, id)
	return err
}

// ProjectIDs lists a tenant's project ids, for the delete's dry run.
func ProjectIDs(ctx context.Context, q store.Querier, tenantID string) ([]string, error) {
	return store.Strings(q.Query(ctx, `SELECT id FROM projects WHERE tenant_id = $1 ORDER BY id`, tenantID))
}

// ProjectInsert creates a project (moving the directory version on).
func ProjectInsert(ctx context.Context, tx store.Tx, p Project) error {
	if err := dirversion.Bump(ctx, tx); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO projects (id, tenant_id, name, display_name, create_time) VALUES ($1, $2, $3, $4, $5)`,
		p.ID, p.TenantID, p.Name, p.DisplayName, p.CreateTime)
	return err
}

const projectColumns = `id, tenant_id, name, display_name, create_time`

func scanProject(row interface{ Scan(...any) error }) (Project, error) {
	var p Project
	err := row.Scan(&p.ID, &p.TenantID, &p.Name, &p.DisplayName, &p.CreateTime)
	return p, err
}

// ProjectGet resolves a project of a tenant by id (prj_…) or name; a project
// of another tenant is not found.
func ProjectGet(ctx context.Context, q store.Querier, tenantID, ref string) (Project, error) {
	col := "name"
	if strings.HasPrefix(ref, "prj_") {
		col = "id"
	}
	return scanProject(q.QueryRow(ctx, `SELECT `+projectColumns+` FROM projects WHERE tenant_id = $1 AND `+col+` = $2`, tenantID, ref))
}

// ProjectList lists a tenant's projects by id after the cursor. namePrefix
// must be validated as a name: it is used in LIKE unescaped.
func ProjectList(ctx context.Context, q store.Querier, tenantID, namePrefix, after string, limit int) ([]Project, error) {
	rows, err := q.Query(ctx, `SELECT `+projectColumns+` FROM projects
		WHERE tenant_id = $1 AND id > $2 AND name LIKE $3 ORDER BY id LIMIT $4`,
		tenantID, after, namePrefix+"%", limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Project
	for rows.Next() {
		p, err := scanProject(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// ProjectDelete deletes a project of a tenant; it reports whether one was.
// It moves the directory version on, so the next request on every replica
// no longer finds the project.
func ProjectDelete(ctx context.Context, tx store.Tx, tenantID, id string) (bool, error) {
	if err := dirversion.Bump(ctx, tx); err != nil {
		return false, err
	}
	n, err := tx.Exec(ctx, `DELETE FROM projects WHERE tenant_id = $1 AND id = $2`, tenantID, id)
	return n == 1, err
}
