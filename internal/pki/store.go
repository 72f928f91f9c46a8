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
	TrustDomain string
	Pin         string
	CreateTime  time.Time
}

func settingsInsert(ctx context.Context, tx store.Tx, s settingsRow) error {
	_, err := tx.Exec(ctx, `INSERT INTO pki_settings (id, trust_domain, pin, create_time) VALUES (1, $1, $2, $3)`,
		s.TrustDomain, s.Pin, s.CreateTime)
	return err
}

func settingsGet(ctx context.Context, q store.Querier) (settingsRow, error) {
	var s settingsRow
	err := q.QueryRow(ctx, `SELECT trust_domain, pin, create_time FROM pki_settings WHERE id = 1`).
		Scan(&s.TrustDomain, &s.Pin, &s.CreateTime)
	return s, err
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
	Serial    string
	NodeID    string
	Role      Role
	NotAfter  time.Time
	IssueTime time.Time
}

func certInsert(ctx context.Context, tx store.Tx, c certRow) error {
	_, err := tx.Exec(ctx, `INSERT INTO pki_certs (serial, node_id, role, not_after, issue_time) VALUES ($1, $2, $3, $4, $5)`,
		c.Serial, c.NodeID, string(c.Role), c.NotAfter, c.IssueTime)
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
