package quorum

// The quorum module's store: every SQL statement over approver_sets,
// command_batches, command_batch_leaves and command_batch_approvals. Time
// comes from the caller's clock (the envelope's), never from SQL.

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Migrations returns the module's tables.
func Migrations() store.Migrations {
	return store.Embedded("quorum", migrationsFS)
}

// BatchIDPrefix is the id prefix of a command batch (envelope.NewID).
const BatchIDPrefix = "cbt"

// Batch states as stored; expired is derived from expire_time (see
// Batch.StateAt), so no sweep has to run for a batch to stop being usable.
const (
	StatePending  = "pending"
	StateApproved = "approved"
	StateRan      = "ran"
	StateCanceled = "canceled"
	StateExpired  = "expired"
)

// ApproverSet is a row of approver_sets.
type ApproverSet struct {
	TenantID  string
	Epoch     int64
	Threshold int
	// Keys are authorized_keys lines, sorted.
	Keys       []string
	Digest     string
	Approvals  []SetApproval
	CreatedBy  string
	CreateTime time.Time
}

// SetApproval is one previous-set key's signature admitting a set.
type SetApproval struct {
	KeyID     string `json:"key_id"`
	Signature []byte `json:"signature"`
}

// Batch is a row of command_batches.
type Batch struct {
	ID           string
	TenantID     string
	State        string
	Root         string
	Epoch        int64
	Threshold    int
	TrustDomain  string
	Description  string
	PayloadBytes int64
	CreatedBy    string
	CreateTime   time.Time
	ExpireTime   time.Time
	UpdateTime   time.Time
}

// StateAt is the batch's state at now: a batch that has not run and
// reached its expiry is expired whatever its row says.
func (b Batch) StateAt(now time.Time) string {
	if (b.State == StatePending || b.State == StateApproved) && !now.Before(b.ExpireTime) {
		return StateExpired
	}
	return b.State
}

// Leaf is a row of command_batch_leaves.
type Leaf struct {
	BatchID string
	Index   int
	Kind    string
	Subject string
	// TargetID is the node, or for a power leaf the machine, the subject
	// resolved to.
	TargetID     string
	Params       string // canonical JSON
	ParamsSHA256 string
	CommandID    string
	WorkflowID   string
}

// Approval is a row of command_batch_approvals.
type Approval struct {
	BatchID    string
	KeyID      string
	Signature  string // base64 of the SSH wire signature
	ApprovedBy string
	CreateTime time.Time
}

// ApproverSetCurrent reads the tenant's set of the highest epoch;
// store.ErrNotFound when it has none.
func ApproverSetCurrent(ctx context.Context, q store.Querier, tenantID string) (ApproverSet, error) {
	return scanSet(q.QueryRow(ctx, `SELECT tenant_id, epoch, threshold, keys, digest, approvals, created_by, create_time
		FROM approver_sets WHERE tenant_id = $1 ORDER BY epoch DESC LIMIT 1`, tenantID))
}

// ApproverSetGet reads one epoch of the tenant's sets.
func ApproverSetGet(ctx context.Context, q store.Querier, tenantID string, epoch int64) (ApproverSet, error) {
	return scanSet(q.QueryRow(ctx, `SELECT tenant_id, epoch, threshold, keys, digest, approvals, created_by, create_time
		FROM approver_sets WHERE tenant_id = $1 AND epoch = $2`, tenantID, epoch))
}

func scanSet(row store.Row) (ApproverSet, error) {
	var (
		s               ApproverSet
		keys, approvals string
	)
	if err := row.Scan(&s.TenantID, &s.Epoch, &s.Threshold, &keys, &s.Digest, &approvals, &s.CreatedBy, &s.CreateTime); err != nil {
		return s, err
	}
	if err := json.Unmarshal([]byte(keys), &s.Keys); err != nil {
		return s, err
	}
	return s, json.Unmarshal([]byte(approvals), &s.Approvals)
}

// ErrEpochTaken says another change inserted the same epoch first.
var ErrEpochTaken = errors.New("approver set epoch already exists")

// ApproverSetInsert inserts a new epoch; ErrEpochTaken when a concurrent
// change won it (the primary key decides, not a read before).
func ApproverSetInsert(ctx context.Context, tx store.Tx, s *ApproverSet) error {
	keys, err := json.Marshal(s.Keys)
	if err != nil {
		return err
	}
	approvals, err := json.Marshal(append([]SetApproval{}, s.Approvals...))
	if err != nil {
		return err
	}
	n, err := tx.Exec(ctx, `INSERT INTO approver_sets (tenant_id, epoch, threshold, keys, digest, approvals, created_by, create_time)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (tenant_id, epoch) DO NOTHING`,
		s.TenantID, s.Epoch, s.Threshold, string(keys), s.Digest, string(approvals), s.CreatedBy, s.CreateTime)
	if err != nil {
		return err
	}
	if n == 0 {
		return ErrEpochTaken
	}
	return nil
}

const batchColumns = `id, tenant_id, state, root, epoch, threshold, trust_domain, description, payload_bytes, created_by,
	create_time, expire_time, update_time`

func scanBatch(row interface{ Scan(...any) error }) (Batch, error) {
	var b Batch
	err := row.Scan(&b.ID, &b.TenantID, &b.State, &b.Root, &b.Epoch, &b.Threshold, &b.TrustDomain, &b.Description,
		&b.PayloadBytes, &b.CreatedBy, &b.CreateTime, &b.ExpireTime, &b.UpdateTime)
	return b, err
}

// BatchInsert inserts a batch and its leaves.
func BatchInsert(ctx context.Context, tx store.Tx, b *Batch, leaves []Leaf) error {
	if _, err := tx.Exec(ctx, `INSERT INTO command_batches (`+batchColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $11)`,
		b.ID, b.TenantID, b.State, b.Root, b.Epoch, b.Threshold, b.TrustDomain, b.Description, b.PayloadBytes, b.CreatedBy,
		b.CreateTime, b.ExpireTime); err != nil {
		return err
	}
	for _, l := range leaves {
		if _, err := tx.Exec(ctx, `INSERT INTO command_batch_leaves (batch_id, idx, kind, subject, target_id, params, params_sha256)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`, b.ID, l.Index, l.Kind, l.Subject, l.TargetID, l.Params, l.ParamsSHA256); err != nil {
			return err
		}
	}
	return nil
}

// BatchGet reads a batch, confined to tenantID unless it is empty; lock
// is "" or store.ForUpdate(tx).
func BatchGet(ctx context.Context, q store.Querier, tenantID, id, lock string) (Batch, error) {
	return scanBatch(q.QueryRow(ctx, `SELECT `+batchColumns+` FROM command_batches
		WHERE id = $1 AND ($2 = '' OR tenant_id = $2)`+lock, id, tenantID))
}

// BatchListParams filter a list of batches; After is the last id seen.
type BatchListParams struct {
	TenantID string
	// States, when set, keeps rows in these stored states.
	States []string
	After  string
	Limit  int
}

// BatchList lists batches by id.
func BatchList(ctx context.Context, q store.Querier, p *BatchListParams) ([]Batch, error) {
	query := `SELECT ` + batchColumns + ` FROM command_batches WHERE ($1 = '' OR tenant_id = $1) AND id > $2`
	args := []any{p.TenantID, p.After}
	if len(p.States) > 0 {
		query += ` AND state IN (`
		for i, s := range p.States {
			if i > 0 {
				query += `, `
			}
			args = append(args, s)
			query += `$` + itoa(len(args))
		}
		query += `)`
	}
	args = append(args, p.Limit)
	query += ` ORDER BY id LIMIT $` + itoa(len(args))
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Batch
	for rows.Next() {
		b, err := scanBatch(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, rows.Err()
}

func itoa(n int) string { return strconv.Itoa(n) }

// BatchStateSet moves a batch to state.
func BatchStateSet(ctx context.Context, tx store.Tx, id, state string, now time.Time) error {
	_, err := tx.Exec(ctx, `UPDATE command_batches SET state = $2, update_time = $3 WHERE id = $1`, id, state, now)
	return err
}

// LeavesOf reads a batch's leaves in order.
func LeavesOf(ctx context.Context, q store.Querier, batchID string) ([]Leaf, error) {
	rows, err := q.Query(ctx, `SELECT batch_id, idx, kind, subject, target_id, params, params_sha256, command_id, workflow_id
		FROM command_batch_leaves WHERE batch_id = $1 ORDER BY idx`, batchID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Leaf
	for rows.Next() {
		var l Leaf
		if err := rows.Scan(&l.BatchID, &l.Index, &l.Kind, &l.Subject, &l.TargetID, &l.Params, &l.ParamsSHA256, &l.CommandID, &l.WorkflowID); err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, rows.Err()
}

// LeafRanSet records the command (node leaf) or workflow (power leaf) a
// leaf became.
func LeafRanSet(ctx context.Context, tx store.Tx, batchID string, idx int, commandID, workflowID string) error {
	_, err := tx.Exec(ctx, `UPDATE command_batch_leaves SET command_id = $3, workflow_id = $4 WHERE batch_id = $1 AND idx = $2`,
		batchID, idx, commandID, workflowID)
	return err
}

// ApprovalInsert records an approval; inserted is false when the key
// already approved the batch (the primary key decides).
func ApprovalInsert(ctx context.Context, tx store.Tx, a *Approval) (inserted bool, err error) {
	n, err := tx.Exec(ctx, `INSERT INTO command_batch_approvals (batch_id, key_id, signature, approved_by, create_time)
		VALUES ($1, $2, $3, $4, $5) ON CONFLICT (batch_id, key_id) DO NOTHING`, a.BatchID, a.KeyID, a.Signature, a.ApprovedBy, a.CreateTime)
	return n == 1, err
}

// ApprovalsOf reads a batch's approvals in the order they came.
func ApprovalsOf(ctx context.Context, q store.Querier, batchID string) ([]Approval, error) {
	rows, err := q.Query(ctx, `SELECT batch_id, key_id, signature, approved_by, create_time
		FROM command_batch_approvals WHERE batch_id = $1 ORDER BY create_time, key_id`, batchID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Approval
	for rows.Next() {
		var a Approval
		if err := rows.Scan(&a.BatchID, &a.KeyID, &a.Signature, &a.ApprovedBy, &a.CreateTime); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, rows.Err()
}
