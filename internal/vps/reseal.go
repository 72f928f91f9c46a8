package vps

import (
	"context"
	"encoding/base64"
	"fmt"

	"github.com/better-compute/better-compute/internal/store"
)

// LegacySealer is a Sealer that also tells a value an earlier release
// sealed under the raw deployment secret (pki.Sealer.Legacy).
type LegacySealer interface {
	Sealer
	Legacy(sealed []byte) bool
}

// ResealLegacy re-seals under s's derived key, in tx, the SSH CA's key and
// every instance's user data an earlier release sealed under the raw
// deployment secret, and returns how many it re-sealed and the ids (of
// CAs and instances) whose legacy value did not open. Values already
// current are left alone, so replicas starting together only repeat a
// no-op. A value that does not open is skipped, not fatal: it opened no
// better before, and one bad row must not stop the control plane from
// starting.
//
// The seeds sealed in instance.create command params are fleet's rows;
// they still open, and end with their command's deadline.
func ResealLegacy(ctx context.Context, tx store.Tx, s LegacySealer) (resealed int, unopened []string, err error) {
	reseal := func(id, ref string, old []byte, swap func(resealed []byte) (bool, error)) error {
		if !s.Legacy(old) {
			return nil
		}
		pt, err := s.Open(ref, old)
		if err != nil {
			unopened = append(unopened, id)
			return nil //nolint:nilerr // a value that does not open is reported, not fatal (above)
		}
		sealed, err := s.Seal(ref, pt)
		clear(pt)
		if err != nil {
			return fmt.Errorf("vps: reseal %s: %w", id, err)
		}
		ok, err := swap(sealed)
		if err != nil {
			return fmt.Errorf("vps: reseal %s: %w", id, err)
		}
		if ok {
			resealed++
		}
		return nil
	}

	ids, keys, err := sshCAsSealed(ctx, tx)
	if err != nil {
		return 0, nil, fmt.Errorf("vps: reseal: %w", err)
	}
	for i, id := range ids {
		raw, err := base64.StdEncoding.DecodeString(keys[i])
		if err != nil {
			unopened = append(unopened, "ssh_ca/"+id)
			continue
		}
		if err := reseal("ssh_ca/"+id, sshCARef(id), raw, func(b []byte) (bool, error) {
			return sshCAReseal(ctx, tx, id, keys[i], base64.StdEncoding.EncodeToString(b))
		}); err != nil {
			return 0, nil, err
		}
	}

	uds, err := instancesUserDataSealed(ctx, tx)
	if err != nil {
		return 0, nil, fmt.Errorf("vps: reseal: %w", err)
	}
	for _, u := range uds {
		if err := reseal(u.ID, userDataRef(u.ID), u.Sealed, func(b []byte) (bool, error) {
			return instanceUserDataReseal(ctx, tx, u.ID, u.Sealed, b)
		}); err != nil {
			return 0, nil, err
		}
	}
	return resealed, unopened, nil
}
