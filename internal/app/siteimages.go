package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/better-compute/better-compute/internal/gateway"
	"github.com/better-compute/better-compute/internal/metal"
)

// siteImages serves the gateway's FetchSiteImage from the machine
// lifecycle and the image catalog's blobs, both built after the gateway.
type siteImages struct{ a *App }

func (s siteImages) OpenSiteImage(ctx context.Context, nodeID, sha, token string) (io.ReadCloser, func(bool), error) {
	rt := s.a.discovery.rt
	if rt == nil || s.a.Blobs == nil {
		return nil, nil, fmt.Errorf("%w: this replica runs no machine lifecycle", gateway.ErrSiteImageDenied)
	}
	f, finish, err := rt.OpenSiteImage(ctx, nodeID, sha, token, s.a.Blobs.Open)
	switch {
	case errors.Is(err, metal.ErrImageFetchDenied):
		return nil, nil, fmt.Errorf("%w%s", gateway.ErrSiteImageDenied, strings.TrimPrefix(err.Error(), metal.ErrImageFetchDenied.Error()))
	case errors.Is(err, metal.ErrImageFetchNoBlob):
		return nil, nil, fmt.Errorf("%w%s", gateway.ErrSiteImageMissing, strings.TrimPrefix(err.Error(), metal.ErrImageFetchNoBlob.Error()))
	case err != nil:
		return nil, nil, err
	}
	return f, finish, nil
}
