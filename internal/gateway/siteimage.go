package gateway

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
)

// siteImageChunk is the most one FetchSiteImage frame carries.
const siteImageChunk = 1 << 20

// ErrSiteImageDenied and ErrSiteImageMissing are the refusals of a
// SiteImages the site agent may see (PERMISSION_DENIED, NOT_FOUND); any
// other error is internal.
var (
	ErrSiteImageDenied  = errors.New("image fetch refused")
	ErrSiteImageMissing = errors.New("no such image blob")
)

// SiteImages serves deploying machines' images to site agents.
type SiteImages interface {
	// OpenSiteImage checks the capability token that node nodeID (its
	// verified certificate's identity) presents for blob sha256 and
	// claims its one use. finish reports whether the whole blob was sent.
	OpenSiteImage(ctx context.Context, nodeID, sha256, token string) (blob io.ReadCloser, finish func(complete bool), err error)
}

// FetchSiteImage streams a deploying machine's image to the site agent the
// capability was minted for. The capability is a bearer only together with
// that agent's mTLS certificate: another node presenting it is refused.
func (g *Gateway) FetchSiteImage(req *agentv1.FetchSiteImageRequest, stream grpc.ServerStreamingServer[agentv1.SiteImageChunk]) error {
	ctx := stream.Context()
	log := sessionLog{l: g.log, peer: peerAddr(ctx)}
	ident, _, err := g.peerIdentity(ctx)
	if err != nil {
		return g.refused(log, "image fetch refused", err)
	}
	log.node = ident.NodeID
	if err := decodeError(req); err != nil {
		return g.refused(log, "image fetch refused", invalid("%v", err))
	}
	if ident.Role != RoleSite {
		return g.refused(log, "image fetch refused", denied("only site agents fetch site images"))
	}
	if g.cfg.SiteImages == nil {
		return status.Error(codes.Unimplemented, "this gateway serves no site images")
	}
	blob, finish, err := g.cfg.SiteImages.OpenSiteImage(ctx, ident.NodeID, req.GetSha256(), req.GetToken())
	switch {
	case errors.Is(err, ErrSiteImageDenied):
		return g.refused(log, "image fetch refused", status.Error(codes.PermissionDenied, err.Error()))
	case errors.Is(err, ErrSiteImageMissing):
		return g.refused(log, "image fetch refused", status.Error(codes.NotFound, err.Error()))
	case err != nil:
		return g.refused(log, "image fetch failed", err)
	}
	defer blob.Close()
	complete := false
	defer func() { finish(complete) }()
	buf := make([]byte, siteImageChunk)
	for {
		n, err := io.ReadFull(blob, buf)
		if n > 0 {
			if err := stream.Send(&agentv1.SiteImageChunk{Data: buf[:n]}); err != nil {
				return err
			}
		}
		switch {
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			complete = true
			return nil
		case err != nil:
			return g.refused(log, "image fetch failed", err)
		}
	}
}
