package metal

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

// ResealLegacy re-seals under s's derived key, in tx, every machine's BMC
// password an earlier release sealed under the raw deployment secret, and
// returns how many it re-sealed and the ids of machines whose legacy value
// did not open. Values already current are left alone, so replicas
// starting together only repeat a no-op. A value that does not open is
// skipped, not fatal: it opened no better before, and one bad row must not
// stop the control plane from starting.
//
// The copies of a password (and the discovery tokens) inside bmc.power
// command params are fleet's rows; they still open, and end with their
// command's deadline.
func ResealLegacy(ctx context.Context, tx store.Tx, s LegacySealer) (resealed int, unopened []string, err error) {
	creds, err := machineCredentials(ctx, tx)
	if err != nil {
		return 0, nil, fmt.Errorf("metal: reseal: %w", err)
	}
	for _, c := range creds {
		if !s.Legacy(c.Sealed) {
			continue
		}
		pt, err := s.Open(sealRef(c.CredentialRef), c.Sealed)
		if err != nil {
			unopened = append(unopened, c.ID)
			continue
		}
		sealed, err := s.Seal(sealRef(c.CredentialRef), pt)
		clear(pt)
		if err != nil {
			return 0, nil, fmt.Errorf("metal: reseal %s: %w", c.ID, err)
		}
		ok, err := machineCredentialReseal(ctx, tx, c.ID, c.Sealed, sealed)
		if err != nil {
			return 0, nil, fmt.Errorf("metal: reseal %s: %w", c.ID, err)
		}
		if ok {
			resealed++
		}
	}
	return resealed, unopened, nil
}
