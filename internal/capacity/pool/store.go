package pool

import (
	"cmp"
	"context"
	"embed"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Migrations returns the module's tables.
func Migrations() store.Migrations {
	return store.Embedded("pool", migrationsFS)
}

// IDPrefix is the prefix of pool ids (envelope.NewID).
const IDPrefix = "pool"

// Pool states.
const (
	StateActive   = "active"
	StateArchived = "archived"
)

// Pool is a row of pools.
type Pool struct {
	ID          string
	TenantID    string
	Name        string
	Selector    string // JSON array of requirements
	Policy      string // JSON object
	State       string
	CreatedBy   string
	CreateTime  time.Time
	UpdateTime  time.Time
	ArchiveTime *time.Time
}

const poolColumns = `id, tenant_id, name, selector, policy, state, created_by, create_time, update_time, archive_time`

func scanPool(row interface{ Scan(...any) error }) (Pool, error) {
	var p Pool
	err := row.Scan(&p.ID, &p.TenantID, &p.Name, &p.Selector, &p.Policy, &p.State, &p.CreatedBy,
		&p.CreateTime, &p.UpdateTime, &p.ArchiveTime)
	return p, err
}

// Insert creates a pool's row.
func Insert(ctx context.Context, tx store.Tx, p *Pool) error {
	_, err := tx.Exec(ctx, `INSERT INTO pools (id, tenant_id, name, selector, policy, state, created_by, create_time, update_time)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		p.ID, p.TenantID, p.Name, cmp.Or(p.Selector, "[]"), cmp.Or(p.Policy, "{}"), cmp.Or(p.State, StateActive),
		p.CreatedBy, p.CreateTime, p.UpdateTime)
	return err
}

// Get reads a pool by name or id; a non-empty tenantID confines the lookup
// (a name needs one).
func Get(ctx context.Context, q store.Querier, tenantID, ref string) (Pool, error) {
	col := "name"
	if strings.HasPrefix(ref, IDPrefix+"_") {
		col = "id"
	}
	return scanPool(q.QueryRow(ctx, `SELECT `+poolColumns+` FROM pools
		WHERE `+col+` = $1 AND ($2 = '' OR tenant_id = $2)`, ref, tenantID))
}

// GetForUpdate reads a pool by id and locks its row until the transaction
// ends (PostgreSQL; SQLite has one writer): an archive or a policy change
// waits for the writer, and two writers of one pool take turns.
func GetForUpdate(ctx context.Context, tx store.Tx, id string) (Pool, error) {
	return scanPool(tx.QueryRow(ctx, `SELECT `+poolColumns+` FROM pools WHERE id = $1`+store.ForUpdate(tx), id))
}

// ListParams filter a pool listing.
type ListParams struct {
	TenantID        string
	IncludeArchived bool
	After           string
	Limit           int
}

// List lists pools by id.
func List(ctx context.Context, q store.Querier, p *ListParams) ([]Pool, error) {
	rows, err := q.Query(ctx, `SELECT `+poolColumns+` FROM pools
		WHERE id > $1 AND ($2 = '' OR tenant_id = $2) AND ($3 OR state = 'active')
		ORDER BY id LIMIT $4`, p.After, p.TenantID, p.IncludeArchived, p.Limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Pool
	for rows.Next() {
		p, err := scanPool(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// Update replaces an active pool's selector and policy; it reports whether
// it did (an archived pool is left alone).
func Update(ctx context.Context, tx store.Tx, tenantID, id, selector, policy string) (bool, error) {
	n, err := tx.Exec(ctx, `UPDATE pools SET selector = $1, policy = $2, update_time = compute_now()
		WHERE id = $3 AND tenant_id = $4 AND state = 'active'`, selector, policy, id, tenantID)
	return n == 1, err
}

// Archive archives an active pool; it reports whether it did.
func Archive(ctx context.Context, tx store.Tx, tenantID, id string) (bool, error) {
	n, err := tx.Exec(ctx, `UPDATE pools SET state = 'archived', archive_time = compute_now(), update_time = compute_now()
		WHERE id = $1 AND tenant_id = $2 AND state = 'active'`, id, tenantID)
	return n == 1, err
}
