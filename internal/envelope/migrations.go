package envelope

import (
	"embed"
	"io/fs"

	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Migrations returns the envelope's tables: idempotency keys and
// confirmations.
func Migrations() store.Migrations {
	return store.Migrations{Module: "envelope", FS: mustSub(migrationsFS, "migrations")}
}

func mustSub(fsys embed.FS, dir string) fs.FS {
	sub, err := fs.Sub(fsys, dir)
	if err != nil {
		panic(err)
	}
	return sub
}
