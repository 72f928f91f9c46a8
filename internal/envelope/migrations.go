package envelope

import (
	"embed"

	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Migrations returns the envelope's tables: idempotency keys and
// confirmations.
func Migrations() store.Migrations {
	return store.Embedded("envelope", migrationsFS)
}
