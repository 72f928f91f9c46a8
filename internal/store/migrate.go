package store

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// Migrations is one module's embedded, forward-only migrations. FS holds
// sqlite/NNNN_name.sql and postgres/NNNN_name.sql; NNNN is the version,
// numbered per module. A file may hold several statements; it is applied in
// one transaction together with its schema_migrations row.
type Migrations struct {
	Module string
	FS     fs.FS
}

//go:embed migrations
var coreFS embed.FS

// CoreModule is the module name of the store's own migrations
// (schema_migrations and, on PostgreSQL, compute_now()).
const CoreModule = "store"

func coreMigrations() Migrations {
	sub, err := fs.Sub(coreFS, "migrations")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	return Migrations{Module: CoreModule, FS: sub}
}

type migrationFile struct {
	version int
	name    string
	sql     string
}

// Migrate applies the store's core migrations and then the pending migrations
// of each set, module by module in the order given, version by version. It
// runs under a migration lock so that replicas starting together apply each
// file once. It refuses with ErrSchemaTooNew, before applying anything, when
// the database holds a version of a module higher than this binary knows.
func (db *DB) Migrate(ctx context.Context, sets ...Migrations) error {
	all := append([]Migrations{coreMigrations()}, sets...)
	files := make([][]migrationFile, len(all))
	seen := map[string]bool{}
	for i, set := range all {
		if set.Module == "" {
			return errors.New("migrate: module name is empty")
		}
		if seen[set.Module] {
			return fmt.Errorf("migrate: module %q given twice", set.Module)
		}
		seen[set.Module] = true
		fl, err := readMigrations(set, db.Dialect())
		if err != nil {
			return err
		}
		files[i] = fl
	}

	return db.WithMigrationLock(ctx, func(ctx context.Context) error {
		return db.migrateLocked(ctx, all, files)
	})
}

// WithMigrationLock runs fn holding the lock Migrate takes, so that other
// schema installers (River's migrations) do not race replicas starting at
// the same time: a PostgreSQL advisory lock, or on SQLite an exclusive lock
// on a file beside the database.
func (db *DB) WithMigrationLock(ctx context.Context, fn func(ctx context.Context) error) error {
	unlock, err := db.d.LockMigrations(ctx)
	if err != nil {
		return fmt.Errorf("migration lock: %w", err)
	}
	defer unlock()
	return fn(ctx)
}

func (db *DB) migrateLocked(ctx context.Context, all []Migrations, files [][]migrationFile) error {
	applied := make([]map[int]bool, len(all))
	for i, set := range all {
		versions, err := db.appliedVersions(ctx, set.Module)
		if err != nil {
			return err
		}
		applied[i] = versions
		known := 0
		if n := len(files[i]); n > 0 {
			known = files[i][n-1].version
		}
		for v := range versions {
			if v > known {
				return fmt.Errorf("%w: module %q is at version %d in the database but this binary knows up to version %d",
					ErrSchemaTooNew, set.Module, v, known)
			}
		}
	}

	for i, set := range all {
		for _, f := range files[i] {
			if applied[i][f.version] {
				continue
			}
			if err := db.applyMigration(ctx, set.Module, f); err != nil {
				return err
			}
		}
	}
	return nil
}

// Pending lists, without applying anything, the migrations of sets (and the
// store's own) the database lacks, as "module/NNNN_name", and fails with
// ErrSchemaTooNew when the database is ahead of this binary.
func (db *DB) Pending(ctx context.Context, sets ...Migrations) ([]string, error) {
	all := append([]Migrations{coreMigrations()}, sets...)
	var out []string
	for _, set := range all {
		files, err := readMigrations(set, db.Dialect())
		if err != nil {
			return nil, err
		}
		applied, err := db.appliedVersions(ctx, set.Module)
		if err != nil {
			return nil, err
		}
		known := 0
		if n := len(files); n > 0 {
			known = files[n-1].version
		}
		for v := range applied {
			if v > known {
				return nil, fmt.Errorf("%w: module %q is at version %d in the database but this binary knows up to version %d",
					ErrSchemaTooNew, set.Module, v, known)
			}
		}
		for _, f := range files {
			if !applied[f.version] {
				out = append(out, fmt.Sprintf("%s/%04d_%s", set.Module, f.version, f.name))
			}
		}
	}
	return out, nil
}

func (db *DB) appliedVersions(ctx context.Context, module string) (map[int]bool, error) {
	versions := map[int]bool{}
	err := db.Read(ctx, func(ctx context.Context, tx Tx) error {
		ok, err := db.d.TableExists(ctx, tx, "schema_migrations")
		if err != nil || !ok {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT version FROM schema_migrations WHERE module = $1`, module)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var v int
			if err := rows.Scan(&v); err != nil {
				return err
			}
			versions[v] = true
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("migrate: read applied versions of %q: %w", module, err)
	}
	return versions, nil
}

func (db *DB) applyMigration(ctx context.Context, module string, f migrationFile) error {
	err := db.write(ctx, db.d.PrepareMigration, func(ctx context.Context, tx Tx) error {
		// Check again inside the write transaction: on SQLite the lock is the
		// writer itself, so another process may have applied it meanwhile.
		ok, err := db.d.TableExists(ctx, tx, "schema_migrations")
		if err != nil {
			return err
		}
		if ok {
			var n int
			err := tx.QueryRow(ctx, `SELECT count(*) FROM schema_migrations WHERE module = $1 AND version = $2`,
				module, f.version).Scan(&n)
			if err != nil || n > 0 {
				return err
			}
		}
		if _, err := tx.Exec(ctx, f.sql); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO schema_migrations (module, version, name, applied_at) VALUES ($1, $2, $3, $4)`,
			module, f.version, f.name, db.clock.Now())
		return err
	})
	if err != nil {
		return fmt.Errorf("migrate: apply %s %04d_%s: %w", module, f.version, f.name, err)
	}
	return nil
}

// readMigrations lists a module's files for one dialect in version order. A
// module without a folder for the dialect is an error, never a silent skip.
func readMigrations(set Migrations, dialect Dialect) ([]migrationFile, error) {
	if set.FS == nil {
		return nil, fmt.Errorf("migrate: module %q has no migrations FS", set.Module)
	}
	dir := string(dialect)
	entries, err := fs.ReadDir(set.FS, dir)
	if err != nil {
		return nil, fmt.Errorf("migrate: module %q: read %s migrations: %w", set.Module, dialect, err)
	}
	var out []migrationFile
	byVersion := map[int]string{}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		base := strings.TrimSuffix(e.Name(), ".sql")
		num, name, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 || name == "" {
			return nil, fmt.Errorf("migrate: module %q: file %s is not named NNNN_name.sql", set.Module, e.Name())
		}
		if prev, dup := byVersion[v]; dup {
			return nil, fmt.Errorf("migrate: module %q: version %d in both %s and %s", set.Module, v, prev, e.Name())
		}
		byVersion[v] = e.Name()
		b, err := fs.ReadFile(set.FS, path.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("migrate: module %q: %w", set.Module, err)
		}
		out = append(out, migrationFile{version: v, name: name, sql: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// Embedded returns a module's migrations from its embedded tree, whose
// "migrations" folder holds sqlite/ and postgres/. The tree is fixed at
// build time, so a bad path is a programming error and panics.
func Embedded(module string, fsys fs.FS) Migrations {
	sub, err := fs.Sub(fsys, "migrations")
	if err != nil {
		panic(fmt.Sprintf("store: %s migrations: %v", module, err))
	}
	return Migrations{Module: module, FS: sub}
}
