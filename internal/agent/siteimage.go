package agent

import (
	"context"
	"errors"
	"io"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
)

// FetchSiteImage streams a deploying machine's image blob from the control
// plane over the session's mutually authenticated gateway connection: the
// capability token opens only with this node's certificate, once
// (site.Config.Fetch in site mode). Closing the reader ends the stream.
func (a *Agent) FetchSiteImage(ctx context.Context, sha256, token string) (io.ReadCloser, error) {
	s := a.currentSession()
	if s == nil || s.conn == nil {
		return nil, errors.New("no gateway session to fetch the image on")
	}
	sctx, cancel := context.WithCancel(ctx)
	stream, err := agentv1.NewAgentServiceClient(s.conn).FetchSiteImage(sctx, &agentv1.FetchSiteImageRequest{Sha256: sha256, Token: token})
	if err != nil {
		cancel()
		return nil, err
	}
	// The first frame carries a refusal (an unknown, foreign or used
	// capability): report it here, not on the cache's first read.
	first, err := stream.Recv()
	if err != nil && !errors.Is(err, io.EOF) {
		cancel()
		return nil, err
	}
	r := &imageStream{recv: stream.Recv, cancel: cancel, buf: first.GetData()}
	if err != nil {
		r.recv = func() (*agentv1.SiteImageChunk, error) { return nil, io.EOF }
	}
	return r, nil
}

// imageStream reads a FetchSiteImage stream as bytes.
type imageStream struct {
	recv   func() (*agentv1.SiteImageChunk, error)
	cancel context.CancelFunc
	buf    []byte
}

func (r *imageStream) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		c, err := r.recv()
		if err != nil {
			return 0, err // io.EOF at the clean end
		}
		r.buf = c.GetData()
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func (r *imageStream) Close() error {
	r.cancel()
	return nil
}
