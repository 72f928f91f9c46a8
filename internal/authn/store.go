package authn

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"math/big"
	"time"

	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/store/dirversion"
)

//go:embed migrations
var migrationsFS embed.FS

// Migrations returns the module's tables.
func Migrations() store.Migrations {
	return store.Embedded("authn", migrationsFS)
}

// ApiKey is a stored key; the secret itself is never stored.
type ApiKey struct {
	ID         string
	TenantID   string
	Name       string
	Role       string
	Kind       string
	Prefix     string
	SecretHash string
	CreatedBy  string
	CreateTime time.Time
	ExpireTime *time.Time
	RevokeTime *time.Time
}

const (
	secretPrefix = "bc_"
	secretLen    = 43 // characters after the prefix: ~256 bits in base62
	prefixShown  = 10
	alphabet     = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
)

// NewSecret returns a fresh API key secret and its hash.
func NewSecret() (secret, hash string, err error) {
	b := make([]byte, secretLen)
	n := big.NewInt(int64(len(alphabet)))
	for i := range b {
		k, err := rand.Int(rand.Reader, n)
		if err != nil {
			return "", "", err
		}
		b[i] = alphabet[k.Int64()]
	}
	secret = secretPrefix + string(b)
	return secret, HashSecret(secret), nil
}

// HashSecret hashes a secret for lookup. Secrets carry 256 bits of entropy,
// so a fast hash is enough: there is nothing to brute-force.
func HashSecret(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

const keyColumns = `id, tenant_id, name, role, kind, prefix, secret_hash, created_by, create_time, expire_time, revoke_time`

func scanKey(row interface{ Scan(...any) error }) (ApiKey, error) {
	var k ApiKey
	err := row.Scan(&k.ID, &k.TenantID, &k.Name, &k.Role, &k.Kind, &k.Prefix, &k.SecretHash, &k.CreatedBy, &k.CreateTime, &k.ExpireTime, &k.RevokeTime)
	return k, err
}

// KeyInsert stores a key. Like every write to api_keys it moves the
// directory version on first, in tx (dirversion.Bump).
func KeyInsert(ctx context.Context, tx store.Tx, k ApiKey) error {
	if err := dirversion.Bump(ctx, tx); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO api_keys (`+keyColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
		k.ID, k.TenantID, k.Name, k.Role, k.Kind, k.Prefix, k.SecretHash, k.CreatedBy, k.CreateTime, k.ExpireTime, k.RevokeTime)
	return err
}

// KeyByHash finds a key by the hash of its secret.
func KeyByHash(ctx context.Context, q store.Querier, hash string) (ApiKey, error) {
	return scanKey(q.QueryRow(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE secret_hash = $1`, hash))
}

// KeyGet finds a key of a tenant ("" for platform keys) by id.
func KeyGet(ctx context.Context, q store.Querier, tenantID, id string) (ApiKey, error) {
	return scanKey(q.QueryRow(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE tenant_id = $1 AND id = $2`, tenantID, id))
}

// KeyByID reads a key by id in whichever tenant holds it (ids are unique
// across tenants), for platform principals that name no tenant.
func KeyByID(ctx context.Context, q store.Querier, id string) (ApiKey, error) {
	return scanKey(q.QueryRow(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE id = $1`, id))
}

// KeyList lists a tenant's keys after the cursor.
func KeyList(ctx context.Context, q store.Querier, tenantID string, includeRevoked bool, after string, limit int) ([]ApiKey, error) {
	rows, err := q.Query(ctx, `SELECT `+keyColumns+` FROM api_keys
		WHERE tenant_id = $1 AND id > $2 AND ($3 OR revoke_time IS NULL) ORDER BY id LIMIT $4`,
		tenantID, after, includeRevoked, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []ApiKey
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// KeyRevoke revokes a key; it reports whether the key was active.
func KeyRevoke(ctx context.Context, tx store.Tx, tenantID, id string) (bool, error) {
	// Every replica's next request reads the key again.
	if err := dirversion.Bump(ctx, tx); err != nil {
		return false, err
	}
	n, err := tx.Exec(ctx, `UPDATE api_keys SET revoke_time = compute_now() WHERE tenant_id = $1 AND id = $2 AND revoke_time IS NULL`, tenantID, id)
	return n == 1, err
}

// KeyCountPlatform counts platform-level keys, to know whether the platform
// was bootstrapped.
func KeyCountPlatform(ctx context.Context, q store.Querier) (int, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT COUNT(*) FROM api_keys WHERE tenant_id = ''`).Scan(&n)
	return n, err
}
