package rollout

import (
	"embed"

	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Migrations are the module's tables: rollouts and their nodes.
func Migrations() store.Migrations {
	return store.Embedded("rollout", migrationsFS)
}
