package rollout

import (
	"context"
	"encoding/json"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

// IDPrefix starts a rollout's id.
const IDPrefix = "rol"

// Rollout states.
const (
	StateRunning    = "running"
	StatePaused     = "paused"
	StateHalted     = "halted"
	StateRolledBack = "rolled_back"
	StateCompleted  = "completed"
	StateAborted    = "aborted"
)

// ActiveStates hold the pool: one rollout in them per pool.
var ActiveStates = []string{StateRunning, StatePaused, StateHalted}

// States lists every rollout state.
var States = []string{StateRunning, StatePaused, StateHalted, StateRolledBack, StateCompleted, StateAborted}

// Node states.
const (
	NodePending    = "pending"
	NodeUpgrading  = "upgrading"
	NodeSoaking    = "soaking"
	NodeDone       = "done"
	NodeFailed     = "failed"
	NodeRolledBack = "rolled_back"
)

// NodeStates lists every node state.
var NodeStates = []string{NodePending, NodeUpgrading, NodeSoaking, NodeDone, NodeFailed, NodeRolledBack}

// Rollout is a row of rollouts.
type Rollout struct {
	ID, Release, PoolID, PoolName string
	Waves                         []string
	WaveNodes                     []int
	MaxUnavailable                int
	PauseBetween, Soak, Revert    time.Duration
	State                         string
	CurrentWave                   int
	WaveStartTime, WaveNotBefore  *time.Time
	Message, CreatedBy            string
	CreateTime, UpdateTime        time.Time
	EndTime                       *time.Time
}

// Node is a row of rollout_nodes.
type Node struct {
	RolloutID, NodeID, NodeName string
	Wave                        int
	FromVersion, State          string
	CommandID, RollbackCmdID    string
	RolledBack                  bool
	Message                     string
	SendTime, SoakTime          *time.Time
	UpdateTime                  time.Time
}

const rolloutColumns = `id, release, pool_id, pool_name, waves, wave_nodes, max_unavailable, pause_between_s, soak_s, revert_after_s,
	state, current_wave, wave_start_time, wave_not_before, message, created_by, create_time, update_time, end_time`

type scanner interface{ Scan(dest ...any) error }

func scanRollout(row scanner) (Rollout, error) {
	var (
		r                   Rollout
		waves, sizes        string
		pause, soak, revert int64
	)
	err := row.Scan(&r.ID, &r.Release, &r.PoolID, &r.PoolName, &waves, &sizes, &r.MaxUnavailable, &pause, &soak, &revert,
		&r.State, &r.CurrentWave, &r.WaveStartTime, &r.WaveNotBefore, &r.Message, &r.CreatedBy, &r.CreateTime, &r.UpdateTime, &r.EndTime)
	if err != nil {
		return r, err
	}
	r.PauseBetween, r.Soak, r.Revert = time.Duration(pause)*time.Second, time.Duration(soak)*time.Second, time.Duration(revert)*time.Second
	if err := json.Unmarshal([]byte(waves), &r.Waves); err != nil {
		return r, err
	}
	return r, json.Unmarshal([]byte(sizes), &r.WaveNodes)
}

// RolloutInsert writes a new rollout; a second active rollout of the pool
// fails with store.ErrUnique.
func RolloutInsert(ctx context.Context, tx store.Tx, r *Rollout) error {
	waves, err := json.Marshal(r.Waves)
	if err != nil {
		return err
	}
	sizes, err := json.Marshal(r.WaveNodes)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO rollouts (id, release, pool_id, pool_name, waves, wave_nodes, max_unavailable,
		pause_between_s, soak_s, revert_after_s, state, current_wave, message, created_by, create_time, update_time)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, 0, $12, $13, $14, $14)`,
		r.ID, r.Release, r.PoolID, r.PoolName, string(waves), string(sizes), r.MaxUnavailable,
		int64(r.PauseBetween/time.Second), int64(r.Soak/time.Second), int64(r.Revert/time.Second), r.State, r.Message, r.CreatedBy, r.CreateTime)
	return err
}

// RolloutGet reads a rollout (store.ErrNotFound when absent).
func RolloutGet(ctx context.Context, q store.Querier, id string) (Rollout, error) {
	return scanRollout(q.QueryRow(ctx, `SELECT `+rolloutColumns+` FROM rollouts WHERE id = $1`, id))
}

// RolloutGetForUpdate reads a rollout and locks its row until the
// transaction ends (PostgreSQL; SQLite has one writer): the controller and
// an operator's pause take turns.
func RolloutGetForUpdate(ctx context.Context, tx store.Tx, id string) (Rollout, error) {
	return scanRollout(tx.QueryRow(ctx, `SELECT `+rolloutColumns+` FROM rollouts WHERE id = $1`+store.ForUpdate(tx), id))
}

// ListParams filter a rollout listing; empty fields do not filter.
type ListParams struct {
	PoolID, State string
	After         string
	Limit         int
}

// RolloutList lists rollouts by id.
func RolloutList(ctx context.Context, q store.Querier, p ListParams) ([]Rollout, error) {
	rows, err := q.Query(ctx, `SELECT `+rolloutColumns+` FROM rollouts
		WHERE id > $1 AND ($2 = '' OR pool_id = $2) AND ($3 = '' OR state = $3) ORDER BY id LIMIT $4`,
		p.After, p.PoolID, p.State, p.Limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Rollout
	for rows.Next() {
		r, err := scanRollout(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// RolloutIDsInStates lists the ids of rollouts in states, by id.
func RolloutIDsInStates(ctx context.Context, q store.Querier, states ...string) ([]string, error) {
	args := []any{}
	in := ""
	for i, s := range states {
		args = append(args, s)
		if i > 0 {
			in += ", "
		}
		in += "$" + itoa(len(args))
	}
	return store.Strings(q.Query(ctx, `SELECT id FROM rollouts WHERE state IN (`+in+`) ORDER BY id`, args...))
}

// ActiveUsing returns an active rollout (running, paused or halted) of
// release version, or "" when none is: a release such a rollout may still
// send or fall back on is not deleted.
func ActiveUsing(ctx context.Context, q store.Querier, version string) (string, error) {
	ids, err := store.Strings(q.Query(ctx, `SELECT id FROM rollouts WHERE release = $1 AND state IN ($2, $3, $4) ORDER BY id LIMIT 1`,
		version, StateRunning, StatePaused, StateHalted))
	if err != nil || len(ids) == 0 {
		return "", err
	}
	return ids[0], nil
}

// RolloutUpdate writes a rollout's moving parts.
func RolloutUpdate(ctx context.Context, tx store.Tx, r *Rollout) error {
	_, err := tx.Exec(ctx, `UPDATE rollouts SET state = $2, current_wave = $3, wave_start_time = $4, wave_not_before = $5,
		message = $6, update_time = $7, end_time = $8 WHERE id = $1`,
		r.ID, r.State, r.CurrentWave, r.WaveStartTime, r.WaveNotBefore, r.Message, r.UpdateTime, r.EndTime)
	return err
}

const nodeColumns = `rollout_id, node_id, node_name, wave, from_version, state, command_id, rollback_command_id, rolled_back,
	message, send_time, soak_time, update_time`

func scanNode(row scanner) (Node, error) {
	var n Node
	err := row.Scan(&n.RolloutID, &n.NodeID, &n.NodeName, &n.Wave, &n.FromVersion, &n.State, &n.CommandID, &n.RollbackCmdID,
		&n.RolledBack, &n.Message, &n.SendTime, &n.SoakTime, &n.UpdateTime)
	return n, err
}

// NodeInsert adds a node to a rollout.
func NodeInsert(ctx context.Context, tx store.Tx, n *Node) error {
	_, err := tx.Exec(ctx, `INSERT INTO rollout_nodes (rollout_id, node_id, node_name, wave, from_version, state, update_time)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`, n.RolloutID, n.NodeID, n.NodeName, n.Wave, n.FromVersion, n.State, n.UpdateTime)
	return err
}

// NodeList lists a rollout's nodes by wave then name; wave < 0 lists all.
func NodeList(ctx context.Context, q store.Querier, rolloutID string, wave int) ([]Node, error) {
	rows, err := q.Query(ctx, `SELECT `+nodeColumns+` FROM rollout_nodes WHERE rollout_id = $1 AND ($2 < 0 OR wave = $2)
		ORDER BY wave, node_name`, rolloutID, wave)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Node
	for rows.Next() {
		n, err := scanNode(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

// NodeUpdate writes a rollout node's moving parts.
func NodeUpdate(ctx context.Context, tx store.Tx, n *Node) error {
	_, err := tx.Exec(ctx, `UPDATE rollout_nodes SET from_version = $3, state = $4, command_id = $5, rollback_command_id = $6,
		rolled_back = $7, message = $8, send_time = $9, soak_time = $10, update_time = $11 WHERE rollout_id = $1 AND node_id = $2`,
		n.RolloutID, n.NodeID, n.FromVersion, n.State, n.CommandID, n.RollbackCmdID, n.RolledBack, n.Message, n.SendTime, n.SoakTime, n.UpdateTime)
	return err
}

// NodeStateCounts counts each rollout's nodes by state.
func NodeStateCounts(ctx context.Context, q store.Querier, rolloutID string) (map[string]int, error) {
	rows, err := q.Query(ctx, `SELECT state, COUNT(*) FROM rollout_nodes WHERE rollout_id = $1 GROUP BY state`, rolloutID)
	return stateCounts(rows, err)
}

func stateCounts(rows store.Rows, err error) (map[string]int, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			return nil, err
		}
		out[s] = n
	}
	return out, rows.Err()
}

// ActiveNodeStateCounts counts the nodes of active rollouts by state.
func ActiveNodeStateCounts(ctx context.Context, q store.Querier) (map[string]int, error) {
	rows, err := q.Query(ctx, `SELECT n.state, COUNT(*) FROM rollout_nodes n JOIN rollouts r ON r.id = n.rollout_id
		WHERE r.state IN ('running', 'paused', 'halted') GROUP BY n.state`)
	return stateCounts(rows, err)
}

func itoa(i int) string {
	b, _ := json.Marshal(i)
	return string(b)
}
