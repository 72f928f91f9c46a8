package images

import (
	"context"
	"embed"
	"errors"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Migrations returns the module's tables.
func Migrations() store.Migrations {
	return store.Embedded("images", migrationsFS)
}

// Id prefixes (envelope.NewID).
const (
	IDPrefix       = "img"
	SignerIDPrefix = "skey"
)

// Visibilities.
const (
	VisibilityPrivate = "private"
	VisibilityPublic  = "public"
)

// Image is a row of images.
type Image struct {
	ID         string
	TenantID   string
	Name       string
	Kind       string
	SHA256     string
	SizeBytes  int64
	Visibility string
	CreatedBy  string
	CreateTime time.Time
}

// Signature is a row of image_signatures.
type Signature struct {
	ImageID        string
	KeyFingerprint string
	Algorithm      string
	Signature      []byte
	CreatedBy      string
	CreateTime     time.Time
}

// SignerKey is a row of signer_keys.
type SignerKey struct {
	ID          string
	TenantID    string
	Name        string
	Algorithm   string
	Fingerprint string
	PublicKey   []byte // PKIX DER
	CreatedBy   string
	CreateTime  time.Time
}

// Ref is a row of image_refs: something that uses an image.
type Ref struct {
	ImageID    string
	Kind       string
	RefID      string
	TenantID   string
	CreateTime time.Time
}

const imageColumns = `id, tenant_id, name, kind, sha256, size_bytes, visibility, created_by, create_time`

func scanImage(row interface{ Scan(...any) error }) (Image, error) {
	var i Image
	err := row.Scan(&i.ID, &i.TenantID, &i.Name, &i.Kind, &i.SHA256, &i.SizeBytes, &i.Visibility, &i.CreatedBy, &i.CreateTime)
	return i, err
}

// ImageInsert creates an image's row.
func ImageInsert(ctx context.Context, tx store.Tx, i *Image) error {
	_, err := tx.Exec(ctx, `INSERT INTO images (`+imageColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		i.ID, i.TenantID, i.Name, i.Kind, i.SHA256, i.SizeBytes, i.Visibility, i.CreatedBy, i.CreateTime)
	return err
}

// ImageGet resolves an image of an owner (tenant id, ” for the platform)
// by id (img_…) or name.
func ImageGet(ctx context.Context, q store.Querier, tenantID, ref string) (Image, error) {
	col := "name"
	if strings.HasPrefix(ref, IDPrefix+"_") {
		col = "id"
	}
	return scanImage(q.QueryRow(ctx, `SELECT `+imageColumns+` FROM images WHERE tenant_id = $1 AND `+col+` = $2`, tenantID, ref))
}

// ImageGetPublic resolves a public image by id, whoever owns it.
func ImageGetPublic(ctx context.Context, q store.Querier, id string) (Image, error) {
	return scanImage(q.QueryRow(ctx, `SELECT `+imageColumns+` FROM images WHERE id = $1 AND visibility = 'public'`, id))
}

// ImageSHA256 reads an image's digest by id, whoever owns it
// (store.ErrNotFound when absent): metal's deploy fetches by digest.
func ImageSHA256(ctx context.Context, q store.Querier, id string) (string, error) {
	var sha string
	err := q.QueryRow(ctx, `SELECT sha256 FROM images WHERE id = $1`, id).Scan(&sha)
	return sha, err
}

// ImageList lists an owner's images and every public image, by id after the
// cursor.
func ImageList(ctx context.Context, q store.Querier, tenantID, after string, limit int) ([]Image, error) {
	rows, err := q.Query(ctx, `SELECT `+imageColumns+` FROM images
		WHERE (tenant_id = $1 OR visibility = 'public') AND id > $2 ORDER BY id LIMIT $3`, tenantID, after, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Image
	for rows.Next() {
		i, err := scanImage(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, i)
	}
	return out, rows.Err()
}

// ImageSetVisibility sets an image's visibility; it reports whether the row
// changed.
func ImageSetVisibility(ctx context.Context, tx store.Tx, id, visibility string) (bool, error) {
	n, err := tx.Exec(ctx, `UPDATE images SET visibility = $2 WHERE id = $1 AND visibility <> $2`, id, visibility)
	return n == 1, err
}

// ImageDelete deletes an image's row and its signatures; it reports
// whether there was one.
func ImageDelete(ctx context.Context, tx store.Tx, id string) (bool, error) {
	if _, err := tx.Exec(ctx, `DELETE FROM image_signatures WHERE image_id = $1`, id); err != nil {
		return false, err
	}
	n, err := tx.Exec(ctx, `DELETE FROM images WHERE id = $1`, id)
	return n == 1, err
}

// ImageCountBySHA256 counts the images that name a blob.
func ImageCountBySHA256(ctx context.Context, q store.Querier, sha string) (int, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT COUNT(*) FROM images WHERE sha256 = $1`, sha).Scan(&n)
	return n, err
}

// SignatureUpsert attaches a signature, replacing one by the same key.
func SignatureUpsert(ctx context.Context, tx store.Tx, s *Signature) error {
	_, err := tx.Exec(ctx, `INSERT INTO image_signatures (image_id, key_fingerprint, algorithm, signature, created_by, create_time)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (image_id, key_fingerprint) DO UPDATE SET signature = excluded.signature,
			created_by = excluded.created_by, create_time = excluded.create_time`,
		s.ImageID, s.KeyFingerprint, s.Algorithm, s.Signature, s.CreatedBy, s.CreateTime)
	return err
}

// SignatureList lists an image's signatures by fingerprint.
func SignatureList(ctx context.Context, q store.Querier, imageID string) ([]Signature, error) {
	rows, err := q.Query(ctx, `SELECT image_id, key_fingerprint, algorithm, signature, created_by, create_time
		FROM image_signatures WHERE image_id = $1 ORDER BY key_fingerprint`, imageID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Signature
	for rows.Next() {
		var s Signature
		if err := rows.Scan(&s.ImageID, &s.KeyFingerprint, &s.Algorithm, &s.Signature, &s.CreatedBy, &s.CreateTime); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

const signerColumns = `id, tenant_id, name, algorithm, fingerprint, public_key, created_by, create_time`

func scanSigner(row interface{ Scan(...any) error }) (SignerKey, error) {
	var k SignerKey
	err := row.Scan(&k.ID, &k.TenantID, &k.Name, &k.Algorithm, &k.Fingerprint, &k.PublicKey, &k.CreatedBy, &k.CreateTime)
	return k, err
}

// SignerKeyInsert adds a key to an allowlist.
func SignerKeyInsert(ctx context.Context, tx store.Tx, k *SignerKey) error {
	_, err := tx.Exec(ctx, `INSERT INTO signer_keys (`+signerColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
		k.ID, k.TenantID, k.Name, k.Algorithm, k.Fingerprint, k.PublicKey, k.CreatedBy, k.CreateTime)
	return err
}

// SignerKeyGet resolves a key of an allowlist by id (skey_…), fingerprint
// (64 hex digits) or name.
func SignerKeyGet(ctx context.Context, q store.Querier, tenantID, ref string) (SignerKey, error) {
	col := "name"
	switch {
	case strings.HasPrefix(ref, SignerIDPrefix+"_"):
		col = "id"
	case len(ref) == 64:
		col = "fingerprint"
	}
	return scanSigner(q.QueryRow(ctx, `SELECT `+signerColumns+` FROM signer_keys WHERE tenant_id = $1 AND `+col+` = $2`, tenantID, ref))
}

// SignerKeyList lists an allowlist by id after the cursor.
func SignerKeyList(ctx context.Context, q store.Querier, tenantID, after string, limit int) ([]SignerKey, error) {
	rows, err := q.Query(ctx, `SELECT `+signerColumns+` FROM signer_keys WHERE tenant_id = $1 AND id > $2 ORDER BY id LIMIT $3`,
		tenantID, after, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []SignerKey
	for rows.Next() {
		k, err := scanSigner(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// SignerKeysByFingerprint returns the keys with these fingerprints on the
// allowlists of the tenants given (tenant id, ” for the platform's).
func SignerKeysByFingerprint(ctx context.Context, q store.Querier, tenantIDs []string, fingerprints []string) ([]SignerKey, error) {
	var out []SignerKey
	// Images carry few signatures and callers ask for two allowlists: a
	// query per pair keeps the SQL the same on both dialects.
	for _, t := range tenantIDs {
		for _, fp := range fingerprints {
			k, err := scanSigner(q.QueryRow(ctx, `SELECT `+signerColumns+` FROM signer_keys WHERE tenant_id = $1 AND fingerprint = $2`, t, fp))
			switch {
			case errors.Is(err, store.ErrNotFound):
				continue
			case err != nil:
				return nil, err
			}
			out = append(out, k)
		}
	}
	return out, nil
}

// SignerKeyDelete removes a key from its allowlist.
func SignerKeyDelete(ctx context.Context, tx store.Tx, tenantID, id string) (bool, error) {
	n, err := tx.Exec(ctx, `DELETE FROM signer_keys WHERE tenant_id = $1 AND id = $2`, tenantID, id)
	return n == 1, err
}

// RefInsert records that something uses an image (the deploy path calls it
// in the transaction that starts a deployment).
func RefInsert(ctx context.Context, tx store.Tx, r *Ref) error {
	_, err := tx.Exec(ctx, `INSERT INTO image_refs (image_id, ref_kind, ref_id, tenant_id, create_time) VALUES ($1, $2, $3, $4, $5)`,
		r.ImageID, r.Kind, r.RefID, r.TenantID, r.CreateTime)
	return err
}

// RefDelete drops a use (a release, a cache eviction).
func RefDelete(ctx context.Context, tx store.Tx, imageID, kind, refID string) (bool, error) {
	n, err := tx.Exec(ctx, `DELETE FROM image_refs WHERE image_id = $1 AND ref_kind = $2 AND ref_id = $3`, imageID, kind, refID)
	return n == 1, err
}

// RefFirst returns one use of an image, for the refusal message; it is
// store.ErrNotFound when there is none.
func RefFirst(ctx context.Context, q store.Querier, imageID string) (Ref, error) {
	var r Ref
	err := q.QueryRow(ctx, `SELECT image_id, ref_kind, ref_id, tenant_id, create_time FROM image_refs
		WHERE image_id = $1 ORDER BY ref_kind, ref_id LIMIT 1`, imageID).Scan(&r.ImageID, &r.Kind, &r.RefID, &r.TenantID, &r.CreateTime)
	return r, err
}
