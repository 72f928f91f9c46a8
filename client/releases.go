package client

import (
	"context"
	"errors"
	"io"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// ReleaseFile is a file of a release to publish: a binary or an SBOM the
// manifest names.
type ReleaseFile struct {
	Name    string
	Content io.Reader
}

// CreateRelease publishes a release: the signed manifest (the exact text
// `release sign` wrote) first, then each file, named, in chunks. The
// server keeps nothing unless every file the manifest names arrives with
// the size and sha256 the manifest pins. idempotencyKey may be empty.
func (c *Client) CreateRelease(ctx context.Context, manifest string, files []ReleaseFile, idempotencyKey string) (*apiv1.CreateReleaseResponse, error) {
	stream := c.Releases.Create(ctx)
	if idempotencyKey != "" {
		stream.RequestHeader().Set(HeaderIdempotencyKey, idempotencyKey)
	}
	send := func(m *apiv1.CreateReleaseRequest) (stop bool, err error) {
		err = stream.Send(m)
		if errors.Is(err, io.EOF) {
			// The server answered early (a refusal or a replay): its answer
			// comes from CloseAndReceive.
			return true, nil
		}
		return false, err
	}
	stop, err := send(&apiv1.CreateReleaseRequest{Part: &apiv1.CreateReleaseRequest_Header{Header: &apiv1.CreateReleaseHeader{Manifest: manifest}}})
	buf := make([]byte, PushChunkBytes)
	for _, f := range files {
		if err != nil || stop {
			break
		}
		stop, err = send(&apiv1.CreateReleaseRequest{Part: &apiv1.CreateReleaseRequest_File{File: &apiv1.CreateReleaseFile{Name: f.Name}}})
		for err == nil && !stop {
			n, rerr := io.ReadFull(f.Content, buf)
			if n > 0 {
				stop, err = send(&apiv1.CreateReleaseRequest{Part: &apiv1.CreateReleaseRequest_Chunk{Chunk: buf[:n]}})
			}
			if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
				break
			}
			if rerr != nil && err == nil {
				err = rerr
			}
		}
	}
	if err != nil {
		_, _ = stream.CloseAndReceive()
		return nil, err
	}
	res, err := stream.CloseAndReceive()
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}
