package placer

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/emptypb"
)

// TestForwardUsesTheReplicaClient: a forward goes out only on the client
// set with SetForwardClient (the replica transport); without one the
// caller's bearer is sent nowhere.
func TestForwardUsesTheReplicaClient(t *testing.T) {
	t.Parallel()
	var reached atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		require.Equal(t, "Bearer bc_caller", r.Header.Get("Authorization"))
		w.Header().Set("Content-Type", "application/proto")
	}))
	t.Cleanup(srv.Close)
	req := func() *connect.Request[emptypb.Empty] {
		r := connect.NewRequest(&emptypb.Empty{})
		r.Header().Set("Authorization", "Bearer bc_caller")
		return r
	}
	e := &Placers{}
	_, err := Forward[emptypb.Empty, emptypb.Empty](context.Background(), e, srv.URL, "/x.v1.S/M", req())
	require.Equal(t, connect.CodeUnavailable, connect.CodeOf(err))
	require.ErrorContains(t, err, "no replica certificate")
	require.Zero(t, reached.Load())

	var used atomic.Int32
	client := srv.Client()
	inner := client.Transport
	client.Transport = roundTripper(func(r *http.Request) (*http.Response, error) {
		used.Add(1)
		return inner.RoundTrip(r)
	})
	e.SetForwardClient(client)
	_, err = Forward[emptypb.Empty, emptypb.Empty](context.Background(), e, srv.URL, "/x.v1.S/M", req())
	require.NoError(t, err)
	require.Equal(t, int32(1), used.Load())
	require.Equal(t, int32(1), reached.Load())
}

// TestForwardStreamRefusals: a stream is forwarded only on the replica
// client, one hop only, and a peer that does not answer is UNAVAILABLE
// with a retry hint.
func TestForwardStreamRefusals(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	down := srv.URL
	srv.Close()
	req := func(forwarded bool) *connect.Request[emptypb.Empty] {
		r := connect.NewRequest(&emptypb.Empty{})
		r.Header().Set("Authorization", "Bearer bc_caller")
		if forwarded {
			r.Header().Set(ForwardedHeader, "rep_x")
		}
		return r
	}
	ctx := context.Background()
	e := &Placers{}
	err := ForwardStream[emptypb.Empty, emptypb.Empty](ctx, e, down, "/x.v1.S/M", "node n's session", req(false), nil)
	require.Equal(t, connect.CodeUnavailable, connect.CodeOf(err))
	require.ErrorContains(t, err, "another replica holds node n's session and this one has no replica certificate")

	e.SetForwardClient(&http.Client{Transport: http.DefaultTransport, Timeout: time.Minute})
	err = ForwardStream[emptypb.Empty, emptypb.Empty](ctx, e, down, "/x.v1.S/M", "node n's session", req(true), nil)
	require.Equal(t, connect.CodeUnavailable, connect.CodeOf(err))
	require.ErrorContains(t, err, "the replica this call was forwarded to no longer holds node n's session; retry")

	err = ForwardStream[emptypb.Empty, emptypb.Empty](ctx, e, down, "/x.v1.S/M", "node n's session", req(false), nil)
	require.Equal(t, connect.CodeUnavailable, connect.CodeOf(err))
	require.ErrorContains(t, err, "the replica that holds node n's session did not answer; retry")
	var ce *connect.Error
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "1", ce.Meta().Get("Retry-After"))
	require.Zero(t, e.cl().stream.Timeout, "a stream lasts as long as what it relays")
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
