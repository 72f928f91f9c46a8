package app

import (
	"context"
	"errors"
	"fmt"

	"github.com/better-compute/better-compute/internal/gateway"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/secrets"
	"github.com/better-compute/better-compute/internal/store"
)

// openNodeSecret serves the gateway's FetchSecret from the secrets module:
// only the node's tenant's secrets marked node-readable. A ref that names
// no valid secret is as missing as any other (ErrSecretNotFound).
func openNodeSecret(sealer *pki.Sealer) func(ctx context.Context, q store.Querier, tenantID, ref string) (gateway.NodeSecret, error) {
	var s secrets.Sealer // a nil *pki.Sealer must stay a nil interface
	if sealer != nil {
		s = sealer
	}
	return func(ctx context.Context, q store.Querier, tenantID, ref string) (gateway.NodeSecret, error) {
		v, err := secrets.OpenForNode(ctx, q, s, tenantID, ref)
		switch {
		case errors.Is(err, secrets.ErrNotFound), errors.Is(err, secrets.ErrBadRef):
			return gateway.NodeSecret{}, fmt.Errorf("%w: %s", gateway.ErrSecretNotFound, ref)
		case err != nil:
			return gateway.NodeSecret{}, err
		}
		return gateway.NodeSecret{ID: v.ID, Version: v.Version, Value: v.Bytes}, nil
	}
}
