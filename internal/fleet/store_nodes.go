package fleet

// SQL over nodes and node_conditions.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/store"
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
	// Attestor is what admitted the node (attestor.JoinToken, TPM, X509,
	// Cloud); AttestedID what it proved; TrustAnchorID the anchor that
	// vouched.
	Attestor      string
	AttestedID    string
	TrustAnchorID string

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
	// ReportedLabels is the JSON object of the labels the node reported
	// (its inventory's labels section). Read-only.
	ReportedLabels string
}

const nodeColumns = `n.id, n.name, n.tenant_id, n.project_id, n.pool, n.labels, n.hardware_key, n.state, n.liveness,
	n.mode, n.agent_version, n.capabilities, n.trust_version, n.last_heartbeat, n.session_owner, n.next_seq,
	n.last_applied_seq, n.inventory_digest, n.cert_serial, n.cert_not_after, n.create_time, n.update_time,
	n.attestor, n.attested_id, n.trust_anchor_id,
	(SELECT COUNT(*) FROM gpus g WHERE g.node_id = n.id),
	COALESCE((SELECT MIN(g.model) FROM gpus g WHERE g.node_id = n.id), ''),
	COALESCE((SELECT MAX(g.model) FROM gpus g WHERE g.node_id = n.id), ''),
	(SELECT COALESCE(p.name, '') FROM node_pools np LEFT JOIN pools p ON p.id = np.pool_id WHERE np.node_id = n.id),
	COALESCE((SELECT g.model FROM gpus g WHERE g.node_id = n.id ORDER BY g.idx, g.uuid LIMIT 1), ''),
	COALESCE((SELECT g.memory_mib FROM gpus g WHERE g.node_id = n.id ORDER BY g.idx, g.uuid LIMIT 1), 0),
	n.reported_labels`

func scanNode(row scanner) (Node, error) {
	var (
		n              Node
		minModel, maxM string
	)
	err := row.Scan(&n.ID, &n.Name, &n.TenantID, &n.ProjectID, &n.Pool, &n.Labels, &n.HardwareKey, &n.State, &n.Liveness,
		&n.Mode, &n.AgentVersion, &n.Capabilities, &n.TrustVersion, &n.LastHeartbeat, &n.SessionOwner, &n.NextSeq,
		&n.LastAppliedSeq, &n.InventoryDigest, &n.CertSerial, &n.CertNotAfter, &n.CreateTime, &n.UpdateTime,
		&n.Attestor, &n.AttestedID, &n.TrustAnchorID, &n.GPUCount, &minModel, &maxM, &n.MemberPool, &n.FirstGPU, &n.FirstGPUMemMiB,
		&n.ReportedLabels)
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
	// LastHeartbeat, when set, starts the liveness clock: a node admitted
	// by a join that never opens a session still turns unreachable.
	LastHeartbeat *time.Time
	CreateTime    time.Time
	// SiteID is the site a site agent joined for (its token's); "" else.
	SiteID string
	// Attestor, AttestedID and TrustAnchorID record what admitted the
	// node; "" Attestor means the join token alone.
	Attestor      string
	AttestedID    string
	TrustAnchorID string
}

// NodeInsert creates a node.
func NodeInsert(ctx context.Context, tx store.Tx, p *NodeInsertParams) error {
	_, err := tx.Exec(ctx, `INSERT INTO nodes (id, name, tenant_id, project_id, pool, labels, hardware_key, state, liveness,
		mode, agent_version, capabilities, last_heartbeat, create_time, update_time, site_id, attestor, attested_id, trust_anchor_id)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $14, $15, $16, $17, $18)`,
		p.ID, p.Name, p.TenantID, p.ProjectID, p.Pool, cmp.Or(p.Labels, "{}"), p.HardwareKey, p.State, p.Liveness,
		cmp.Or(p.Mode, "node"), p.AgentVersion, cmp.Or(p.Capabilities, "[]"), p.LastHeartbeat, p.CreateTime, p.SiteID,
		cmp.Or(p.Attestor, "join_token"), p.AttestedID, p.TrustAnchorID)
	return err
}

// NodeSiteID returns the site a node acts for ("" for a node that is not
// a site agent; store.ErrNotFound when absent).
func NodeSiteID(ctx context.Context, q store.Querier, id string) (string, error) {
	var site string
	err := q.QueryRow(ctx, `SELECT site_id FROM nodes WHERE id = $1`, id).Scan(&site)
	return site, err
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

// NodeStatus is the part of a node's row its session checks on every wake;
// NodeGet's GPU summary would cost a scan of gpus each time.
type NodeStatus struct {
	ID       string
	TenantID string
	Name     string
	Mode     string
	State    string
	Liveness string
	// Pool is the pool name the node joined with (nodes.pool).
	Pool            string
	Labels          string
	HardwareKey     string
	InventoryDigest string
	SessionOwner    string
	// Capabilities is the JSON array the agent last advertised.
	Capabilities string
	// ReportedLabels is the JSON object of the labels the node reported
	// (its inventory's labels section); Labels, the join token's, win.
	ReportedLabels string
}

const nodeStatusColumns = `id, tenant_id, name, mode, state, liveness, pool, labels, hardware_key, inventory_digest, session_owner, capabilities, reported_labels`

func scanNodeStatus(row scanner) (NodeStatus, error) {
	var n NodeStatus
	err := row.Scan(&n.ID, &n.TenantID, &n.Name, &n.Mode, &n.State, &n.Liveness, &n.Pool, &n.Labels, &n.HardwareKey, &n.InventoryDigest,
		&n.SessionOwner, &n.Capabilities, &n.ReportedLabels)
	return n, err
}

// NodeReportedLabelsSet records the labels a node reported (a JSON
// object; "{}" when its inventory has no labels section).
func NodeReportedLabelsSet(ctx context.Context, tx store.Tx, id, labelsJSON string) error {
	n, err := tx.Exec(ctx, `UPDATE nodes SET reported_labels = $2 WHERE id = $1`, id, labelsJSON)
	if err == nil && n == 0 {
		err = store.ErrNotFound
	}
	return err
}

// NodeStatusGet reads a node's status by id (store.ErrNotFound when absent).
func NodeStatusGet(ctx context.Context, q store.Querier, id string) (NodeStatus, error) {
	return scanNodeStatus(q.QueryRow(ctx, `SELECT `+nodeStatusColumns+` FROM nodes WHERE id = $1`, id))
}

// statusBatch is how many ids one NodeStatusList statement binds: under
// both dialects' parameter limits, so a pool's load is one statement for
// any pool of up to that many nodes (chunks' 500 would make it one per
// 500 nodes).
const statusBatch = 30000

// NodeStatusList reads the status of the given nodes, by id; ids with no
// node are left out. Capacity's pool index and vps's host sweep read their
// nodes through it, after reading the ids from their own tables.
func NodeStatusList(ctx context.Context, q store.Querier, ids []string) ([]NodeStatus, error) {
	var out []NodeStatus
	sorted := slices.Clone(ids)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	for len(sorted) > 0 {
		chunk := sorted[:min(len(sorted), statusBatch)]
		sorted = sorted[len(chunk):]
		var args []any
		in := placeholders(&args, chunk)
		rows, err := q.Query(ctx, `SELECT `+nodeStatusColumns+` FROM nodes WHERE id IN (`+in+`) ORDER BY id`, args...)
		got, err := collect(rows, err, scanNodeStatus)
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
	}
	return out, nil
}

// NodeLock takes a node's row lock until the transaction ends (FOR NO KEY
// UPDATE on PostgreSQL; SQLite has one writer), so that capacity's
// reconcile of the node and a placer batch booking on it take turns.
func NodeLock(ctx context.Context, tx store.Tx, id string) error {
	if tx.Dialect() != store.Postgres {
		return nil
	}
	_, err := store.Strings(tx.Query(ctx, `SELECT id FROM nodes WHERE id = $1`+store.ForNoKeyUpdate(tx), id))
	return err
}

// NodeStateForShare reads a node's state and liveness, locking the row
// against a concurrent liveness sweep (FOR SHARE on PostgreSQL)
// (store.ErrNotFound when absent).
func NodeStateForShare(ctx context.Context, tx store.Tx, id string) (state, liveness string, err error) {
	err = tx.QueryRow(ctx, `SELECT state, liveness FROM nodes WHERE id = $1`+store.ForShare(tx), id).Scan(&state, &liveness)
	return state, liveness, err
}

// NodeState is a node's state and liveness.
type NodeState struct{ State, Liveness string }

// NodeStatesForShare is NodeStateForShare for many nodes in one statement,
// locked in id order; a node not found is missing from the answer.
func NodeStatesForShare(ctx context.Context, tx store.Tx, ids []string) (map[string]NodeState, error) {
	out := make(map[string]NodeState, len(ids))
	for len(ids) > 0 {
		n := min(len(ids), 500)
		ph, args := make([]string, n), make([]any, n)
		for i, id := range ids[:n] {
			ph[i], args[i] = "$"+strconv.Itoa(i+1), id
		}
		rows, err := tx.Query(ctx, `SELECT id, state, liveness FROM nodes WHERE id IN (`+strings.Join(ph, ", ")+`) ORDER BY id`+store.ForShare(tx), args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var id string
			var st NodeState
			if err := rows.Scan(&id, &st.State, &st.Liveness); err != nil {
				rows.Close()
				return nil, err
			}
			out[id] = st
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, err
		}
		ids = ids[n:]
	}
	return out, nil
}

// NodeIDsOfTenant lists a tenant's nodes that are not retired, by id.
func NodeIDsOfTenant(ctx context.Context, q store.Querier, tenantID string) ([]string, error) {
	return store.Strings(q.Query(ctx, `SELECT id FROM nodes WHERE tenant_id = $1 AND state <> 'retired' ORDER BY id`, tenantID))
}

// NodeTenantIDs lists the tenants that have nodes that are not retired.
func NodeTenantIDs(ctx context.Context, q store.Querier) ([]string, error) {
	return store.Strings(q.Query(ctx, `SELECT DISTINCT tenant_id FROM nodes WHERE state <> 'retired' ORDER BY tenant_id`))
}

// NodeIDByHardwareKey returns the live (non-retired) node holding a
// hardware key, or "" when none does.
func NodeIDByHardwareKey(ctx context.Context, q store.Querier, key string) (string, error) {
	var id string
	err := q.QueryRow(ctx, `SELECT id FROM nodes WHERE hardware_key = $1 AND state <> 'retired'`, key).Scan(&id)
	if errors.Is(err, store.ErrNotFound) {
		return "", nil
	}
	return id, err
}

// NodeNameTaken reports whether a node already has name.
func NodeNameTaken(ctx context.Context, q store.Querier, name string) (bool, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT count(*) FROM nodes WHERE name = $1`, name).Scan(&n)
	return n > 0, err
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
	return collect(rows, err, scanNode)
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

// NodeUpdateCert records the serial and expiry of a node's newest
// certificate.
func NodeUpdateCert(ctx context.Context, tx store.Tx, nodeID, serial string, notAfter time.Time) error {
	_, err := tx.Exec(ctx, `UPDATE nodes SET cert_serial = $2, cert_not_after = $3, update_time = compute_now() WHERE id = $1`,
		nodeID, serial, notAfter)
	return err
}

// NodeDelete deletes a node if it is in one of the given states; its
// commands, conditions and inventory go with it. It reports whether it did.
func NodeDelete(ctx context.Context, tx store.Tx, id string, states []string) (bool, error) {
	args := []any{id}
	n, err := tx.Exec(ctx, `DELETE FROM nodes WHERE id = $1 AND state IN (`+placeholders(&args, states)+`)`, args...)
	return n == 1, err
}

// NodeRef names a node and its tenant, as events need them.
type NodeRef struct {
	ID       string
	TenantID string
}

func scanNodeRef(row scanner) (NodeRef, error) {
	var r NodeRef
	err := row.Scan(&r.ID, &r.TenantID)
	return r, err
}

// NodeHelloParams is what an agent's Hello records on its node.
type NodeHelloParams struct {
	NodeID         string
	Owner          string
	AgentVersion   string
	Mode           string
	Capabilities   []string
	TrustVersion   int64
	LastAppliedSeq uint64
}

// NodeRecordHello records a Hello: the agent's facts, this replica as
// session owner, joining → active, liveness ready and a heartbeat now. It
// returns the node as it was before; a retired node is returned as it is,
// and nothing is written.
func NodeRecordHello(ctx context.Context, tx store.Tx, p *NodeHelloParams) (NodeStatus, error) {
	before, err := NodeStatusGet(ctx, tx, p.NodeID)
	if err != nil || before.State == "retired" {
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
	_, err = tx.Exec(ctx, `UPDATE nodes SET agent_version = $2, mode = $3, capabilities = $4, trust_version = $5,
			last_applied_seq = $6, session_owner = $7,
			state = CASE WHEN state = 'joining' THEN 'active' ELSE state END,
			liveness = 'ready', last_heartbeat = compute_now(), update_time = compute_now()
		WHERE id = $1`, p.NodeID, p.AgentVersion, p.Mode, string(capsJSON), p.TrustVersion, i64(p.LastAppliedSeq), p.Owner)
	return before, err
}

// NodeReleaseSession clears the session owner when it is still owner.
func NodeReleaseSession(ctx context.Context, tx store.Tx, nodeID, owner string) error {
	_, err := tx.Exec(ctx, `UPDATE nodes SET session_owner = '' WHERE id = $1 AND session_owner = $2`, nodeID, owner)
	return err
}

// NodeRecordGoodbye records that the agent of nodeID closed its session on
// purpose while owner held it: liveness unreachable now (when it was
// ready; the returned refs name it, for the event) and the session owner
// cleared, so heartbeats received before the goodbye and flushed after it
// do not revive the node. A session another replica took over meanwhile is
// left alone.
func NodeRecordGoodbye(ctx context.Context, tx store.Tx, nodeID, owner string) ([]NodeRef, error) {
	rows, err := tx.Query(ctx, `UPDATE nodes SET liveness = 'unreachable', update_time = compute_now()
		WHERE id = $1 AND session_owner = $2 AND liveness = 'ready' AND state <> 'retired'
		RETURNING id, tenant_id`, nodeID, owner)
	refs, err := collect(rows, err, scanNodeRef)
	if err != nil {
		return nil, err
	}
	return refs, NodeReleaseSession(ctx, tx, nodeID, owner)
}

// NodeRecordHeartbeats records heartbeats of many nodes at once:
// last_heartbeat = compute_now() and liveness ready. It returns the nodes
// that were unreachable or lost, which are ready again now. A node without
// a session owner is skipped: its session ended (with a goodbye, or
// replaced and released) before the batch was written.
func NodeRecordHeartbeats(ctx context.Context, tx store.Tx, ids []string) ([]NodeRef, error) {
	var revived []NodeRef
	for _, chunk := range chunks(ids) {
		var args []any
		in := placeholders(&args, chunk)
		rows, err := tx.Query(ctx, `UPDATE nodes SET liveness = 'ready', last_heartbeat = compute_now(), update_time = compute_now()
			WHERE id IN (`+in+`) AND liveness <> 'ready' AND state <> 'retired' AND session_owner <> '' RETURNING id, tenant_id`, args...)
		refs, err := collect(rows, err, scanNodeRef)
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

// NodeSweepLiveness marks ready nodes without a heartbeat for
// unreachableAfter unreachable, and nodes without one for lostAfter lost.
func NodeSweepLiveness(ctx context.Context, tx store.Tx, unreachableAfter, lostAfter time.Duration) (unreachable, lost []NodeRef, err error) {
	d := tx.Dialect()
	rows, err := tx.Query(ctx, `UPDATE nodes SET liveness = 'lost', update_time = compute_now()
		WHERE liveness <> 'lost' AND state <> 'retired' AND last_heartbeat < `+ago(d, 1)+`
		RETURNING id, tenant_id`, agoArg(d, lostAfter))
	if lost, err = collect(rows, err, scanNodeRef); err != nil {
		return nil, nil, err
	}
	rows, err = tx.Query(ctx, `UPDATE nodes SET liveness = 'unreachable', update_time = compute_now()
		WHERE liveness = 'ready' AND state <> 'retired' AND last_heartbeat < `+ago(d, 1)+`
		RETURNING id, tenant_id`, agoArg(d, unreachableAfter))
	if unreachable, err = collect(rows, err, scanNodeRef); err != nil {
		return nil, nil, err
	}
	return unreachable, lost, nil
}

// NodeCondition is one health fact of a node.
type NodeCondition struct {
	NodeID  string
	Type    string
	Status  string // true, false or unknown
	Reason  string
	Message string
	// UpdateTime says since when the condition holds; NodeConditionSet
	// sets it.
	UpdateTime time.Time
}

// NodeConditionSet upserts a node condition. update_time moves (to
// compute_now()) only when the status changes, so it says since when the
// condition holds.
func NodeConditionSet(ctx context.Context, tx store.Tx, c *NodeCondition) error {
	_, err := tx.Exec(ctx, `INSERT INTO node_conditions (node_id, type, status, reason, message, update_time)
		VALUES ($1, $2, $3, $4, $5, compute_now())
		ON CONFLICT (node_id, type) DO UPDATE SET status = excluded.status, reason = excluded.reason, message = excluded.message,
			update_time = CASE WHEN node_conditions.status = excluded.status THEN node_conditions.update_time ELSE excluded.update_time END`,
		c.NodeID, c.Type, c.Status, c.Reason, c.Message)
	return err
}

// NodeConditionUpdate changes a condition the node already carries, and
// only when its status differs; it never creates one. Capacity clears its
// pool-conflict condition with it, so that only a node that once had a
// conflict carries the condition.
func NodeConditionUpdate(ctx context.Context, tx store.Tx, c *NodeCondition) error {
	_, err := tx.Exec(ctx, `UPDATE node_conditions SET status = $3, reason = $4, message = $5, update_time = compute_now()
		WHERE node_id = $1 AND type = $2 AND status <> $3`, c.NodeID, c.Type, c.Status, c.Reason, c.Message)
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
	conds, err := collect(rows, err, func(r scanner) (NodeCondition, error) {
		var c NodeCondition
		err := r.Scan(&c.NodeID, &c.Type, &c.Status, &c.Reason, &c.Message, &c.UpdateTime)
		return c, err
	})
	for _, c := range conds {
		out[c.NodeID] = append(out[c.NodeID], c)
	}
	return out, err
}

// GatewayReplicaSet records the URL peers reach gateway replica id by; a
// serving replica calls it again now and then to keep its row fresh
// (GatewayReplicaPrune).
func GatewayReplicaSet(ctx context.Context, tx store.Tx, id, url string) error {
	_, err := tx.Exec(ctx, `INSERT INTO gateway_replicas (id, url, update_time) VALUES ($1, $2, compute_now())
		ON CONFLICT (id) DO UPDATE SET url = excluded.url, update_time = excluded.update_time`, id, url)
	return err
}

// GatewayReplicaPrune deletes the rows of replicas that have not touched
// theirs for staleAfter, unless a node's session still names the replica
// (its row is how peers reach that session until the session moves or the
// liveness sweep releases it). It returns how many rows went.
func GatewayReplicaPrune(ctx context.Context, tx store.Tx, staleAfter time.Duration) (int64, error) {
	d := tx.Dialect()
	return tx.Exec(ctx, `DELETE FROM gateway_replicas WHERE update_time < `+ago(d, 1)+`
		AND NOT EXISTS (SELECT 1 FROM nodes n WHERE n.session_owner = gateway_replicas.id)`, agoArg(d, staleAfter))
}

// NodeSessionReplica returns the replica holding nodeID's session and the
// URL it recorded; both "" when no replica holds it, and url "" when the
// owner recorded none (store.ErrNotFound for an unknown node).
func NodeSessionReplica(ctx context.Context, q store.Querier, nodeID string) (owner, url string, err error) {
	err = q.QueryRow(ctx, `SELECT n.session_owner, COALESCE(r.url, '') FROM nodes n
		LEFT JOIN gateway_replicas r ON r.id = n.session_owner AND n.session_owner <> ''
		WHERE n.id = $1`, nodeID).Scan(&owner, &url)
	return owner, url, err
}

// NodeTrust is where a node stands for pki status: the command-signing
// version it reported at its last session start, and its liveness.
type NodeTrust struct {
	ID           string
	Name         string
	TrustVersion int64
	Liveness     string
}

// NodeTrustList lists every node's NodeTrust.
func NodeTrustList(ctx context.Context, q store.Querier) ([]NodeTrust, error) {
	var out []NodeTrust
	err := queryEach(ctx, q, `SELECT id, name, trust_version, liveness FROM nodes ORDER BY id`, nil, func(r store.Rows) error {
		var n NodeTrust
		if err := r.Scan(&n.ID, &n.Name, &n.TrustVersion, &n.Liveness); err != nil {
			return err
		}
		out = append(out, n)
		return nil
	})
	return out, err
}

// NodeIDByAttestedID is the node of the tenant, not retired, that an
// anchor's attestor proved to be attestedID; "" when none.
func NodeIDByAttestedID(ctx context.Context, q store.Querier, tenantID, anchorID, attestedID string) (string, error) {
	var id string
	err := q.QueryRow(ctx, `SELECT id FROM nodes WHERE tenant_id = $1 AND trust_anchor_id = $2 AND attested_id = $3 AND state <> 'retired' ORDER BY id LIMIT 1`,
		tenantID, anchorID, attestedID).Scan(&id)
	if errors.Is(err, store.ErrNotFound) {
		return "", nil
	}
	return id, err
}
