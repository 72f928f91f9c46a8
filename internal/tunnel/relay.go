package tunnel

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// A node opens its tunnel on its gateway session, so the request waiting for
// it must be on the replica holding that session. A replica that redeems a
// ticket for a node whose session is elsewhere hands the redeemed ticket to
// that replica (Forward), which opens the tunnel as if redeemed there and
// answers with the same upgrade; the first replica pipes the two
// connections. One hop only: the replica that takes a forwarded ticket opens
// the tunnel itself, never forwards it again.

// Replica-to-replica contract of a forwarded tunnel.
const (
	// ForwardPath is the peer endpoint: GET with Upgrade, served only to
	// replicas (a verified client certificate of the internal CA).
	ForwardPath = "/internal/v1/ssh/tunnel"
	// HeaderForwardedTicket carries the redeemed ticket, base64url JSON.
	HeaderForwardedTicket = "X-BC-Forwarded-Ticket"
)

// ErrForwardedTicket: a forwarded request's ticket is missing, malformed or
// expired.
var ErrForwardedTicket = errors.New("tunnel: the forwarded ticket is missing, malformed or expired")

// maxForwardedTicket bounds the header: ids of at most a few hundred bytes.
const maxForwardedTicket = 4 << 10

// forwarded is a ticket on the wire between replicas.
type forwarded struct {
	TenantID   string    `json:"tenant_id"`
	InstanceID string    `json:"instance_id"`
	HostID     string    `json:"host_id"`
	NodeID     string    `json:"node_id"`
	Expire     time.Time `json:"expire"`
}

// Forward asks the replica at baseURL, which holds t's node's session, to
// open the tunnel of the redeemed ticket t, over rt (the replicas' mutually
// authenticated transport; it must speak HTTP/1.1 to that endpoint, as an
// upgrade needs). The connection it returns carries the guest's SSH stream;
// a refusal is a *RefusedError with the peer's status and message.
func Forward(ctx context.Context, rt http.RoundTripper, baseURL string, t Ticket) (io.ReadWriteCloser, error) {
	b, err := json.Marshal(forwarded(t))
	if err != nil {
		return nil, fmt.Errorf("tunnel: forward: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(baseURL, "/")+ForwardPath, nil)
	if err != nil {
		return nil, fmt.Errorf("tunnel: forward to %s: %w", baseURL, err)
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", Protocol)
	req.Header.Set(HeaderForwardedTicket, base64.RawURLEncoding.EncodeToString(b))
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return nil, fmt.Errorf("tunnel: forward to %s: %w", baseURL, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer func() { _ = resp.Body.Close() }()
		refused := &RefusedError{Status: resp.StatusCode}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(body, &refused.ErrorBody) != nil {
			refused.Code, refused.Message = http.StatusText(resp.StatusCode), strings.TrimSpace(string(body))
		}
		return nil, refused
	}
	// net/http hands a 101's connection over as the body.
	conn, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		_ = resp.Body.Close()
		return nil, fmt.Errorf("tunnel: forward to %s: the transport cannot carry an upgraded connection", baseURL)
	}
	return conn, nil
}

// ForwardedTicket reads the ticket of a forwarded request. It must not have
// expired by now: the replica that redeemed it forwards at once.
func ForwardedTicket(r *http.Request, now time.Time) (Ticket, error) {
	v := r.Header.Get(HeaderForwardedTicket)
	if v == "" || len(v) > maxForwardedTicket {
		return Ticket{}, ErrForwardedTicket
	}
	b, err := base64.RawURLEncoding.DecodeString(v)
	if err != nil {
		return Ticket{}, fmt.Errorf("%w: %w", ErrForwardedTicket, err)
	}
	var f forwarded
	if err := json.Unmarshal(b, &f); err != nil {
		return Ticket{}, fmt.Errorf("%w: %w", ErrForwardedTicket, err)
	}
	if f.TenantID == "" || f.InstanceID == "" || f.HostID == "" || f.NodeID == "" || !now.Before(f.Expire) {
		return Ticket{}, ErrForwardedTicket
	}
	return Ticket(f), nil
}
