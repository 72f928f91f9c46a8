package secrets

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

// ResealLegacy re-seals under s's derived key, in tx, every secret value
// an earlier release sealed under the raw deployment secret, and returns
// how many it re-sealed and the ids of legacy values that did not open.
// Values already current are left alone, so replicas starting together
// only repeat a no-op. A value that does not open is skipped, not fatal:
// it opened no better before, and one bad row must not stop the control
// plane from starting.
func ResealLegacy(ctx context.Context, tx store.Tx, s LegacySealer) (resealed int, unopened []string, err error) {
	vals, err := sealedValues(ctx, tx)
	if err != nil {
		return 0, nil, fmt.Errorf("secrets: reseal: %w", err)
	}
	for _, v := range vals {
		if !s.Legacy(v.Sealed) {
			continue
		}
		pt, err := s.Open(sealRef(v.ID), v.Sealed)
		if err != nil {
			unopened = append(unopened, v.ID)
			continue
		}
		sealed, err := s.Seal(sealRef(v.ID), pt)
		clear(pt)
		if err != nil {
			return 0, nil, fmt.Errorf("secrets: reseal %s: %w", v.ID, err)
		}
		ok, err := valueReseal(ctx, tx, v.ID, v.Sealed, sealed)
		if err != nil {
			return 0, nil, fmt.Errorf("secrets: reseal %s: %w", v.ID, err)
		}
		if ok {
			resealed++
		}
	}
	return resealed, unopened, nil
}
