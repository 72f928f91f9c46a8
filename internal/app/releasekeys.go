package app

import (
	"fmt"
	"os"

	"github.com/better-compute/better-compute/internal/release"
)

// loadReleaseKeys reads the --release-pubkey files. A file that is not a
// release public key stops the start: a control plane that silently
// trusted fewer keys than it was given would refuse releases it should
// take, and one that took another kind of key would be worse.
func loadReleaseKeys(paths []string) ([]release.PublicKey, error) {
	var keys []release.PublicKey
	for _, p := range paths {
		text, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("--release-pubkey %s: %w", p, err)
		}
		k, err := release.ParsePublicKeyPEM(text)
		if err != nil {
			return nil, fmt.Errorf("--release-pubkey %s: %w", p, err)
		}
		keys = append(keys, k)
	}
	return keys, nil
}
