package console_test

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/console"
)

// openLive opens the console's event stream with b's session and returns
// its lines as they come; the stream ends with the test.
func openLive(t *testing.T, b *browser, query string) (reply, <-chan string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.base+console.PathLive+query, nil)
	require.NoError(t, err)
	res, err := b.c.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { _ = res.Body.Close() })
	lines := make(chan string, 256)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
	return reply{StatusCode: res.StatusCode, Header: res.Header}, lines
}

// TestConsoleLive: the console's stream is the API's, read with the
// viewer's own key: acme's viewer sees acme's events and never rival's,
// each as an unnamed message (its type is in its JSON).
func TestConsoleLive(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	who, err := f.cp.Client(f.viewer).Identity.WhoAmI(ctx, connect.NewRequest(&apiv1.WhoAmIRequest{}))
	require.NoError(t, err)
	acmeID := who.Msg.GetTenantId()

	b := newBrowser(t, f.cp.URL, nil)
	res, _ := b.get(console.PathLive)
	require.Equal(t, http.StatusSeeOther, res.StatusCode, "no session: sent to sign in")
	b.signIn(f.viewer)

	// A viewer's page names the stream; the sign-in page does not.
	_, body := b.get(console.PathOverview)
	require.Contains(t, body, `data-live-url="`+console.PathLive+`"`)
	require.Contains(t, body, `src="/console/assets/console.js"`)

	live, lines := openLive(t, b, "?types=reservation.*&tenant=rival")
	require.Equal(t, http.StatusOK, live.StatusCode)
	require.Equal(t, "text/event-stream", live.Header.Get("Content-Type"))
	require.Equal(t, console.ContentSecurityPolicy, live.Header.Get("Content-Security-Policy"))
	for l := range lines {
		if l == ": connected" {
			break
		}
	}

	// rival's reservation comes first: were it leaked, it would be read
	// before acme's.
	rival, err := f.cp.Client(f.rivalMember).Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{
		Tenant: "rival", Pool: "gpu", Gpus: 1, DurationSeconds: 3600}))
	require.NoError(t, err)
	mine, err := f.cp.Client(f.member).Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{
		Tenant: "acme", Pool: "gpu", Gpus: 1, DurationSeconds: 3600}))
	require.NoError(t, err)
	rivalID, mineID := rival.Msg.GetReservation().GetId(), mine.Msg.GetReservation().GetId()

	var data []string
	for l := range lines {
		require.False(t, strings.HasPrefix(l, "event: "), "events reach the script unnamed: %s", l)
		if d, ok := strings.CutPrefix(l, "data: "); ok {
			data = append(data, d)
			if strings.Contains(d, mineID) {
				break
			}
		}
	}
	require.NotEmpty(t, data, "acme's reservation reached the stream")
	for _, d := range data {
		require.NotContains(t, d, rivalID)
		require.Contains(t, d, `"tenantId":"`+acmeID+`"`)
		require.Contains(t, d, `"type":"reservation.`)
	}

	// A type filter the API refuses is answered with its status and
	// message, not streamed.
	res, body = b.get(console.PathLive + "?types=%5B")
	require.Equal(t, http.StatusBadRequest, res.StatusCode, body)
	require.Contains(t, body, "INVALID_ARGUMENT")
	require.Contains(t, body, "types")
}
