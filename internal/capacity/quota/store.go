package quota

import (
	"context"
	"embed"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Migrations returns the module's tables. They read the reservations table,
// so they are applied after the reservation module's.
func Migrations() store.Migrations {
	return store.Embedded("quota", migrationsFS)
}

// IDPrefix is the prefix of quota ids (envelope.NewID).
const IDPrefix = "quo"

// Unlimited is the limit of a quota that does not bound GPUs or GPU-hours.
const Unlimited = -1

// Scope kinds, the Cedar attribute "scope" of a Quota: a tenant-wide quota
// is the platform's to set, a project's the tenant admins'.
const (
	ScopeTenant  = "tenant"
	ScopeProject = "project"
)

// Quota is a row of quotas. Empty ProjectID, Model or PoolID mean "all".
type Quota struct {
	ID        string
	TenantID  string
	ProjectID string
	// Model is normalized upper-case (H100).
	Model  string
	PoolID string
	// GPUs and GPUHours are limits; Unlimited (-1) means none.
	GPUs       int
	GPUHours   float64
	CreatedBy  string
	CreateTime time.Time
	UpdateTime time.Time
}

// Kind is ScopeTenant or ScopeProject.
func (q Quota) Kind() string {
	if q.ProjectID == "" {
		return ScopeTenant
	}
	return ScopeProject
}

// Scope names what the quota bounds, as QuotaUse.scope says it: "tenant" or
// "project/<id>", then "/model=<M>" and "/pool=<id>" when it is narrowed.
func (q Quota) Scope() string {
	s := ScopeTenant
	if q.ProjectID != "" {
		s = ScopeProject + "/" + q.ProjectID
	}
	if q.Model != "" {
		s += "/model=" + q.Model
	}
	if q.PoolID != "" {
		s += "/pool=" + q.PoolID
	}
	return s
}

// NormalModel is the form models are stored and compared in.
func NormalModel(m string) string { return strings.ToUpper(strings.TrimSpace(m)) }

const quotaColumns = `id, tenant_id, project_id, model, pool_id, gpus, gpu_hours, created_by, create_time, update_time`

func scanQuota(row interface{ Scan(...any) error }) (Quota, error) {
	var q Quota
	err := row.Scan(&q.ID, &q.TenantID, &q.ProjectID, &q.Model, &q.PoolID, &q.GPUs, &q.GPUHours, &q.CreatedBy,
		&q.CreateTime, &q.UpdateTime)
	return q, err
}

func scanQuotas(rows store.Rows, err error) ([]Quota, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Quota
	for rows.Next() {
		q, err := scanQuota(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, q)
	}
	return out, rows.Err()
}

// Upsert writes the quota of q's scope, replacing the limits of the one
// already there. The existing row keeps its id, creator and create time;
// Upsert reads them back into q.
func Upsert(ctx context.Context, tx store.Tx, q *Quota) error {
	return tx.QueryRow(ctx, `INSERT INTO quotas (`+quotaColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
		ON CONFLICT (tenant_id, project_id, model, pool_id) DO UPDATE
		SET gpus = excluded.gpus, gpu_hours = excluded.gpu_hours, update_time = excluded.update_time
		RETURNING id, created_by, create_time`,
		q.ID, q.TenantID, q.ProjectID, q.Model, q.PoolID, q.GPUs, q.GPUHours, q.CreatedBy, q.CreateTime, q.UpdateTime,
	).Scan(&q.ID, &q.CreatedBy, &q.CreateTime)
}

// Get reads a quota of a tenant by id.
func Get(ctx context.Context, q store.Querier, tenantID, id string) (Quota, error) {
	return scanQuota(q.QueryRow(ctx, `SELECT `+quotaColumns+` FROM quotas WHERE id = $1 AND tenant_id = $2`, id, tenantID))
}

// ListParams filter a quota listing; empty fields do not filter.
type ListParams struct {
	TenantID  string
	ProjectID string
	After     string
	Limit     int
}

// List lists quotas by id.
func List(ctx context.Context, q store.Querier, p *ListParams) ([]Quota, error) {
	return scanQuotas(q.Query(ctx, `SELECT `+quotaColumns+` FROM quotas
		WHERE id > $1 AND ($2 = '' OR tenant_id = $2) AND ($3 = '' OR project_id = $3)
		ORDER BY id LIMIT $4`, p.After, p.TenantID, p.ProjectID, p.Limit))
}

// covering reads the quotas that bound a charge: the tenant's, the
// project's, each either for every model and pool or for the charge's.
func covering(ctx context.Context, q store.Querier, c Charge) ([]Quota, error) {
	return scanQuotas(q.Query(ctx, `SELECT `+quotaColumns+` FROM quotas
		WHERE tenant_id = $1 AND project_id IN ('', $2) AND model IN ('', $3) AND pool_id IN ('', $4)
		ORDER BY id`, c.TenantID, c.ProjectID, NormalModel(c.Model), c.PoolID))
}

// Reservation states, as the reservation module writes them.
var (
	// liveStates hold their GPUs over their window.
	liveStates = []string{"pending", "placed", "binding", "active", "releasing"}
	// chargedStates count toward GPU-hours: a release cuts the window short,
	// so only the hours held stay charged; failed and canceled reservations
	// are never charged.
	chargedStates = []string{"pending", "placed", "binding", "active", "releasing", "released", "expired"}
	chargedIn     = "'" + strings.Join(chargedStates, "', '") + "'"
)

// Usage is what a quota's scope holds.
type Usage struct {
	// GPUs is the sum of the GPUs of the scope's live reservations whose
	// window overlaps the window asked about. It is conservative: two
	// reservations that overlap the window but not each other both count.
	GPUs int
	// GPUHours is the sum of gpus × (ends_at − starts_at) over the scope's
	// reservations in a charged state, whenever they run.
	GPUHours float64
}

// usageOf computes what quota's scope holds over [start, end), leaving the
// reservation exclude out. A reservation is in the scope when its tenant is
// the quota's, its project is the quota's (or the quota is tenant-wide), its
// pool is the quota's (or the quota is for every pool), and the model it was
// placed on (else the one it asked for) is the quota's (or the quota is for
// every model). Hours are summed in Go from the scanned times, so both
// dialects compute them alike.
func usageOf(ctx context.Context, q store.Querier, quota Quota, start, end time.Time, exclude string) (Usage, error) {
	rows, err := q.Query(ctx, `SELECT state, gpus, starts_at, ends_at FROM reservations
		WHERE tenant_id = $1 AND ($2 = '' OR project_id = $2) AND ($3 = '' OR pool_id = $3)
		AND ($4 = '' OR upper(coalesce(nullif(gpu_model, ''), model)) = $4)
		AND state IN (`+chargedIn+`) AND id <> $5`,
		quota.TenantID, quota.ProjectID, quota.PoolID, quota.Model, exclude)
	if err != nil {
		return Usage{}, err
	}
	defer rows.Close()
	var u Usage
	for rows.Next() {
		var (
			state        string
			gpus         int
			starts, ends time.Time
		)
		if err := rows.Scan(&state, &gpus, &starts, &ends); err != nil {
			return Usage{}, err
		}
		u.GPUHours += float64(gpus) * ends.Sub(starts).Hours()
		if slices.Contains(liveStates, state) && starts.Before(end) && ends.After(start) {
			u.GPUs += gpus
		}
	}
	return u, rows.Err()
}

// LockTenants locks every quota of the tenants, in id order (PostgreSQL;
// SQLite has one writer): a batch of charges takes its quota locks once,
// in the one global order, before it checks any.
func LockTenants(ctx context.Context, tx store.Tx, tenantIDs []string) error {
	if tx.Dialect() != store.Postgres || len(tenantIDs) == 0 {
		return nil
	}
	ph := make([]string, len(tenantIDs))
	args := make([]any, len(tenantIDs))
	for i, t := range tenantIDs {
		ph[i], args[i] = fmt.Sprintf("$%d", i+1), t
	}
	_, err := tx.Exec(ctx, `SELECT id FROM quotas WHERE tenant_id IN (`+strings.Join(ph, ", ")+`) ORDER BY id`+store.ForUpdate(tx), args...)
	return err
}
