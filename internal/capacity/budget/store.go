package budget

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Migrations returns the module's tables. The spend check reads the
// reservations table, so they are applied after the reservation module's.
func Migrations() store.Migrations {
	return store.Embedded("budget", migrationsFS)
}

// IDPrefix is the prefix of budget ids (envelope.NewID).
const IDPrefix = "bud"

// Budget is a row of budgets.
type Budget struct {
	ID          string
	TenantID    string
	Period      string
	Amount      Micros
	Enforcement string
	Thresholds  []int
	CreatedBy   string
	CreateTime  time.Time
	UpdateTime  time.Time
}

const budgetColumns = `id, tenant_id, period, amount_micros, enforcement, thresholds, created_by, create_time, update_time`

func scanBudget(row interface{ Scan(...any) error }) (Budget, error) {
	var (
		b  Budget
		th string
	)
	if err := row.Scan(&b.ID, &b.TenantID, &b.Period, &b.Amount, &b.Enforcement, &th, &b.CreatedBy, &b.CreateTime, &b.UpdateTime); err != nil {
		return b, err
	}
	for _, s := range strings.Split(th, ",") {
		if n, err := strconv.Atoi(s); err == nil {
			b.Thresholds = append(b.Thresholds, n)
		}
	}
	return b, nil
}

func joinThresholds(ts []int) string {
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = strconv.Itoa(t)
	}
	return strings.Join(s, ",")
}

// Upsert writes a tenant's budget, replacing the one already there; the
// existing row keeps its id, creator and create time, read back into b.
func Upsert(ctx context.Context, tx store.Tx, b *Budget) error {
	return tx.QueryRow(ctx, `INSERT INTO budgets (`+budgetColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		ON CONFLICT (tenant_id) DO UPDATE
		SET period = excluded.period, amount_micros = excluded.amount_micros, enforcement = excluded.enforcement,
			thresholds = excluded.thresholds, update_time = excluded.update_time
		RETURNING id, created_by, create_time`,
		b.ID, b.TenantID, b.Period, b.Amount, b.Enforcement, joinThresholds(b.Thresholds), b.CreatedBy, b.CreateTime, b.UpdateTime,
	).Scan(&b.ID, &b.CreatedBy, &b.CreateTime)
}

// Get reads a tenant's budget; store.ErrNotFound when it has none.
func Get(ctx context.Context, q store.Querier, tenantID string) (Budget, error) {
	return scanBudget(q.QueryRow(ctx, `SELECT `+budgetColumns+` FROM budgets WHERE tenant_id = $1`, tenantID))
}

// Delete removes a tenant's budget and the thresholds its periods reached;
// false when it had none.
func Delete(ctx context.Context, tx store.Tx, tenantID string) (Budget, bool, error) {
	b, err := scanBudget(tx.QueryRow(ctx, `DELETE FROM budgets WHERE tenant_id = $1 RETURNING `+budgetColumns, tenantID))
	if errors.Is(err, store.ErrNotFound) {
		return b, false, nil
	}
	if err != nil {
		return b, false, err
	}
	_, err = tx.Exec(ctx, `DELETE FROM budget_thresholds WHERE budget_id = $1`, b.ID)
	return b, true, err
}

// ListParams filter a budget listing; an empty tenant lists every tenant's.
type ListParams struct {
	TenantID string
	After    string
	Limit    int
}

// List lists budgets by id.
func List(ctx context.Context, q store.Querier, p *ListParams) ([]Budget, error) {
	rows, err := q.Query(ctx, `SELECT `+budgetColumns+` FROM budgets
		WHERE id > $1 AND ($2 = '' OR tenant_id = $2) ORDER BY id LIMIT $3`, p.After, p.TenantID, p.Limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Budget
	for rows.Next() {
		b, err := scanBudget(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, rows.Err()
}

// LockTenants locks the tenants' budget rows in id order (PostgreSQL;
// SQLite has one writer) and reads them: a batch takes them after the
// quota rows (quota.LockTenants), the one global order, before it checks
// any booking of those tenants. A tenant without a budget is absent.
func LockTenants(ctx context.Context, tx store.Tx, tenantIDs []string) (map[string]Budget, error) {
	out := map[string]Budget{}
	if len(tenantIDs) == 0 {
		return out, nil
	}
	ph := make([]string, len(tenantIDs))
	args := make([]any, len(tenantIDs))
	for i, t := range tenantIDs {
		ph[i], args[i] = fmt.Sprintf("$%d", i+1), t
	}
	rows, err := tx.Query(ctx, `SELECT `+budgetColumns+` FROM budgets WHERE tenant_id IN (`+strings.Join(ph, ", ")+`)
		ORDER BY id`+store.ForUpdate(tx), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		b, err := scanBudget(rows)
		if err != nil {
			return nil, err
		}
		out[b.TenantID] = b
	}
	return out, rows.Err()
}

// chargedIn are the reservation states whose booked hours are committed:
// a release or expiry cuts the window short, so the hours held stay
// committed; failed and canceled reservations commit nothing (as quotas
// count GPU-hours).
const chargedIn = `'pending', 'placed', 'binding', 'active', 'releasing', 'released', 'expired'`

// booked is one of a tenant's reservations, priced.
type booked struct {
	rate       Micros
	start, end time.Time
}

// committedRows reads, in one query, the tenant's charged reservations
// whose window overlaps [from, to), except exclude, and prices each at
// its pool's prices (read once per pool through prices).
func committedRows(ctx context.Context, q store.Querier, tenantID, exclude string, from, to time.Time, prices *PriceBook) ([]booked, error) {
	type row struct {
		pool string
		it   Item
		b    booked
	}
	rs, err := q.Query(ctx, `SELECT pool_id, upper(coalesce(nullif(gpu_model, ''), model)), flavor, gpus + slots, vcpu, memory_gib,
			starts_at, ends_at
		FROM reservations
		WHERE tenant_id = $1 AND state IN (`+chargedIn+`) AND id <> $2 AND starts_at < $3 AND ends_at > $4`,
		tenantID, exclude, to, from)
	if err != nil {
		return nil, fmt.Errorf("read committed reservations: %w", err)
	}
	var raw []row
	for rs.Next() {
		var r row
		if err := rs.Scan(&r.pool, &r.it.Model, &r.it.Flavor, &r.it.GPUs, &r.it.VCPU, &r.it.MemoryGiB, &r.b.start, &r.b.end); err != nil {
			rs.Close()
			return nil, err
		}
		raw = append(raw, r)
	}
	rs.Close()
	if err := rs.Err(); err != nil {
		return nil, err
	}
	out := make([]booked, 0, len(raw))
	for _, r := range raw {
		p, err := prices.Of(ctx, q, r.pool)
		if err != nil {
			return nil, err
		}
		r.b.rate = p.Rate(r.it)
		out = append(out, r.b)
	}
	return out, nil
}

// PriceBook reads pools' prices once each.
type PriceBook struct{ m map[string]Prices }

// Of returns a pool's prices; a pool that is gone is free.
func (pb *PriceBook) Of(ctx context.Context, q store.Querier, poolID string) (Prices, error) {
	if p, ok := pb.m[poolID]; ok {
		return p, nil
	}
	var p Prices
	if poolID != "" {
		row, err := pool.Get(ctx, q, "", poolID)
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return Prices{}, err
		default:
			p = ParsePrices(pool.Policy(row).GetPrices())
		}
	}
	if pb.m == nil {
		pb.m = map[string]Prices{}
	}
	pb.m[poolID] = p
	return p, nil
}

// Rearm forgets the thresholds a budget's periods reached: its percents
// are of the new amount now, and each goes out again when reached.
func Rearm(ctx context.Context, tx store.Tx, budgetID string) error {
	_, err := tx.Exec(ctx, `DELETE FROM budget_thresholds WHERE budget_id = $1`, budgetID)
	return err
}

// reach records that a budget's period reached percent; false when it had
// already.
func reach(ctx context.Context, tx store.Tx, budgetID string, periodStart time.Time, percent int, now time.Time) (bool, error) {
	n, err := tx.Exec(ctx, `INSERT INTO budget_thresholds (budget_id, period_start, percent, reach_time)
		VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`, budgetID, periodStart, percent, now)
	return n == 1, err
}
