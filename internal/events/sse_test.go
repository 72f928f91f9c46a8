package events_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/events"
)

// sseFrame is one event frame of the stream.
type sseFrame struct {
	id, event string
	data      map[string]any
}

// sseStream is a Go client of /v1/events/stream: frames and comment lines
// as they arrive.
type sseStream struct {
	frames      chan sseFrame
	comments    chan string
	contentType string
}

// openSSE opens a stream; a refused one gives its status and error body.
func openSSE(t *testing.T, ctx context.Context, base, token, query, lastID string) (*sseStream, int, envelope.HTTPError) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+events.SSEPath+query, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	res, err := http.DefaultClient.Do(req) //nolint:bodyclose // closed below, or by the reader goroutine when the stream ends
	require.NoError(t, err)
	if res.StatusCode != http.StatusOK {
		defer res.Body.Close()
		var e envelope.HTTPError
		require.NoError(t, json.NewDecoder(res.Body).Decode(&e))
		e.Message += " (Retry-After: " + res.Header.Get("Retry-After") + ")"
		return nil, res.StatusCode, e
	}
	s := &sseStream{frames: make(chan sseFrame, 100), comments: make(chan string, 100), contentType: res.Header.Get("Content-Type")}
	go func() {
		defer res.Body.Close()
		sc := bufio.NewScanner(res.Body)
		var f sseFrame
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if f.id != "" || f.event != "" {
					s.frames <- f
				}
				f = sseFrame{}
			case strings.HasPrefix(line, ":"):
				select {
				case s.comments <- strings.TrimSpace(line[1:]):
				default:
				}
			case strings.HasPrefix(line, "id: "):
				f.id = line[4:]
			case strings.HasPrefix(line, "event: "):
				f.event = line[7:]
			case strings.HasPrefix(line, "data: "):
				_ = json.Unmarshal([]byte(line[6:]), &f.data)
			}
		}
		close(s.frames)
	}()
	return s, http.StatusOK, envelope.HTTPError{}
}

func sseKey(t *testing.T, cp *bctest.ControlPlane, tenant, role string) string {
	t.Helper()
	k, err := cp.Admin().ApiKeys.Create(context.Background(), connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: tenant, Role: role}))
	require.NoError(t, err)
	return k.Msg.GetSecret()
}

func mkProject(t *testing.T, cp *bctest.ControlPlane, tenant, name string) {
	t.Helper()
	_, err := cp.Admin().Projects.Create(context.Background(), connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: tenant, Name: name}))
	require.NoError(t, err)
}

// TestSSEResumeAndScope: the stream serves the tenant's events (filtered by
// type glob) with heartbeats, resumes after Last-Event-ID, refuses another
// tenant's stream, and bounds the streams one key holds open.
func TestSSEResumeAndScope(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t, func(c *app.Config) {
		c.SSEHeartbeat = 20 * time.Millisecond
		c.Limits = envelope.Limits{MaxStreams: 3}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin := cp.Admin()
	for _, n := range []string{"acme", "other"} {
		_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: n}))
		require.NoError(t, err)
	}
	viewer := sseKey(t, cp, "acme", "viewer")

	s, _, _ := openSSE(t, ctx, cp.URL, viewer, "?tenant=acme&types=project.*", "")
	require.NotNil(t, s, "the stream opens")
	require.Equal(t, "text/event-stream", s.contentType)
	mkProject(t, cp, "other", "not-mine")
	for _, n := range []string{"a", "b", "c"} {
		mkProject(t, cp, "acme", n)
	}
	var got []sseFrame
	for range 3 {
		got = append(got, bctest.Receive(t, "an event", s.frames))
	}
	for i, f := range got {
		require.Equal(t, "project.created", f.event)
		require.Equal(t, f.id, f.data["id"])
		require.Equal(t, "Project", f.data["resourceType"], "frame %d", i)
		require.Equal(t, got[0].data["tenantId"], f.data["tenantId"], "frame %d: acme's only", i)
	}
	require.Equal(t, "connected", bctest.Receive(t, "the opening comment", s.comments))
	require.Equal(t, "heartbeat", bctest.Receive(t, "a heartbeat", s.comments))

	// Resume after the first: the other two, nothing before.
	r, _, _ := openSSE(t, ctx, cp.URL, viewer, "?tenant=acme&types=project.*", got[0].id)
	require.NotNil(t, r)
	require.Equal(t, got[1].id, bctest.Receive(t, "the second", r.frames).id)
	require.Equal(t, got[2].id, bctest.Receive(t, "the third", r.frames).id)

	// A third stream of this key is the limit; a fourth is refused.
	third, _, _ := openSSE(t, ctx, cp.URL, viewer, "?tenant=acme", "")
	require.NotNil(t, third)
	_, status, e := openSSE(t, ctx, cp.URL, viewer, "?tenant=acme", "")
	require.Equal(t, http.StatusTooManyRequests, status)
	require.Equal(t, "TOO_MANY_STREAMS", e.Code)
	require.Contains(t, e.Message, "at most 3")
	require.NotContains(t, e.Message, "(Retry-After: )", "a Retry-After header")

	// Another tenant's key, and bad requests.
	evil := sseKey(t, cp, "other", "admin")
	for _, tc := range []struct {
		token, query, last string
		status             int
		code               string
	}{
		{evil, "?tenant=acme", "", http.StatusForbidden, "PERMISSION_DENIED"},
		{"bc_nope", "?tenant=acme", "", http.StatusUnauthorized, "UNAUTHENTICATED"},
		{evil, "?tenant=other", "x", http.StatusBadRequest, "INVALID_ARGUMENT"},
		{evil, "?tenant=other", "999999999", http.StatusBadRequest, "INVALID_ARGUMENT"},
		{evil, "?tenant=other&bogus=1", "", http.StatusBadRequest, "INVALID_ARGUMENT"},
		{evil, "?tenant=other&types=[", "", http.StatusBadRequest, "INVALID_ARGUMENT"},
	} {
		_, status, e := openSSE(t, ctx, cp.URL, tc.token, tc.query, tc.last)
		require.Equal(t, tc.status, status, "%s %s", tc.query, tc.last)
		require.Equal(t, tc.code, e.Code, "%s %s: %s", tc.query, tc.last, e.Message)
	}
	// other's own stream (no tenant= is the key's own tenant), even
	// resumed from a cursor of acme's, carries none of acme's events.
	mine, _, _ := openSSE(t, ctx, cp.URL, evil, "?types=project.*", got[0].id)
	require.NotNil(t, mine)
	mkProject(t, cp, "other", "mine")
	f := bctest.Receive(t, "other's event", mine.frames)
	require.Equal(t, "project.created", f.event)
	require.Equal(t, "Project", f.data["resourceType"])
	require.NotEqual(t, got[1].data["tenantId"], f.data["tenantId"], "not acme's")
}

// TestSSEWithCurl: curl -N follows the stream and resumes with
// Last-Event-ID.
func TestSSEWithCurl(t *testing.T) {
	t.Parallel()
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("curl is not installed")
	}
	cp := bctest.NewControlPlane(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err = cp.Admin().Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	key := sseKey(t, cp, "acme", "member")

	run := func(lastID string) (ids chan string, stop func()) {
		cctx, ccancel := context.WithCancel(ctx)
		args := []string{"-N", "-s", "-H", "Authorization: Bearer " + key, cp.URL + events.SSEPath + "?tenant=acme&types=project.created"}
		if lastID != "" {
			args = append(args, "-H", "Last-Event-ID: "+lastID)
		}
		cmd := exec.CommandContext(cctx, curl, args...)
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		ids = make(chan string, 100)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if id, ok := strings.CutPrefix(sc.Text(), "id: "); ok {
					ids <- id
				}
				if sc.Text() == ": connected" {
					ids <- "connected"
				}
			}
			_, _ = io.Copy(io.Discard, out)
		}()
		return ids, func() { ccancel(); _ = cmd.Wait() }
	}
	ids, stop := run("")
	require.Equal(t, "connected", bctest.Receive(t, "curl connected", ids))
	for _, n := range []string{"a", "b", "c"} {
		mkProject(t, cp, "acme", n)
	}
	first := bctest.Receive(t, "the first event", ids)
	second := bctest.Receive(t, "the second event", ids)
	third := bctest.Receive(t, "the third event", ids)
	stop()

	again, stop2 := run(first)
	defer stop2()
	require.Equal(t, "connected", bctest.Receive(t, "curl reconnected", again))
	require.Equal(t, second, bctest.Receive(t, "the second again", again))
	require.Equal(t, third, bctest.Receive(t, "the third again", again))
}
