package pki

import (
	"context"
	"embed"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Migrations returns the module's tables: pki_settings, pki_cas, pki_certs
// and pki_nonces.
func Migrations() store.Migrations {
	return store.Embedded("pki", migrationsFS)
}

// settingsRow is the one pki_settings row.
type settingsRow struct {
	TrustDomain       string
	Pin               string
	CreateTime        time.Time
	ServingGeneration int64
}

func settingsInsert(ctx context.Context, tx store.Tx, s settingsRow) error {
	_, err := tx.Exec(ctx, `INSERT INTO pki_settings (id, trust_domain, pin, create_time) VALUES (1, $1, $2, $3)`,
		s.TrustDomain, s.Pin, s.CreateTime)
	return err
}

func settingsGet(ctx context.Context, q store.Querier) (settingsRow, error) {
	var s settingsRow
	err := q.QueryRow(ctx, `SELECT trust_domain, pin, create_time, serving_generation FROM pki_settings WHERE id = 1`).
		Scan(&s.TrustDomain, &s.Pin, &s.CreateTime, &s.ServingGeneration)
	return s, err
}

// settingsServe makes gen the serving generation, retiring older ones.
func settingsServe(ctx context.Context, tx store.Tx, gen int64, pin string) error {
	_, err := tx.Exec(ctx, `UPDATE pki_settings SET serving_generation = $1, pin = $2 WHERE id = 1`, gen, pin)
	return err
}

// caRow is one CA; KeySealed is nil for an offline root.
type caRow struct {
	Kind      caKind
	CertDER   []byte
	KeySealed []byte
	NotAfter  time.Time
}

func caInsert(ctx context.Context, tx store.Tx, c caRow) error {
	var key any // a nil []byte must bind as NULL on both drivers
	if c.KeySealed != nil {
		key = c.KeySealed
	}
	_, err := tx.Exec(ctx, `INSERT INTO pki_cas (kind, cert_der, key_sealed, not_after) VALUES ($1, $2, $3, $4)`,
		string(c.Kind), c.CertDER, key, c.NotAfter)
	return err
}

func caList(ctx context.Context, q store.Querier) ([]caRow, error) {
	rows, err := q.Query(ctx, `SELECT kind, cert_der, key_sealed, not_after FROM pki_cas ORDER BY kind`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []caRow
	for rows.Next() {
		var c caRow
		var kind string
		if err := rows.Scan(&kind, &c.CertDER, &c.KeySealed, &c.NotAfter); err != nil {
			return nil, err
		}
		c.Kind = caKind(kind)
		out = append(out, c)
	}
	return out, rows.Err()
}

func caKeyUpdate(ctx context.Context, tx store.Tx, kind caKind, sealed []byte) error {
	_, err := tx.Exec(ctx, `UPDATE pki_cas SET key_sealed = $2 WHERE kind = $1`, string(kind), sealed)
	return err
}

// certRow is one issued node certificate.
type certRow struct {
	Serial     string
	NodeID     string
	Role       Role
	NotAfter   time.Time
	IssueTime  time.Time
	Generation int64
}

// certInsert records a node certificate and marks the node's earlier ones
// replaced: a rotation waits only on certificates nothing replaced.
func certInsert(ctx context.Context, tx store.Tx, c certRow) error {
	if _, err := tx.Exec(ctx, `INSERT INTO pki_certs (serial, node_id, role, not_after, issue_time, generation) VALUES ($1, $2, $3, $4, $5, $6)`,
		c.Serial, c.NodeID, string(c.Role), c.NotAfter, c.IssueTime, c.Generation); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `UPDATE pki_certs SET supersede_time = $3
		WHERE node_id = $1 AND serial <> $2 AND supersede_time IS NULL AND revoke_time IS NULL AND not_after > $3`,
		c.NodeID, c.Serial, c.IssueTime)
	return err
}

// certStragglers lists the live, unrevoked, unreplaced node certificates
// of generations older than newest.
func certStragglers(ctx context.Context, q store.Querier, newest int64) ([]Straggler, error) {
	rows, err := q.Query(ctx, `SELECT node_id, serial, generation, not_after FROM pki_certs
		WHERE generation < $1 AND revoke_time IS NULL AND supersede_time IS NULL AND not_after > compute_now()
		ORDER BY node_id, serial`, newest)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Straggler
	for rows.Next() {
		var s Straggler
		if err := rows.Scan(&s.NodeID, &s.Serial, &s.Generation, &s.NotAfter); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// NodeCert is a node's live certificate, for pki status.
type NodeCert struct {
	NodeID     string
	Serial     string
	Role       Role
	Generation int64
	NotAfter   time.Time
}

// NodeCertsLive lists every live, unrevoked, unreplaced node certificate.
func NodeCertsLive(ctx context.Context, q store.Querier) ([]NodeCert, error) {
	rows, err := q.Query(ctx, `SELECT node_id, serial, role, generation, not_after FROM pki_certs
		WHERE revoke_time IS NULL AND supersede_time IS NULL AND not_after > compute_now()
		ORDER BY node_id, serial`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []NodeCert
	for rows.Next() {
		var c NodeCert
		var role string
		if err := rows.Scan(&c.NodeID, &c.Serial, &role, &c.Generation, &c.NotAfter); err != nil {
			return nil, err
		}
		c.Role = Role(role)
		out = append(out, c)
	}
	return out, rows.Err()
}

// genRow is one pki_generations row; a nil RootKey is an offline root.
type genRow struct {
	Gen                                       int64
	RootDER, NodeDER, ServingDER, InternalDER []byte
	RootKey, NodeKey, ServingKey, InternalKey []byte
	Seal                                      []byte
	CreateTime                                time.Time
}

const genColumns = `generation, root_der, root_key_sealed, node_der, node_key_sealed, serving_der, serving_key_sealed,
	internal_der, internal_key_sealed, seal, create_time`

func scanGen(r store.Row) (genRow, error) {
	var g genRow
	err := r.Scan(&g.Gen, &g.RootDER, &g.RootKey, &g.NodeDER, &g.NodeKey, &g.ServingDER, &g.ServingKey,
		&g.InternalDER, &g.InternalKey, &g.Seal, &g.CreateTime)
	return g, err
}

func genInsert(ctx context.Context, tx store.Tx, g genRow) error {
	var rootKey any // a nil []byte must bind as NULL on both drivers
	if g.RootKey != nil {
		rootKey = g.RootKey
	}
	_, err := tx.Exec(ctx, `INSERT INTO pki_generations (`+genColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
		g.Gen, g.RootDER, rootKey, g.NodeDER, g.NodeKey, g.ServingDER, g.ServingKey, g.InternalDER, g.InternalKey, g.Seal, g.CreateTime)
	return err
}

// genList lists the generations from from on, oldest first.
func genList(ctx context.Context, q store.Querier, from int64) ([]genRow, error) {
	rows, err := q.Query(ctx, `SELECT `+genColumns+` FROM pki_generations WHERE generation >= $1 ORDER BY generation`, from)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []genRow
	for rows.Next() {
		g, err := scanGen(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, rows.Err()
}

func genGet(ctx context.Context, q store.Querier, gen int64) (genRow, error) {
	return scanGen(q.QueryRow(ctx, `SELECT `+genColumns+` FROM pki_generations WHERE generation = $1`, gen))
}

// genNewest is the newest generation, or def when none was rotated in.
func genNewest(ctx context.Context, q store.Querier, def int64) (int64, error) {
	var n *int64
	if err := q.QueryRow(ctx, `SELECT MAX(generation) FROM pki_generations`).Scan(&n); err != nil {
		return 0, err
	}
	if n == nil || *n < def {
		return def, nil
	}
	return *n, nil
}

func genKeysUpdate(ctx context.Context, tx store.Tx, g genRow) error {
	var rootKey any
	if g.RootKey != nil {
		rootKey = g.RootKey
	}
	_, err := tx.Exec(ctx, `UPDATE pki_generations SET root_key_sealed = $2, node_key_sealed = $3, serving_key_sealed = $4,
		internal_key_sealed = $5, seal = $6 WHERE generation = $1`, g.Gen, rootKey, g.NodeKey, g.ServingKey, g.InternalKey, g.Seal)
	return err
}

// certRevoke revokes one certificate and reports whether it was revoked now.
func certRevoke(ctx context.Context, tx store.Tx, serial, reason string) (bool, error) {
	n, err := tx.Exec(ctx, `UPDATE pki_certs SET revoke_time = compute_now(), revoke_reason = $2
		WHERE serial = $1 AND revoke_time IS NULL`, serial, reason)
	return n == 1, err
}

func certExists(ctx context.Context, q store.Querier, serial string) (bool, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT COUNT(*) FROM pki_certs WHERE serial = $1`, serial).Scan(&n)
	return n > 0, err
}

// certRevokeNode revokes every unexpired, unrevoked certificate of a node
// and returns their serials.
func certRevokeNode(ctx context.Context, tx store.Tx, nodeID, reason string) ([]string, error) {
	rows, err := tx.Query(ctx, `UPDATE pki_certs SET revoke_time = compute_now(), revoke_reason = $2
		WHERE node_id = $1 AND revoke_time IS NULL AND not_after > compute_now()
		RETURNING serial`, nodeID, reason)
	if err != nil {
		return nil, err
	}
	return scanStrings(rows)
}

// certRevokedList lists the serials of revoked certificates that have not
// expired yet; an expired one fails chain verification anyway.
func certRevokedList(ctx context.Context, q store.Querier) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT serial FROM pki_certs WHERE revoke_time IS NOT NULL AND not_after > compute_now()`)
	if err != nil {
		return nil, err
	}
	return scanStrings(rows)
}

func scanStrings(rows store.Rows) ([]string, error) {
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

func nonceInsert(ctx context.Context, tx store.Tx, nonce string, expire time.Time) error {
	_, err := tx.Exec(ctx, `INSERT INTO pki_nonces (nonce, expire_time) VALUES ($1, $2)`, nonce, expire)
	return err
}

func noncePrune(ctx context.Context, tx store.Tx) error {
	_, err := tx.Exec(ctx, `DELETE FROM pki_nonces WHERE expire_time <= compute_now()`)
	return err
}

// CAExpiry is one CA's kind and the end of its certificate.
type CAExpiry struct {
	Kind     string
	NotAfter time.Time
}

// CAExpiries lists the CAs' ends (doctor warns before they come); none
// before pki init.
func CAExpiries(ctx context.Context, q store.Querier) ([]CAExpiry, error) {
	cas, err := caList(ctx, q)
	out := make([]CAExpiry, 0, len(cas))
	for _, c := range cas {
		out = append(out, CAExpiry{Kind: string(c.Kind), NotAfter: c.NotAfter})
	}
	return out, err
}
