package gateway

import (
	"context"
	"runtime/debug"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// unaryInterceptor turns a panic into INTERNAL and logs the call's end.
func (g *Gateway) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			g.log.Error("panic in agent call", "method", info.FullMethod, "panic", r, "stack", string(debug.Stack()))
			err = status.Error(codes.Internal, "internal error")
		}
		g.log.Debug("agent call", "method", info.FullMethod, "code", status.Code(err).String(), "took", time.Since(start), "peer", peerAddr(ctx))
	}()
	return handler(ctx, req)
}

// streamInterceptor turns a panic into INTERNAL and logs the stream's end.
func (g *Gateway) streamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			g.log.Error("panic in agent stream", "method", info.FullMethod, "panic", r, "stack", string(debug.Stack()))
			err = status.Error(codes.Internal, "internal error")
		}
		g.log.Debug("agent stream", "method", info.FullMethod, "code", status.Code(err).String(), "took", time.Since(start), "peer", peerAddr(ss.Context()))
	}()
	return handler(srv, ss)
}
