package tunnel_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/tunnel"
)

// TestForwardCarriesTheTicketAndTheStream: the peer reads the ticket the
// redeeming replica forwarded, answers 101 and carries bytes both ways; a
// refusal comes back with the peer's status, code and message.
func TestForwardCarriesTheTicketAndTheStream(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tk := tunnel.Ticket{TenantID: "tnt_a", InstanceID: "ins_1", HostID: "ins-1", NodeID: "nod_1", Expire: now.Add(time.Minute)}
	got := make(chan tunnel.Ticket, 1)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.Equal(t, tunnel.ForwardPath, r.URL.Path)
		ft, err := tunnel.ForwardedTicket(r, now)
		if err != nil {
			w.WriteHeader(http.StatusUnauthorized)
			_ = json.NewEncoder(w).Encode(tunnel.ErrorBody{Code: "UNAUTHENTICATED", Message: err.Error()})
			return
		}
		got <- ft
		conn, brw, err := http.NewResponseController(w).Hijack()
		require.NoError(t, err)
		defer conn.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + tunnel.Protocol + "\r\n\r\n")
		_ = brw.Flush()
		// Echo one line.
		line, _ := bufio.NewReader(brw).ReadString('\n')
		_, _ = conn.Write([]byte("echo " + line))
	}))
	t.Cleanup(srv.Close)
	rt := srv.Client().Transport

	conn, err := tunnel.Forward(context.Background(), rt, srv.URL, tk)
	require.NoError(t, err)
	require.Equal(t, tk, <-got)
	_, err = conn.Write([]byte("hi\n"))
	require.NoError(t, err)
	b, err := io.ReadAll(conn)
	require.NoError(t, err)
	require.Equal(t, "echo hi\n", string(b))
	require.NoError(t, conn.Close())

	expired := tk
	expired.Expire = now
	_, err = tunnel.Forward(context.Background(), rt, srv.URL, expired)
	var refused *tunnel.RefusedError
	require.ErrorAs(t, err, &refused)
	require.Equal(t, http.StatusUnauthorized, refused.Status)
	require.Equal(t, "UNAUTHENTICATED", refused.Code)
	require.Contains(t, refused.Message, "forwarded ticket")
}

func TestForwardedTicketRefusesGarbage(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, v := range []string{"", "!!!", "e30", "eyJ0ZW5hbnRfaWQiOiJ4In0"} { // "", bad base64, {}, a partial ticket
		r := httptest.NewRequest(http.MethodGet, tunnel.ForwardPath, nil)
		if v != "" {
			r.Header.Set(tunnel.HeaderForwardedTicket, v)
		}
		_, err := tunnel.ForwardedTicket(r, now)
		require.ErrorIs(t, err, tunnel.ErrForwardedTicket, v)
	}
}
