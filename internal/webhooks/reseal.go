package webhooks

import (
	"context"
	"fmt"

	"github.com/better-compute/better-compute/internal/store"
)

// LegacySealer is a Sealer that also tells a value an earlier release
// sealed under the raw deployment secret (pki.Sealer.Legacy).
type LegacySealer interface {
	Sealer
	Legacy(sealed []byte) bool
}

// Reseal re-seals every endpoint secret from one BETTER_COMPUTE_SECRET to
// another in tx (alongside pki.Reseal when the secret rotates), and
// returns how many endpoints it re-sealed.
func Reseal(ctx context.Context, tx store.Tx, from, to Sealer) (int, error) {
	ws, err := WebhookSecrets(ctx, tx)
	if err != nil {
		return 0, err
	}
	reseal := func(id string, sealed []byte) ([]byte, error) {
		if len(sealed) == 0 {
			return sealed, nil
		}
		pt, err := from.Open("webhook/"+id, sealed)
		if err != nil {
			return nil, fmt.Errorf("webhooks: open the secret of %s: %w", id, err)
		}
		defer clear(pt)
		return to.Seal("webhook/"+id, pt)
	}
	for _, w := range ws {
		cur, err := reseal(w.ID, w.Secret)
		if err != nil {
			return 0, err
		}
		prev, err := reseal(w.ID, w.PreviousSecret)
		if err != nil {
			return 0, err
		}
		if err := WebhookSetSecrets(ctx, tx, w.ID, cur, prev); err != nil {
			return 0, err
		}
	}
	return len(ws), nil
}

// ResealLegacy re-seals under s's derived key, in tx, every endpoint secret
// and previous secret an earlier release sealed under the raw deployment
// secret, and returns how many values it re-sealed and the ids of
// endpoints with a legacy value that did not open. Values already current
// are left alone, so replicas starting together only repeat a no-op. A
// value that does not open is skipped, not fatal: it opened no better
// before, and one bad row must not stop the control plane from starting.
func ResealLegacy(ctx context.Context, tx store.Tx, s LegacySealer) (resealed int, unopened []string, err error) {
	ws, err := WebhookSecrets(ctx, tx)
	if err != nil {
		return 0, nil, fmt.Errorf("webhooks: reseal: %w", err)
	}
	for _, w := range ws {
		for _, v := range []struct {
			previous bool
			sealed   []byte
		}{{false, w.Secret}, {true, w.PreviousSecret}} {
			if !s.Legacy(v.sealed) {
				continue
			}
			pt, err := s.Open("webhook/"+w.ID, v.sealed)
			if err != nil {
				unopened = append(unopened, w.ID)
				continue
			}
			sealed, err := s.Seal("webhook/"+w.ID, pt)
			clear(pt)
			if err != nil {
				return 0, nil, fmt.Errorf("webhooks: reseal %s: %w", w.ID, err)
			}
			ok, err := webhookSecretReseal(ctx, tx, w.ID, v.previous, v.sealed, sealed)
			if err != nil {
				return 0, nil, fmt.Errorf("webhooks: reseal %s: %w", w.ID, err)
			}
			if ok {
				resealed++
			}
		}
	}
	return resealed, unopened, nil
}
