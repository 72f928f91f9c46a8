package gateway

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/execrelay"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/nodesig"
	"github.com/better-compute/better-compute/internal/store"
)

// errReplaced ends a session when a newer one of the same node starts.
var errReplaced = status.Error(codes.Aborted, "replaced by a newer session of this node")

// commandPage is how many commands one delivery reads at a time.
const commandPage = 100

// session is one node's stream on this replica. Only its own goroutine
// (Gateway.Session) sends on the stream and touches its fields; the hub
// only pokes or cancels it.
type session struct {
	g      *Gateway
	nodeID string
	ident  NodeIdentity
	leaf   *x509.Certificate
	stream grpc.BidiStreamingServer[agentv1.AgentMessage, agentv1.GatewayMessage]
	ctx    context.Context
	cancel context.CancelCauseFunc
	wakeCh chan struct{}
	log    sessionLog
	// msgs and errc carry what the receive goroutine reads (startRecv).
	msgs <-chan *agentv1.AgentMessage
	errc <-chan error
	// registered: the hub holds this session, so its end releases the
	// node's session owner.
	registered bool

	node fleet.NodeStatus
	// cursor is the highest command seq sent on this session (or the
	// agent's last applied one); inflight are those sent and not known to
	// have ended, so a cancel or expiry can be passed on. Both maps are
	// made on first use: most sessions never hold a command or a snapshot.
	cursor    uint64
	inflight  map[string]uint64
	snapshots map[string]*pendingSnapshot
	// signs: the node pinned command-signing roots (Hello.trust_version >
	// 0), so its final updates and allocation reports must carry its
	// signature (internal/nodesig).
	signs bool
	// signed is what the node signed of the message being handled (nil
	// when it is not a signed report).
	signed []byte
}

func (s *session) poke() {
	select {
	case s.wakeCh <- struct{}{}:
	default:
	}
}

// Session serves a node's stream: Hello first, then heartbeats, status,
// inventory, command updates and allocation reports from the node, and
// commands and cancels to it. A newer session of the same node replaces
// this one.
//
// Its frame stays small on purpose: the handler goroutine waits in loop for
// the session's whole life, and the runtime halves an idle goroutine's
// stack only while less than a quarter of it is in use. Everything up to
// the loop runs in open, whose frame is gone by then, so the goroutine
// settles at 8 KiB of stack instead of 16 (see docs/benchmarks.md).
func (g *Gateway) Session(stream grpc.BidiStreamingServer[agentv1.AgentMessage, agentv1.GatewayMessage]) error {
	s, err := g.open(stream)
	if s == nil {
		return err
	}
	defer s.close()
	if err != nil {
		return err
	}
	return s.loop()
}

// open authenticates the stream, waits for the Hello, registers the
// session and records the Hello, answers it and delivers what is pending.
// It returns a nil session when the stream was refused before the session
// was registered; otherwise the caller closes the session.
func (g *Gateway) open(stream grpc.BidiStreamingServer[agentv1.AgentMessage, agentv1.GatewayMessage]) (*session, error) {
	ctx := stream.Context()
	log := sessionLog{l: g.log, peer: peerAddr(ctx)}
	ident, leaf, err := g.peerIdentity(ctx)
	if err != nil {
		return nil, g.refused(log, "session refused", err)
	}
	log.node = ident.NodeID
	var node fleet.NodeStatus
	err = g.cfg.DB.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		node, err = fleet.NodeStatusGet(ctx, tx, ident.NodeID)
		return err
	})
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, g.refused(log, "session refused", denied("node %s is not known", ident.NodeID))
	case err != nil:
		return nil, g.refused(log, "session refused", err)
	case node.State == "retired":
		return nil, g.refused(log, "session refused", denied("node %s is retired", ident.NodeID))
	}

	sctx, cancel := context.WithCancelCause(ctx)
	s := &session{
		g: g, nodeID: ident.NodeID, ident: ident, leaf: leaf, stream: stream, ctx: sctx, cancel: cancel,
		wakeCh: make(chan struct{}, 1), log: log, node: node,
	}
	s.msgs, s.errc = s.startRecv()

	timer := time.NewTimer(g.cfg.HelloTimeout)
	defer timer.Stop()
	var first *agentv1.AgentMessage
	select {
	case first = <-s.msgs:
	case err := <-s.errc:
		return s, s.recvError(err)
	case <-timer.C:
		return s, g.refused(log, "session refused", status.Errorf(codes.DeadlineExceeded, "no hello within %v", g.cfg.HelloTimeout))
	case <-sctx.Done():
		return s, s.doneError()
	}
	hello := first.GetHello()
	if hello == nil {
		return s, g.refused(log, "session refused", invalid("the first message of a session must be hello"))
	}
	if err := ValidateAgentMessage(first); err != nil {
		return s, g.refused(log, "session refused", err)
	}
	if err := g.hub.register(s); err != nil {
		return s, err
	}
	s.registered = true
	if err := s.hello(hello); err != nil {
		return s, g.refused(log, "session hello failed", err)
	}
	log.Info("session started", "agent_version", hello.GetAgentVersion(), "last_applied_seq", hello.GetLastAppliedSeq())
	err = s.send(&agentv1.GatewayMessage{Msg: &agentv1.GatewayMessage_HelloAck{HelloAck: &agentv1.HelloAck{
		NodeId: s.nodeID, HeartbeatSeconds: int32(g.cfg.HeartbeatInterval / time.Second), ServerTime: timestamppb.New(g.cfg.Clock.Now()),
	}}})
	if err != nil {
		return s, s.sendError(err)
	}
	if d := hello.GetInventoryDigest(); d == "" || d != s.node.InventoryDigest {
		if err := s.send(&agentv1.GatewayMessage{Msg: &agentv1.GatewayMessage_InventoryRequest{InventoryRequest: &agentv1.InventoryRequest{}}}); err != nil {
			return s, s.sendError(err)
		}
	}
	s.siteAlive()
	s.siteDrivers(hello.GetBmcDrivers())
	if err := s.sync(); err != nil {
		return s, s.fail(err)
	}
	return s, nil
}

// siteAlive tells the site hooks a site agent is alive. A failure is
// logged, not fatal: the next heartbeat tries again, and a lease not
// renewed only expires.
func (s *session) siteAlive() {
	if s.ident.Role != RoleSite || s.g.cfg.Sites == nil {
		return
	}
	if err := s.g.cfg.Sites.SiteAlive(s.ctx, s.nodeID); err != nil {
		s.log.Warn("site agent's boot lease not renewed", "err", err)
	}
}

// siteDrivers records the BMC drivers a site agent's Hello reported. A
// failure is logged, not fatal: the drivers are reported again with the
// next session, and a step for a machine whose driver is not recorded is
// refused with the reason, not sent.
func (s *session) siteDrivers(ds []*agentv1.BMCDriver) {
	if s.ident.Role != RoleSite || s.g.cfg.Sites == nil {
		return
	}
	if err := s.g.cfg.Sites.SiteDrivers(s.ctx, s.nodeID, ds); err != nil {
		s.log.Warn("site agent's BMC drivers not recorded", "err", err)
	}
}

// close ends the session's context (which stops its receive goroutine) and,
// when it is still the node's session here, releases the session owner.
func (s *session) close() {
	s.cancel(nil)
	if !s.registered || !s.g.hub.unregister(s) {
		return
	}
	s.g.metrics.telemetry.forget(s.nodeID)
	g := s.g
	rctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), 5*time.Second)
	defer cancel()
	if err := g.cfg.DB.Write(rctx, func(ctx context.Context, tx store.Tx) error {
		return fleet.NodeReleaseSession(ctx, tx, s.nodeID, g.cfg.ReplicaID)
	}); err != nil {
		s.log.Warn("release session owner", "err", err)
	}
}

func (s *session) loop() error {
	// Jitter spreads the rechecks of sessions that started together.
	every := s.g.cfg.RecheckInterval
	ticker := time.NewTicker(every + rand.N(every/4+1))
	defer ticker.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return s.doneError()
		case err := <-s.errc:
			return s.recvError(err)
		case m := <-s.msgs:
			if err := s.handle(m); err != nil {
				return s.fail(err)
			}
		case <-s.wakeCh:
			if err := s.sync(); err != nil {
				return s.fail(err)
			}
		case <-ticker.C:
			if err := s.sync(); err != nil {
				return s.fail(err)
			}
		}
	}
}

// startRecv reads the stream on its own goroutine, so the session can wait
// for messages, wakes and its end at once.
func (s *session) startRecv() (<-chan *agentv1.AgentMessage, <-chan error) {
	msgs := make(chan *agentv1.AgentMessage)
	errc := make(chan error, 1)
	go func() {
		for {
			m, err := s.stream.Recv()
			if err == nil {
				err = decodeError(m)
			}
			if err != nil {
				errc <- err
				return
			}
			select {
			case msgs <- m:
			case <-s.ctx.Done():
				return
			}
		}
	}()
	return msgs, errc
}

func (s *session) send(m *agentv1.GatewayMessage) error { return s.stream.Send(m) }

// fail ends the session for err: a refusal is logged and returned as its
// status; a send failure means the peer is gone.
func (s *session) fail(err error) error {
	if errors.Is(err, errGoodbye) {
		return nil
	}
	if s.ctx.Err() != nil {
		return s.doneError()
	}
	if _, ok := status.FromError(err); !ok && errors.Is(err, io.EOF) {
		return nil
	}
	return s.g.refused(s.log, "session ended", err)
}

func (s *session) sendError(err error) error {
	if s.ctx.Err() != nil {
		return s.doneError()
	}
	s.log.Info("session send failed", "err", err)
	return err
}

// recvError maps the end of the receive side: EOF is a clean close, a
// message that does not decode is INVALID_ARGUMENT (see malformed), an
// oversize frame keeps grpc's RESOURCE_EXHAUSTED.
func (s *session) recvError(err error) error {
	if errors.Is(err, io.EOF) {
		s.log.Info("session closed by the agent")
		return nil
	}
	if s.ctx.Err() != nil {
		return s.doneError()
	}
	return s.g.refused(s.log, "session receive refused", err)
}

// doneError is the status a session ends with once its context is done:
// the cause it was cancelled with (replaced, shutting down), or the
// client's own cancellation.
func (s *session) doneError() error {
	cause := context.Cause(s.ctx)
	if st, ok := status.FromError(cause); ok && cause != nil {
		s.log.Info("session ended", "reason", st.Message())
		return st.Err()
	}
	s.log.Info("session ended by the agent")
	return status.FromContextError(s.ctx.Err()).Err()
}

// hello records the Hello: agent facts, session owner, joining → active,
// liveness ready (event node.ready when it was not) and a heartbeat.
func (s *session) hello(h *agentv1.Hello) error {
	g := s.g
	// The certificate's role (the join token's) is the node's mode; a Hello
	// claiming another must not rewrite it, or a rejoin would be issued
	// that role.
	if mode := roleOf(h.GetMode()); mode != s.ident.Role {
		return denied("hello: mode %s, but the node's certificate is for role %s", mode, s.ident.Role)
	}
	s.cursor = h.GetLastAppliedSeq()
	s.signs = h.GetTrustVersion() > 0
	before, err := g.hellos.submit(s.ctx, fleet.NodeHelloParams{
		NodeID: s.nodeID, Owner: g.cfg.ReplicaID, AgentVersion: h.GetAgentVersion(), Mode: s.ident.Role,
		Capabilities: h.GetCapabilities(), TrustVersion: h.GetTrustVersion(), LastAppliedSeq: h.GetLastAppliedSeq(),
	})
	if errors.Is(err, errRetired) {
		return denied("node %s is retired", s.nodeID)
	}
	if err != nil {
		return err
	}
	s.node = before
	s.node.SessionOwner = g.cfg.ReplicaID
	if before.State == "joining" {
		s.node.State = "active"
	}
	return nil
}

// sync checks the session may go on (node not retired, this replica still
// owner, certificate still valid), passes cancels and expiries of commands
// sent on it, and delivers every open command after the cursor.
func (s *session) sync() error {
	g := s.g
	var (
		node    fleet.NodeStatus
		cmds    []fleet.Command
		stopped map[string]uint64
	)
	err := g.cfg.DB.Read(s.ctx, func(ctx context.Context, tx store.Tx) (err error) {
		if node, err = fleet.NodeStatusGet(ctx, tx, s.nodeID); err != nil {
			return err
		}
		if cmds, err = fleet.CommandListOpen(ctx, tx, s.nodeID, s.cursor, commandPage); err != nil {
			return err
		}
		if len(s.inflight) > 0 {
			lo := s.cursor
			for _, seq := range s.inflight {
				lo = min(lo, seq)
			}
			stopped, err = fleet.CommandListStopped(ctx, tx, s.nodeID, lo, s.cursor)
		}
		return err
	})
	switch {
	case errors.Is(err, store.ErrNotFound):
		return denied("node %s no longer exists", s.nodeID)
	case err != nil:
		return err
	case node.State == "retired":
		return denied("node %s was retired", s.nodeID)
	case node.SessionOwner != "" && node.SessionOwner != g.cfg.ReplicaID:
		return status.Errorf(codes.Aborted, "replaced by a newer session of this node (on %s)", node.SessionOwner)
	}
	if err := s.certificateValid(); err != nil {
		return status.Errorf(codes.Unauthenticated, "node certificate no longer valid: %v", err)
	}
	s.node = node
	for id, seq := range stopped {
		if _, ok := s.inflight[id]; !ok {
			continue
		}
		if err := s.send(&agentv1.GatewayMessage{Msg: &agentv1.GatewayMessage_Cancel{Cancel: &agentv1.CancelCommand{CommandId: id, Seq: seq}}}); err != nil {
			return err
		}
		delete(s.inflight, id)
	}
	for len(cmds) > 0 {
		if err := s.deliver(cmds); err != nil {
			return err
		}
		if len(cmds) < commandPage {
			return nil
		}
		err := g.cfg.DB.Read(s.ctx, func(ctx context.Context, tx store.Tx) (err error) {
			cmds, err = fleet.CommandListOpen(ctx, tx, s.nodeID, s.cursor, commandPage)
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// certificateValid checks the session's certificate again. Of what open
// verified, only revocation can change while the session is up (the chain,
// names, role and key usage are fixed in the certificate), so where the
// Authority answers revocation alone the ECDSA signature check that
// VerifyNode repeats is skipped: it was a quarter of the CPU of sync at
// 10,000 sessions (docs/benchmarks.md).
func (s *session) certificateValid() error {
	if r, ok := s.g.cfg.Authority.(revocations); ok {
		if r.IsRevoked(s.ident.Serial) {
			return fmt.Errorf("certificate %s is revoked", s.ident.Serial)
		}
		return nil
	}
	_, err := s.g.cfg.Authority.VerifyNode(s.leaf)
	return err
}

// deliver sends commands in seq order, then marks the pending ones
// delivered. Sending first keeps the single SQLite writer off the dispatch
// path; the mark is bookkeeping only — redelivery follows the agent's
// last applied seq, and the agent applies a command at most once. A
// command that cannot be encoded is failed in the same write, with its
// event, rather than left open until its deadline.
func (s *session) deliver(cmds []fleet.Command) error {
	from, pending := s.cursor, false
	var unencodable []fleet.Command
	var reasons []error
	var codes []string
	// sealed marks the failures whose sealed params did not open: their
	// owner hears of it (CommandDone), as of an answer from the agent.
	var sealed []bool
	for _, c := range cmds {
		pending = pending || c.State == "pending"
		// The params as stored are what the signature covers; delivery
		// may open sealed values or add a site's credentials below.
		signed := c.Params
		// The certificate's role decides what the agent may run: a
		// ramdisk never gets a node's command, nor a node a wipe.
		if err := fleet.CheckKindForMode(s.ident.Role, c.Kind); err != nil {
			s.log.Warn("command refused for the node's role; failed", "command", c.ID, "role", s.ident.Role, "err", err)
			unencodable, reasons, codes = append(unencodable, c), append(reasons, err), append(codes, fleet.CommandFailWrongRole)
			sealed = append(sealed, false)
			s.cursor = seqOf(c)
			continue
		}
		if s.ident.Role == RoleSite && s.g.cfg.Sites != nil {
			p, err := s.g.cfg.Sites.SiteCommandParams(s.ctx, s.nodeID, c)
			switch {
			case err != nil && c.State == "pending":
				// Never sent: failed with the reason, so the step that
				// queued it knows it did not run.
				s.log.Warn("site command not deliverable; failed", "command", c.ID, "err", err)
				code := fleet.CommandFailUnencodable
				if errors.Is(err, fleet.ErrCommandFenced) {
					code = fleet.CommandFailFenced
				}
				unencodable, reasons, codes = append(unencodable, c), append(reasons, err), append(codes, code)
				sealed = append(sealed, false)
				s.cursor = seqOf(c)
				continue
			case err != nil:
				// Delivered before: the agent answers it from its log.
			default:
				c.Params = p
			}
		}
		switch p, err := s.g.cfg.OpenParams.Open(c); {
		case err != nil && c.State == "pending":
			// Never sent without what was sealed: failed with the reason.
			s.log.Warn("command params cannot be opened; failed", "command", c.ID, "kind", c.Kind, "err", err)
			unencodable, reasons, codes = append(unencodable, c), append(reasons, err), append(codes, fleet.CommandFailUnencodable)
			sealed = append(sealed, true)
			s.cursor = seqOf(c)
			continue
		case err != nil:
			// Delivered before: the agent answers it from its log.
		default:
			c.Params = p
		}
		m, err := commandMessage(c)
		if err == nil {
			err = s.g.attachSignature(s.ctx, m, c, signed)
			if err != nil && !errors.Is(err, fleet.ErrCommandUnencodable) {
				return err // the store failed: the session retries
			}
		}
		if err != nil {
			s.log.Error("command cannot be encoded; failed", "command", c.ID, "err", err)
			unencodable, reasons, codes = append(unencodable, c), append(reasons, err), append(codes, fleet.CommandFailUnencodable)
			sealed = append(sealed, false)
			s.cursor = seqOf(c)
			continue
		}
		if err := s.send(&agentv1.GatewayMessage{Msg: &agentv1.GatewayMessage_Command{Command: m}}); err != nil {
			return err
		}
		if c.State == "pending" {
			s.g.metrics.dispatched(c.Kind, s.g.cfg.Clock.Now().Sub(c.CreateTime))
		}
		s.cursor = seqOf(c)
		if s.inflight == nil {
			s.inflight = map[string]uint64{}
		}
		s.inflight[c.ID] = seqOf(c)
	}
	if !pending && len(unencodable) == 0 {
		return nil
	}
	return s.g.cfg.DB.Write(s.ctx, func(ctx context.Context, tx store.Tx) error {
		var evs []envelope.Event
		for i, c := range unencodable {
			ok, err := fleet.CommandUpdate(ctx, tx, &fleet.CommandUpdateParams{
				ID: c.ID, FromState: c.State, State: fleet.CommandFailed, Progress: c.Progress,
				Message: truncateMessage(reasons[i].Error()), FailureCode: codes[i],
			})
			if err != nil {
				return err
			}
			if ok && codes[i] == fleet.CommandFailWrongRole {
				now := s.g.cfg.Clock.Now()
				if err := s.g.cfg.Recorder.InsertAudits(ctx, tx, []envelope.AuditEntry{{
					ID: envelope.NewID("aud", now), Time: now, TenantID: c.TenantID, PrincipalID: s.nodeID, PrincipalKind: "node",
					Action: "commands.deliver", ResourceType: "Command", ResourceID: c.ID, Decision: envelope.DecisionDeny,
					Result: fleet.CommandFailWrongRole, Detail: truncateMessage(reasons[i].Error()),
				}}); err != nil {
					return err
				}
			}
			if ok && sealed[i] && s.g.cfg.CommandDone != nil {
				if err := s.g.cfg.CommandDone(ctx, tx, c, fleet.CommandFailed, truncateMessage(reasons[i].Error()), nil); err != nil {
					return err
				}
			}
			if ok {
				evs = append(evs, envelope.Event{
					Type: "command." + fleet.CommandFailed, TenantID: c.TenantID, ResourceType: "Command", ResourceID: c.ID,
					Time: s.g.cfg.Clock.Now(), Data: map[string]any{"node_id": s.nodeID, "seq": c.Seq, "kind": c.Kind,
						"failure_code": codes[i]},
				})
			}
		}
		if len(evs) > 0 {
			if err := s.g.cfg.Recorder.InsertEvents(ctx, tx, evs); err != nil {
				return err
			}
		}
		if !pending {
			return nil
		}
		return fleet.CommandMarkDelivered(ctx, tx, s.nodeID, from, seqOf(cmds[len(cmds)-1]))
	})
}

// truncateMessage keeps a failure message to what a command row shows.
func truncateMessage(msg string) string {
	const limit = 512
	if len(msg) > limit {
		msg = msg[:limit] + "…"
	}
	return strings.ToValidUTF8(msg, "?")
}

// seqOf is a command's sequence number as the agent protocol carries it.
func seqOf(c fleet.Command) uint64 { return uint64(max(c.Seq, 0)) }

// commandMessage encodes a command for its agent; an error means it never
// can be (fleet.ErrCommandUnencodable).
func commandMessage(c fleet.Command) (*agentv1.Command, error) {
	ps, err := fleet.CommandParamsStruct(c.Params)
	if err != nil {
		return nil, err
	}
	return &agentv1.Command{
		Id: c.ID, Seq: seqOf(c), Kind: c.Kind, Params: ps, IdempotencyKey: c.IdempotencyKey,
		Deadline: timestamppb.New(c.Deadline), Traceparent: c.Traceparent,
	}, nil
}

// handle acts on one message after Hello.
func (s *session) handle(m *agentv1.AgentMessage) error {
	// A report's signature covers what the node sent, before validation
	// defuses its text in place.
	s.signed = nil
	if err := s.verifyReport(m); err != nil {
		return err
	}
	if err := ValidateAgentMessage(m); err != nil {
		return err
	}
	switch msg := m.GetMsg().(type) {
	case *agentv1.AgentMessage_Hello:
		return invalid("hello: sent twice on one session")
	case *agentv1.AgentMessage_Heartbeat:
		s.g.beats.add(s.nodeID)
		s.siteAlive()
		s.g.metrics.heartbeat(s.nodeID, s.node.Name, msg.Heartbeat.GetGpus())
	case *agentv1.AgentMessage_Status:
		// A status report is a sign of life too.
		s.g.beats.add(s.nodeID)
		s.log.Debug("status", "health", msg.Status.GetHealth(), "events", len(msg.Status.GetEvents()))
		return s.health(msg.Status)
	case *agentv1.AgentMessage_Inventory:
		return s.inventory(msg.Inventory)
	case *agentv1.AgentMessage_CommandUpdate:
		return s.commandUpdate(msg.CommandUpdate)
	case *agentv1.AgentMessage_AllocationBound:
		b := msg.AllocationBound
		enforced := make([]any, 0, len(b.GetEnforced()))
		for _, e := range b.GetEnforced() {
			enforced = append(enforced, map[string]any{"resource": e.GetResource(), "state": EnforcementState(e.GetState()), "detail": e.GetDetail()})
		}
		return s.allocation("allocation.bound", b.GetAllocationId(), b.GetCommandId(), b, map[string]any{"cgroup": b.GetCgroup(), "enforced": enforced},
			func(ctx context.Context, tx store.Tx, h Hooks) error { return h.AllocationBound(ctx, tx, s.nodeID, b) })
	case *agentv1.AgentMessage_AllocationReleased:
		r := msg.AllocationReleased
		return s.allocation("allocation.released", r.GetAllocationId(), r.GetCommandId(), r, map[string]any{"killed_processes": r.GetKilledProcesses()},
			func(ctx context.Context, tx store.Tx, h Hooks) error {
				return h.AllocationReleased(ctx, tx, s.nodeID, r)
			})
	case *agentv1.AgentMessage_Goodbye:
		return s.goodbye(msg.Goodbye)
	case *agentv1.AgentMessage_ProcessOutput:
		s.processOutput(msg.ProcessOutput)
	}
	return nil
}

// processOutput relays a chunk of a running process.exec to the API call
// waiting for it on this replica. Only a command sent on this session is
// relayed: a node cannot write into another node's exec, and it costs no
// database read per chunk. Output of a command sent on an earlier session
// is dropped (the agent does not get it again after a reconnect).
func (s *session) processOutput(o *agentv1.ProcessOutput) {
	if seq, ok := s.inflight[o.GetCommandId()]; !ok || seq != o.GetSeq() || s.g.cfg.Exec == nil {
		return
	}
	s.g.cfg.Exec.Output(o.GetCommandId(), o.GetStream(), o.GetData())
}

// commandStates maps the wire's command states to the database's.
var commandStates = map[agentv1.CommandState]string{
	agentv1.CommandState_COMMAND_STATE_ACCEPTED:  "accepted",
	agentv1.CommandState_COMMAND_STATE_RUNNING:   "running",
	agentv1.CommandState_COMMAND_STATE_SUCCEEDED: "succeeded",
	agentv1.CommandState_COMMAND_STATE_FAILED:    "failed",
	agentv1.CommandState_COMMAND_STATE_CANCELED:  "canceled",
}

// stateRank orders command states; terminal ones share the last rank, so
// no state moves from one terminal state to another.
func stateRank(state string) int {
	switch state {
	case "pending":
		return 0
	case "delivered":
		return 1
	case "accepted":
		return 2
	case "running":
		return 3
	}
	return 4
}

// commandUpdate records an agent's report on one of its node's commands.
// States only move forward: a stale or repeated report is ignored.
func (s *session) commandUpdate(u *agentv1.CommandUpdate) error {
	g := s.g
	next := commandStates[u.GetState()]
	terminal, kind := false, ""
	var cmd fleet.Command
	err := g.cfg.DB.Write(s.ctx, func(ctx context.Context, tx store.Tx) error {
		terminal, kind = false, ""
		c, err := fleet.CommandGet(ctx, tx, "", u.GetCommandId())
		cmd = c
		if errors.Is(err, store.ErrNotFound) {
			return denied("command %s is not a command of node %s", u.GetCommandId(), s.nodeID)
		}
		if err != nil {
			return err
		}
		if c.NodeID != s.nodeID {
			s.log.Warn("node reported on another node's command", "command", c.ID, "owner", c.NodeID)
			return denied("command %s is not a command of node %s", u.GetCommandId(), s.nodeID)
		}
		if seqOf(c) != u.GetSeq() {
			return invalid("command_update.seq: command %s has seq %d, not %d", c.ID, c.Seq, u.GetSeq())
		}
		from, to := stateRank(c.State), stateRank(next)
		progress := u.GetProgress()
		switch {
		case to < from, to == from && next != "running":
			s.log.Debug("stale command update ignored", "command", c.ID, "state", c.State, "update", next)
			return nil
		case next == "running" && c.State == "running" && int(progress) < c.Progress:
			return nil
		}
		if next == "succeeded" {
			progress = 100
		}
		result := ""
		if r := u.GetResult(); r != nil {
			b, err := json.Marshal(r.AsMap())
			if err != nil {
				return invalid("command_update.result: %v", err)
			}
			result = string(b)
		}
		ok, err := fleet.CommandUpdate(ctx, tx, &fleet.CommandUpdateParams{
			ID: c.ID, FromState: c.State, State: next, Progress: int(progress), Message: u.GetMessage(),
			Result: result, FailureCode: u.GetFailureCode(),
		})
		if err != nil || !ok {
			return err
		}
		if to < 4 {
			return nil
		}
		terminal, kind = true, c.Kind
		if err := s.recordReport(ctx, tx, "command."+next, c.ID, u); err != nil {
			return err
		}
		if g.cfg.CommandDone != nil {
			if err := g.cfg.CommandDone(ctx, tx, c, next, u.GetMessage(), u.GetResult().AsMap()); err != nil {
				return err
			}
		}
		if s.ident.Role == RoleSite && g.cfg.Sites != nil {
			ended := c
			ended.State, ended.Progress, ended.Message, ended.Result, ended.FailureCode = next, int(progress), u.GetMessage(), result, u.GetFailureCode()
			if err := g.cfg.Sites.SiteCommandEnded(ctx, tx, ended); err != nil {
				return err
			}
		}
		now := g.cfg.Clock.Now()
		evs := []envelope.Event{{
			Type: "command." + next, TenantID: c.TenantID, ResourceType: "Command", ResourceID: c.ID, Time: now,
			Data: map[string]any{"node_id": s.nodeID, "seq": c.Seq, "kind": c.Kind, "failure_code": u.GetFailureCode()},
		}}
		if c.Kind == "node.drain" && next == "succeeded" {
			drained, err := fleet.NodeUpdateState(ctx, tx, &fleet.NodeUpdateStateParams{ID: s.nodeID, From: []string{fleet.NodeDraining}, To: fleet.NodeDrained})
			if err != nil {
				return err
			}
			if drained {
				evs = append(evs, envelope.Event{Type: "node.drained", TenantID: s.node.TenantID, ResourceType: "Node", ResourceID: s.nodeID, Time: now})
			}
		}
		return g.cfg.Recorder.InsertEvents(ctx, tx, evs)
	})
	if err == nil && terminal {
		g.metrics.commandFinished(kind, next)
		g.traceCommandDone(cmd, u, next)
		delete(s.inflight, u.GetCommandId())
		if kind == KindProcessExec && g.cfg.Exec != nil {
			g.cfg.Exec.Exited(u.GetCommandId(), &execrelay.Exit{State: next, Message: u.GetMessage(),
				FailureCode: u.GetFailureCode(), Result: u.GetResult().AsMap()})
		}
	}
	return err
}

// KindProcessExec is the command kind of reservations.exec.
const KindProcessExec = "process.exec"

// allocation records allocation.bound or allocation.released, only for an
// allocation a command of this node carries.
func (s *session) allocation(typ, allocationID, commandID string, report proto.Message, data map[string]any, hook func(context.Context, store.Tx, Hooks) error) error {
	g := s.g
	return g.cfg.DB.Write(s.ctx, func(ctx context.Context, tx store.Tx) error {
		cmds, err := fleet.CommandListForAllocation(ctx, tx, s.nodeID, commandID, allocationID)
		if err != nil {
			return err
		}
		var found *fleet.Command
		for i := range cmds {
			var params any
			if json.Unmarshal([]byte(cmds[i].Params), &params) == nil && namesAllocation(params, allocationID) {
				found = &cmds[i]
				break
			}
		}
		if found == nil {
			s.log.Warn("allocation report for an allocation no command of this node carries", "allocation", allocationID, "command", commandID)
			return denied("allocation %s is not in a command of node %s", allocationID, s.nodeID)
		}
		if data == nil {
			data = map[string]any{}
		}
		data["node_id"], data["command_id"] = s.nodeID, found.ID
		if err := s.recordReport(ctx, tx, typ, allocationID, report); err != nil {
			return err
		}
		if h := g.cfg.Hooks; h != nil {
			if err := hook(ctx, tx, h); err != nil {
				return err
			}
		}
		return g.cfg.Recorder.InsertEvents(ctx, tx, []envelope.Event{{
			Type: typ, TenantID: found.TenantID, ResourceType: "Allocation", ResourceID: allocationID,
			Time: g.cfg.Clock.Now(), Data: data,
		}})
	})
}

// EnforcementState is the word for an enforcement state in events and on
// reservations: "applied", "not_applied", "simulated", "not_requested".
func EnforcementState(st agentv1.EnforcementState) string {
	name, ok := agentv1.EnforcementState_name[int32(st)]
	if !ok || st == agentv1.EnforcementState_ENFORCEMENT_STATE_UNSPECIFIED {
		return "unspecified"
	}
	return strings.ToLower(strings.TrimPrefix(name, "ENFORCEMENT_STATE_"))
}

// namesAllocation reports whether a command's params carry allocationID
// under "allocation_id" (or protojson's "allocationId"), at any depth.
func namesAllocation(v any, allocationID string) bool {
	switch x := v.(type) {
	case map[string]any:
		for k, val := range x {
			if (k == "allocation_id" || k == "allocationId") && val == allocationID {
				return true
			}
			if namesAllocation(val, allocationID) {
				return true
			}
		}
	case []any:
		for _, val := range x {
			if namesAllocation(val, allocationID) {
				return true
			}
		}
	}
	return false
}

// health hands a status report's findings to the health module, in one
// transaction: its findings, quarantines and remediations commit together.
func (s *session) health(st *agentv1.StatusReport) error {
	h := s.g.cfg.Health
	if h == nil || (len(st.GetEvents()) == 0 && len(st.GetFindings()) == 0 && !st.GetFindingsComplete()) {
		return nil
	}
	if len(st.GetEvents()) == 0 && len(st.GetFindings()) == 0 {
		// A healthy node's report (every session opens with one): a write
		// only when it clears something, so a reconnect storm of healthy
		// nodes takes no writer.
		var open bool
		if err := s.g.cfg.DB.Read(s.ctx, func(ctx context.Context, tx store.Tx) (err error) {
			open, err = h.HasOpenStanding(ctx, tx, s.nodeID)
			return err
		}); err != nil || !open {
			return err
		}
	}
	return s.g.cfg.DB.Write(s.ctx, func(ctx context.Context, tx store.Tx) error {
		return h.Report(ctx, tx, s.nodeID, st.GetEvents(), st.GetFindings(), st.GetFindingsComplete())
	})
}

// attachSignature adds a signed command's signature and its signer's chain
// to m. A row without a signature goes out without one: a node that pinned
// command-signing roots refuses it, which is the point. A signer whose
// chain is gone is an error only for this command.
func (g *Gateway) attachSignature(ctx context.Context, m *agentv1.Command, c fleet.Command, signedParams string) error {
	ct, ok := g.cfg.Authority.(CommandTrust)
	if !ok || len(c.Signature) == 0 {
		return nil
	}
	var chain [][]byte
	if v, ok := g.signerChains.Load(c.Signer); ok {
		chain = v.([][]byte)
	} else {
		if err := g.cfg.DB.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
			chain, err = ct.CommandSignerChain(ctx, tx, c.Signer)
			return err
		}); err != nil {
			return err
		}
		if chain == nil {
			return fmt.Errorf("%w: its signer %s is unknown", fleet.ErrCommandUnencodable, c.Signer)
		}
		g.signerChains.Store(c.Signer, chain)
	}
	m.Signature = &agentv1.CommandSignature{TrustVersion: c.TrustVersion, Chain: chain, Signature: c.Signature,
		SignedParams: []byte(signedParams)}
	return nil
}

// verifyReport checks the node's signature on a report it must sign (a
// final command update, an allocation report): with the key of the
// certificate this session was opened with. It keeps the signed bytes for
// recordReport. A node that pinned no command-signing roots signs nothing.
func (s *session) verifyReport(am *agentv1.AgentMessage) error {
	if !s.signs {
		return nil
	}
	var m proto.Message
	switch x := am.GetMsg().(type) {
	case *agentv1.AgentMessage_CommandUpdate:
		m = x.CommandUpdate
	case *agentv1.AgentMessage_AllocationBound:
		m = x.AllocationBound
	case *agentv1.AgentMessage_AllocationReleased:
		m = x.AllocationReleased
	}
	if m == nil || !nodesig.Signed(m) {
		return nil
	}
	signed, err := nodesig.Verify(s.leaf.PublicKey, s.g.cfg.Authority.TrustDomain(), s.nodeID, m)
	if err != nil {
		s.log.Warn("report refused: its node signature does not verify", "type", m.ProtoReflect().Descriptor().Name(), "err", err)
		return denied("%s: %v", m.ProtoReflect().Descriptor().Name(), err)
	}
	s.signed = signed
	return nil
}

// recordReport keeps the signed report verifyReport passed (node_reports),
// in the transaction that acts on it: the record of what the node said it
// did, checkable with the node CA alone.
func (s *session) recordReport(ctx context.Context, tx store.Tx, kind, subject string, m proto.Message) error {
	if !s.signs || s.signed == nil {
		return nil
	}
	now := s.g.cfg.Clock.Now()
	return fleet.NodeReportInsert(ctx, tx, fleet.NodeReport{ID: envelope.NewID("nrp", now), NodeID: s.nodeID, Kind: kind, Subject: subject,
		CertDER: s.leaf.Raw, Signed: s.signed, Signature: nodesigSignature(m), CreateTime: now})
}

func nodesigSignature(m proto.Message) []byte {
	switch x := m.(type) {
	case *agentv1.CommandUpdate:
		return x.GetNodeSignature()
	case *agentv1.AllocationBound:
		return x.GetNodeSignature()
	case *agentv1.AllocationReleased:
		return x.GetNodeSignature()
	}
	return nil
}
