package vps

import (
	"bufio"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/tunnel"
)

// TunnelOpenTimeout bounds the wait for the node to open a tunnel.
const TunnelOpenTimeout = 30 * time.Second

// maxTicketLen bounds the ticket header (tunnel.NewID makes 43 characters).
const maxTicketLen = 64

// TunnelHandler serves GET /v1/ssh/tunnel: it redeems the ticket (once),
// asks the instance's node to open a tunnel (instance.tunnel), waits for
// the node's stream on this replica's gateway, then answers 101 Switching
// Protocols and carries bytes both ways until either side closes. The
// ticket is the credential: it was issued by an authorized, audited
// InstanceService.Ssh or SandboxService.Exec, is bound to its tenant,
// instance and node, and opens one tunnel within a minute.
func (s *InstanceService) TunnelHandler(log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.tunnels == nil {
			tunnelRefuse(w, http.StatusNotImplemented, envelope.CodeFailedPrecondition, "this control plane carries no SSH tunnels")
			return
		}
		if r.ProtoMajor != 1 || !strings.EqualFold(r.Header.Get("Upgrade"), tunnel.Protocol) {
			tunnelRefuse(w, http.StatusUpgradeRequired, envelope.CodeInvalidArgument,
				"a tunnel is an HTTP/1.1 request with Connection: Upgrade and Upgrade: "+tunnel.Protocol)
			return
		}
		id := r.Header.Get(tunnel.HeaderTicket)
		if id == "" || len(id) > maxTicketLen {
			tunnelRefuse(w, http.StatusUnauthorized, envelope.CodeUnauthenticated, "the "+tunnel.HeaderTicket+" header must carry a ticket")
			return
		}
		t, err := s.tunnels.Redeem(id)
		if err != nil {
			tunnelRefuse(w, http.StatusUnauthorized, envelope.CodeUnauthenticated,
				"the ticket is unknown, already used or expired (tickets open one tunnel, within a minute, on the replica that issued them)")
			return
		}
		tunnelID, err := tunnel.NewID()
		if err != nil {
			tunnelRefuse(w, http.StatusInternalServerError, envelope.CodeInternal, "internal error")
			return
		}
		p := s.tunnels.Expect(tunnelID, t.NodeID)
		defer p.Close()
		if err := s.OpenTunnel(r.Context(), t, tunnelID); err != nil {
			e := envelope.AsError(err)
			status := http.StatusInternalServerError
			if e.Code == envelope.CodeFailedPrecondition || e.Code == envelope.CodeNotFound {
				status = http.StatusConflict
			}
			if e.Code == envelope.CodeInternal {
				log.Error("ssh tunnel: open", "instance", t.InstanceID, "err", err)
			}
			tunnelRefuse(w, status, e.Code, e.Message)
			return
		}
		timer := time.NewTimer(TunnelOpenTimeout)
		defer timer.Stop()
		var o tunnel.Opened
		select {
		case o = <-p.Opened():
		case <-timer.C:
			tunnelRefuse(w, http.StatusGatewayTimeout, envelope.CodeUnavailable,
				"the instance's host did not open the tunnel in time (it must be connected to this replica's gateway)")
			return
		case <-r.Context().Done():
			return
		}
		if o.Err != nil {
			tunnelRefuse(w, http.StatusBadGateway, envelope.CodeUnavailable, "the host could not open the tunnel to the guest's sshd: "+o.Err.Error())
			return
		}
		defer func() { _ = o.Stream.Close() }()
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			tunnelRefuse(w, http.StatusInternalServerError, envelope.CodeInternal, "the connection cannot be taken over: "+err.Error())
			return
		}
		// The server's header deadlines must not cut the tunnel.
		_ = conn.SetDeadline(time.Time{})
		if _, err := brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + tunnel.Protocol + "\r\n\r\n"); err != nil {
			_ = conn.Close()
			return
		}
		if err := brw.Flush(); err != nil {
			_ = conn.Close()
			return
		}
		// Bytes the client sent after its request are in brw's reader.
		tunnel.Pipe(&hijacked{Conn: conn, r: brw}, o.Stream)
	})
}

// hijacked reads through the server's buffered reader.
type hijacked struct {
	net.Conn
	r *bufio.ReadWriter
}

func (h *hijacked) Read(p []byte) (int, error) { return h.r.Read(p) }

func tunnelRefuse(w http.ResponseWriter, status int, code envelope.Code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(tunnel.ErrorBody{Code: string(code), Message: msg})
}
