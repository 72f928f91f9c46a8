package pool

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/store/dirversion"
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
	// Offer is private, all or tenants (those in pool_offers).
	Offer string
	// Owner is the owning tenant's name (read with the row).
	Owner string
	// OfferedTo names the consumer tenants of a list offer (filled by
	// withOffers, not read with the row).
	OfferedTo []string
}

// Offer scopes.
const (
	OfferPrivate = "private"
	OfferAll     = "all"
	OfferTenants = "tenants"
)

// poolColumns reads a pool with its owner's name: a consumer sees whose
// pool it books from.
const poolColumns = `id, tenant_id, name, selector, policy, state, created_by, create_time, update_time, archive_time, offer,
	COALESCE((SELECT t.name FROM tenants t WHERE t.id = pools.tenant_id), '')`

func scanPool(row interface{ Scan(...any) error }) (Pool, error) {
	var p Pool
	err := row.Scan(&p.ID, &p.TenantID, &p.Name, &p.Selector, &p.Policy, &p.State, &p.CreatedBy,
		&p.CreateTime, &p.UpdateTime, &p.ArchiveTime, &p.Offer, &p.Owner)
	return p, err
}

// offeredTo is the condition that a pool is the tenant's own or offered to
// it; $N is the tenant's id.
func offeredTo(n string) string {
	return `(tenant_id = ` + n + ` OR offer = 'all' OR (offer = 'tenants' AND EXISTS (
		SELECT 1 FROM pool_offers o WHERE o.pool_id = pools.id AND o.tenant_id = ` + n + `)))`
}

// Visible reads the pools named ref (a name or an id) that tenantID may
// reserve from — its own first, then those offered to it — at most two, so
// the caller can tell an ambiguous name. ownerID, when set, confines the
// lookup to that owner's pools.
func Visible(ctx context.Context, q store.Querier, tenantID, ownerID, ref string) ([]Pool, error) {
	col := "name"
	if strings.HasPrefix(ref, IDPrefix+"_") {
		col = "id"
	}
	rows, err := q.Query(ctx, `SELECT `+poolColumns+` FROM pools
		WHERE `+col+` = $1 AND ($3 = '' OR tenant_id = $3) AND `+offeredTo("$2")+`
		ORDER BY CASE WHEN tenant_id = $2 THEN 0 ELSE 1 END, id LIMIT 2`, ref, tenantID, ownerID)
	if err != nil {
		return nil, err
	}
	return collectPools(rows)
}

// SetOffer replaces an active pool's offer: its scope and, for tenants, the
// consumer tenant ids. It reports whether the pool was active. It moves the
// directory version on, so an offer withdrawn is seen by the next request on
// every replica.
func SetOffer(ctx context.Context, tx store.Tx, id, scope string, tenantIDs []string) (bool, error) {
	if err := dirversion.Bump(ctx, tx); err != nil {
		return false, err
	}
	n, err := tx.Exec(ctx, `UPDATE pools SET offer = $1, update_time = compute_now() WHERE id = $2 AND state = 'active'`, scope, id)
	if err != nil || n != 1 {
		return false, err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM pool_offers WHERE pool_id = $1`, id); err != nil {
		return false, err
	}
	rows := make([][]any, 0, len(tenantIDs))
	for _, t := range tenantIDs {
		rows = append(rows, []any{id, t})
	}
	return true, store.InsertRows(ctx, tx, `INSERT INTO pool_offers (pool_id, tenant_id)`, "", rows)
}

// OfferedTenants names the tenants a pool is offered to by list, by name.
func OfferedTenants(ctx context.Context, q store.Querier, poolID string) ([]string, error) {
	return store.Strings(q.Query(ctx, `SELECT t.name FROM pool_offers o JOIN tenants t ON t.id = o.tenant_id
		WHERE o.pool_id = $1 ORDER BY t.name`, poolID))
}

func collectPools(rows store.Rows) ([]Pool, error) {
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

// Insert creates a pool's row. Like every write to pools and pool_offers it
// moves the directory version on first, in tx (dirversion.Bump), so no
// replica's cache answers from before it.
func Insert(ctx context.Context, tx store.Tx, p *Pool) error {
	if err := dirversion.Bump(ctx, tx); err != nil {
		return err
	}
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
	TenantID string
	// Offered adds the pools offered to TenantID to its own.
	Offered         bool
	IncludeArchived bool
	After           string
	Limit           int
}

// List lists pools by id.
func List(ctx context.Context, q store.Querier, p *ListParams) ([]Pool, error) {
	tenant := `($2 = '' OR tenant_id = $2)`
	if p.Offered && p.TenantID != "" {
		tenant = offeredTo("$2")
	}
	rows, err := q.Query(ctx, `SELECT `+poolColumns+` FROM pools
		WHERE id > $1 AND `+tenant+` AND ($3 OR state = 'active')
		ORDER BY id LIMIT $4`, p.After, p.TenantID, p.IncludeArchived, p.Limit)
	if err != nil {
		return nil, err
	}
	return collectPools(rows)
}

// Update replaces an active pool's selector and policy; it reports whether
// it did (an archived pool is left alone).
func Update(ctx context.Context, tx store.Tx, tenantID, id, selector, policy string) (bool, error) {
	if err := dirversion.Bump(ctx, tx); err != nil {
		return false, err
	}
	n, err := tx.Exec(ctx, `UPDATE pools SET selector = $1, policy = $2, update_time = compute_now()
		WHERE id = $3 AND tenant_id = $4 AND state = 'active'`, selector, policy, id, tenantID)
	return n == 1, err
}

// Archive archives an active pool; it reports whether it did.
func Archive(ctx context.Context, tx store.Tx, tenantID, id string) (bool, error) {
	if err := dirversion.Bump(ctx, tx); err != nil {
		return false, err
	}
	n, err := tx.Exec(ctx, `UPDATE pools SET state = 'archived', archive_time = compute_now(), update_time = compute_now()
		WHERE id = $1 AND tenant_id = $2 AND state = 'active'`, id, tenantID)
	return n == 1, err
}

// ListVisible lists up to limit active pools tenantID may book from — its
// own first, then those offered to it — for a caller that picks the only
// one when the request names none (an instance's create).
func ListVisible(ctx context.Context, q store.Querier, tenantID string, limit int) ([]Pool, error) {
	rows, err := q.Query(ctx, `SELECT `+poolColumns+` FROM pools WHERE state = 'active' AND `+offeredTo("$1")+`
		ORDER BY CASE WHEN tenant_id = $1 THEN 0 ELSE 1 END, id LIMIT $2`, tenantID, limit)
	if err != nil {
		return nil, err
	}
	return collectPools(rows)
}

// OfNode reads the pool capacity's membership puts the node in; found is
// false for a node of no pool.
func OfNode(ctx context.Context, q store.Querier, nodeID string) (p Pool, found bool, err error) {
	p, err = scanPool(q.QueryRow(ctx, `SELECT `+poolColumns+` FROM pools WHERE id = (SELECT pool_id FROM node_pools WHERE node_id = $1)`, nodeID))
	if errors.Is(err, store.ErrNotFound) {
		return Pool{}, false, nil
	}
	return p, err == nil, err
}

// NodeCount counts the nodes in a pool.
func NodeCount(ctx context.Context, q store.Querier, poolID string) (int, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT COUNT(*) FROM node_pools WHERE pool_id = $1`, poolID).Scan(&n)
	return n, err
}

// PoolNodes is a live pool with its node count.
type PoolNodes struct {
	ID, Name, Policy string
	Nodes            int
}

// LiveNodeCounts lists every pool that is not archived with its node
// count, by id.
func LiveNodeCounts(ctx context.Context, q store.Querier) ([]PoolNodes, error) {
	rows, err := q.Query(ctx, `SELECT p.id, p.name, p.policy, COUNT(np.node_id) FROM pools p LEFT JOIN node_pools np ON np.pool_id = p.id
		WHERE p.state <> 'archived' GROUP BY p.id, p.name, p.policy ORDER BY p.id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []PoolNodes
	for rows.Next() {
		var p PoolNodes
		if err := rows.Scan(&p.ID, &p.Name, &p.Policy, &p.Nodes); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// NodeIDs lists the ids of the nodes in a pool, by id.
func NodeIDs(ctx context.Context, q store.Querier, poolID string) ([]string, error) {
	return store.Strings(q.Query(ctx, `SELECT node_id FROM node_pools WHERE pool_id = $1 ORDER BY node_id`, poolID))
}

// ByName lists the pools of every tenant named name that are not archived,
// by id: a platform operator's reference by name is ambiguous when two
// tenants use it.
func ByName(ctx context.Context, q store.Querier, name string) ([]Pool, error) {
	rows, err := q.Query(ctx, `SELECT `+poolColumns+` FROM pools WHERE name = $1 AND state <> 'archived' ORDER BY id`, name)
	if err != nil {
		return nil, err
	}
	return collectPools(rows)
}
