package webhooks

import (
	"context"
	"fmt"

	"github.com/better-compute/better-compute/internal/store"
)

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
