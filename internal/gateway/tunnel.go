package gateway

import (
	"errors"
	"io"
	"sync"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/tunnel"
)

// maxTunnelIDLen bounds the id a node presents (tunnel.NewID makes 43
// characters).
const maxTunnelIDLen = 64

// Tunnel carries one byte stream between a waiting API request and a
// guest's sshd; an empty first frame back accepts it. The node is authenticated from its mTLS certificate as
// Session does, and may only attach a tunnel id issued for it.
func (g *Gateway) Tunnel(stream grpc.BidiStreamingServer[agentv1.TunnelRequest, agentv1.TunnelResponse]) error {
	ctx := stream.Context()
	log := sessionLog{l: g.log, peer: peerAddr(ctx)}
	ident, _, err := g.peerIdentity(ctx)
	if err != nil {
		return g.refused(log, "tunnel refused", err)
	}
	log.node = ident.NodeID
	if ident.Role != RoleNode {
		return g.refused(log, "tunnel refused", denied("only node agents open tunnels"))
	}
	if g.cfg.Tunnels == nil {
		return status.Error(codes.Unimplemented, "this gateway carries no tunnels")
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	id := first.GetTunnelId()
	if id == "" || len(id) > maxTunnelIDLen || len(first.GetData()) > 0 {
		return g.refused(log, "tunnel refused", invalid("the first tunnel frame must carry a tunnel_id of 1-%d characters and no data", maxTunnelIDLen))
	}
	conn := &tunnelConn{stream: stream, done: make(chan struct{})}
	o := tunnel.Opened{Stream: conn}
	if msg := first.GetError(); msg != "" {
		if !utf8.ValidString(msg) {
			msg = "bcd could not reach the guest"
		}
		o = tunnel.Opened{Err: errors.New(truncateMessage(msg))}
	}
	// The accepting frame goes before any of the API side's bytes: hold
	// the send lock across the handover.
	conn.sendMu.Lock()
	err = g.cfg.Tunnels.Attach(id, ident.NodeID, o)
	if err != nil || o.Err != nil {
		conn.sendMu.Unlock()
	}
	switch {
	case errors.Is(err, tunnel.ErrWrongNode):
		return g.refused(log, "tunnel refused", denied("tunnel %s was not issued for node %s", id, ident.NodeID))
	case errors.Is(err, tunnel.ErrUnknownTunnel):
		return g.refused(log, "tunnel refused", status.Errorf(codes.NotFound, "no request waits for tunnel %s on this replica", id))
	case err != nil:
		return err
	}
	if o.Err != nil {
		// The node's failure went to the waiting request; the stream
		// itself ends cleanly.
		return nil //nolint:nilerr // o.Err is the guest's, reported to the request
	}
	// An empty frame tells bcd the tunnel was accepted.
	err = stream.Send(&agentv1.TunnelResponse{})
	conn.sendMu.Unlock()
	if err != nil {
		_ = conn.Close()
		return err
	}
	// The API side pipes and closes conn; the stream lives until then.
	select {
	case <-conn.done:
	case <-ctx.Done():
	}
	return nil
}

// tunnelConn is the node's stream as a byte stream: Read takes data frames,
// Write sends them. gRPC's flow control is the backpressure: a Write
// blocks while bcd does not read.
type tunnelConn struct {
	stream grpc.BidiStreamingServer[agentv1.TunnelRequest, agentv1.TunnelResponse]
	// sendMu orders Sends (the accepting frame, then data).
	sendMu sync.Mutex
	rest   []byte
	once   sync.Once
	done   chan struct{}
}

func (c *tunnelConn) Read(p []byte) (int, error) {
	for len(c.rest) == 0 {
		f, err := c.stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return 0, io.EOF
			}
			return 0, err
		}
		c.rest = f.GetData()
	}
	n := copy(p, c.rest)
	c.rest = c.rest[n:]
	return n, nil
}

func (c *tunnelConn) Write(p []byte) (int, error) {
	select {
	case <-c.done:
		return 0, io.ErrClosedPipe
	default:
	}
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	// gRPC may hold the slice until sent: send a copy.
	if err := c.stream.Send(&agentv1.TunnelResponse{Data: append([]byte(nil), p...)}); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Close ends the stream: the handler returns, which closes it for bcd.
func (c *tunnelConn) Close() error {
	c.once.Do(func() { close(c.done) })
	return nil
}
