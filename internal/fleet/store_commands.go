package fleet

// SQL over commands, and the NOTIFY that wakes a node's session.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/internal/cmdsig"
	"github.com/better-compute/better-compute/internal/store"
)

// Command states. The first four are open; the rest are terminal.
const (
	CommandPending   = "pending"
	CommandDelivered = "delivered"
	CommandAccepted  = "accepted"
	CommandRunning   = "running"
	CommandSucceeded = "succeeded"
	CommandFailed    = "failed"
	CommandCanceled  = "canceled"
	CommandExpired   = "expired"
)

// OpenCommandStates are the states a command can still leave.
var OpenCommandStates = []string{CommandPending, CommandDelivered, CommandAccepted, CommandRunning}

// Command is a row of commands.
type Command struct {
	ID             string
	TenantID       string
	NodeID         string
	Seq            int64
	Kind           string
	Params         string // JSON object
	IdempotencyKey string
	State          string
	Progress       int
	Message        string
	Result         string // JSON object
	FailureCode    string
	Traceparent    string
	CreatedBy      string
	Deadline       time.Time
	CreateTime     time.Time
	UpdateTime     time.Time
	// Signer, TrustVersion and Signature are the command's signature
	// (internal/cmdsig); empty on a row no signer signed.
	Signer       string
	TrustVersion int64
	Signature    []byte
}

// SigningFields are what a command's signature covers.
func (c *Command) SigningFields() cmdsig.Fields {
	return cmdsig.Fields{TrustVersion: c.TrustVersion, ID: c.ID, NodeID: c.NodeID, Seq: uint64(max(c.Seq, 0)), Kind: c.Kind,
		ParamsDigest: cmdsig.Digest([]byte(c.Params)), IdempotencyKey: c.IdempotencyKey, Deadline: c.Deadline}
}

// CommandSigner signs a command in the transaction that inserts it
// (pki.CommandSigner).
type CommandSigner interface {
	SignCommand(ctx context.Context, tx store.Tx, f cmdsig.Fields) (cmdsig.Signature, error)
}

const commandColumns = `id, tenant_id, node_id, seq, kind, params, idempotency_key, state, progress, message, result,
	failure_code, traceparent, created_by, deadline, create_time, update_time, signer, trust_version, signature`

func scanCommand(row scanner) (Command, error) {
	var c Command
	err := row.Scan(&c.ID, &c.TenantID, &c.NodeID, &c.Seq, &c.Kind, &c.Params, &c.IdempotencyKey, &c.State, &c.Progress,
		&c.Message, &c.Result, &c.FailureCode, &c.Traceparent, &c.CreatedBy, &c.Deadline, &c.CreateTime, &c.UpdateTime,
		&c.Signer, &c.TrustVersion, &c.Signature)
	return c, err
}

// CommandInsertParams are the fields of a new command; it starts pending.
type CommandInsertParams struct {
	ID       string
	TenantID string
	NodeID   string
	Kind     string
	Params   string // JSON object; "" means {}
	// IdempotencyKey is unique per node; "" means the command id.
	IdempotencyKey string
	Traceparent    string
	CreatedBy      string
	Deadline       time.Time
	CreateTime     time.Time
	// Signer signs the row; nil leaves it unsigned, and any bcd that pinned
	// command-signing roots refuses it.
	Signer CommandSigner
}

// CommandInsert allocates the node's next sequence number and inserts a
// pending command with it, in the caller's transaction: the sequence and
// the row commit together or not at all. When the node already has a
// command with the idempotency key, nothing is written (the transaction
// stays usable: no unique violation is raised) and the stored command is
// returned with inserted false; the caller compares it with its request.
func CommandInsert(ctx context.Context, tx store.Tx, p *CommandInsertParams) (c Command, inserted bool, err error) {
	var seq int64
	if err := tx.QueryRow(ctx, `UPDATE nodes SET next_seq = next_seq + 1 WHERE id = $1 RETURNING next_seq`, p.NodeID).Scan(&seq); err != nil {
		return Command{}, false, err
	}
	c = Command{
		ID: p.ID, TenantID: p.TenantID, NodeID: p.NodeID, Seq: seq, Kind: p.Kind, Params: cmp.Or(p.Params, "{}"),
		IdempotencyKey: cmp.Or(p.IdempotencyKey, p.ID), State: CommandPending, Result: "{}", Traceparent: p.Traceparent,
		CreatedBy: p.CreatedBy, Deadline: p.Deadline, CreateTime: p.CreateTime, UpdateTime: p.CreateTime,
		Signature: []byte{},
	}
	if p.Signer != nil {
		sig, err := p.Signer.SignCommand(ctx, tx, c.SigningFields())
		if err != nil {
			return Command{}, false, fmt.Errorf("fleet: sign command: %w", err)
		}
		c.Signer, c.TrustVersion, c.Signature = sig.Signer, sig.TrustVersion, sig.Sig
	}
	var id string
	err = tx.QueryRow(ctx, `INSERT INTO commands (id, tenant_id, node_id, seq, kind, params, idempotency_key, state,
		traceparent, created_by, deadline, create_time, update_time, signer, trust_version, signature)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $12, $13, $14, $15)
		ON CONFLICT (node_id, idempotency_key) DO NOTHING RETURNING id`,
		c.ID, c.TenantID, c.NodeID, c.Seq, c.Kind, c.Params, c.IdempotencyKey, c.State, c.Traceparent, c.CreatedBy,
		c.Deadline, c.CreateTime, c.Signer, c.TrustVersion, c.Signature).Scan(&id)
	if err == nil {
		return c, true, nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return Command{}, false, err
	}
	// A repeat: hand the number back (the node's row stays locked by the
	// UPDATE above, so no other command took a later one meanwhile).
	if _, err := tx.Exec(ctx, `UPDATE nodes SET next_seq = next_seq - 1 WHERE id = $1`, p.NodeID); err != nil {
		return Command{}, false, err
	}
	stored, err := scanCommand(tx.QueryRow(ctx, `SELECT `+commandColumns+` FROM commands WHERE node_id = $1 AND idempotency_key = $2`,
		p.NodeID, c.IdempotencyKey))
	return stored, false, err
}

// CommandGet reads a command (store.ErrNotFound when absent); a non-empty
// tenantID confines the lookup.
func CommandGet(ctx context.Context, q store.Querier, tenantID, id string) (Command, error) {
	return scanCommand(q.QueryRow(ctx, `SELECT `+commandColumns+` FROM commands
		WHERE id = $1 AND ($2 = '' OR tenant_id = $2)`, id, tenantID))
}

// CommandListParams filter a command listing.
type CommandListParams struct {
	TenantID string
	NodeID   string
	State    string
	After    string
	Limit    int
}

// CommandList lists commands by id.
func CommandList(ctx context.Context, q store.Querier, p *CommandListParams) ([]Command, error) {
	rows, err := q.Query(ctx, `SELECT `+commandColumns+` FROM commands
		WHERE id > $1 AND ($2 = '' OR tenant_id = $2) AND ($3 = '' OR node_id = $3) AND ($4 = '' OR state = $4)
		ORDER BY id LIMIT $5`, p.After, p.TenantID, p.NodeID, p.State, p.Limit)
	return collect(rows, err, scanCommand)
}

// CommandListOpen returns up to limit open commands of a node with seq >
// afterSeq, in seq order: what its session delivers next.
func CommandListOpen(ctx context.Context, q store.Querier, nodeID string, afterSeq uint64, limit int) ([]Command, error) {
	args := []any{nodeID, i64(afterSeq), limit}
	rows, err := q.Query(ctx, `SELECT `+commandColumns+` FROM commands
		WHERE node_id = $1 AND seq > $2 AND state IN (`+placeholders(&args, OpenCommandStates)+`)
		ORDER BY seq LIMIT $3`, args...)
	return collect(rows, err, scanCommand)
}

// CommandListStopped returns the ids and seqs of the node's commands in
// [fromSeq, toSeq] that were canceled or expired, so the session can tell
// the agent to stop them.
func CommandListStopped(ctx context.Context, q store.Querier, nodeID string, fromSeq, toSeq uint64) (map[string]uint64, error) {
	out := map[string]uint64{}
	err := queryEach(ctx, q, `SELECT id, seq FROM commands WHERE node_id = $1 AND state IN ('canceled', 'expired') AND seq >= $2 AND seq <= $3`,
		[]any{nodeID, i64(fromSeq), i64(toSeq)}, func(r store.Rows) error {
			var id string
			var seq int64
			if err := r.Scan(&id, &seq); err != nil {
				return err
			}
			out[id] = uint64(max(seq, 0))
			return nil
		})
	return out, err
}

// CommandListForAllocation returns the latest commands of nodeID whose
// params may name allocationID (commandID narrows it when not empty). The
// caller checks the params precisely; LIKE only narrows the scan.
func CommandListForAllocation(ctx context.Context, q store.Querier, nodeID, commandID, allocationID string) ([]Command, error) {
	pattern := "%" + strings.NewReplacer(`\`, `\\`, "%", `\%`, "_", `\_`).Replace(allocationID) + "%"
	rows, err := q.Query(ctx, `SELECT `+commandColumns+` FROM commands
		WHERE node_id = $1 AND ($2 = '' OR id = $2) AND params LIKE $3 ESCAPE '\' ORDER BY seq DESC LIMIT 20`,
		nodeID, commandID, pattern)
	return collect(rows, err, scanCommand)
}

// CommandListOpenForAllocation returns nodeID's open commands of kind whose
// params may name allocationID. The caller checks the params precisely;
// LIKE only narrows the scan.
func CommandListOpenForAllocation(ctx context.Context, q store.Querier, nodeID, kind, allocationID string) ([]Command, error) {
	pattern := "%" + strings.NewReplacer(`\`, `\\`, "%", `\%`, "_", `\_`).Replace(allocationID) + "%"
	args := []any{nodeID, kind, pattern}
	rows, err := q.Query(ctx, `SELECT `+commandColumns+` FROM commands
		WHERE node_id = $1 AND kind = $2 AND params LIKE $3 ESCAPE '\' AND state IN (`+placeholders(&args, OpenCommandStates)+`) ORDER BY seq`, args...)
	return collect(rows, err, scanCommand)
}

// CommandMarkDelivered marks the node's pending commands with seq in
// (afterSeq, lastSeq] delivered.
func CommandMarkDelivered(ctx context.Context, tx store.Tx, nodeID string, afterSeq, lastSeq uint64) error {
	_, err := tx.Exec(ctx, `UPDATE commands SET state = 'delivered', update_time = compute_now()
		WHERE node_id = $1 AND state = 'pending' AND seq > $2 AND seq <= $3`, nodeID, i64(afterSeq), i64(lastSeq))
	return err
}

// CommandUpdateParams move a command on: an agent's report, or the
// gateway failing a command it cannot send.
type CommandUpdateParams struct {
	ID          string
	FromState   string
	State       string
	Progress    int
	Message     string
	Result      string // JSON object; "" means {}
	FailureCode string
}

// CommandUpdate moves a command from FromState to State; it reports false
// when the command is no longer in FromState (a concurrent update or the
// sweeper won), so updates only ever move forward.
func CommandUpdate(ctx context.Context, tx store.Tx, p *CommandUpdateParams) (bool, error) {
	n, err := tx.Exec(ctx, `UPDATE commands SET state = $3, progress = $4, message = $5, result = $6, failure_code = $7, update_time = compute_now()
		WHERE id = $1 AND state = $2`, p.ID, p.FromState, p.State, p.Progress, p.Message, cmp.Or(p.Result, "{}"), p.FailureCode)
	return n == 1, err
}

// CommandCancelParams cancel open commands: one by ID, or every open one of
// a node and kind.
type CommandCancelParams struct {
	ID      string
	NodeID  string
	Kind    string
	Message string
}

// CommandCancel cancels the open commands the params name and returns how
// many it canceled.
func CommandCancel(ctx context.Context, tx store.Tx, p *CommandCancelParams) (int64, error) {
	if p.ID == "" && (p.NodeID == "" || p.Kind == "") {
		return 0, fmt.Errorf("fleet: CommandCancel needs an id, or a node and a kind")
	}
	args := []any{p.ID, p.NodeID, p.Kind, p.Message}
	return tx.Exec(ctx, `UPDATE commands SET state = 'canceled', message = $4, update_time = compute_now()
		WHERE ($1 = '' OR id = $1) AND ($2 = '' OR node_id = $2) AND ($3 = '' OR kind = $3)
		AND state IN (`+placeholders(&args, OpenCommandStates)+`)`, args...)
}

// CommandExpire moves up to limit open commands past their deadline to
// expired and returns them.
func CommandExpire(ctx context.Context, tx store.Tx, limit int) ([]Command, error) {
	args := []any{limit}
	rows, err := tx.Query(ctx, `UPDATE commands SET state = 'expired', update_time = compute_now()
		WHERE id IN (SELECT id FROM commands WHERE state IN (`+placeholders(&args, OpenCommandStates)+`) AND deadline < compute_now() LIMIT $1)
		RETURNING `+commandColumns, args...)
	return collect(rows, err, scanCommand)
}

// CommandChannel is the PostgreSQL NOTIFY channel that wakes the replica
// holding a node's session; the payload is the node id.
const CommandChannel = "bc_commands"

// CommandNotify wakes the replica holding nodeID's session: pg_notify in
// the caller's transaction on PostgreSQL, so it is sent only if it commits.
// It does nothing on SQLite (one process: the in-process hub does it).
func CommandNotify(ctx context.Context, tx store.Tx, nodeID string) error {
	if tx.Dialect() != store.Postgres {
		return nil
	}
	_, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, CommandChannel, nodeID)
	return err
}

// CommandListen subscribes a dedicated PostgreSQL connection to
// CommandChannel.
func CommandListen(ctx context.Context, conn *pgx.Conn) error {
	_, err := conn.Exec(ctx, `LISTEN `+CommandChannel)
	return err
}

// CommandByKey reads a node's command by its idempotency key
// (store.ErrNotFound when absent).
func CommandByKey(ctx context.Context, q store.Querier, nodeID, key string) (Command, error) {
	return scanCommand(q.QueryRow(ctx, `SELECT `+commandColumns+` FROM commands WHERE node_id = $1 AND idempotency_key = $2`, nodeID, key))
}

// NodeReport is a row of node_reports: what a node signed (nodesig).
type NodeReport struct {
	ID         string
	NodeID     string
	Kind       string // command.succeeded, allocation.bound, …
	Subject    string // the command or allocation id
	CertDER    []byte
	Signed     []byte
	Signature  []byte
	CreateTime time.Time
}

// NodeReportInsert keeps a signed report.
func NodeReportInsert(ctx context.Context, tx store.Tx, r NodeReport) error {
	_, err := tx.Exec(ctx, `INSERT INTO node_reports (id, node_id, kind, subject, cert_der, signed, signature, create_time)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, r.ID, r.NodeID, r.Kind, r.Subject, r.CertDER, r.Signed, r.Signature, r.CreateTime)
	return err
}

// NodeReportsFor lists the signed reports about a command or allocation,
// oldest first.
func NodeReportsFor(ctx context.Context, q store.Querier, subject string) ([]NodeReport, error) {
	rows, err := q.Query(ctx, `SELECT id, node_id, kind, subject, cert_der, signed, signature, create_time FROM node_reports
		WHERE subject = $1 ORDER BY create_time, id`, subject)
	return collect(rows, err, func(row scanner) (NodeReport, error) {
		var r NodeReport
		err := row.Scan(&r.ID, &r.NodeID, &r.Kind, &r.Subject, &r.CertDER, &r.Signed, &r.Signature, &r.CreateTime)
		return r, err
	})
}

// CommandOpenSignedUpTo counts the open commands signed under a
// command-signing generation at or below version: a rotation retires the
// old generation only when none is left (pki.AdvanceRotation).
func CommandOpenSignedUpTo(ctx context.Context, q store.Querier, version int64) (int, error) {
	args := []any{version}
	var n int
	err := q.QueryRow(ctx, `SELECT COUNT(*) FROM commands
		WHERE trust_version > 0 AND trust_version <= $1 AND state IN (`+placeholders(&args, OpenCommandStates)+`)`, args...).Scan(&n)
	return n, err
}
