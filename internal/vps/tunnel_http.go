package vps

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
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

// TunnelPeers finds the replica that holds a node's gateway session and
// reaches it: a node opens its tunnel on its session, so a ticket redeemed
// on another replica is bridged through that one.
type TunnelPeers interface {
	// SessionReplica is the URL of the replica holding nodeID's session;
	// "" when this replica holds it, none does, or replicas cannot reach
	// each other (the tunnel is then opened here, as on one replica).
	SessionReplica(ctx context.Context, nodeID string) (string, error)
	// Transport carries requests to peers: mutual TLS with the internal
	// CA's certificates, HTTP/1.1 (a tunnel is an upgrade), and no
	// response header timeout shorter than TunnelOpenTimeout (the peer
	// answers once the node opened the tunnel).
	Transport() http.RoundTripper
}

// TunnelHandler serves GET /v1/ssh/tunnel: it redeems the ticket (once),
// asks the instance's node to open a tunnel (instance.tunnel), waits for
// the node's stream, then answers 101 Switching Protocols and carries bytes
// both ways until either side closes. When another replica holds the
// node's gateway session, the redeemed ticket goes there (its
// ForwardedTunnelHandler opens the tunnel) and this replica pipes the two
// connections. The ticket is the credential: it was issued by an
// authorized, audited InstanceService.Ssh or SandboxService.Exec, is bound
// to its tenant, instance and node, and opens one tunnel within a minute.
func (s *InstanceService) TunnelHandler(log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.tunnelRequest(w, r) {
			return
		}
		id := r.Header.Get(tunnel.HeaderTicket)
		if id == "" || len(id) > maxTicketLen {
			tunnelRefuse(w, http.StatusUnauthorized, envelope.CodeUnauthenticated, "the "+tunnel.HeaderTicket+" header must carry a ticket")
			return
		}
		t, err := s.RedeemTicket(r.Context(), id)
		if errors.Is(err, errTicket) {
			tunnelRefuse(w, http.StatusUnauthorized, envelope.CodeUnauthenticated,
				"the ticket is unknown, already used or expired (tickets open one tunnel, within a minute)")
			return
		}
		if err != nil {
			log.Error("ssh tunnel: redeem the ticket", "err", err)
			tunnelRefuse(w, http.StatusInternalServerError, envelope.CodeInternal, "internal error")
			return
		}
		if s.peers != nil {
			url, err := s.peers.SessionReplica(r.Context(), t.NodeID)
			if err != nil {
				log.Error("ssh tunnel: find the node's session", "node", t.NodeID, "err", err)
				tunnelRefuse(w, http.StatusInternalServerError, envelope.CodeInternal, "internal error")
				return
			}
			if url != "" {
				s.forwardTunnel(w, r, log, url, t)
				return
			}
		}
		s.openTunnel(w, r, log, t)
	})
}

// ForwardedTunnelHandler serves tunnel.ForwardPath to peer replicas: a
// ticket another replica redeemed for a node whose session is here. Mount
// it only on the replicas' mutual-TLS listener; it refuses besides a
// request whose client fromReplica does not accept (a replica certificate
// of the internal CA). The tunnel is opened here, never forwarded again.
func (s *InstanceService) ForwardedTunnelHandler(log *slog.Logger, fromReplica func(*http.Request) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || fromReplica == nil || !fromReplica(r) {
			tunnelRefuse(w, http.StatusForbidden, envelope.CodePermissionDenied, "forwarded tunnels are taken from replicas only (a verified client certificate)")
			return
		}
		if !s.tunnelRequest(w, r) {
			return
		}
		t, err := tunnel.ForwardedTicket(r, s.env.Clock().Now())
		if err != nil {
			tunnelRefuse(w, http.StatusBadRequest, envelope.CodeInvalidArgument, err.Error())
			return
		}
		s.openTunnel(w, r, log, t)
	})
}

// tunnelRequest refuses what cannot be a tunnel here; it reports whether
// the request may go on.
func (s *InstanceService) tunnelRequest(w http.ResponseWriter, r *http.Request) bool {
	if s.tunnels == nil {
		tunnelRefuse(w, http.StatusNotImplemented, envelope.CodeFailedPrecondition, "this control plane carries no SSH tunnels")
		return false
	}
	if r.ProtoMajor != 1 || !strings.EqualFold(r.Header.Get("Upgrade"), tunnel.Protocol) {
		tunnelRefuse(w, http.StatusUpgradeRequired, envelope.CodeInvalidArgument,
			"a tunnel is an HTTP/1.1 request with Connection: Upgrade and Upgrade: "+tunnel.Protocol)
		return false
	}
	return true
}

// forwardTunnel bridges t's tunnel through the replica at url, which holds
// the node's session.
func (s *InstanceService) forwardTunnel(w http.ResponseWriter, r *http.Request, log *slog.Logger, url string, t tunnel.Ticket) {
	// The peer takes the ticket as redeemed: it is good for the hop, not
	// for what is left of the ticket's minute.
	t.Expire = s.env.Clock().Now().Add(TunnelOpenTimeout)
	stream, err := tunnel.Forward(r.Context(), s.peers.Transport(), url, t)
	if err != nil {
		var refused *tunnel.RefusedError
		if errors.As(err, &refused) {
			tunnelRefuse(w, refused.Status, envelope.Code(refused.Code), refused.Message)
			return
		}
		if r.Context().Err() != nil {
			return
		}
		log.Warn("ssh tunnel: forward to the node's replica", "node", t.NodeID, "replica", url, "err", err)
		tunnelRefuse(w, http.StatusBadGateway, envelope.CodeUnavailable, "the replica holding the host's session did not answer; retry with a new ticket")
		return
	}
	upgradeAndPipe(w, stream)
}

// openTunnel opens t's tunnel on this replica: the node's session is here.
func (s *InstanceService) openTunnel(w http.ResponseWriter, r *http.Request, log *slog.Logger, t tunnel.Ticket) {
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
			"the instance's host did not open the tunnel in time (it must be connected to a gateway of this control plane)")
		return
	case <-r.Context().Done():
		return
	}
	if o.Err != nil {
		tunnelRefuse(w, http.StatusBadGateway, envelope.CodeUnavailable, "the host could not open the tunnel to the guest's sshd: "+o.Err.Error())
		return
	}
	upgradeAndPipe(w, o.Stream)
}

// upgradeAndPipe answers 101 and carries bytes between the client and
// stream until either side ends; stream is closed either way.
func upgradeAndPipe(w http.ResponseWriter, stream io.ReadWriteCloser) {
	defer func() { _ = stream.Close() }()
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
	tunnel.Pipe(&hijacked{Conn: conn, r: brw}, stream)
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
