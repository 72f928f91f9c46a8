package gateway

import "google.golang.org/grpc"

// windowBytes is the HTTP/2 flow-control window of a session stream and of
// its connection. It bounds what an agent can have in flight that the
// gateway has not read yet; 256 KiB moves a 1 MiB inventory section in four
// round trips.
const windowBytes = 256 << 10

// bufferOptions size the server's per-connection buffers for many idle
// sessions (docs/benchmarks.md, "Agent gateway").
//
//   - Read buffer off. grpc-go's default gives every connection a 32 KiB
//     bufio.Reader for its whole life, the largest single item of a
//     session's memory. Over TLS it buys nothing: crypto/tls reads whole
//     records into its own buffer and the framer reads frames from that.
//   - Fixed flow-control windows. With grpc-go's dynamic windows the server
//     answers the first data frame after each ping ack with a
//     bandwidth-estimation ping, so every heartbeat of every session cost
//     a ping written and an ack read. A fixed window sends none, and it
//     bounds unread data per stream instead of letting it grow to 16 MiB.
//   - The 32 KiB write buffer stays: grpc-go shares it between connections
//     (SharedWriteBuffer is on by default), so a connection holds one only
//     while it writes.
func bufferOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ReadBufferSize(0),
		grpc.StaticStreamWindowSize(windowBytes),
		grpc.StaticConnWindowSize(windowBytes),
	}
}
