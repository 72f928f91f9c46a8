package client

import (
	"context"
	"errors"
	"io"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// PushChunkBytes is the size of the chunks PushImage sends: well under the
// server's 1 MiB message cap.
const PushChunkBytes = 256 << 10

// PushImage streams an image: hdr first (its sha256 and size_bytes must
// describe exactly what r yields, or the server keeps nothing and answers
// DIGEST_MISMATCH), then r in chunks. It never holds more than one chunk in
// memory. idempotencyKey may be empty.
func (c *Client) PushImage(ctx context.Context, hdr *apiv1.PushImageHeader, r io.Reader, idempotencyKey string) (*apiv1.PushImageResponse, error) {
	stream := c.Images.Push(ctx)
	if idempotencyKey != "" {
		stream.RequestHeader().Set(HeaderIdempotencyKey, idempotencyKey)
	}
	send := func(m *apiv1.PushImageRequest) (stop bool, err error) {
		err = stream.Send(m)
		if errors.Is(err, io.EOF) {
			// The server answered early (a refusal or a replay): its answer
			// comes from CloseAndReceive.
			return true, nil
		}
		return false, err
	}
	stop, err := send(&apiv1.PushImageRequest{Part: &apiv1.PushImageRequest_Header{Header: hdr}})
	buf := make([]byte, PushChunkBytes)
	for err == nil && !stop {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			stop, err = send(&apiv1.PushImageRequest{Part: &apiv1.PushImageRequest_Chunk{Chunk: buf[:n]}})
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil && err == nil {
			err = rerr
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
