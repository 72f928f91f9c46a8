package placer_test

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/capacity/placer"
)

// TestForwardOwnerResetIsUnavailable: the owner a mutation is forwarded to
// dies under the call (SIGKILL: the kernel resets its connections).
// connect-go reads the reset as the peer going away, CANCELED, and Forward
// passed that on, telling a caller who cancelled nothing that it had; the
// replica torture test met it. The caller is told UNAVAILABLE, retryable,
// as for an owner that does not answer; one whose own context ended is
// still told CANCELED.
func TestForwardOwnerResetIsUnavailable(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	// The dying owner: it reads the whole request, then resets the
	// connection (linger 0) instead of answering.
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			if req, err := http.ReadRequest(bufio.NewReader(conn)); err == nil {
				_ = req.Body.Close()
			}
			_ = conn.(*net.TCPConn).SetLinger(0)
			_ = conn.Close()
		}
	}()
	forward := func(ctx context.Context) error {
		var e placer.Placers
		e.SetForwardClient(&http.Client{})
		_, err := placer.Forward[apiv1.ExtendReservationRequest, apiv1.ExtendReservationResponse](ctx, &e, "http://"+ln.Addr().String(),
			apiv1connect.ReservationServiceExtendProcedure, connect.NewRequest(&apiv1.ExtendReservationRequest{Tenant: "acme", Reservation: "rsv_1", ExtendSeconds: 60}))
		return err
	}
	err = forward(context.Background())
	require.Error(t, err)
	require.Equal(t, connect.CodeUnavailable, connect.CodeOf(err), "%v", err)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.Equal(t, connect.CodeCanceled, connect.CodeOf(forward(ctx)), "the caller's own cancel")
}
