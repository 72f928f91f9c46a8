package fleet

import (
	"cmp"
	"context"
	"embed"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Migrations returns the module's tables.
func Migrations() store.Migrations {
	return store.Embedded("fleet", migrationsFS)
}

// Id prefixes of the fleet's rows (envelope.NewID).
const (
	NodeIDPrefix        = "nod"
	CommandIDPrefix     = "cmd"
	JoinTokenIDPrefix   = "jtk"
	JoinRequestIDPrefix = "jrq"
)

// Node states: the lifecycle an operator drives.
const (
	NodeJoining  = "joining"
	NodeActive   = "active"
	NodeDraining = "draining"
	NodeDrained  = "drained"
	NodeRetired  = "retired"
)

// Node liveness: what heartbeats say.
const (
	LivenessReady       = "ready"
	LivenessUnreachable = "unreachable"
	LivenessLost        = "lost"
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

// Join request states.
const (
	JoinRequestPending  = "pending"
	JoinRequestApproved = "approved"
	JoinRequestRejected = "rejected"
	JoinRequestAdmitted = "admitted"
)

// Node is a row of nodes, with the GPU summary of its inventory.
type Node struct {
	ID          string
	Name        string
	TenantID    string
	ProjectID   string
	Pool        string
	Labels      string // JSON object
	HardwareKey string
	State       string
	Liveness    string
	Mode        string
	// AgentVersion and Capabilities (a JSON array) come from the agent's Hello.
	AgentVersion    string
	Capabilities    string
	TrustVersion    int64
	LastHeartbeat   *time.Time
	SessionOwner    string
	NextSeq         int64
	LastAppliedSeq  int64
	InventoryDigest string
	CertSerial      string
	CertNotAfter    *time.Time
	CreateTime      time.Time
	UpdateTime      time.Time

	// GPUCount and GPUModel summarize the gpus table; GPUModel is "mixed"
	// when the models differ. Read-only.
	GPUCount int
	GPUModel string
	// MemberPool is the name of the pool capacity's membership puts the
	// node in ("" for none, e.g. two pools claim it); nil before capacity
	// first reconciled the node. Read-only.
	MemberPool *string
	// FirstGPU and FirstGPUMemMiB are the first GPU's name and memory (by
	// index), from which derived labels come. Read-only.
	FirstGPU       string
	FirstGPUMemMiB int
}

const nodeColumns = `n.id, n.name, n.tenant_id, n.project_id, n.pool, n.labels, n.hardware_key, n.state, n.liveness,
	n.mode, n.agent_version, n.capabilities, n.trust_version, n.last_heartbeat, n.session_owner, n.next_seq,
	n.last_applied_seq, n.inventory_digest, n.cert_serial, n.cert_not_after, n.create_time, n.update_time,
	(SELECT COUNT(*) FROM gpus g WHERE g.node_id = n.id),
	COALESCE((SELECT MIN(g.model) FROM gpus g WHERE g.node_id = n.id), ''),
	COALESCE((SELECT MAX(g.model) FROM gpus g WHERE g.node_id = n.id), ''),
	(SELECT COALESCE(p.name, '') FROM node_pools np LEFT JOIN pools p ON p.id = np.pool_id WHERE np.node_id = n.id),
	COALESCE((SELECT g.model FROM gpus g WHERE g.node_id = n.id ORDER BY g.idx, g.uuid LIMIT 1), ''),
	COALESCE((SELECT g.memory_mib FROM gpus g WHERE g.node_id = n.id ORDER BY g.idx, g.uuid LIMIT 1), 0)`

func scanNode(row interface{ Scan(...any) error }) (Node, error) {
	var (
		n              Node
		minModel, maxM string
	)
	err := row.Scan(&n.ID, &n.Name, &n.TenantID, &n.ProjectID, &n.Pool, &n.Labels, &n.HardwareKey, &n.State, &n.Liveness,
		&n.Mode, &n.AgentVersion, &n.Capabilities, &n.TrustVersion, &n.LastHeartbeat, &n.SessionOwner, &n.NextSeq,
		&n.LastAppliedSeq, &n.InventoryDigest, &n.CertSerial, &n.CertNotAfter, &n.CreateTime, &n.UpdateTime,
		&n.GPUCount, &minModel, &maxM, &n.MemberPool, &n.FirstGPU, &n.FirstGPUMemMiB)
	n.GPUModel = minModel
	if minModel != maxM {
		n.GPUModel = "mixed"
	}
	return n, err
}

// NodeInsertParams are the fields of a new node; the rest take their
// defaults.
type NodeInsertParams struct {
	ID           string
	Name         string
	TenantID     string
	ProjectID    string
	Pool         string
	Labels       string // JSON object; "" means {}
	HardwareKey  string
	State        string
	Liveness     string
	Mode         string // "" means node
	AgentVersion string
	Capabilities string // JSON array; "" means []
	CreateTime   time.Time
}

// NodeInsert creates a node.
func NodeInsert(ctx context.Context, tx store.Tx, p *NodeInsertParams) error {
	_, err := tx.Exec(ctx, `INSERT INTO nodes (id, name, tenant_id, project_id, pool, labels, hardware_key, state, liveness,
		mode, agent_version, capabilities, create_time, update_time)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13)`,
		p.ID, p.Name, p.TenantID, p.ProjectID, p.Pool, cmp.Or(p.Labels, "{}"), p.HardwareKey, p.State, p.Liveness,
		cmp.Or(p.Mode, "node"), p.AgentVersion, cmp.Or(p.Capabilities, "[]"), p.CreateTime)
	return err
}

// NodeGet resolves a node by id (nod_…) or name. A non-empty tenantID
// confines the lookup to that tenant's nodes.
func NodeGet(ctx context.Context, q store.Querier, tenantID, ref string) (Node, error) {
	col := "name"
	if strings.HasPrefix(ref, NodeIDPrefix+"_") {
		col = "id"
	}
	return scanNode(q.QueryRow(ctx, `SELECT `+nodeColumns+` FROM nodes n
		WHERE n.`+col+` = $1 AND ($2 = '' OR n.tenant_id = $2)`, ref, tenantID))
}

// NodeListParams filter a node listing; empty fields do not filter.
type NodeListParams struct {
	TenantID  string
	ProjectID string
	State     string
	Liveness  string
	// After is the id the page starts after.
	After string
	Limit int
}

// NodeList lists nodes by id.
func NodeList(ctx context.Context, q store.Querier, p *NodeListParams) ([]Node, error) {
	rows, err := q.Query(ctx, `SELECT `+nodeColumns+` FROM nodes n
		WHERE n.id > $1 AND ($2 = '' OR n.tenant_id = $2) AND ($3 = '' OR n.project_id = $3)
		AND ($4 = '' OR n.state = $4) AND ($5 = '' OR n.liveness = $5)
		ORDER BY n.id LIMIT $6`, p.After, p.TenantID, p.ProjectID, p.State, p.Liveness, p.Limit)
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

// NodeUpdateStateParams move a node from one of From to To.
type NodeUpdateStateParams struct {
	ID   string
	From []string
	To   string
}

// NodeUpdateState moves a node to a new state if it is in one of the From
// states; it reports whether it did.
func NodeUpdateState(ctx context.Context, tx store.Tx, p *NodeUpdateStateParams) (bool, error) {
	if len(p.From) == 0 {
		return false, fmt.Errorf("fleet: NodeUpdateState of %s needs From states", p.ID)
	}
	args := []any{p.ID, p.To}
	n, err := tx.Exec(ctx, `UPDATE nodes SET state = $2, update_time = compute_now()
		WHERE id = $1 AND state IN (`+placeholders(&args, p.From)+`)`, args...)
	return n == 1, err
}

// NodeDelete deletes a node if it is in one of the given states; its
// commands, conditions and inventory go with it. It reports whether it did.
func NodeDelete(ctx context.Context, tx store.Tx, id string, states []string) (bool, error) {
	args := []any{id}
	n, err := tx.Exec(ctx, `DELETE FROM nodes WHERE id = $1 AND state IN (`+placeholders(&args, states)+`)`, args...)
	return n == 1, err
}

// NodeCondition is one health fact of a node.
type NodeCondition struct {
	NodeID     string
	Type       string
	Status     string
	Reason     string
	Message    string
	UpdateTime time.Time
}

// NodeConditionUpsert sets one condition of a node.
func NodeConditionUpsert(ctx context.Context, tx store.Tx, c *NodeCondition) error {
	_, err := tx.Exec(ctx, `INSERT INTO node_conditions (node_id, type, status, reason, message, update_time)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (node_id, type) DO UPDATE SET status = excluded.status, reason = excluded.reason,
			message = excluded.message, update_time = excluded.update_time`,
		c.NodeID, c.Type, c.Status, c.Reason, c.Message, c.UpdateTime)
	return err
}

// NodeConditionList returns the conditions of the given nodes by node and
// type.
func NodeConditionList(ctx context.Context, q store.Querier, nodeIDs ...string) (map[string][]NodeCondition, error) {
	out := map[string][]NodeCondition{}
	if len(nodeIDs) == 0 {
		return out, nil
	}
	var args []any
	in := placeholders(&args, nodeIDs)
	rows, err := q.Query(ctx, `SELECT node_id, type, status, reason, message, update_time FROM node_conditions
		WHERE node_id IN (`+in+`) ORDER BY node_id, type`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var c NodeCondition
		if err := rows.Scan(&c.NodeID, &c.Type, &c.Status, &c.Reason, &c.Message, &c.UpdateTime); err != nil {
			return nil, err
		}
		out[c.NodeID] = append(out[c.NodeID], c)
	}
	return out, rows.Err()
}

// JoinToken is a row of join_tokens. The token itself is never stored.
type JoinToken struct {
	ID         string
	TenantID   string
	ProjectID  string
	Pool       string
	Labels     string // JSON object
	CreatedBy  string
	CreateTime time.Time
	ExpireTime time.Time
	RevokeTime *time.Time
	UsedTime   *time.Time
	CSRSHA256  string
	NodeID     string
}

// Join token states, derived from the row.
const (
	JoinTokenActive  = "active"
	JoinTokenUsed    = "used"
	JoinTokenExpired = "expired"
	JoinTokenRevoked = "revoked"
)

// State says whether the token can still admit a machine at now.
func (t JoinToken) State(now time.Time) string {
	switch {
	case t.RevokeTime != nil:
		return JoinTokenRevoked
	case t.UsedTime != nil:
		return JoinTokenUsed
	case !now.Before(t.ExpireTime):
		return JoinTokenExpired
	default:
		return JoinTokenActive
	}
}

const joinTokenColumns = `id, tenant_id, project_id, pool, labels, created_by, create_time, expire_time, revoke_time,
	used_time, csr_sha256, node_id`

func scanJoinToken(row interface{ Scan(...any) error }) (JoinToken, error) {
	var t JoinToken
	err := row.Scan(&t.ID, &t.TenantID, &t.ProjectID, &t.Pool, &t.Labels, &t.CreatedBy, &t.CreateTime, &t.ExpireTime,
		&t.RevokeTime, &t.UsedTime, &t.CSRSHA256, &t.NodeID)
	return t, err
}

// JoinTokenInsert creates a join token's row.
func JoinTokenInsert(ctx context.Context, tx store.Tx, t *JoinToken) error {
	_, err := tx.Exec(ctx, `INSERT INTO join_tokens (id, tenant_id, project_id, pool, labels, created_by, create_time, expire_time)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
		t.ID, t.TenantID, t.ProjectID, t.Pool, cmp.Or(t.Labels, "{}"), t.CreatedBy, t.CreateTime, t.ExpireTime)
	return err
}

// JoinTokenGet reads a join token; a non-empty tenantID confines the lookup.
func JoinTokenGet(ctx context.Context, q store.Querier, tenantID, id string) (JoinToken, error) {
	return scanJoinToken(q.QueryRow(ctx, `SELECT `+joinTokenColumns+` FROM join_tokens
		WHERE id = $1 AND ($2 = '' OR tenant_id = $2)`, id, tenantID))
}

// JoinTokenListParams filter a join token listing.
type JoinTokenListParams struct {
	TenantID string
	// IncludeInactive lists used, expired and revoked tokens too.
	IncludeInactive bool
	After           string
	Limit           int
}

// JoinTokenList lists join tokens by id.
func JoinTokenList(ctx context.Context, q store.Querier, p *JoinTokenListParams) ([]JoinToken, error) {
	rows, err := q.Query(ctx, `SELECT `+joinTokenColumns+` FROM join_tokens
		WHERE id > $1 AND ($2 = '' OR tenant_id = $2)
		AND ($3 OR (revoke_time IS NULL AND used_time IS NULL AND expire_time > compute_now()))
		ORDER BY id LIMIT $4`, p.After, p.TenantID, p.IncludeInactive, p.Limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []JoinToken
	for rows.Next() {
		t, err := scanJoinToken(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// JoinTokenRevoke revokes a token that was neither used nor revoked; it
// reports whether it did.
func JoinTokenRevoke(ctx context.Context, tx store.Tx, tenantID, id string) (bool, error) {
	n, err := tx.Exec(ctx, `UPDATE join_tokens SET revoke_time = compute_now()
		WHERE id = $1 AND tenant_id = $2 AND revoke_time IS NULL AND used_time IS NULL`, id, tenantID)
	return n == 1, err
}

// JoinRequest is a row of join_requests: a deferred join.
type JoinRequest struct {
	ID          string
	TenantID    string
	TokenID     string
	CSRSHA256   string
	HardwareKey string
	Identity    string
	Reason      string
	State       string
	DecidedBy   string
	NodeID      string
	CreateTime  time.Time
	DecideTime  *time.Time
}

const joinRequestColumns = `id, tenant_id, token_id, csr_sha256, hardware_key, identity, reason, state, decided_by,
	node_id, create_time, decide_time`

func scanJoinRequest(row interface{ Scan(...any) error }) (JoinRequest, error) {
	var r JoinRequest
	err := row.Scan(&r.ID, &r.TenantID, &r.TokenID, &r.CSRSHA256, &r.HardwareKey, &r.Identity, &r.Reason, &r.State,
		&r.DecidedBy, &r.NodeID, &r.CreateTime, &r.DecideTime)
	return r, err
}

// JoinRequestInsert records a deferred join (state pending).
func JoinRequestInsert(ctx context.Context, tx store.Tx, r *JoinRequest) error {
	_, err := tx.Exec(ctx, `INSERT INTO join_requests (id, tenant_id, token_id, csr_sha256, hardware_key, identity, reason,
		state, create_time) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		r.ID, r.TenantID, r.TokenID, r.CSRSHA256, r.HardwareKey, r.Identity, r.Reason, cmp.Or(r.State, JoinRequestPending), r.CreateTime)
	return err
}

// JoinRequestGet reads a join request; a non-empty tenantID confines the
// lookup.
func JoinRequestGet(ctx context.Context, q store.Querier, tenantID, id string) (JoinRequest, error) {
	return scanJoinRequest(q.QueryRow(ctx, `SELECT `+joinRequestColumns+` FROM join_requests
		WHERE id = $1 AND ($2 = '' OR tenant_id = $2)`, id, tenantID))
}

// JoinRequestListParams filter a join request listing.
type JoinRequestListParams struct {
	TenantID string
	State    string
	After    string
	Limit    int
}

// JoinRequestList lists join requests by id.
func JoinRequestList(ctx context.Context, q store.Querier, p *JoinRequestListParams) ([]JoinRequest, error) {
	rows, err := q.Query(ctx, `SELECT `+joinRequestColumns+` FROM join_requests
		WHERE id > $1 AND ($2 = '' OR tenant_id = $2) AND ($3 = '' OR state = $3)
		ORDER BY id LIMIT $4`, p.After, p.TenantID, p.State, p.Limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []JoinRequest
	for rows.Next() {
		r, err := scanJoinRequest(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// JoinRequestDecideParams decide a pending join request.
type JoinRequestDecideParams struct {
	TenantID  string
	ID        string
	State     string // approved or rejected
	DecidedBy string
}

// JoinRequestDecide approves or rejects a pending join request; it reports
// whether it did.
func JoinRequestDecide(ctx context.Context, tx store.Tx, p *JoinRequestDecideParams) (bool, error) {
	n, err := tx.Exec(ctx, `UPDATE join_requests SET state = $3, decided_by = $4, decide_time = compute_now()
		WHERE id = $1 AND tenant_id = $2 AND state = 'pending'`, p.ID, p.TenantID, p.State, p.DecidedBy)
	return n == 1, err
}

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
}

const commandColumns = `id, tenant_id, node_id, seq, kind, params, idempotency_key, state, progress, message, result,
	failure_code, traceparent, created_by, deadline, create_time, update_time`

func scanCommand(row interface{ Scan(...any) error }) (Command, error) {
	var c Command
	err := row.Scan(&c.ID, &c.TenantID, &c.NodeID, &c.Seq, &c.Kind, &c.Params, &c.IdempotencyKey, &c.State, &c.Progress,
		&c.Message, &c.Result, &c.FailureCode, &c.Traceparent, &c.CreatedBy, &c.Deadline, &c.CreateTime, &c.UpdateTime)
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
}

// CommandInsert allocates the node's next sequence number and inserts a
// pending command with it, in the caller's transaction: the sequence and
// the row commit together or not at all.
func CommandInsert(ctx context.Context, tx store.Tx, p *CommandInsertParams) (Command, error) {
	var seq int64
	if err := tx.QueryRow(ctx, `UPDATE nodes SET next_seq = next_seq + 1 WHERE id = $1 RETURNING next_seq`, p.NodeID).Scan(&seq); err != nil {
		return Command{}, err
	}
	c := Command{
		ID: p.ID, TenantID: p.TenantID, NodeID: p.NodeID, Seq: seq, Kind: p.Kind, Params: cmp.Or(p.Params, "{}"),
		IdempotencyKey: cmp.Or(p.IdempotencyKey, p.ID), State: CommandPending, Result: "{}", Traceparent: p.Traceparent,
		CreatedBy: p.CreatedBy, Deadline: p.Deadline, CreateTime: p.CreateTime, UpdateTime: p.CreateTime,
	}
	_, err := tx.Exec(ctx, `INSERT INTO commands (id, tenant_id, node_id, seq, kind, params, idempotency_key, state,
		traceparent, created_by, deadline, create_time, update_time)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $12)`,
		c.ID, c.TenantID, c.NodeID, c.Seq, c.Kind, c.Params, c.IdempotencyKey, c.State, c.Traceparent, c.CreatedBy,
		c.Deadline, c.CreateTime)
	return c, err
}

// CommandGet reads a command; a non-empty tenantID confines the lookup.
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
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Command
	for rows.Next() {
		c, err := scanCommand(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
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

// Inventory is what a node's agent last reported about its hardware.
type Inventory struct {
	NodeID     string
	Digest     string
	GPUs       []GPU
	NvLinks    []NvLink
	NumaNodes  []NumaNode
	Resources  *NodeResources
	Conditions []NodeCondition
}

// GPU is a row of gpus with its MIG instances.
type GPU struct {
	UUID         string
	Index        int
	Model        string
	MemoryMiB    int64
	PCIBusID     string
	NumaNode     int
	MigMode      string
	UpdateTime   time.Time
	MigInstances []MigInstance
}

// MigInstance is a row of mig_instances.
type MigInstance struct {
	UUID          string
	GPUUUID       string
	Profile       string
	GPUInstanceID int
	MemoryMiB     int64
}

// NvLink is a row of nvlinks.
type NvLink struct {
	GPUUUID  string
	PeerUUID string
	Link     int
}

// NumaNode is a row of numa_nodes.
type NumaNode struct {
	ID           int
	CPUs         string
	MemoryMiB    int64
	Hugepages2Mi int64
	Hugepages1Gi int64
}

// NodeResources is a row of node_resources.
type NodeResources struct {
	CPUModel          string
	Sockets           int
	Cores             int
	Threads           int
	MemoryMiB         int64
	Hugepages2MiTotal int64
	Hugepages1GiTotal int64
	UpdateTime        time.Time
}

// InventoryGet reads a node's devices, NUMA layout, resources and
// conditions.
func InventoryGet(ctx context.Context, q store.Querier, nodeID string) (Inventory, error) {
	inv := Inventory{NodeID: nodeID}
	if err := q.QueryRow(ctx, `SELECT inventory_digest FROM nodes WHERE id = $1`, nodeID).Scan(&inv.Digest); err != nil {
		return Inventory{}, err
	}
	if err := queryEach(ctx, q, `SELECT uuid, idx, model, memory_mib, pci_bus_id, numa_node, mig_mode, update_time
		FROM gpus WHERE node_id = $1 ORDER BY idx, uuid`, []any{nodeID}, func(r store.Rows) error {
		var g GPU
		if err := r.Scan(&g.UUID, &g.Index, &g.Model, &g.MemoryMiB, &g.PCIBusID, &g.NumaNode, &g.MigMode, &g.UpdateTime); err != nil {
			return err
		}
		inv.GPUs = append(inv.GPUs, g)
		return nil
	}); err != nil {
		return Inventory{}, err
	}
	byGPU := map[string]*GPU{}
	for i := range inv.GPUs {
		byGPU[inv.GPUs[i].UUID] = &inv.GPUs[i]
	}
	if err := queryEach(ctx, q, `SELECT m.uuid, m.gpu_uuid, m.profile, m.gpu_instance_id, m.memory_mib
		FROM mig_instances m JOIN gpus g ON g.uuid = m.gpu_uuid WHERE g.node_id = $1
		ORDER BY m.gpu_uuid, m.gpu_instance_id, m.uuid`, []any{nodeID}, func(r store.Rows) error {
		var m MigInstance
		if err := r.Scan(&m.UUID, &m.GPUUUID, &m.Profile, &m.GPUInstanceID, &m.MemoryMiB); err != nil {
			return err
		}
		if g := byGPU[m.GPUUUID]; g != nil {
			g.MigInstances = append(g.MigInstances, m)
		}
		return nil
	}); err != nil {
		return Inventory{}, err
	}
	if err := queryEach(ctx, q, `SELECT gpu_uuid, peer_uuid, link FROM nvlinks WHERE node_id = $1
		ORDER BY gpu_uuid, link`, []any{nodeID}, func(r store.Rows) error {
		var l NvLink
		if err := r.Scan(&l.GPUUUID, &l.PeerUUID, &l.Link); err != nil {
			return err
		}
		inv.NvLinks = append(inv.NvLinks, l)
		return nil
	}); err != nil {
		return Inventory{}, err
	}
	if err := queryEach(ctx, q, `SELECT numa_id, cpus, memory_mib, hugepages_2mi, hugepages_1gi FROM numa_nodes
		WHERE node_id = $1 ORDER BY numa_id`, []any{nodeID}, func(r store.Rows) error {
		var n NumaNode
		if err := r.Scan(&n.ID, &n.CPUs, &n.MemoryMiB, &n.Hugepages2Mi, &n.Hugepages1Gi); err != nil {
			return err
		}
		inv.NumaNodes = append(inv.NumaNodes, n)
		return nil
	}); err != nil {
		return Inventory{}, err
	}
	if err := queryEach(ctx, q, `SELECT cpu_model, sockets, cores, threads, memory_mib, hugepages_2mi_total,
		hugepages_1gi_total, update_time FROM node_resources WHERE node_id = $1`, []any{nodeID}, func(r store.Rows) error {
		var res NodeResources
		if err := r.Scan(&res.CPUModel, &res.Sockets, &res.Cores, &res.Threads, &res.MemoryMiB, &res.Hugepages2MiTotal,
			&res.Hugepages1GiTotal, &res.UpdateTime); err != nil {
			return err
		}
		inv.Resources = &res
		return nil
	}); err != nil {
		return Inventory{}, err
	}
	conds, err := NodeConditionList(ctx, q, nodeID)
	if err != nil {
		return Inventory{}, err
	}
	inv.Conditions = conds[nodeID]
	return inv, nil
}

// InventoryReplace replaces a node's devices, NUMA layout and resources with
// inv (conditions are kept: they have their own upsert) and records its
// digest on the node.
func InventoryReplace(ctx context.Context, tx store.Tx, inv *Inventory, now time.Time) error {
	id := inv.NodeID
	for _, stmt := range []string{
		`DELETE FROM gpus WHERE node_id = $1`, // mig_instances cascade
		`DELETE FROM nvlinks WHERE node_id = $1`,
		`DELETE FROM numa_nodes WHERE node_id = $1`,
		`DELETE FROM node_resources WHERE node_id = $1`,
	} {
		if _, err := tx.Exec(ctx, stmt, id); err != nil {
			return err
		}
	}
	for _, g := range inv.GPUs {
		if _, err := tx.Exec(ctx, `INSERT INTO gpus (uuid, node_id, idx, model, memory_mib, pci_bus_id, numa_node, mig_mode, update_time)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
			g.UUID, id, g.Index, g.Model, g.MemoryMiB, g.PCIBusID, g.NumaNode, cmp.Or(g.MigMode, "disabled"), now); err != nil {
			return err
		}
		for _, m := range g.MigInstances {
			if _, err := tx.Exec(ctx, `INSERT INTO mig_instances (uuid, gpu_uuid, profile, gpu_instance_id, memory_mib)
				VALUES ($1, $2, $3, $4, $5)`, m.UUID, g.UUID, m.Profile, m.GPUInstanceID, m.MemoryMiB); err != nil {
				return err
			}
		}
	}
	for _, l := range inv.NvLinks {
		if _, err := tx.Exec(ctx, `INSERT INTO nvlinks (node_id, gpu_uuid, peer_uuid, link) VALUES ($1, $2, $3, $4)`,
			id, l.GPUUUID, l.PeerUUID, l.Link); err != nil {
			return err
		}
	}
	for _, n := range inv.NumaNodes {
		if _, err := tx.Exec(ctx, `INSERT INTO numa_nodes (node_id, numa_id, cpus, memory_mib, hugepages_2mi, hugepages_1gi)
			VALUES ($1, $2, $3, $4, $5, $6)`, id, n.ID, n.CPUs, n.MemoryMiB, n.Hugepages2Mi, n.Hugepages1Gi); err != nil {
			return err
		}
	}
	if r := inv.Resources; r != nil {
		if _, err := tx.Exec(ctx, `INSERT INTO node_resources (node_id, cpu_model, sockets, cores, threads, memory_mib,
			hugepages_2mi_total, hugepages_1gi_total, update_time) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
			id, r.CPUModel, r.Sockets, r.Cores, r.Threads, r.MemoryMiB, r.Hugepages2MiTotal, r.Hugepages1GiTotal, now); err != nil {
			return err
		}
	}
	n, err := tx.Exec(ctx, `UPDATE nodes SET inventory_digest = $2, update_time = compute_now() WHERE id = $1`, id, inv.Digest)
	if err == nil && n == 0 {
		err = store.ErrNotFound
	}
	return err
}

// queryEach runs a query and calls fn for every row.
func queryEach(ctx context.Context, q store.Querier, query string, args []any, fn func(store.Rows) error) error {
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// placeholders appends values to args and returns their "$n, $m" list.
func placeholders(args *[]any, values []string) string {
	ps := make([]string, len(values))
	for i, v := range values {
		*args = append(*args, v)
		ps[i] = fmt.Sprintf("$%d", len(*args))
	}
	return strings.Join(ps, ", ")
}
