package reservation

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/capacity/atoms"
	"github.com/better-compute/better-compute/internal/capacity/booking"
	"github.com/better-compute/better-compute/internal/capacity/placer"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Migrations returns the module's tables. They follow fleet's, pool's and
// booking's.
func Migrations() store.Migrations {
	return store.Embedded("reservation", migrationsFS)
}

// IDPrefix is the prefix of reservation ids.
const IDPrefix = "rsv"

const columns = `id, tenant_id, project_id, pool_id, state, gpus, model, mig_profile, slots, vcpu, memory_gib,
	hugepages_1gi, binding, single_tenant, starts_at, ends_at, node_id, gpu_model, placement, conditions,
	explanation, command_id, bind_attempts, bind_deadline, active_since, active_until, created_by, create_time, update_time, flavor, ends_as, release_time`

func scan(row interface{ Scan(...any) error }) (Reservation, error) {
	var r Reservation
	var placement, conds string
	err := row.Scan(&r.ID, &r.TenantID, &r.ProjectID, &r.PoolID, &r.State, &r.GPUs, &r.Model, &r.MIGProfile, &r.Slots,
		&r.VCPU, &r.MemoryGiB, &r.Hugepages1Gi, &r.Binding, &r.SingleTenant, &r.StartsAt, &r.EndsAt, &r.NodeID,
		&r.GPUModel, &placement, &conds, &r.Explanation, &r.CommandID, &r.BindAttempts, &r.BindDeadline,
		&r.ActiveSince, &r.ActiveUntil, &r.CreatedBy, &r.CreateTime, &r.UpdateTime, &r.Flavor, &r.EndsAs, &r.ReleaseTime)
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal([]byte(placement), &r.Placement); err != nil {
		return r, fmt.Errorf("reservation %s placement: %w", r.ID, err)
	}
	if err := json.Unmarshal([]byte(conds), &r.Conditions); err != nil {
		return r, fmt.Errorf("reservation %s conditions: %w", r.ID, err)
	}
	r.StartsAt, r.EndsAt = r.StartsAt.UTC(), r.EndsAt.UTC()
	return r, nil
}

func scanAll(rows store.Rows, err error) ([]Reservation, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Reservation
	for rows.Next() {
		r, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only plain structs are marshalled here
	}
	return string(b)
}

// insertHead is the INSERT new reservation rows are written by.
const insertHead = `INSERT INTO reservations (` + columns + `)`

// stageInsert stages a new reservation row in the batch: written at once
// outside a placer, with the batch's other new reservations inside one.
func stageInsert(ctx context.Context, b *placer.Batch, r *Reservation) error {
	if r.Conditions == nil {
		r.Conditions = []Condition{}
	}
	return b.Stage(ctx, insertHead, []any{r.ID, r.TenantID, r.ProjectID, r.PoolID, r.State, r.GPUs, r.Model, r.MIGProfile, r.Slots, r.VCPU, r.MemoryGiB,
		r.Hugepages1Gi, r.Binding, r.SingleTenant, r.StartsAt, r.EndsAt, r.NodeID, r.GPUModel, jsonText(r.Placement),
		jsonText(r.Conditions), r.Explanation, r.CommandID, r.BindAttempts, r.BindDeadline, r.ActiveSince, r.ActiveUntil,
		r.CreatedBy, r.CreateTime, r.UpdateTime, r.Flavor, r.EndsAs, r.ReleaseTime})
}

// save writes back every mutable column of r, guarded by the state it was
// read in: it reports false when another writer moved it first.
func save(ctx context.Context, tx store.Tx, r *Reservation, fromState string) (bool, error) {
	n, err := tx.Exec(ctx, `UPDATE reservations SET state = $2, starts_at = $3, ends_at = $4, node_id = $5, gpu_model = $6,
		placement = $7, conditions = $8, explanation = $9, command_id = $10, bind_attempts = $11, bind_deadline = $12,
		active_since = $13, active_until = $14, update_time = $15, ends_as = $17, release_time = $18
		WHERE id = $1 AND state = $16`,
		r.ID, r.State, r.StartsAt, r.EndsAt, r.NodeID, r.GPUModel, jsonText(r.Placement), jsonText(r.Conditions),
		r.Explanation, r.CommandID, r.BindAttempts, r.BindDeadline, r.ActiveSince, r.ActiveUntil, r.UpdateTime, fromState,
		r.EndsAs, r.ReleaseTime)
	return n == 1, err
}

// bookingsDelete drops a reservation's bookings.
func bookingsDelete(ctx context.Context, tx store.Tx, reservationID string) error {
	_, err := booking.Delete(ctx, tx, []string{reservationID})
	return err
}

// Get reads a reservation; a non-empty tenantID confines the lookup.
func Get(ctx context.Context, q store.Querier, tenantID, id string) (Reservation, error) {
	return scan(q.QueryRow(ctx, `SELECT `+columns+` FROM reservations WHERE id = $1 AND ($2 = '' OR tenant_id = $2)`, id, tenantID))
}

// getForUpdate reads a reservation in a write transaction, locking its row on
// PostgreSQL so that concurrent transitions serialize.
func getForUpdate(ctx context.Context, tx store.Tx, id string) (Reservation, error) {
	return scan(tx.QueryRow(ctx, `SELECT `+columns+` FROM reservations WHERE id = $1`+store.ForUpdate(tx), id))
}

// pendingForUpdate lists a pool's pending reservations for the queued
// placer, locking them on PostgreSQL so that two placers of one pool (the
// tick's and a woken job's) take turns: the second sees what the first left
// pending instead of failing on what it placed.
func pendingForUpdate(ctx context.Context, tx store.Tx, poolID string, limit int) ([]Reservation, error) {
	return scanAll(tx.Query(ctx, `SELECT `+columns+` FROM reservations WHERE pool_id = $1 AND state = 'pending'
		ORDER BY id LIMIT $2`+store.ForUpdate(tx), poolID, limit))
}

// countLive counts a pool's live reservations (capmodel.Live) and names the
// one with the lowest id.
func countLive(ctx context.Context, tx store.Tx, poolID string) (n int, oneID string, err error) {
	var first *string
	err = tx.QueryRow(ctx, `SELECT COUNT(*), MIN(id) FROM reservations
		WHERE pool_id = $1 AND state IN ('pending', 'placed', 'binding', 'active', 'releasing')`, poolID).Scan(&n, &first)
	if first != nil {
		oneID = *first
	}
	return n, oneID, err
}

// ListParams filter a listing.
type ListParams struct {
	TenantID, ProjectID, PoolID string
	// PoolOwnerID lists the reservations on the pools a tenant owns,
	// whoever holds them (TenantID is then empty).
	PoolOwnerID string
	States      []string
	After       string
	Limit       int
}

// List lists reservations by id.
func List(ctx context.Context, q store.Querier, p *ListParams) ([]Reservation, error) {
	args := []any{p.After, p.TenantID, p.ProjectID, p.PoolID, p.Limit}
	where := ""
	if p.PoolOwnerID != "" {
		args = append(args, p.PoolOwnerID)
		where = fmt.Sprintf(" AND pool_id IN (SELECT id FROM pools WHERE tenant_id = $%d)", len(args))
	}
	if len(p.States) > 0 {
		ph := make([]string, len(p.States))
		for i, s := range p.States {
			args = append(args, s)
			ph[i] = fmt.Sprintf("$%d", len(args))
		}
		where += " AND state IN (" + strings.Join(ph, ", ") + ")"
	}
	return scanAll(q.Query(ctx, `SELECT `+columns+` FROM reservations
		WHERE id > $1 AND ($2 = '' OR tenant_id = $2) AND ($3 = '' OR project_id = $3) AND ($4 = '' OR pool_id = $4)`+where+`
		ORDER BY id LIMIT $5`, args...))
}

// onNode lists the reservations of a node in the given states.
func onNode(ctx context.Context, q store.Querier, nodeID string, states ...string) ([]Reservation, error) {
	args := []any{nodeID}
	ph := make([]string, len(states))
	for i, s := range states {
		args = append(args, s)
		ph[i] = fmt.Sprintf("$%d", i+2)
	}
	lock := ""
	if tx, ok := q.(store.Tx); ok {
		lock = store.ForUpdate(tx) // the caller changes them: an Extend or a tick waits
	}
	return scanAll(q.Query(ctx, `SELECT `+columns+` FROM reservations WHERE node_id = $1 AND state IN (`+strings.Join(ph, ", ")+`) ORDER BY id`+lock, args...))
}

// rollupBooked moves the booked rollup of a reservation's atoms by sign.
func rollupBooked(ctx context.Context, tx store.Tx, r *Reservation, sign int) error {
	for kind, n := range r.Placement.Kinds {
		if err := atoms.RollupAdd(ctx, tx, r.PoolID, r.Placement.AtomModel, kind, 0, sign*n, 0); err != nil {
			return err
		}
	}
	return nil
}

// duePool lists the reservations of a pool the tick acts on: placed ones whose start came,
// live ones whose end came (a releasing one's end is where its hold is
// extended or ends) and binds past their deadline. FOR UPDATE on
// PostgreSQL: an Extend, a second tick or the placer waits, and what it then
// reads is what the tick wrote.
func duePool(ctx context.Context, tx store.Tx, poolID string, now time.Time) ([]Reservation, error) {
	return scanAll(tx.Query(ctx, `SELECT `+columns+` FROM reservations
			WHERE pool_id = $2 AND ((state = 'placed' AND starts_at <= $1) OR (state IN ('placed', 'binding', 'active', 'releasing', 'pending') AND ends_at <= $1)
				OR (state = 'binding' AND bind_deadline < $1))
			ORDER BY id LIMIT 500`+store.ForUpdate(tx), now, poolID))
}

// duePools lists the pools that have reservations the tick acts on.
func duePools(ctx context.Context, q store.Querier, now time.Time) ([]string, error) {
	return store.Strings(q.Query(ctx, `SELECT DISTINCT pool_id FROM reservations
		WHERE (state = 'placed' AND starts_at <= $1) OR (state IN ('placed', 'binding', 'active', 'releasing', 'pending') AND ends_at <= $1)
			OR (state = 'binding' AND bind_deadline < $1)
		ORDER BY pool_id`, now))
}

// nodeTenants lists the tenants that have nodes that are not retired.
func nodeTenants(ctx context.Context, q store.Querier) ([]string, error) {
	return fleet.NodeTenantIDs(ctx, q)
}

// nodePool reads the pool a node is a member of.
func nodePool(ctx context.Context, q store.Querier, nodeID string) store.Row {
	return q.QueryRow(ctx, `SELECT pool_id FROM node_pools WHERE node_id = $1`, nodeID)
}

// countModelAtoms counts the device atoms of a model, named in full or by
// its first word ("H100" for "H100 80GB").
func countModelAtoms(ctx context.Context, q store.Querier, model string) store.Row {
	return q.QueryRow(ctx, `SELECT COUNT(*) FROM atoms WHERE kind <> 'cpu' AND (upper(model) = upper($1) OR upper(model) LIKE upper($1) || ' %')`, model)
}

// pendingPools lists the pools that have pending reservations.
func pendingPools(ctx context.Context, q store.Querier) ([]string, error) {
	return store.Strings(q.Query(ctx, `SELECT DISTINCT pool_id FROM reservations WHERE state = 'pending' ORDER BY pool_id`))
}

// MIGDemand is what a pool's queue asks of one MIG profile: the instances
// its pending reservations want.
type MIGDemand struct {
	Model, Profile string
	Count          int
}

// PendingMIGDemand sums the pending reservations of a pool per model and
// MIG profile, for the MIG repartitioner.
func PendingMIGDemand(ctx context.Context, q store.Querier, poolID string) ([]MIGDemand, error) {
	rows, err := q.Query(ctx, `SELECT model, mig_profile, SUM(gpus) FROM reservations
		WHERE pool_id = $1 AND state = 'pending' AND mig_profile <> ''
		GROUP BY model, mig_profile ORDER BY model, mig_profile`, poolID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []MIGDemand
	for rows.Next() {
		var d MIGDemand
		if err := rows.Scan(&d.Model, &d.Profile, &d.Count); err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// MIGRefusalAdd counts one create refused for want of capacity against
// the minute of at.
func MIGRefusalAdd(ctx context.Context, tx store.Tx, poolID, model, profile string, at time.Time) error {
	_, err := tx.Exec(ctx, `INSERT INTO mig_refusals (pool_id, model, profile, bucket, count) VALUES ($1, $2, $3, $4, 1)
		ON CONFLICT (pool_id, bucket, model, profile) DO UPDATE SET count = mig_refusals.count + 1`,
		poolID, model, profile, at.UTC().Truncate(time.Minute))
	return err
}

// MIGRefusal is the count of one minute's refused creates of a pool for
// one model and MIG profile.
type MIGRefusal struct {
	Model, Profile string
	Bucket         time.Time
	Count          int
}

// MIGRefusalList lists a pool's refusal counts of the minutes from since
// on.
func MIGRefusalList(ctx context.Context, q store.Querier, poolID string, since time.Time) ([]MIGRefusal, error) {
	rows, err := q.Query(ctx, `SELECT model, profile, bucket, count FROM mig_refusals WHERE pool_id = $1 AND bucket >= $2
		ORDER BY bucket, model, profile`, poolID, since.UTC().Truncate(time.Minute))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []MIGRefusal
	for rows.Next() {
		var r MIGRefusal
		if err := rows.Scan(&r.Model, &r.Profile, &r.Bucket, &r.Count); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// MIGRefusalConsume takes counts a repartitioner round acted on off a
// pool's refusals (those counted since stay) and deletes what is used up.
func MIGRefusalConsume(ctx context.Context, tx store.Tx, poolID string, used []MIGRefusal) error {
	for _, r := range used {
		if _, err := tx.Exec(ctx, `UPDATE mig_refusals SET count = count - $5 WHERE pool_id = $1 AND bucket = $2 AND model = $3 AND profile = $4`,
			poolID, r.Bucket.UTC(), r.Model, r.Profile, r.Count); err != nil {
			return err
		}
	}
	_, err := tx.Exec(ctx, `DELETE FROM mig_refusals WHERE pool_id = $1 AND count <= 0`, poolID)
	return err
}

// MIGRefusalPrune deletes the refusal counts of minutes before before.
func MIGRefusalPrune(ctx context.Context, tx store.Tx, before time.Time) error {
	_, err := tx.Exec(ctx, `DELETE FROM mig_refusals WHERE bucket < $1`, before.UTC().Truncate(time.Minute))
	return err
}

// holdingGPU lists the reservations with a booking on a node's GPU that
// has not ended by now.
func holdingGPU(ctx context.Context, q store.Querier, nodeID, gpuUUID string, now time.Time) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT DISTINCT b.reservation_id FROM bookings b JOIN atoms a ON a.id = b.atom
		WHERE a.node_id = $1 AND a.gpu_uuid = $2 AND b.ends_at > $3 ORDER BY b.reservation_id`, nodeID, gpuUUID, now)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// releasingDue lists a pool's releasing reservations whose booking's end
// came, locked (PostgreSQL) as duePool locks them.
func releasingDue(ctx context.Context, tx store.Tx, poolID string, now time.Time) ([]Reservation, error) {
	return scanAll(tx.Query(ctx, `SELECT `+columns+` FROM reservations
			WHERE pool_id = $2 AND state = 'releasing' AND ends_at <= $1 ORDER BY id LIMIT 500`+store.ForUpdate(tx), now, poolID))
}
