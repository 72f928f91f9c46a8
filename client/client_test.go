package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/envelope"
)

// fakeServer speaks the real Connect protocol and records the headers each
// call arrived with.
type fakeServer struct {
	apiv1connect.UnimplementedIdentityServiceHandler
	apiv1connect.UnimplementedProjectServiceHandler

	mu      sync.Mutex
	headers []http.Header
	events  []*apiv1.Event
	// streamErr ends the watch stream after the events.
	streamErr error
	// limited is how many project reads are refused RATE_LIMITED first.
	limited int
}

// fakeEvents serves the fake's event stream: EventService and
// ProjectService both have a List, so one type cannot embed both.
type fakeEvents struct {
	apiv1connect.UnimplementedEventServiceHandler
	f *fakeServer
}

func (e fakeEvents) Watch(ctx context.Context, req *connect.Request[apiv1.WatchEventsRequest], stream *connect.ServerStream[apiv1.WatchEventsResponse]) error {
	return e.f.Watch(ctx, req, stream)
}

func (f *fakeServer) record(h http.Header) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.headers = append(f.headers, h.Clone())
}

func (f *fakeServer) setLimited(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.limited = n
}

func (f *fakeServer) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.headers)
}

func (f *fakeServer) lastHeader() http.Header {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.headers[len(f.headers)-1]
}

func (f *fakeServer) WhoAmI(_ context.Context, req *connect.Request[apiv1.WhoAmIRequest]) (*connect.Response[apiv1.WhoAmIResponse], error) {
	f.record(req.Header())
	return connect.NewResponse(&apiv1.WhoAmIResponse{PrincipalId: "svc_1", Kind: "service", TenantName: "acme"}), nil
}

func (f *fakeServer) Delete(_ context.Context, req *connect.Request[apiv1.DeleteProjectRequest]) (*connect.Response[apiv1.DeleteProjectResponse], error) {
	f.record(req.Header())
	cerr := connect.NewError(connect.CodeFailedPrecondition, errors.New("approval needed"))
	d, err := connect.NewErrorDetail(&apiv1.ErrorDetail{
		Code: "CONFIRMATION_REQUIRED", Message: "approval needed", ConfirmationId: "cfm_1",
		Violations: []*apiv1.FieldViolation{{Field: "project", Reason: "protected"}},
	})
	if err != nil {
		return nil, err
	}
	cerr.AddDetail(d)
	return nil, cerr
}

func (f *fakeServer) Get(_ context.Context, req *connect.Request[apiv1.GetProjectRequest]) (*connect.Response[apiv1.GetProjectResponse], error) {
	f.record(req.Header())
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.limited > 0 {
		f.limited--
		return nil, envelope.ToConnect(&envelope.Error{Code: envelope.CodeRateLimited, Message: "slow down", RetryAfter: 10 * time.Millisecond})
	}
	return connect.NewResponse(&apiv1.GetProjectResponse{Project: &apiv1.Project{Name: req.Msg.GetProject()}}), nil
}

func (f *fakeServer) Watch(_ context.Context, req *connect.Request[apiv1.WatchEventsRequest], stream *connect.ServerStream[apiv1.WatchEventsResponse]) error {
	f.record(req.Header())
	for _, ev := range f.events {
		if err := stream.Send(&apiv1.WatchEventsResponse{Event: ev}); err != nil {
			return err
		}
	}
	return f.streamErr
}

type bundle struct {
	fake *fakeServer
	srv  *httptest.Server
}

func setup(t *testing.T, tls bool) bundle {
	t.Helper()
	fake := &fakeServer{}
	mux := http.NewServeMux()
	mux.Handle(apiv1connect.NewIdentityServiceHandler(fake))
	mux.Handle(apiv1connect.NewEventServiceHandler(fakeEvents{f: fake}))
	mux.Handle(apiv1connect.NewProjectServiceHandler(fake))
	srv := httptest.NewUnstartedServer(mux)
	if tls {
		srv.EnableHTTP2 = true
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return bundle{fake: fake, srv: srv}
}

func TestBearerAndHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	c := client.New(b.srv.URL+"/", "bc_secret", client.WithHTTPClient(b.srv.Client()),
		client.WithHeader("X-Request-Id", "req-1"), client.WithHeader("Authorization", "Bearer spoofed"))

	resp, err := c.Identity.WhoAmI(t.Context(), connect.NewRequest(&apiv1.WhoAmIRequest{}))
	require.NoError(t, err)
	require.Equal(t, "acme", resp.Msg.GetTenantName())
	h := b.fake.lastHeader()
	require.Equal(t, "Bearer bc_secret", h.Get("Authorization"))
	require.Equal(t, "req-1", h.Get("X-Request-Id"))
}

func TestNoTokenSendsNoAuthorization(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	c := client.New(b.srv.URL, "", client.WithHTTPClient(b.srv.Client()))
	_, err := c.Identity.WhoAmI(t.Context(), connect.NewRequest(&apiv1.WhoAmIRequest{}))
	require.NoError(t, err)
	require.Empty(t, b.fake.lastHeader().Values("Authorization"))
}

func TestGRPC(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	c := client.New(b.srv.URL, "bc_grpc", client.WithHTTPClient(b.srv.Client()), client.WithGRPC())
	_, err := c.Identity.WhoAmI(t.Context(), connect.NewRequest(&apiv1.WhoAmIRequest{}))
	require.NoError(t, err)
	h := b.fake.lastHeader()
	require.Equal(t, "Bearer bc_grpc", h.Get("Authorization"))
	require.Contains(t, h.Get("Content-Type"), "application/grpc")
}

func TestErrorDetailAndCode(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	c := client.New(b.srv.URL, "bc_x", client.WithHTTPClient(b.srv.Client()))

	req := connect.NewRequest(&apiv1.DeleteProjectRequest{Tenant: "acme", Project: "web"})
	req.Header().Set(client.HeaderConfirmationID, "cfm_0")
	_, err := c.Projects.Delete(t.Context(), req)
	require.Error(t, err)
	require.Equal(t, "cfm_0", b.fake.lastHeader().Get(client.HeaderConfirmationID))

	d := client.Detail(err)
	require.NotNil(t, d)
	require.Equal(t, "cfm_1", d.GetConfirmationId())
	require.Equal(t, "project", d.GetViolations()[0].GetField())

	tests := []struct {
		name string
		err  error
		want string
	}{
		{"nil", nil, ""},
		{"detail wins over connect code", err, "CONFIRMATION_REQUIRED"},
		{"connect code", connect.NewError(connect.CodeInvalidArgument, errors.New("x")), "INVALID_ARGUMENT"},
		{"unauthenticated", connect.NewError(connect.CodeUnauthenticated, errors.New("x")), "UNAUTHENTICATED"},
		{"plain error", errors.New("boom"), "UNKNOWN"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, client.Code(tt.err))
		})
	}
	require.Nil(t, client.Detail(errors.New("plain")))
}

func TestUnimplementedCode(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	c := client.New(b.srv.URL, "bc_x", client.WithHTTPClient(b.srv.Client()))
	_, err := c.Projects.List(t.Context(), connect.NewRequest(&apiv1.ListProjectsRequest{}))
	require.Equal(t, "UNIMPLEMENTED", client.Code(err))
	require.Nil(t, client.Detail(err))
}

func TestWatch(t *testing.T) {
	t.Parallel()
	events := []*apiv1.Event{{Id: "1", Type: "tenant.created"}, {Id: "2", Type: "project.created"}, {Id: "3", Type: "project.deleted"}}

	t.Run("follows the stream to its end", func(t *testing.T) {
		t.Parallel()
		b := setup(t, false)
		b.fake.events = events
		c := client.New(b.srv.URL, "bc_w", client.WithHTTPClient(b.srv.Client()))
		var got []string
		err := c.Watch(t.Context(), &apiv1.WatchEventsRequest{After: "0"}, func(ev *apiv1.Event) error {
			got = append(got, ev.GetId())
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, []string{"1", "2", "3"}, got)
		require.Equal(t, "Bearer bc_w", b.fake.lastHeader().Get("Authorization"))
	})

	t.Run("returns fn's error", func(t *testing.T) {
		t.Parallel()
		b := setup(t, false)
		b.fake.events = events
		c := client.New(b.srv.URL, "bc_w", client.WithHTTPClient(b.srv.Client()))
		stop := errors.New("stop")
		var got []string
		err := c.Watch(t.Context(), &apiv1.WatchEventsRequest{}, func(ev *apiv1.Event) error {
			got = append(got, ev.GetId())
			if ev.GetId() == "2" {
				return stop
			}
			return nil
		})
		require.ErrorIs(t, err, stop)
		require.Equal(t, []string{"1", "2"}, got)
	})

	t.Run("returns the stream's error", func(t *testing.T) {
		t.Parallel()
		b := setup(t, false)
		b.fake.events = events[:1]
		b.fake.streamErr = connect.NewError(connect.CodePermissionDenied, errors.New("no"))
		c := client.New(b.srv.URL, "bc_w", client.WithHTTPClient(b.srv.Client()))
		err := c.Watch(t.Context(), &apiv1.WatchEventsRequest{}, func(*apiv1.Event) error { return nil })
		require.Equal(t, "PERMISSION_DENIED", client.Code(err))
	})
}

func TestNewIdempotencyKeyIsFresh(t *testing.T) {
	t.Parallel()
	a, b := client.NewIdempotencyKey(), client.NewIdempotencyKey()
	require.NotEmpty(t, a)
	require.NotEqual(t, a, b)
}

// TestRateLimitRetry: with WithRateLimitRetry a call refused RATE_LIMITED
// is sent again after the refusal's delay, until it passes or the wait
// would pass the bound; without it the refusal comes back at once.
func TestRateLimitRetry(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	get := func(c *client.Client) error {
		_, err := c.Projects.Get(t.Context(), connect.NewRequest(&apiv1.GetProjectRequest{Project: "p"}))
		return err
	}
	b.fake.setLimited(1)
	require.Equal(t, "RATE_LIMITED", client.Code(get(client.New(b.srv.URL, "bc_x"))), "no retry unless asked")
	b.fake.setLimited(3)
	require.NoError(t, get(client.New(b.srv.URL, "bc_x", client.WithRateLimitRetry(time.Second))))
	require.Equal(t, 1+4, b.fake.calls())
	b.fake.setLimited(100)
	require.Equal(t, "RATE_LIMITED", client.Code(get(client.New(b.srv.URL, "bc_x", client.WithRateLimitRetry(25*time.Millisecond)))),
		"two waits of 10ms fit the bound, a third does not")
	require.Equal(t, 5+3, b.fake.calls())
}
