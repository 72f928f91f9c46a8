package audit

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

// Insert writes audit rows in tx, many in one statement, and queues each
// for the Merkle tree (audit_pending) in the same transaction, so a row
// that commits is sequenced and a row that rolls back never is.
func Insert(ctx context.Context, tx store.Tx, entries ...envelope.AuditEntry) error {
	rows := make([][]any, len(entries))
	pending := make([][]any, len(entries))
	for i, e := range entries {
		rows[i] = []any{e.ID, e.Time, e.TenantID, e.PrincipalID, e.PrincipalKind, e.Action, e.ResourceType, e.ResourceID, e.Decision, e.RequestID, e.TraceID, e.Result, e.Detail}
		pending[i] = []any{e.ID}
	}
	if err := store.InsertRows(ctx, tx, `INSERT INTO audit_log (id, time, tenant_id, principal_id, principal_kind, action, resource_type, resource_id, decision, request_id, trace_id, result, detail)`, "", rows); err != nil {
		return err
	}
	return store.InsertRows(ctx, tx, `INSERT INTO audit_pending (audit_id)`, "", pending)
}

const entryColumns = `l.id, l.time, l.tenant_id, l.principal_id, l.principal_kind, l.action, l.resource_type, l.resource_id, l.decision, l.request_id, l.trace_id, l.result, l.detail`

func scanEntry(r store.Row, e *envelope.AuditEntry, extra ...any) error {
	return r.Scan(append([]any{&e.ID, &e.Time, &e.TenantID, &e.PrincipalID, &e.PrincipalKind, &e.Action, &e.ResourceType, &e.ResourceID, &e.Decision, &e.RequestID, &e.TraceID, &e.Result, &e.Detail}, extra...)...)
}

// List returns audit rows newest first.
func List(ctx context.Context, q store.Querier, p ListParams) ([]envelope.AuditEntry, error) {
	before := p.Before
	if before == "" {
		before = "~" // sorts after every id
	}
	rows, err := q.Query(ctx, `SELECT `+entryColumns+`
		FROM audit_log l WHERE ($1 OR l.tenant_id = $2) AND ($3 = '' OR l.action = $3) AND l.id < $4 ORDER BY l.id DESC LIMIT $5`,
		p.AllTenants, p.TenantID, p.Action, before, p.Limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []envelope.AuditEntry
	for rows.Next() {
		var e envelope.AuditEntry
		if err := scanEntry(rows, &e); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// entryGet reads one audit row.
func entryGet(ctx context.Context, q store.Querier, id string) (envelope.AuditEntry, error) {
	var e envelope.AuditEntry
	err := scanEntry(q.QueryRow(ctx, `SELECT `+entryColumns+` FROM audit_log l WHERE l.id = $1`, id), &e)
	return e, err
}

// pendingList returns up to limit queued rows in id order.
func pendingList(ctx context.Context, q store.Querier, limit int) ([]envelope.AuditEntry, error) {
	rows, err := q.Query(ctx, `SELECT `+entryColumns+` FROM audit_pending p JOIN audit_log l ON l.id = p.audit_id
		ORDER BY p.audit_id LIMIT $1`, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []envelope.AuditEntry
	for rows.Next() {
		var e envelope.AuditEntry
		if err := scanEntry(rows, &e); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// pendingDelete removes exactly these ids from the queue: an id committed
// meanwhile (with a lower id, by a slower transaction) stays for the next
// run.
func pendingDelete(ctx context.Context, tx store.Tx, ids []string) error {
	const chunk = 500
	for len(ids) > 0 {
		n := min(chunk, len(ids))
		ph := make([]string, n)
		args := make([]any, n)
		for i := range n {
			ph[i] = fmt.Sprintf("$%d", i+1)
			args[i] = ids[i]
		}
		if _, err := tx.Exec(ctx, `DELETE FROM audit_pending WHERE audit_id IN (`+strings.Join(ph, ", ")+`)`, args...); err != nil {
			return err
		}
		ids = ids[n:]
	}
	return nil
}

// treeState is the one audit_tree row.
type treeState struct {
	Size        int64
	RangeHashes []byte
}

// treeLock reads the tree's state and, on PostgreSQL, locks its row until
// the transaction ends: the sequencer's fence. SQLite has one writer.
func treeLock(ctx context.Context, tx store.Tx) (treeState, error) {
	var s treeState
	err := tx.QueryRow(ctx, `SELECT size, range_hashes FROM audit_tree WHERE id = 1`+store.ForUpdate(tx)).Scan(&s.Size, &s.RangeHashes)
	return s, err
}

// treeUpdate moves the tree from size old to s; it fails when another
// sequencer moved it first (which the lock should already prevent).
func treeUpdate(ctx context.Context, tx store.Tx, old int64, s treeState) error {
	n, err := tx.Exec(ctx, `UPDATE audit_tree SET size = $1, range_hashes = $2 WHERE id = 1 AND size = $3`, s.Size, s.RangeHashes, old)
	if err != nil {
		return err
	}
	if n != 1 {
		return fmt.Errorf("audit: the tree moved from size %d under the sequencer", old)
	}
	return nil
}

type leafRow struct {
	Seq      int64
	AuditID  string
	LeafHash []byte
}

type nodeRow struct {
	Level int
	Index int64
	Hash  []byte
}

func leavesInsert(ctx context.Context, tx store.Tx, ls []leafRow) error {
	rows := make([][]any, len(ls))
	for i, l := range ls {
		rows[i] = []any{l.Seq, l.AuditID, l.LeafHash}
	}
	return store.InsertRows(ctx, tx, `INSERT INTO audit_leaves (seq, audit_id, leaf_hash)`, "", rows)
}

func nodesInsert(ctx context.Context, tx store.Tx, ns []nodeRow) error {
	rows := make([][]any, len(ns))
	for i, n := range ns {
		rows[i] = []any{n.Level, n.Index, n.Hash}
	}
	return store.InsertRows(ctx, tx, `INSERT INTO audit_nodes (level, idx, hash)`, "", rows)
}

// leafSeq returns an entry's leaf index; ok is false while it is pending
// or when no such row exists (pending tells which).
func leafSeq(ctx context.Context, q store.Querier, auditID string) (seq int64, ok, pending bool, err error) {
	err = q.QueryRow(ctx, `SELECT seq FROM audit_leaves WHERE audit_id = $1`, auditID).Scan(&seq)
	if err == nil {
		return seq, true, false, nil
	}
	if !isNotFound(err) {
		return 0, false, false, err
	}
	var n int64
	if err := q.QueryRow(ctx, `SELECT COUNT(*) FROM audit_pending WHERE audit_id = $1`, auditID).Scan(&n); err != nil {
		return 0, false, false, err
	}
	return 0, false, n > 0, nil
}

// leafHashes returns the stored hashes of leaves by index.
func leafHashes(ctx context.Context, q store.Querier, seqs []int64) (map[int64][]byte, error) {
	out := make(map[int64][]byte, len(seqs))
	if len(seqs) == 0 {
		return out, nil
	}
	ph := make([]string, len(seqs))
	args := make([]any, len(seqs))
	for i, s := range seqs {
		ph[i] = fmt.Sprintf("$%d", i+1)
		args[i] = s
	}
	rows, err := q.Query(ctx, `SELECT seq, leaf_hash FROM audit_leaves WHERE seq IN (`+strings.Join(ph, ", ")+`)`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			s int64
			h []byte
		)
		if err := rows.Scan(&s, &h); err != nil {
			return nil, err
		}
		out[s] = h
	}
	return out, rows.Err()
}

type nodeKey struct {
	Level int
	Index int64
}

// nodeHashes returns the stored hashes of inner nodes.
func nodeHashes(ctx context.Context, q store.Querier, keys []nodeKey) (map[nodeKey][]byte, error) {
	out := make(map[nodeKey][]byte, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	conds := make([]string, len(keys))
	args := make([]any, 0, 2*len(keys))
	for i, k := range keys {
		conds[i] = fmt.Sprintf("(level = $%d AND idx = $%d)", 2*i+1, 2*i+2)
		args = append(args, k.Level, k.Index)
	}
	rows, err := q.Query(ctx, `SELECT level, idx, hash FROM audit_nodes WHERE `+strings.Join(conds, " OR "), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			k nodeKey
			h []byte
		)
		if err := rows.Scan(&k.Level, &k.Index, &h); err != nil {
			return nil, err
		}
		out[k] = h
	}
	return out, rows.Err()
}

// checkpointRow is one signed checkpoint.
type checkpointRow struct {
	Size       int64
	Root       []byte
	Note       string
	CreateTime time.Time
}

func checkpointInsert(ctx context.Context, tx store.Tx, c checkpointRow) error {
	_, err := tx.Exec(ctx, `INSERT INTO audit_checkpoints (size, root_hash, note, create_time) VALUES ($1, $2, $3, $4)`,
		c.Size, c.Root, c.Note, c.CreateTime)
	return err
}

// checkpointGet returns the checkpoint of a size, or the latest for size 0.
func checkpointGet(ctx context.Context, q store.Querier, size int64) (checkpointRow, error) {
	var c checkpointRow
	err := q.QueryRow(ctx, `SELECT size, root_hash, note, create_time FROM audit_checkpoints
		WHERE ($1 = 0 OR size = $1) ORDER BY size DESC LIMIT 1`, size).Scan(&c.Size, &c.Root, &c.Note, &c.CreateTime)
	return c, err
}

func checkpointList(ctx context.Context, q store.Querier) ([]checkpointRow, error) {
	rows, err := q.Query(ctx, `SELECT size, root_hash, note, create_time FROM audit_checkpoints ORDER BY size`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []checkpointRow
	for rows.Next() {
		var c checkpointRow
		if err := rows.Scan(&c.Size, &c.Root, &c.Note, &c.CreateTime); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// signerRow is the sealed checkpoint key.
type signerRow struct {
	Origin     string
	Verifier   string
	KeySealed  []byte
	CreateTime time.Time
}

func signerGet(ctx context.Context, q store.Querier) (signerRow, error) {
	var s signerRow
	err := q.QueryRow(ctx, `SELECT origin, verifier, key_sealed, create_time FROM audit_signer WHERE id = 1`).
		Scan(&s.Origin, &s.Verifier, &s.KeySealed, &s.CreateTime)
	return s, err
}

// signerInsert writes the key unless a replica wrote one first.
func signerInsert(ctx context.Context, tx store.Tx, s signerRow) error {
	_, err := tx.Exec(ctx, `INSERT INTO audit_signer (id, origin, verifier, key_sealed, create_time) VALUES (1, $1, $2, $3, $4)
		ON CONFLICT (id) DO NOTHING`, s.Origin, s.Verifier, s.KeySealed, s.CreateTime)
	return err
}

// checkRow is one leaf as the full check reads it: the stored leaf and,
// when the row still exists, the row.
type checkRow struct {
	Seq      int64
	AuditID  string
	LeafHash []byte
	Entry    envelope.AuditEntry
	RowFound bool
}

// checkScan walks every leaf in index order with its audit row (if any).
func checkScan(ctx context.Context, q store.Querier, fn func(checkRow) error) error {
	rows, err := q.Query(ctx, `SELECT s.seq, s.audit_id, s.leaf_hash, l.id IS NOT NULL,
		COALESCE(l.id, ''), COALESCE(l.time, $1), COALESCE(l.tenant_id, ''), COALESCE(l.principal_id, ''), COALESCE(l.principal_kind, ''),
		COALESCE(l.action, ''), COALESCE(l.resource_type, ''), COALESCE(l.resource_id, ''), COALESCE(l.decision, ''),
		COALESCE(l.request_id, ''), COALESCE(l.trace_id, ''), COALESCE(l.result, ''), COALESCE(l.detail, '')
		FROM audit_leaves s LEFT JOIN audit_log l ON l.id = s.audit_id ORDER BY s.seq`, time.Unix(0, 0).UTC())
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var r checkRow
		e := &r.Entry
		if err := rows.Scan(&r.Seq, &r.AuditID, &r.LeafHash, &r.RowFound, &e.ID, &e.Time, &e.TenantID, &e.PrincipalID, &e.PrincipalKind,
			&e.Action, &e.ResourceType, &e.ResourceID, &e.Decision, &e.RequestID, &e.TraceID, &e.Result, &e.Detail); err != nil {
			return err
		}
		if err := fn(r); err != nil {
			return err
		}
	}
	return rows.Err()
}

// unsequencedRows lists audit rows that are neither leaves nor pending: a
// row that escaped the tree.
func unsequencedRows(ctx context.Context, q store.Querier, limit int) ([]string, error) {
	return store.Strings(q.Query(ctx, `SELECT l.id FROM audit_log l
		WHERE NOT EXISTS (SELECT 1 FROM audit_leaves s WHERE s.audit_id = l.id)
		AND NOT EXISTS (SELECT 1 FROM audit_pending p WHERE p.audit_id = l.id) ORDER BY l.id LIMIT $1`, limit))
}
