package client

import (
	"context"
	"errors"
	"io"

	"connectrpc.com/connect"

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

// PullImage streams an image's content from req's offset into w and
// returns the image. It does not check the bytes: a caller that uses them
// verifies them (imagesig.CopyVerified over what it wrote, or a sha256 of
// the whole).
func (c *Client) PullImage(ctx context.Context, req *apiv1.PullImageRequest, w io.Writer) (*apiv1.Image, error) {
	stream, err := c.Images.Pull(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	defer func() { _ = stream.Close() }()
	var img *apiv1.Image
	for stream.Receive() {
		switch part := stream.Msg().GetPart().(type) {
		case *apiv1.PullImageResponse_Image:
			img = part.Image
		case *apiv1.PullImageResponse_Chunk:
			if img == nil {
				return nil, errors.New("pull: content before the image")
			}
			if _, err := w.Write(part.Chunk); err != nil {
				return img, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return img, err
	}
	if img == nil {
		return nil, errors.New("pull: the stream ended without the image")
	}
	return img, nil
}
