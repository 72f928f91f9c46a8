package app

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/better-compute/better-compute/internal/metal"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/secrets"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vps"
	"github.com/better-compute/better-compute/internal/webhooks"
)

// resealLegacy moves every value a module keeps sealed under the raw
// deployment secret (an earlier release's) under the derived key, one
// transaction per module, as pki.LoadOrInit does for the CA keys: after a
// start, nothing at rest depends on the raw secret keying the cipher.
// Rows already current are left alone, so replicas starting together
// repeat a no-op. A legacy value that does not open is logged and left,
// not fatal: it opened no better before the start.
func resealLegacy(ctx context.Context, db *store.DB, s *pki.Sealer, log *slog.Logger) error {
	modules := []struct {
		name   string
		reseal func(context.Context, store.Tx, *pki.Sealer) (int, []string, error)
	}{
		{"secrets", func(ctx context.Context, tx store.Tx, s *pki.Sealer) (int, []string, error) {
			return secrets.ResealLegacy(ctx, tx, s)
		}},
		{"webhooks", func(ctx context.Context, tx store.Tx, s *pki.Sealer) (int, []string, error) {
			return webhooks.ResealLegacy(ctx, tx, s)
		}},
		{"metal", func(ctx context.Context, tx store.Tx, s *pki.Sealer) (int, []string, error) {
			return metal.ResealLegacy(ctx, tx, s)
		}},
		{"vps", func(ctx context.Context, tx store.Tx, s *pki.Sealer) (int, []string, error) {
			return vps.ResealLegacy(ctx, tx, s)
		}},
	}
	for _, m := range modules {
		var (
			n        int
			unopened []string
		)
		err := db.Write(ctx, func(ctx context.Context, tx store.Tx) (err error) {
			// A retried transaction starts over.
			n, unopened, err = m.reseal(ctx, tx, s)
			return err
		})
		if err != nil {
			return fmt.Errorf("reseal %s: %w", m.name, err)
		}
		if n > 0 {
			log.Info("resealed values sealed under the raw secret by an earlier release under the derived key", "module", m.name, "count", n)
		}
		if len(unopened) > 0 {
			log.Warn("values sealed by an earlier release do not open (tampered, or moved to another row): left as they are", "module", m.name, "ids", unopened)
		}
	}
	return nil
}
