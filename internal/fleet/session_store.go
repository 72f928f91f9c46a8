package fleet

// session_store.go holds the SQL of the agent gateway (internal/gateway):
// joins, sessions, heartbeats, command delivery and updates, inventory
// snapshots and the liveness and command sweeps. Every function is named
// Session… or Gateway… so it never collides with the fleet API's own store
// functions. Time is read only through compute_now().

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/internal/store"
)

// CommandChannel is the PostgreSQL NOTIFY channel that wakes the replica
// holding a node's session; the payload is the node id.
const CommandChannel = "bc_commands"

// sessionInList renders "$n, $n+1, …" for count values starting at n.
func sessionInList(start, count int) string {
	var b strings.Builder
	for i := range count {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("$")
		b.WriteString(strconv.Itoa(start + i))
	}
	return b.String()
}

// sessionAgo is SQL for "compute_now() minus d" in the dialect of tx, with
// the duration bound as parameter $n. On SQLite the shifted time is rebuilt
// in the store's fixed-width text format (strftime keeps milliseconds; the
// microsecond digits come from compute_now() itself, which a whole-millisecond
// shift leaves unchanged), so text comparison with stored times stays exact.
func sessionAgo(d store.Dialect, n int) string {
	p := "$" + strconv.Itoa(n)
	if d == store.Postgres {
		return "(compute_now() - make_interval(secs => " + p + "))"
	}
	return "(strftime('%Y-%m-%dT%H:%M:%f', compute_now(), " + p + ") || substr(compute_now(), 24))"
}

// sessionAgoArg is the parameter sessionAgo expects for d.
func sessionAgoArg(d store.Dialect, dur time.Duration) any {
	ms := dur.Milliseconds()
	if d == store.Postgres {
		return float64(ms) / 1000
	}
	return fmt.Sprintf("-%d.%03d seconds", ms/1000, ms%1000)
}

// NodeRef names a node and its tenant, as events need them.
type NodeRef struct {
	ID       string
	TenantID string
}

// ---- join ----------------------------------------------------------------

// GatewayJoinToken is a join_tokens row as the gateway checks it.
type GatewayJoinToken struct {
	ID        string
	TenantID  string
	ProjectID string
	Pool      string
	Labels    string
	CSRSHA256 string
	NodeID    string
	Revoked   bool
	Expired   bool
}

// GatewayJoinTokenGet reads a join token and whether it is revoked or
// expired (by compute_now()). It returns store.ErrNotFound when absent.
func GatewayJoinTokenGet(ctx context.Context, q store.Querier, id string) (GatewayJoinToken, error) {
	var t GatewayJoinToken
	var revoked, expired int
	err := q.QueryRow(ctx, `SELECT id, tenant_id, project_id, pool, labels, csr_sha256, node_id,
			CASE WHEN revoke_time IS NULL THEN 0 ELSE 1 END,
			CASE WHEN expire_time <= compute_now() THEN 1 ELSE 0 END
		FROM join_tokens WHERE id = $1`, id).
		Scan(&t.ID, &t.TenantID, &t.ProjectID, &t.Pool, &t.Labels, &t.CSRSHA256, &t.NodeID, &revoked, &expired)
	t.Revoked, t.Expired = revoked == 1, expired == 1
	return t, err
}

// GatewayJoinTokenBind records the first CSR (and, once admitted, the node)
// on a token. It reports false when the token is bound to another CSR.
func GatewayJoinTokenBind(ctx context.Context, tx store.Tx, id, csrSHA256, nodeID string) (bool, error) {
	n, err := tx.Exec(ctx, `UPDATE join_tokens SET csr_sha256 = $2, node_id = $3, used_time = COALESCE(used_time, compute_now())
		WHERE id = $1 AND (csr_sha256 = '' OR csr_sha256 = $2)`, id, csrSHA256, nodeID)
	return n == 1, err
}

// GatewayJoinRequest is a join_requests row.
type GatewayJoinRequest struct {
	ID          string
	TenantID    string
	TokenID     string
	CSRSHA256   string
	HardwareKey string
	Identity    string
	Reason      string
	State       string
	NodeID      string
}

// GatewayJoinRequestByToken reads the join request of a token
// (store.ErrNotFound when there is none).
func GatewayJoinRequestByToken(ctx context.Context, q store.Querier, tokenID string) (GatewayJoinRequest, error) {
	var r GatewayJoinRequest
	err := q.QueryRow(ctx, `SELECT id, tenant_id, token_id, csr_sha256, hardware_key, identity, reason, state, node_id
		FROM join_requests WHERE token_id = $1`, tokenID).
		Scan(&r.ID, &r.TenantID, &r.TokenID, &r.CSRSHA256, &r.HardwareKey, &r.Identity, &r.Reason, &r.State, &r.NodeID)
	return r, err
}

// GatewayJoinRequestInsert records a deferred join (state pending).
func GatewayJoinRequestInsert(ctx context.Context, tx store.Tx, r GatewayJoinRequest) error {
	_, err := tx.Exec(ctx, `INSERT INTO join_requests (id, tenant_id, token_id, csr_sha256, hardware_key, identity, reason, state, create_time)
		VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', compute_now())`,
		r.ID, r.TenantID, r.TokenID, r.CSRSHA256, r.HardwareKey, r.Identity, r.Reason)
	return err
}

// GatewayJoinRequestAdmit moves an approved request to admitted for nodeID;
// it reports false when the request was not approved (an approval admits
// exactly one join).
func GatewayJoinRequestAdmit(ctx context.Context, tx store.Tx, id, nodeID string) (bool, error) {
	n, err := tx.Exec(ctx, `UPDATE join_requests SET state = 'admitted', node_id = $2 WHERE id = $1 AND state = 'approved'`, id, nodeID)
	return n == 1, err
}

// GatewayNodeByHardwareKey returns the live (non-retired) node holding a
// hardware key, or "" when none does.
func GatewayNodeByHardwareKey(ctx context.Context, q store.Querier, key string) (string, error) {
	var id string
	err := q.QueryRow(ctx, `SELECT id FROM nodes WHERE hardware_key = $1 AND state <> 'retired'`, key).Scan(&id)
	if errors.Is(err, store.ErrNotFound) {
		return "", nil
	}
	return id, err
}

// GatewayNodeNameTaken reports whether a node already has name.
func GatewayNodeNameTaken(ctx context.Context, q store.Querier, name string) (bool, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT count(*) FROM nodes WHERE name = $1`, name).Scan(&n)
	return n > 0, err
}

// GatewayNodeInsertParams is a node admitted by a join.
type GatewayNodeInsertParams struct {
	ID           string
	Name         string
	TenantID     string
	ProjectID    string
	Pool         string
	Labels       string
	HardwareKey  string
	Mode         string
	AgentVersion string
}

// GatewayNodeInsert creates a node in state joining, liveness ready, with
// its first heartbeat now so that a node that never opens a session still
// turns unreachable.
func GatewayNodeInsert(ctx context.Context, tx store.Tx, p GatewayNodeInsertParams) error {
	_, err := tx.Exec(ctx, `INSERT INTO nodes (id, name, tenant_id, project_id, pool, labels, hardware_key, state, liveness,
			mode, agent_version, last_heartbeat, create_time, update_time)
		VALUES ($1, $2, $3, $4, $5, $6, $7, 'joining', 'ready', $8, $9, compute_now(), compute_now(), compute_now())`,
		p.ID, p.Name, p.TenantID, p.ProjectID, p.Pool, p.Labels, p.HardwareKey, p.Mode, p.AgentVersion)
	return err
}

// GatewayNodeCertSet records the serial and expiry of a node's newest
// certificate.
func GatewayNodeCertSet(ctx context.Context, tx store.Tx, nodeID, serial string, notAfter time.Time) error {
	_, err := tx.Exec(ctx, `UPDATE nodes SET cert_serial = $2, cert_not_after = $3, update_time = compute_now() WHERE id = $1`,
		nodeID, serial, notAfter)
	return err
}

// ---- sessions --------------------------------------------------------------

// SessionNode is what a session needs of its node's row.
type SessionNode struct {
	ID              string
	TenantID        string
	Name            string
	Mode            string
	State           string
	Liveness        string
	Labels          string
	HardwareKey     string
	InventoryDigest string
	SessionOwner    string
}

// SessionNodeGet reads a node (store.ErrNotFound when absent).
func SessionNodeGet(ctx context.Context, q store.Querier, id string) (SessionNode, error) {
	var n SessionNode
	err := q.QueryRow(ctx, `SELECT id, tenant_id, name, mode, state, liveness, labels, hardware_key, inventory_digest, session_owner
		FROM nodes WHERE id = $1`, id).
		Scan(&n.ID, &n.TenantID, &n.Name, &n.Mode, &n.State, &n.Liveness, &n.Labels, &n.HardwareKey, &n.InventoryDigest, &n.SessionOwner)
	return n, err
}

// SessionHelloParams is what a Hello records on the node.
type SessionHelloParams struct {
	NodeID         string
	Owner          string
	AgentVersion   string
	Mode           string
	Capabilities   []string
	TrustVersion   int64
	LastAppliedSeq uint64
}

// SessionHello records a Hello: the agent's facts, this replica as session
// owner, joining → active, liveness ready and a heartbeat now. It returns the
// node as it was before.
func SessionHello(ctx context.Context, tx store.Tx, p SessionHelloParams) (SessionNode, error) {
	before, err := SessionNodeGet(ctx, tx, p.NodeID)
	if err != nil {
		return before, err
	}
	caps := p.Capabilities
	if caps == nil {
		caps = []string{}
	}
	capsJSON, err := json.Marshal(caps)
	if err != nil {
		return before, err
	}
	last := i64(p.LastAppliedSeq)
	_, err = tx.Exec(ctx, `UPDATE nodes SET agent_version = $2, mode = $3, capabilities = $4, trust_version = $5,
			last_applied_seq = $6, session_owner = $7,
			state = CASE WHEN state = 'joining' THEN 'active' ELSE state END,
			liveness = 'ready', last_heartbeat = compute_now(), update_time = compute_now()
		WHERE id = $1`, p.NodeID, p.AgentVersion, p.Mode, string(capsJSON), p.TrustVersion, last, p.Owner)
	return before, err
}

// SessionRelease clears the session owner when it is still owner.
func SessionRelease(ctx context.Context, tx store.Tx, nodeID, owner string) error {
	_, err := tx.Exec(ctx, `UPDATE nodes SET session_owner = '' WHERE id = $1 AND session_owner = $2`, nodeID, owner)
	return err
}

// SessionGoodbye records that the agent of nodeID closed its session on
// purpose while owner held it: liveness unreachable now (when it was
// ready; the returned refs name it, for the event) and the session owner
// cleared, so heartbeats received before the goodbye and flushed after it
// do not revive the node. A session another replica took over meanwhile is
// left alone.
func SessionGoodbye(ctx context.Context, tx store.Tx, nodeID, owner string) ([]NodeRef, error) {
	rows, err := tx.Query(ctx, `UPDATE nodes SET liveness = 'unreachable', update_time = compute_now()
		WHERE id = $1 AND session_owner = $2 AND liveness = 'ready' AND state <> 'retired'
		RETURNING id, tenant_id`, nodeID, owner)
	if err != nil {
		return nil, err
	}
	refs, err := scanNodeRefs(rows)
	if err != nil {
		return nil, err
	}
	return refs, SessionRelease(ctx, tx, nodeID, owner)
}

// sessionBatch is how many ids one statement binds.
const sessionBatch = 500

// SessionHeartbeats records heartbeats of many nodes at once: last_heartbeat
// = compute_now() and liveness ready. It returns the nodes that were
// unreachable or lost, which are ready again now. A node without a session
// owner is skipped: its session ended (with a goodbye, or replaced and
// released) before the batch was written.
func SessionHeartbeats(ctx context.Context, tx store.Tx, ids []string) ([]NodeRef, error) {
	var revived []NodeRef
	for len(ids) > 0 {
		chunk := ids[:min(len(ids), sessionBatch)]
		ids = ids[len(chunk):]
		args := make([]any, len(chunk))
		for i, id := range chunk {
			args[i] = id
		}
		in := sessionInList(1, len(chunk))
		rows, err := tx.Query(ctx, `UPDATE nodes SET liveness = 'ready', last_heartbeat = compute_now(), update_time = compute_now()
			WHERE id IN (`+in+`) AND liveness <> 'ready' AND state <> 'retired' AND session_owner <> '' RETURNING id, tenant_id`, args...)
		if err != nil {
			return nil, err
		}
		refs, err := scanNodeRefs(rows)
		if err != nil {
			return nil, err
		}
		revived = append(revived, refs...)
		if _, err := tx.Exec(ctx, `UPDATE nodes SET last_heartbeat = compute_now(), liveness = 'ready'
			WHERE id IN (`+in+`) AND state <> 'retired' AND session_owner <> ''`, args...); err != nil {
			return nil, err
		}
	}
	return revived, nil
}

func scanNodeRefs(rows store.Rows) ([]NodeRef, error) {
	defer rows.Close()
	var out []NodeRef
	for rows.Next() {
		var r NodeRef
		if err := rows.Scan(&r.ID, &r.TenantID); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// SessionNotify wakes the replica holding nodeID's session: pg_notify in the
// caller's transaction on PostgreSQL, so it is sent only if it commits. It
// does nothing on SQLite (one process: the in-process hub does it).
func SessionNotify(ctx context.Context, tx store.Tx, nodeID string) error {
	if tx.Dialect() != store.Postgres {
		return nil
	}
	_, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, CommandChannel, nodeID)
	return err
}

// SessionListen subscribes a dedicated PostgreSQL connection to
// CommandChannel.
func SessionListen(ctx context.Context, conn *pgx.Conn) error {
	_, err := conn.Exec(ctx, `LISTEN `+CommandChannel)
	return err
}

// ---- commands --------------------------------------------------------------

// SessionCommand is a command row as the gateway delivers and updates it.
type SessionCommand struct {
	ID             string
	TenantID       string
	NodeID         string
	Seq            uint64
	Kind           string
	Params         string
	IdempotencyKey string
	State          string
	Progress       int32
	Traceparent    string
	Deadline       time.Time
}

const sessionCommandCols = `id, tenant_id, node_id, seq, kind, params, idempotency_key, state, progress, traceparent, deadline`

func scanSessionCommand(row interface{ Scan(...any) error }) (SessionCommand, error) {
	var c SessionCommand
	var seq int64
	err := row.Scan(&c.ID, &c.TenantID, &c.NodeID, &seq, &c.Kind, &c.Params, &c.IdempotencyKey, &c.State, &c.Progress, &c.Traceparent, &c.Deadline)
	c.Seq = uint64(max(seq, 0))
	return c, err
}

// SessionCommandsAfter returns up to limit open commands of a node
// (pending, delivered, accepted, running) with seq > afterSeq, in seq order.
func SessionCommandsAfter(ctx context.Context, q store.Querier, nodeID string, afterSeq uint64, limit int) ([]SessionCommand, error) {
	rows, err := q.Query(ctx, `SELECT `+sessionCommandCols+` FROM commands
		WHERE node_id = $1 AND seq > $2 AND state IN ('pending', 'delivered', 'accepted', 'running')
		ORDER BY seq LIMIT $3`, nodeID, i64(afterSeq), limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []SessionCommand
	for rows.Next() {
		c, err := scanSessionCommand(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// SessionCommandsDelivered marks the node's pending commands with seq in
// (afterSeq, lastSeq] delivered.
func SessionCommandsDelivered(ctx context.Context, tx store.Tx, nodeID string, afterSeq, lastSeq uint64) error {
	_, err := tx.Exec(ctx, `UPDATE commands SET state = 'delivered', update_time = compute_now()
		WHERE node_id = $1 AND state = 'pending' AND seq > $2 AND seq <= $3`, nodeID, i64(afterSeq), i64(lastSeq))
	return err
}

// SessionCommandsStopped returns the ids and seqs of the node's commands in
// [fromSeq, toSeq] that were canceled or expired, so the session can tell the
// agent to stop them.
func SessionCommandsStopped(ctx context.Context, q store.Querier, nodeID string, fromSeq, toSeq uint64) (map[string]uint64, error) {
	rows, err := q.Query(ctx, `SELECT id, seq FROM commands WHERE node_id = $1 AND state IN ('canceled', 'expired') AND seq >= $2 AND seq <= $3`,
		nodeID, i64(fromSeq), i64(toSeq))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]uint64{}
	for rows.Next() {
		var id string
		var seq int64
		if err := rows.Scan(&id, &seq); err != nil {
			return nil, err
		}
		out[id] = uint64(max(seq, 0))
	}
	return out, rows.Err()
}

// SessionCommandGet reads one command (store.ErrNotFound when absent).
func SessionCommandGet(ctx context.Context, q store.Querier, id string) (SessionCommand, error) {
	return scanSessionCommand(q.QueryRow(ctx, `SELECT `+sessionCommandCols+` FROM commands WHERE id = $1`, id))
}

// SessionCommandUpdateParams is an agent's report on a command.
type SessionCommandUpdateParams struct {
	ID          string
	FromState   string
	State       string
	Progress    int32
	Message     string
	Result      string
	FailureCode string
}

// SessionCommandUpdate moves a command from FromState to State; it reports
// false when the command is no longer in FromState (a concurrent update or
// the sweeper won), so updates only ever move forward.
func SessionCommandUpdate(ctx context.Context, tx store.Tx, p SessionCommandUpdateParams) (bool, error) {
	result := p.Result
	if result == "" {
		result = "{}"
	}
	n, err := tx.Exec(ctx, `UPDATE commands SET state = $3, progress = $4, message = $5, result = $6, failure_code = $7, update_time = compute_now()
		WHERE id = $1 AND state = $2`, p.ID, p.FromState, p.State, p.Progress, p.Message, result, p.FailureCode)
	return n == 1, err
}

// SessionCommandForAllocation returns a command of nodeID whose params name
// allocationID (commandID narrows it when not empty), or store.ErrNotFound.
// The caller checks the params precisely; LIKE only narrows the scan.
func SessionCommandForAllocation(ctx context.Context, q store.Querier, nodeID, commandID, allocationID string) ([]SessionCommand, error) {
	pattern := "%" + strings.NewReplacer(`\`, `\\`, "%", `\%`, "_", `\_`).Replace(allocationID) + "%"
	rows, err := q.Query(ctx, `SELECT `+sessionCommandCols+` FROM commands
		WHERE node_id = $1 AND ($2 = '' OR id = $2) AND params LIKE $3 ESCAPE '\' ORDER BY seq DESC LIMIT 20`,
		nodeID, commandID, pattern)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []SessionCommand
	for rows.Next() {
		c, err := scanSessionCommand(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// SessionNodeDrained moves a draining node to drained; it reports whether
// it did.
func SessionNodeDrained(ctx context.Context, tx store.Tx, nodeID string) (bool, error) {
	n, err := tx.Exec(ctx, `UPDATE nodes SET state = 'drained', update_time = compute_now() WHERE id = $1 AND state = 'draining'`, nodeID)
	return n == 1, err
}

// ---- sweeps ----------------------------------------------------------------

// GatewayLivenessSweep marks ready nodes without a heartbeat for
// unreachableAfter unreachable, and nodes without one for lostAfter lost.
func GatewayLivenessSweep(ctx context.Context, tx store.Tx, unreachableAfter, lostAfter time.Duration) (unreachable, lost []NodeRef, err error) {
	d := tx.Dialect()
	rows, err := tx.Query(ctx, `UPDATE nodes SET liveness = 'lost', update_time = compute_now()
		WHERE liveness <> 'lost' AND state <> 'retired' AND last_heartbeat < `+sessionAgo(d, 1)+`
		RETURNING id, tenant_id`, sessionAgoArg(d, lostAfter))
	if err != nil {
		return nil, nil, err
	}
	if lost, err = scanNodeRefs(rows); err != nil {
		return nil, nil, err
	}
	rows, err = tx.Query(ctx, `UPDATE nodes SET liveness = 'unreachable', update_time = compute_now()
		WHERE liveness = 'ready' AND state <> 'retired' AND last_heartbeat < `+sessionAgo(d, 1)+`
		RETURNING id, tenant_id`, sessionAgoArg(d, unreachableAfter))
	if err != nil {
		return nil, nil, err
	}
	if unreachable, err = scanNodeRefs(rows); err != nil {
		return nil, nil, err
	}
	return unreachable, lost, nil
}

// GatewayCommandsExpire moves open commands past their deadline to expired
// and returns them.
func GatewayCommandsExpire(ctx context.Context, tx store.Tx, limit int) ([]SessionCommand, error) {
	rows, err := tx.Query(ctx, `UPDATE commands SET state = 'expired', update_time = compute_now()
		WHERE id IN (SELECT id FROM commands WHERE state IN ('pending', 'delivered', 'accepted', 'running') AND deadline < compute_now() LIMIT $1)
		RETURNING `+sessionCommandCols, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []SessionCommand
	for rows.Next() {
		c, err := scanSessionCommand(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// ---- inventory -------------------------------------------------------------

// SessionInventorySectionPut stores one verified inventory section.
func SessionInventorySectionPut(ctx context.Context, tx store.Tx, nodeID, name, sha256 string, data []byte) error {
	_, err := tx.Exec(ctx, `INSERT INTO inventory_sections (node_id, name, sha256, data, update_time) VALUES ($1, $2, $3, $4, compute_now())
		ON CONFLICT (node_id, name) DO UPDATE SET sha256 = excluded.sha256, data = excluded.data, update_time = excluded.update_time`,
		nodeID, name, sha256, data)
	return err
}

// SessionGPU is one GPU row.
type SessionGPU struct {
	UUID      string
	Index     int32
	Model     string
	MemoryMiB uint64
	PCIBusID  string
	NUMANode  int32
	MIGMode   string
}

// SessionGPUs lists a node's GPUs by index.
func SessionGPUs(ctx context.Context, q store.Querier, nodeID string) ([]SessionGPU, error) {
	rows, err := q.Query(ctx, `SELECT uuid, idx, model, memory_mib, pci_bus_id, numa_node, mig_mode FROM gpus WHERE node_id = $1 ORDER BY idx, uuid`, nodeID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []SessionGPU
	for rows.Next() {
		var g SessionGPU
		var mem int64
		if err := rows.Scan(&g.UUID, &g.Index, &g.Model, &mem, &g.PCIBusID, &g.NUMANode, &g.MIGMode); err != nil {
			return nil, err
		}
		g.MemoryMiB = uint64(max(mem, 0))
		out = append(out, g)
	}
	return out, rows.Err()
}

// SessionGPUOwners returns, of the given GPU UUIDs, those a node other than
// nodeID holds, mapped to that node.
func SessionGPUOwners(ctx context.Context, q store.Querier, nodeID string, uuids []string) (map[string]string, error) {
	out := map[string]string{}
	for len(uuids) > 0 {
		chunk := uuids[:min(len(uuids), sessionBatch)]
		uuids = uuids[len(chunk):]
		args := []any{nodeID}
		for _, u := range chunk {
			args = append(args, u)
		}
		rows, err := q.Query(ctx, `SELECT uuid, node_id FROM gpus WHERE node_id <> $1 AND uuid IN (`+sessionInList(2, len(chunk))+`)`, args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var u, n string
			if err := rows.Scan(&u, &n); err != nil {
				rows.Close()
				return nil, err
			}
			out[u] = n
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// SessionMIGInstance is one MIG instance row.
type SessionMIGInstance struct {
	UUID          string
	GPUUUID       string
	Profile       string
	GPUInstanceID uint32
	MemoryMiB     uint64
}

// SessionNVLink is one NVLink row.
type SessionNVLink struct {
	GPUUUID  string
	PeerUUID string
	Link     int32
}

// SessionNUMANode is one NUMA node row.
type SessionNUMANode struct {
	ID           int32
	CPUs         string
	MemoryMiB    uint64
	Hugepages2Mi uint64
	Hugepages1Gi uint64
}

// SessionResources is the node_resources row.
type SessionResources struct {
	CPUModel          string
	Sockets           int32
	Cores             int32
	Threads           int32
	MemoryMiB         uint64
	Hugepages2MiTotal uint64
	Hugepages1GiTotal uint64
}

// SessionInventoryParams is one complete inventory snapshot of a node.
type SessionInventoryParams struct {
	NodeID    string
	Digest    string
	Diff      string
	GPUs      []SessionGPU
	MIG       []SessionMIGInstance
	NVLinks   []SessionNVLink
	NUMA      []SessionNUMANode
	Resources SessionResources
}

// i64 converts an unsigned count for binding; the database stores BIGINT.
func i64(v uint64) int64 { return int64(min(v, math.MaxInt64)) }

// SessionInventoryReplace rebuilds a node's devices from a snapshot, records
// the snapshot with its diff and sets the node's inventory digest.
func SessionInventoryReplace(ctx context.Context, tx store.Tx, p SessionInventoryParams) error {
	for _, stmt := range []string{
		`DELETE FROM gpus WHERE node_id = $1`, // mig_instances cascade
		`DELETE FROM nvlinks WHERE node_id = $1`,
		`DELETE FROM numa_nodes WHERE node_id = $1`,
	} {
		if _, err := tx.Exec(ctx, stmt, p.NodeID); err != nil {
			return err
		}
	}
	for _, g := range p.GPUs {
		if _, err := tx.Exec(ctx, `INSERT INTO gpus (uuid, node_id, idx, model, memory_mib, pci_bus_id, numa_node, mig_mode, update_time)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, compute_now())`,
			g.UUID, p.NodeID, g.Index, g.Model, i64(g.MemoryMiB), g.PCIBusID, g.NUMANode, g.MIGMode); err != nil {
			return fmt.Errorf("gpu %s: %w", g.UUID, err)
		}
	}
	for _, m := range p.MIG {
		if _, err := tx.Exec(ctx, `INSERT INTO mig_instances (uuid, gpu_uuid, profile, gpu_instance_id, memory_mib) VALUES ($1, $2, $3, $4, $5)`,
			m.UUID, m.GPUUUID, m.Profile, int64(m.GPUInstanceID), i64(m.MemoryMiB)); err != nil {
			return fmt.Errorf("mig instance %s: %w", m.UUID, err)
		}
	}
	for _, l := range p.NVLinks {
		if _, err := tx.Exec(ctx, `INSERT INTO nvlinks (node_id, gpu_uuid, peer_uuid, link) VALUES ($1, $2, $3, $4)`,
			p.NodeID, l.GPUUUID, l.PeerUUID, l.Link); err != nil {
			return fmt.Errorf("nvlink %s/%d: %w", l.GPUUUID, l.Link, err)
		}
	}
	for _, n := range p.NUMA {
		if _, err := tx.Exec(ctx, `INSERT INTO numa_nodes (node_id, numa_id, cpus, memory_mib, hugepages_2mi, hugepages_1gi) VALUES ($1, $2, $3, $4, $5, $6)`,
			p.NodeID, n.ID, n.CPUs, i64(n.MemoryMiB), i64(n.Hugepages2Mi), i64(n.Hugepages1Gi)); err != nil {
			return fmt.Errorf("numa node %d: %w", n.ID, err)
		}
	}
	r := p.Resources
	if _, err := tx.Exec(ctx, `INSERT INTO node_resources (node_id, cpu_model, sockets, cores, threads, memory_mib, hugepages_2mi_total, hugepages_1gi_total, update_time)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, compute_now())
		ON CONFLICT (node_id) DO UPDATE SET cpu_model = excluded.cpu_model, sockets = excluded.sockets, cores = excluded.cores,
			threads = excluded.threads, memory_mib = excluded.memory_mib, hugepages_2mi_total = excluded.hugepages_2mi_total,
			hugepages_1gi_total = excluded.hugepages_1gi_total, update_time = excluded.update_time`,
		p.NodeID, r.CPUModel, r.Sockets, r.Cores, r.Threads, i64(r.MemoryMiB), i64(r.Hugepages2MiTotal), i64(r.Hugepages1GiTotal)); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO inventory_snapshots (node_id, digest, diff, create_time) VALUES ($1, $2, $3, compute_now())
		ON CONFLICT (node_id, digest) DO UPDATE SET diff = excluded.diff, create_time = excluded.create_time`,
		p.NodeID, p.Digest, p.Diff); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `UPDATE nodes SET inventory_digest = $2, update_time = compute_now() WHERE id = $1`, p.NodeID, p.Digest)
	return err
}

// SessionCondition is one node condition.
type SessionCondition struct {
	Type    string
	Status  string // true, false or unknown
	Reason  string
	Message string
}

// SessionConditionSet upserts a node condition. update_time moves only when
// the status changes, so it says since when the condition holds.
func SessionConditionSet(ctx context.Context, tx store.Tx, nodeID string, c SessionCondition) error {
	_, err := tx.Exec(ctx, `INSERT INTO node_conditions (node_id, type, status, reason, message, update_time)
		VALUES ($1, $2, $3, $4, $5, compute_now())
		ON CONFLICT (node_id, type) DO UPDATE SET status = excluded.status, reason = excluded.reason, message = excluded.message,
			update_time = CASE WHEN node_conditions.status = excluded.status THEN node_conditions.update_time ELSE excluded.update_time END`,
		nodeID, c.Type, c.Status, c.Reason, c.Message)
	return err
}

// SessionConditions lists a node's conditions by type.
func SessionConditions(ctx context.Context, q store.Querier, nodeID string) ([]SessionCondition, error) {
	rows, err := q.Query(ctx, `SELECT type, status, reason, message FROM node_conditions WHERE node_id = $1 ORDER BY type`, nodeID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []SessionCondition
	for rows.Next() {
		var c SessionCondition
		if err := rows.Scan(&c.Type, &c.Status, &c.Reason, &c.Message); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}
