package placer

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

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

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
