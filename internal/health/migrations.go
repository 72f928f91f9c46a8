package health

import (
	"embed"

	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Migrations are the module's tables: findings, remediations, quarantined
// GPUs and circuit breakers.
func Migrations() store.Migrations {
	return store.Embedded("health", migrationsFS)
}
