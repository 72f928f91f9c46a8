package releases

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Migrations returns the module's tables.
func Migrations() store.Migrations {
	return store.Embedded("releases", migrationsFS)
}

// ErrNotFound: no release of that version is published.
var ErrNotFound = errors.New("release not found")

// Kinds of release file.
const (
	KindBinary = "binary"
	KindSBOM   = "sbom"
)

// Release is a published release (a row of releases).
type Release struct {
	Version                string
	MinControlPlaneVersion string
	// Manifest is the signed envelope text, as it was uploaded.
	Manifest []byte
	// Platforms it carries a binary for, sorted.
	Platforms  []string
	KeyID      string
	CreatedBy  string
	CreateTime time.Time
}

// File is a row of release_files: a binary or an SBOM of a release.
type File struct {
	Version   string
	Name      string
	Platform  string
	Kind      string
	SHA256    string
	SizeBytes int64
}

const releaseColumns = `version, min_control_plane_version, manifest, platforms, key_id, created_by, create_time`

func scanRelease(row interface{ Scan(...any) error }) (Release, error) {
	var (
		r         Release
		manifest  string
		platforms string
	)
	if err := row.Scan(&r.Version, &r.MinControlPlaneVersion, &manifest, &platforms, &r.KeyID, &r.CreatedBy, &r.CreateTime); err != nil {
		return Release{}, err
	}
	r.Manifest = []byte(manifest)
	r.Platforms = strings.Split(platforms, ",")
	return r, nil
}

// Get reads the published release of version; a version not published
// answers an error that errors.Is ErrNotFound (and store.ErrNotFound).
func Get(ctx context.Context, q store.Querier, version string, lock ...string) (Release, error) {
	r, err := scanRelease(q.QueryRow(ctx, `SELECT `+releaseColumns+` FROM releases WHERE version = $1`+strings.Join(lock, ""), version))
	if errors.Is(err, store.ErrNotFound) {
		return Release{}, fmt.Errorf("release %s: %w", version, errors.Join(ErrNotFound, store.ErrNotFound))
	}
	return r, err
}

// ReleaseInsert creates a release's row and its files' rows.
func ReleaseInsert(ctx context.Context, tx store.Tx, r *Release, files []File) error {
	if _, err := tx.Exec(ctx, `INSERT INTO releases (`+releaseColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		r.Version, r.MinControlPlaneVersion, string(r.Manifest), strings.Join(r.Platforms, ","), r.KeyID, r.CreatedBy, r.CreateTime); err != nil {
		return err
	}
	for _, f := range files {
		if _, err := tx.Exec(ctx, `INSERT INTO release_files (version, name, platform, kind, sha256, size_bytes) VALUES ($1, $2, $3, $4, $5, $6)`,
			r.Version, f.Name, f.Platform, f.Kind, f.SHA256, f.SizeBytes); err != nil {
			return err
		}
	}
	return nil
}

// ReleaseList lists releases by version text after the cursor.
func ReleaseList(ctx context.Context, q store.Querier, after string, limit int) ([]Release, error) {
	rows, err := q.Query(ctx, `SELECT `+releaseColumns+` FROM releases WHERE version > $1 ORDER BY version LIMIT $2`, after, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Release
	for rows.Next() {
		r, err := scanRelease(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// ReleaseDelete removes a release and its files' rows; it reports whether
// the release was there.
func ReleaseDelete(ctx context.Context, tx store.Tx, version string) (bool, error) {
	// The files first: SQLite and PostgreSQL both cascade, but an explicit
	// delete does not lean on the foreign-key pragma.
	if _, err := tx.Exec(ctx, `DELETE FROM release_files WHERE version = $1`, version); err != nil {
		return false, err
	}
	n, err := tx.Exec(ctx, `DELETE FROM releases WHERE version = $1`, version)
	return n == 1, err
}

// FileList lists a release's files by platform and kind.
func FileList(ctx context.Context, q store.Querier, version string) ([]File, error) {
	rows, err := q.Query(ctx, `SELECT version, name, platform, kind, sha256, size_bytes FROM release_files
		WHERE version = $1 ORDER BY platform, kind`, version)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []File
	for rows.Next() {
		var f File
		if err := rows.Scan(&f.Version, &f.Name, &f.Platform, &f.Kind, &f.SHA256, &f.SizeBytes); err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, rows.Err()
}

// FileCountBySHA256 counts the release files that name a blob.
func FileCountBySHA256(ctx context.Context, q store.Querier, sha string) (int, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT COUNT(*) FROM release_files WHERE sha256 = $1`, sha).Scan(&n)
	return n, err
}
