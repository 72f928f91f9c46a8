package fleet

// SQL over join_tokens and join_requests.

import (
	"cmp"
	"context"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

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
	// Role is what a machine joining with the token becomes: node, site
	// or ramdisk. The token decides it; "" means node.
	Role string
	// SiteID binds a site token (role site) to its site: the agent that
	// joins with it acts for that site only.
	SiteID string
	// Attestor is the attestor a join with the token must bring evidence
	// from (tpm, x509, cloud); "" when the token alone admits.
	Attestor string
}

// Agent roles a join token can bind; the certificate carries the same
// word (pki.Role).
const (
	RoleNode    = "node"
	RoleSite    = "site"
	RoleRamdisk = "ramdisk"
)

// JoinTokenRoles are the roles a join token can bind.
var JoinTokenRoles = []string{RoleNode, RoleSite, RoleRamdisk}

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
	used_time, csr_sha256, node_id, role, site_id, attestor`

func scanJoinToken(row scanner) (JoinToken, error) {
	var t JoinToken
	err := row.Scan(&t.ID, &t.TenantID, &t.ProjectID, &t.Pool, &t.Labels, &t.CreatedBy, &t.CreateTime, &t.ExpireTime,
		&t.RevokeTime, &t.UsedTime, &t.CSRSHA256, &t.NodeID, &t.Role, &t.SiteID, &t.Attestor)
	return t, err
}

// JoinTokenInsert creates a join token's row.
func JoinTokenInsert(ctx context.Context, tx store.Tx, t *JoinToken) error {
	_, err := tx.Exec(ctx, `INSERT INTO join_tokens (id, tenant_id, project_id, pool, labels, created_by, create_time, expire_time, role, site_id, attestor)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
		t.ID, t.TenantID, t.ProjectID, t.Pool, cmp.Or(t.Labels, "{}"), t.CreatedBy, t.CreateTime, t.ExpireTime, cmp.Or(t.Role, RoleNode), t.SiteID, t.Attestor)
	return err
}

// JoinTokenGet reads a join token (store.ErrNotFound when absent); a
// non-empty tenantID confines the lookup.
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
	return collect(rows, err, scanJoinToken)
}

// JoinTokenLabelsOfNode reads the labels (a JSON object) of the token
// createdBy made that admitted a node (store.ErrNotFound when none did).
func JoinTokenLabelsOfNode(ctx context.Context, q store.Querier, nodeID, createdBy string) (string, error) {
	var labels string
	err := q.QueryRow(ctx, `SELECT labels FROM join_tokens WHERE node_id = $1 AND created_by = $2`, nodeID, createdBy).Scan(&labels)
	return labels, err
}

// JoinTokenListAdmitting lists the tokens createdBy made that admitted a
// node and whose labels text contains labelsContain (a LIKE prefilter: the
// caller matches the decoded label exactly).
func JoinTokenListAdmitting(ctx context.Context, q store.Querier, createdBy, labelsContain string) ([]JoinToken, error) {
	rows, err := q.Query(ctx, `SELECT `+joinTokenColumns+` FROM join_tokens WHERE created_by = $1 AND node_id <> '' AND labels LIKE $2`,
		createdBy, "%"+labelsContain+"%")
	return collect(rows, err, scanJoinToken)
}

// JoinTokenRevoke revokes a token that was neither used nor revoked; it
// reports whether it did.
func JoinTokenRevoke(ctx context.Context, tx store.Tx, tenantID, id string) (bool, error) {
	n, err := tx.Exec(ctx, `UPDATE join_tokens SET revoke_time = compute_now()
		WHERE id = $1 AND tenant_id = $2 AND revoke_time IS NULL AND used_time IS NULL`, id, tenantID)
	return n == 1, err
}

// JoinTokenBind records the first CSR (and, once admitted, the node) on a
// token. It reports false when the token is bound to another CSR.
func JoinTokenBind(ctx context.Context, tx store.Tx, id, csrSHA256, nodeID string) (bool, error) {
	n, err := tx.Exec(ctx, `UPDATE join_tokens SET csr_sha256 = $2, node_id = $3, used_time = COALESCE(used_time, compute_now())
		WHERE id = $1 AND (csr_sha256 = '' OR csr_sha256 = $2)`, id, csrSHA256, nodeID)
	return n == 1, err
}

// Join request states.
const (
	JoinRequestPending  = "pending"
	JoinRequestApproved = "approved"
	JoinRequestRejected = "rejected"
	JoinRequestAdmitted = "admitted"
)

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

func scanJoinRequest(row scanner) (JoinRequest, error) {
	var r JoinRequest
	err := row.Scan(&r.ID, &r.TenantID, &r.TokenID, &r.CSRSHA256, &r.HardwareKey, &r.Identity, &r.Reason, &r.State,
		&r.DecidedBy, &r.NodeID, &r.CreateTime, &r.DecideTime)
	return r, err
}

// JoinRequestInsert records a deferred join (state pending unless set).
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

// JoinRequestGetByToken reads the join request of a token
// (store.ErrNotFound when there is none).
func JoinRequestGetByToken(ctx context.Context, q store.Querier, tokenID string) (JoinRequest, error) {
	return scanJoinRequest(q.QueryRow(ctx, `SELECT `+joinRequestColumns+` FROM join_requests WHERE token_id = $1`, tokenID))
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
	return collect(rows, err, scanJoinRequest)
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

// JoinRequestAdmit moves an approved request to admitted for nodeID; it
// reports false when the request was not approved (an approval admits
// exactly one join).
func JoinRequestAdmit(ctx context.Context, tx store.Tx, id, nodeID string) (bool, error) {
	n, err := tx.Exec(ctx, `UPDATE join_requests SET state = 'admitted', node_id = $2 WHERE id = $1 AND state = 'approved'`, id, nodeID)
	return n == 1, err
}
