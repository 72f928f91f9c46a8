// Package storeopen opens a store.DB for a configured URL, choosing the
// dialect driver. It exists because package store cannot import its own
// dialect subpackages.
//
// It must never hold SQL or anything beyond choosing and opening a driver.
package storeopen

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/store/postgres"
	"github.com/better-compute/better-compute/internal/store/sqlite"
)

// SQLiteFile is the database file name under Config.StateDir.
const SQLiteFile = "better-compute.db"

// Open opens the database cfg.URL names: "" or "sqlite:" for SQLite under
// cfg.StateDir, "postgres://..." or "postgresql://..." for PostgreSQL. It
// does not migrate; call db.Migrate.
func Open(ctx context.Context, cfg store.Config) (*store.DB, error) {
	clk := cfg.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	switch {
	case cfg.URL == "" || cfg.URL == "sqlite:":
		if cfg.StateDir == "" {
			return nil, fmt.Errorf("open store: sqlite needs a state directory")
		}
		if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
			return nil, fmt.Errorf("open store: %w", err)
		}
		path := filepath.Join(cfg.StateDir, SQLiteFile)
		if err := prepareSQLiteFile(cfg.StateDir, path, cmp.Or(cfg.Logger, slog.Default())); err != nil {
			return nil, fmt.Errorf("open store: %w", err)
		}
		d, err := sqlite.Open(ctx, sqlite.Config{
			Path:       path,
			Clock:      clk,
			MaxReaders: cmp.Or(cfg.MaxReaders, 4),
			Exclusive:  cfg.Exclusive,
		})
		if err != nil {
			return nil, fmt.Errorf("open store: %w", err)
		}
		return store.New(d, clk), nil
	case strings.HasPrefix(cfg.URL, "postgres://") || strings.HasPrefix(cfg.URL, "postgresql://"):
		d, err := postgres.Open(ctx, postgres.Config{URL: cfg.URL, Clock: clk,
			StatementTimeout: cfg.StatementTimeout, LockTimeout: cfg.LockTimeout})
		if err != nil {
			return nil, fmt.Errorf("open store: %w", err)
		}
		return store.New(d, clk), nil
	default:
		return nil, fmt.Errorf("open store: unsupported database url scheme in %q (want sqlite: or postgres://)", redact(cfg.URL))
	}
}

// redact drops everything after the scheme so a password never reaches a log.
func redact(u string) string {
	if i := strings.Index(u, ":"); i >= 0 {
		return u[:i+1] + "..."
	}
	return "..."
}

// prepareSQLiteFile creates the database file 0600 before SQLite opens it:
// SQLite would create it with the process umask (0644 by default) inside a
// directory that already existed, and it gives the -wal and -shm files the
// database file's mode. It warns about a state directory others can read,
// and about database files that an older version left readable.
func prepareSQLiteFile(dir, path string, log *slog.Logger) error {
	if fi, err := os.Stat(dir); err == nil && fi.Mode().Perm()&0o077 != 0 {
		log.Warn("the state directory is readable by group or others; it holds the database (API key hashes, sealed keys): chmod 700 it",
			"dir", dir, "mode", fmt.Sprintf("%#o", fi.Mode().Perm()))
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	switch {
	case err == nil:
		return f.Close()
	case !errors.Is(err, fs.ErrExist):
		return err
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode().Perm()&0o077 != 0 {
			log.Warn("a database file is readable by group or others: chmod 600 it", "file", p, "mode", fmt.Sprintf("%#o", fi.Mode().Perm()))
		}
	}
	return nil
}
