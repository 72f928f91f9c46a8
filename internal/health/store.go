package health

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/capacity/atoms"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/store"
)

// ID prefixes (envelope.NewID).
const (
	FindingIDPrefix     = "hfd"
	RemediationIDPrefix = "hrm"
)

// Finding states.
const (
	FindingOpen     = "open"
	FindingResolved = "resolved"
)

// Remediation states.
const (
	RemPending   = "pending"
	RemDraining  = "draining"
	RemRunning   = "running"
	RemSucceeded = "succeeded"
	RemFailed    = "failed"
	RemEscalated = "escalated"
	RemCanceled  = "canceled"
)

// activeRemStates are the states that hold a node's one active remediation.
var activeRemStates = []string{RemPending, RemDraining, RemRunning}

// GPU states in health_gpus.
const (
	GPUQuarantined = "quarantined"
	GPURMA         = "rma"
)

// Breaker states.
const (
	BreakerClosed = "closed"
	BreakerOpen   = "open"
)

// Finding is a row of health_findings.
type Finding struct {
	ID, NodeID, TenantID, PoolID string
	GPUUUID                      string
	GPUIndex                     int
	Kind                         string
	Code                         int64
	Severity, Message            string
	PID                          int64
	ProcessName                  string
	Action, State                string
	Standing                     bool
	Count                        int64
	OccurTime, CreateTime        time.Time
	UpdateTime                   time.Time
	ResolveTime                  *time.Time
	ResolvedBy, RemediationID    string
}

const findingColumns = `id, node_id, tenant_id, pool_id, gpu_uuid, gpu_index, kind, code, severity, message, pid, process_name,
	action, state, standing, count, occur_time, create_time, update_time, resolve_time, resolved_by, remediation_id`

func scanFinding(r scanner) (Finding, error) {
	var f Finding
	err := r.Scan(&f.ID, &f.NodeID, &f.TenantID, &f.PoolID, &f.GPUUUID, &f.GPUIndex, &f.Kind, &f.Code, &f.Severity, &f.Message,
		&f.PID, &f.ProcessName, &f.Action, &f.State, &f.Standing, &f.Count, &f.OccurTime, &f.CreateTime, &f.UpdateTime,
		&f.ResolveTime, &f.ResolvedBy, &f.RemediationID)
	return f, err
}

// FindingInsert writes a new finding.
func FindingInsert(ctx context.Context, tx store.Tx, f *Finding) error {
	_, err := tx.Exec(ctx, `INSERT INTO health_findings (`+findingColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22)`,
		f.ID, f.NodeID, f.TenantID, f.PoolID, f.GPUUUID, f.GPUIndex, f.Kind, f.Code, f.Severity, f.Message, f.PID, f.ProcessName,
		f.Action, f.State, f.Standing, f.Count, f.OccurTime, f.CreateTime, f.UpdateTime, f.ResolveTime, f.ResolvedBy, f.RemediationID)
	return err
}

// FindingsQuery selects findings; zero fields do not filter.
type FindingsQuery struct {
	TenantID, NodeID, PoolID, GPUUUID, State string
	// Severities keeps findings of these severities only.
	Severities []string
	// Standing: only standing findings.
	Standing bool
	// After is the last id of the previous page.
	After string
	Limit int
}

// FindingList lists findings in id order.
func FindingList(ctx context.Context, q store.Querier, p FindingsQuery) ([]Finding, error) {
	var where []string
	var args []any
	add := func(col, v string) {
		if v != "" {
			args = append(args, v)
			where = append(where, col+" = $"+strconv.Itoa(len(args)))
		}
	}
	add("tenant_id", p.TenantID)
	add("node_id", p.NodeID)
	add("pool_id", p.PoolID)
	add("gpu_uuid", p.GPUUUID)
	add("state", p.State)
	if p.After != "" {
		args = append(args, p.After)
		where = append(where, "id > $"+strconv.Itoa(len(args)))
	}
	if p.Standing {
		where = append(where, "standing")
	}
	if len(p.Severities) > 0 {
		where = append(where, "severity IN ("+placeholders(&args, p.Severities)+")")
	}
	query := `SELECT ` + findingColumns + ` FROM health_findings`
	if len(where) > 0 {
		query += ` WHERE ` + strings.Join(where, " AND ")
	}
	query += ` ORDER BY id`
	if p.Limit > 0 {
		query += ` LIMIT ` + strconv.Itoa(p.Limit)
	}
	rows, err := q.Query(ctx, query, args...)
	return collect(rows, err, scanFinding)
}

// FindingCount bumps an open standing finding seen again.
func FindingCount(ctx context.Context, tx store.Tx, id string, now time.Time) error {
	_, err := tx.Exec(ctx, `UPDATE health_findings SET count = count + 1, update_time = $2 WHERE id = $1`, id, now)
	return err
}

// FindingsResolve resolves open findings by id; it returns how many.
func FindingsResolve(ctx context.Context, tx store.Tx, ids []string, by string, now time.Time) (int, error) {
	n := 0
	for _, id := range ids {
		c, err := tx.Exec(ctx, `UPDATE health_findings SET state = 'resolved', resolve_time = $2, update_time = $2, resolved_by = $3
			WHERE id = $1 AND state = 'open'`, id, now, by)
		if err != nil {
			return n, err
		}
		n += int(c)
	}
	return n, nil
}

// FindingSetRemediation links a finding to the remediation it started.
func FindingSetRemediation(ctx context.Context, tx store.Tx, id, remID string) error {
	_, err := tx.Exec(ctx, `UPDATE health_findings SET remediation_id = $2 WHERE id = $1`, id, remID)
	return err
}

// Remediation is a row of health_remediations.
type Remediation struct {
	ID, NodeID, TenantID, PoolID, GPUUUID string
	Action, State, Reason, FindingID      string
	WorkflowID, Error                     string
	// Drained: the reconciler drained the node.
	Drained            bool
	CreateTime         time.Time
	StartTime, EndTime *time.Time
	UpdateTime         time.Time
}

const remColumns = `id, node_id, tenant_id, pool_id, gpu_uuid, action, state, reason, finding_id, workflow_id, error, drained,
	create_time, start_time, end_time, update_time`

func scanRemediation(r scanner) (Remediation, error) {
	var m Remediation
	err := r.Scan(&m.ID, &m.NodeID, &m.TenantID, &m.PoolID, &m.GPUUUID, &m.Action, &m.State, &m.Reason, &m.FindingID,
		&m.WorkflowID, &m.Error, &m.Drained, &m.CreateTime, &m.StartTime, &m.EndTime, &m.UpdateTime)
	return m, err
}

// RemediationInsert writes a new remediation.
func RemediationInsert(ctx context.Context, tx store.Tx, m *Remediation) error {
	_, err := tx.Exec(ctx, `INSERT INTO health_remediations (`+remColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)`,
		m.ID, m.NodeID, m.TenantID, m.PoolID, m.GPUUUID, m.Action, m.State, m.Reason, m.FindingID, m.WorkflowID, m.Error, m.Drained,
		m.CreateTime, m.StartTime, m.EndTime, m.UpdateTime)
	return err
}

// RemediationUpdate writes a remediation's state, moving it only from
// from; it reports whether it did.
func RemediationUpdate(ctx context.Context, tx store.Tx, m *Remediation, from string) (bool, error) {
	n, err := tx.Exec(ctx, `UPDATE health_remediations SET state = $3, workflow_id = $4, error = $5, start_time = $6, end_time = $7,
		update_time = $8, action = $9, reason = $10, drained = $11, gpu_uuid = $12 WHERE id = $1 AND state = $2`,
		m.ID, from, m.State, m.WorkflowID, m.Error, m.StartTime, m.EndTime, m.UpdateTime, m.Action, m.Reason, m.Drained, m.GPUUUID)
	return n == 1, err
}

// RemediationsQuery selects remediations; zero fields do not filter.
type RemediationsQuery struct {
	TenantID, NodeID, PoolID, WorkflowID string
	States                               []string
	After                                string
	Limit                                int
}

// RemediationList lists remediations in id order.
func RemediationList(ctx context.Context, q store.Querier, p RemediationsQuery) ([]Remediation, error) {
	var where []string
	var args []any
	add := func(col, v string) {
		if v != "" {
			args = append(args, v)
			where = append(where, col+" = $"+strconv.Itoa(len(args)))
		}
	}
	add("tenant_id", p.TenantID)
	add("node_id", p.NodeID)
	add("pool_id", p.PoolID)
	add("workflow_id", p.WorkflowID)
	if p.After != "" {
		args = append(args, p.After)
		where = append(where, "id > $"+strconv.Itoa(len(args)))
	}
	if len(p.States) > 0 {
		where = append(where, "state IN ("+placeholders(&args, p.States)+")")
	}
	query := `SELECT ` + remColumns + ` FROM health_remediations`
	if len(where) > 0 {
		query += ` WHERE ` + strings.Join(where, " AND ")
	}
	query += ` ORDER BY id`
	if p.Limit > 0 {
		query += ` LIMIT ` + strconv.Itoa(p.Limit)
	}
	rows, err := q.Query(ctx, query, args...)
	return collect(rows, err, scanRemediation)
}

// ActiveRemediation returns a node's active remediation, if any.
func ActiveRemediation(ctx context.Context, q store.Querier, nodeID string) (Remediation, bool, error) {
	rs, err := RemediationList(ctx, q, RemediationsQuery{NodeID: nodeID, States: activeRemStates, Limit: 1})
	if err != nil || len(rs) == 0 {
		return Remediation{}, false, err
	}
	return rs[0], true, nil
}

// GPU is a row of health_gpus: a GPU out of placement for health.
type GPU struct {
	UUID, NodeID, TenantID, PoolID, State, Reason, FindingID, CreatedBy string
	CreateTime                                                          time.Time
}

// GPUGet reads a GPU's quarantine row; store.ErrNotFound when it is in
// service.
func GPUGet(ctx context.Context, q store.Querier, uuid string) (GPU, error) {
	var g GPU
	err := q.QueryRow(ctx, `SELECT gpu_uuid, node_id, tenant_id, pool_id, state, reason, finding_id, created_by, create_time
		FROM health_gpus WHERE gpu_uuid = $1`, uuid).Scan(&g.UUID, &g.NodeID, &g.TenantID, &g.PoolID, &g.State, &g.Reason, &g.FindingID, &g.CreatedBy, &g.CreateTime)
	return g, err
}

// GPUPut takes a GPU out (or changes why): the row, RMA or quarantined.
func GPUPut(ctx context.Context, tx store.Tx, g *GPU) error {
	_, err := tx.Exec(ctx, `INSERT INTO health_gpus (gpu_uuid, node_id, tenant_id, pool_id, state, reason, finding_id, created_by, create_time)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		ON CONFLICT (gpu_uuid) DO UPDATE SET node_id = excluded.node_id, tenant_id = excluded.tenant_id, pool_id = excluded.pool_id,
			state = excluded.state, reason = excluded.reason, finding_id = excluded.finding_id, created_by = excluded.created_by`,
		g.UUID, g.NodeID, g.TenantID, g.PoolID, g.State, g.Reason, g.FindingID, g.CreatedBy, g.CreateTime)
	return err
}

// GPUDelete puts a GPU back in service.
func GPUDelete(ctx context.Context, tx store.Tx, uuid string) error {
	_, err := tx.Exec(ctx, `DELETE FROM health_gpus WHERE gpu_uuid = $1`, uuid)
	return err
}

// GPUsOutOfPool counts a pool's GPUs out of placement.
func GPUsOutOfPool(ctx context.Context, q store.Querier, poolID string) (int, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT COUNT(*) FROM health_gpus WHERE pool_id = $1`, poolID).Scan(&n)
	return n, err
}

// RemediationsSucceededSince counts a node's remediations that succeeded
// after since, on gpu or on the whole node.
func RemediationsSucceededSince(ctx context.Context, q store.Querier, nodeID, gpu string, since time.Time) (int, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT COUNT(*) FROM health_remediations WHERE node_id = $1 AND state = 'succeeded' AND end_time > $2
		AND (gpu_uuid = $3 OR gpu_uuid = '')`, nodeID, since, gpu).Scan(&n)
	return n, err
}

// UnhealthyNodes counts a pool's nodes with a finding of severity error
// or worse since since.
func UnhealthyNodes(ctx context.Context, q store.Querier, poolID string, since time.Time) (int, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT COUNT(DISTINCT node_id) FROM health_findings WHERE pool_id = $1 AND severity IN ('critical', 'error') AND create_time >= $2`,
		poolID, since).Scan(&n)
	return n, err
}

// RemediationLoad counts a pool's remediations in flight (draining or
// running: they use the budget) and waiting.
func RemediationLoad(ctx context.Context, q store.Querier, poolID string) (inFlight, pending int, err error) {
	err = q.QueryRow(ctx, `SELECT COALESCE(SUM(CASE WHEN state IN ('draining', 'running') THEN 1 ELSE 0 END), 0),
			COALESCE(SUM(CASE WHEN state = 'pending' THEN 1 ELSE 0 END), 0)
		FROM health_remediations WHERE pool_id = $1 AND state IN ('pending', 'draining', 'running')`, poolID).Scan(&inFlight, &pending)
	return inFlight, pending, err
}

// PoolsWithWork lists the pools with a remediation in flight or waiting,
// or a serious finding since since (their breakers are checked).
func PoolsWithWork(ctx context.Context, q store.Querier, since time.Time) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT DISTINCT pool_id FROM health_remediations WHERE state IN ('pending', 'draining', 'running')
		UNION SELECT DISTINCT pool_id FROM health_findings WHERE create_time >= $1 AND severity IN ('critical', 'error')`, since)
	return collect(rows, err, func(r scanner) (string, error) {
		var id string
		err := r.Scan(&id)
		return id, err
	})
}

// GPUsOfNodes reads the quarantine rows of nodes' GPUs, by UUID.
func GPUsOfNodes(ctx context.Context, q store.Querier, nodeIDs []string) (map[string]GPU, error) {
	out := map[string]GPU{}
	if len(nodeIDs) == 0 {
		return out, nil
	}
	args := make([]any, len(nodeIDs))
	ph := make([]string, len(nodeIDs))
	for i, id := range nodeIDs {
		args[i] = id
		ph[i] = "$" + strconv.Itoa(i+1)
	}
	rows, err := q.Query(ctx, `SELECT gpu_uuid, node_id, tenant_id, pool_id, state, reason, finding_id, created_by, create_time
		FROM health_gpus WHERE node_id IN (`+strings.Join(ph, ", ")+`)`, args...)
	gs, err := collect(rows, err, func(r scanner) (GPU, error) {
		var g GPU
		err := r.Scan(&g.UUID, &g.NodeID, &g.TenantID, &g.PoolID, &g.State, &g.Reason, &g.FindingID, &g.CreatedBy, &g.CreateTime)
		return g, err
	})
	for _, g := range gs {
		out[g.UUID] = g
	}
	return out, err
}

// Breaker is a row of health_breakers.
type Breaker struct {
	PoolID, TenantID, State, Reason string
	TripTime, ResetTime             *time.Time
	ResetBy                         string
	Trips                           int64
	UpdateTime                      time.Time
}

// BreakerGet reads a pool's breaker; a pool that never tripped has a
// closed one.
func BreakerGet(ctx context.Context, q store.Querier, poolID string) (Breaker, error) {
	b := Breaker{PoolID: poolID, State: BreakerClosed}
	err := q.QueryRow(ctx, `SELECT tenant_id, state, reason, trip_time, reset_time, reset_by, trips, update_time
		FROM health_breakers WHERE pool_id = $1`, poolID).Scan(&b.TenantID, &b.State, &b.Reason, &b.TripTime, &b.ResetTime, &b.ResetBy, &b.Trips, &b.UpdateTime)
	if errors.Is(err, store.ErrNotFound) {
		return b, nil
	}
	return b, err
}

// BreakerPut writes a pool's breaker.
func BreakerPut(ctx context.Context, tx store.Tx, b *Breaker) error {
	_, err := tx.Exec(ctx, `INSERT INTO health_breakers (pool_id, tenant_id, state, reason, trip_time, reset_time, reset_by, trips, update_time)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		ON CONFLICT (pool_id) DO UPDATE SET state = excluded.state, reason = excluded.reason, trip_time = excluded.trip_time,
			reset_time = excluded.reset_time, reset_by = excluded.reset_by, trips = excluded.trips, update_time = excluded.update_time`,
		b.PoolID, b.TenantID, b.State, b.Reason, b.TripTime, b.ResetTime, b.ResetBy, b.Trips, b.UpdateTime)
	return err
}

// placeholders appends vs to args and returns their placeholders, comma
// separated.
func placeholders(args *[]any, vs []string) string {
	ph := make([]string, len(vs))
	for i, v := range vs {
		*args = append(*args, v)
		ph[i] = "$" + strconv.Itoa(len(*args))
	}
	return strings.Join(ph, ", ")
}

// GPUReservations counts, by GPU UUID, the reservations holding a node's
// GPUs at now (capacity's bookings).
func GPUReservations(ctx context.Context, q store.Querier, nodeID string, now time.Time) (map[string]int, error) {
	return atoms.ReservationsPerGPU(ctx, q, nodeID, now)
}

// ScopeQuery names the nodes a health summary covers; zero fields do not
// filter.
type ScopeQuery struct {
	TenantID, NodeID, PoolID string
}

// ScopeCounts reads what a scope's health takes out: the GPUs out of
// placement and the nodes with an open finding of severity error or worse.
func ScopeCounts(ctx context.Context, q store.Querier, p ScopeQuery) (gpusOut, nodesUnhealthy int, err error) {
	var where []string
	var args []any
	add := func(col, v string) {
		if v != "" {
			args = append(args, v)
			where = append(where, col+" = $"+strconv.Itoa(len(args)))
		}
	}
	add("h.tenant_id", p.TenantID)
	add("h.node_id", p.NodeID)
	add("h.pool_id", p.PoolID)
	cond := ""
	if len(where) > 0 {
		cond = " AND " + strings.Join(where, " AND ")
	}
	if err := q.QueryRow(ctx, `SELECT COUNT(*) FROM health_gpus h WHERE 1 = 1`+cond, args...).Scan(&gpusOut); err != nil {
		return 0, 0, err
	}
	err = q.QueryRow(ctx, `SELECT COUNT(DISTINCT h.node_id) FROM health_findings h WHERE h.state = 'open'
		AND h.severity IN ('critical', 'error')`+cond, args...).Scan(&nodesUnhealthy)
	return gpusOut, nodesUnhealthy, err
}

type scanner interface{ Scan(...any) error }

// collect reads every row of a query with scan.
func collect[T any](rows store.Rows, err error, scan func(scanner) (T, error)) ([]T, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// PoolMetrics is one pool's health at scrape time (PoolID "" gathers the
// nodes of no pool).
type PoolMetrics struct {
	PoolID, Name string
	// GPUsOut by health_gpus state, Findings (open) by severity,
	// Remediations (active) by state.
	GPUsOut      map[string]int
	Findings     map[string]int
	Remediations map[string]int
	BreakerOpen  bool
	// Budget and BudgetUsed: the most nodes under remediation at once,
	// and how many are (draining or running).
	Budget, BudgetUsed int
}

// PoolsMetrics reads every live pool's health for the metrics collector
// in a handful of grouped queries, whatever the number of pools.
func PoolsMetrics(ctx context.Context, q store.Querier) ([]PoolMetrics, error) {
	byID := map[string]*PoolMetrics{}
	var order []string
	get := func(id string) *PoolMetrics {
		if m, ok := byID[id]; ok {
			return m
		}
		m := &PoolMetrics{PoolID: id, GPUsOut: map[string]int{GPUQuarantined: 0, GPURMA: 0}, Findings: map[string]int{},
			Remediations: map[string]int{RemPending: 0, RemDraining: 0, RemRunning: 0}}
		byID[id] = m
		order = append(order, id)
		return m
	}
	pools, err := pool.LiveNodeCounts(ctx, q)
	if err != nil {
		return nil, err
	}
	for _, p := range pools {
		pol := &apiv1.PoolPolicy{}
		if err := unmarshalPolicy(p.Policy, pol); err != nil {
			return nil, fmt.Errorf("pool %s: policy: %w", p.ID, err)
		}
		m := get(p.ID)
		m.Name, m.Budget = p.Name, Budget(p.Nodes, pol.GetHealth())
	}
	type count struct {
		pool, key string
		n         int
	}
	scanCount := func(r scanner) (count, error) {
		var c count
		err := r.Scan(&c.pool, &c.key, &c.n)
		return c, err
	}
	groups := []struct {
		query string
		add   func(m *PoolMetrics, key string, n int)
	}{
		{`SELECT pool_id, state, COUNT(*) FROM health_gpus GROUP BY pool_id, state`, func(m *PoolMetrics, k string, n int) { m.GPUsOut[k] += n }},
		{`SELECT pool_id, severity, COUNT(*) FROM health_findings WHERE state = 'open' GROUP BY pool_id, severity`,
			func(m *PoolMetrics, k string, n int) { m.Findings[k] += n }},
		{`SELECT pool_id, state, COUNT(*) FROM health_remediations WHERE state IN ('pending', 'draining', 'running') GROUP BY pool_id, state`,
			func(m *PoolMetrics, k string, n int) {
				m.Remediations[k] += n
				if k != RemPending {
					m.BudgetUsed += n
				}
			}},
		{`SELECT pool_id, state, 1 FROM health_breakers WHERE state = 'open'`, func(m *PoolMetrics, _ string, _ int) { m.BreakerOpen = true }},
	}
	for _, g := range groups {
		rows, err := q.Query(ctx, g.query)
		cs, err := collect(rows, err, scanCount)
		if err != nil {
			return nil, err
		}
		for _, c := range cs {
			if _, live := byID[c.pool]; !live && c.pool != "" {
				continue // an archived or deleted pool's leftovers
			}
			g.add(get(c.pool), c.key, c.n)
		}
	}
	out := make([]PoolMetrics, 0, len(order))
	for _, id := range order {
		m := byID[id]
		if id == "" {
			m.Budget = 1 // the reconciler's budget for nodes of no pool
		}
		out = append(out, *m)
	}
	return out, nil
}

// HasOpenStanding reports whether a node has open standing findings.
func (m *Module) HasOpenStanding(ctx context.Context, q store.Querier, nodeID string) (bool, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT COUNT(*) FROM health_findings WHERE node_id = $1 AND state = 'open' AND standing`, nodeID).Scan(&n)
	return n > 0, err
}

// EventSeen reports whether a node already reported this event: the same
// GPU, kind and code at the same time on the node's clock (bcd sends the
// events it holds again on every new session).
func EventSeen(ctx context.Context, q store.Querier, nodeID, gpu, kind string, code int64, occur time.Time) (bool, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT COUNT(*) FROM health_findings WHERE node_id = $1 AND gpu_uuid = $2 AND kind = $3 AND code = $4
		AND occur_time = $5 AND NOT standing`, nodeID, gpu, kind, code, occur).Scan(&n)
	return n > 0, err
}

// OpenFindingsSince counts a node's open findings created at or after
// since: what a rollout watches on a node it upgraded.
func OpenFindingsSince(ctx context.Context, q store.Querier, nodeID string, since time.Time) (int, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT COUNT(*) FROM health_findings WHERE node_id = $1 AND state = 'open' AND create_time >= $2`,
		nodeID, since).Scan(&n)
	return n, err
}
