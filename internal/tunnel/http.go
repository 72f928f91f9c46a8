package tunnel

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
)

// HTTP contract of the tunnel endpoint on the API listener.
const (
	// Path is the endpoint: GET with Upgrade, answered 101 then raw bytes.
	Path = "/v1/ssh/tunnel"
	// HeaderTicket carries the ticket.
	HeaderTicket = "X-BC-SSH-Ticket"
	// Protocol is the Upgrade token.
	Protocol = "bc-ssh-tunnel"
)

// ErrorBody is the JSON body of a refused tunnel request.
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// RefusedError is a tunnel request the server refused.
type RefusedError struct {
	Status int
	ErrorBody
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("ssh tunnel refused (%d %s): %s", e.Status, e.Code, e.Message)
}

// Dial opens a tunnel with a ticket against the API at baseURL (http or
// https; tlsConfig is used for https). The connection carries the guest's
// SSH stream.
func Dial(ctx context.Context, baseURL, ticket string, tlsConfig *tls.Config) (net.Conn, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("tunnel: api url %q: %w", baseURL, err)
	}
	host := u.Host
	if u.Port() == "" {
		if u.Scheme == "https" {
			host = net.JoinHostPort(u.Hostname(), "443")
		} else {
			host = net.JoinHostPort(u.Hostname(), "80")
		}
	}
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, fmt.Errorf("tunnel: dial %s: %w", host, err)
	}
	conn := raw
	if u.Scheme == "https" {
		cfg := &tls.Config{}
		if tlsConfig != nil {
			cfg = tlsConfig.Clone()
		}
		if cfg.ServerName == "" {
			cfg.ServerName = u.Hostname()
		}
		// HTTP/1.1 only: Upgrade does not exist in HTTP/2.
		cfg.NextProtos = []string{"http/1.1"}
		tc := tls.Client(raw, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = raw.Close()
			return nil, fmt.Errorf("tunnel: tls: %w", err)
		}
		conn = tc
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	path := strings.TrimSuffix(u.Path, "/") + Path
	req := fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: %s\r\n%s: %s\r\n\r\n", path, u.Host, Protocol, HeaderTicket, ticket)
	if _, err := io.WriteString(conn, req); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("tunnel: send request: %w", err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodGet})
	if err != nil {
		_ = conn.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("tunnel: %w", ctx.Err())
		}
		return nil, fmt.Errorf("tunnel: read response: %w", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer func() { _ = resp.Body.Close(); _ = conn.Close() }()
		refused := &RefusedError{Status: resp.StatusCode}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(b, &refused.ErrorBody) != nil {
			refused.Code, refused.Message = http.StatusText(resp.StatusCode), strings.TrimSpace(string(b))
		}
		return nil, refused
	}
	// A 101 has no body: what follows on conn is the tunnel.
	_ = resp.Body.Close()
	if !stop() {
		return nil, fmt.Errorf("tunnel: %w", ctx.Err())
	}
	return &bufConn{Conn: conn, r: br}, nil
}

// bufConn reads what the response reader buffered before the conn.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// Pipe copies both ways between a and b until either side ends, then
// closes both.
func Pipe(a, b io.ReadWriteCloser) {
	var once sync.Once
	closeBoth := func() {
		once.Do(func() {
			_ = a.Close()
			_ = b.Close()
		})
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(a, b)
		closeBoth()
	}()
	_, _ = io.Copy(b, a)
	closeBoth()
	<-done
}
