package agent

import (
	"context"
	"crypto"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/nodesig"
)

// backoff is jittered exponential backoff: each wait is drawn from
// [d/2, d] where d doubles from min up to max.
type backoff struct {
	min, max time.Duration
	cur      time.Duration
}

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(b.cur*2, b.max)
	}
	half := b.cur / 2
	return half + rand.N(half+1)
}

func (b *backoff) reset() { b.cur = 0 }

// defaultHeartbeat is used when the gateway does not say.
const defaultHeartbeat = 15 * time.Second

// statusEvery is how many heartbeats pass between status reports.
const statusEvery = 4

type session struct {
	stream agentv1.AgentService_SessionClient
	cancel context.CancelFunc
	// conn is the session's gateway connection; tunnels open streams on it.
	conn *grpc.ClientConn
	// gateway is the address conn went to.
	gateway gatewayAddr
	mu      sync.Mutex
	// leaving is set once the Goodbye went out: nothing more is sent, and
	// the stream's end is the gateway's answer, not a failure.
	leaving bool
	// sign signs a report with the key of the certificate this session
	// presented (nodesig); nil on a node that pinned no command-signing
	// roots.
	sign func(proto.Message) error
}

// errLeaving refuses a send after the Goodbye.
var errLeaving = errors.New("session is closing: goodbye sent")

// ErrHelloTimeout ends a session attempt whose HelloAck did not come within
// Config.HelloTimeout.
var ErrHelloTimeout = errors.New("no HelloAck from the gateway in time")

func (s *session) send(m *agentv1.AgentMessage) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.leaving {
		return errLeaving
	}
	if s.sign != nil {
		var inner proto.Message
		switch x := m.GetMsg().(type) {
		case *agentv1.AgentMessage_CommandUpdate:
			inner = x.CommandUpdate
		case *agentv1.AgentMessage_AllocationBound:
			inner = x.AllocationBound
		case *agentv1.AgentMessage_AllocationReleased:
			inner = x.AllocationReleased
		}
		if inner != nil && nodesig.Signed(inner) {
			if err := s.sign(inner); err != nil {
				return fmt.Errorf("sign %s: %w", inner.ProtoReflect().Descriptor().Name(), err)
			}
		}
	}
	return s.stream.Send(m)
}

// goodbye sends Goodbye and closes the sending side, once; the gateway
// marks the node unreachable and ends the stream with OK.
func (s *session) goodbye(reason string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.leaving {
		return nil
	}
	s.leaving = true
	if err := s.stream.Send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Goodbye{Goodbye: &agentv1.Goodbye{Reason: reason}}}); err != nil {
		return err
	}
	return s.stream.CloseSend()
}

func (s *session) isLeaving() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.leaving
}

// Run keeps one session with the gateway until ctx ends, reconnecting with
// jittered exponential backoff, renews the certificate at 2/3 of its
// lifetime and applies commands. When ctx ends with a session established,
// the agent says Goodbye and waits (at most GoodbyeTimeout) for the gateway
// to close it, so the node turns unreachable at once rather than after the
// heartbeat timeout. It returns nil when ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	if !a.Joined() {
		return ErrNotJoined
	}
	if !a.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer a.running.Store(false)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a.mu.Lock()
	a.runCtx = ctx
	a.mu.Unlock()
	var wg sync.WaitGroup
	// Withdrawals wait on pods; they end with ctx.
	defer a.kubeWG.Wait()
	wg.Go(func() { a.kubeLoop(ctx) })
	wg.Go(func() { a.renewLoop(ctx) })
	wg.Go(func() { a.commandLoop(ctx) })
	wg.Go(func() { a.labelsLoop(ctx) })
	wg.Go(func() { a.healthLoop(ctx) })
	wg.Go(func() { a.xidLoop(ctx) })
	wg.Go(func() { a.upgradeWatchdog(ctx) })
	defer wg.Wait()
	// Running processes are killed when ctx ends; their final updates are
	// kept for the next session.
	defer a.execWG.Wait()

	bo := backoff{min: a.cfg.ReconnectMin, max: a.cfg.ReconnectMax}
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			a.metrics.reconnects.Inc()
		}
		established, err := a.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if established {
			bo.reset()
		}
		d := bo.next()
		a.log.Warn("session ended; trying the next gateway", "err", err, "reconnect_in", d)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// session runs one session; established reports whether HelloAck arrived.
func (a *Agent) session(ctx context.Context) (established bool, err error) {
	// Each attempt takes the next gateway: one that failed or dropped the
	// session is left for another replica.
	gw, err := a.gws.pick(ctx)
	if err != nil {
		return false, err
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("gateway %s: %w", gw.addr, err)
		}
	}()
	// The report signatures use the key of the certificate this
	// connection presented, which the gateway verifies them with, even
	// if a renewal replaces the node's key meanwhile.
	tlsCfg := a.mtlsConfig(gw.serverName)
	var presented atomic.Pointer[tls.Certificate]
	getCert := tlsCfg.GetClientCertificate
	tlsCfg.GetClientCertificate = func(i *tls.CertificateRequestInfo) (*tls.Certificate, error) {
		c, err := getCert(i)
		if err == nil {
			presented.Store(c)
		}
		return c, err
	}
	conn, err := a.dial(gw, tlsCfg)
	if err != nil {
		return false, err
	}
	defer func() { _ = conn.Close() }()
	sections, digest, invErr := a.inventory(ctx)
	if invErr != nil {
		a.log.Warn("inventory", "err", invErr)
	}
	// The stream outlives ctx by the goodbye: a stopping agent still says
	// it on this stream. Before HelloAck there is nothing to say goodbye to,
	// so ctx ending then ends the stream at once.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stopEarly := context.AfterFunc(ctx, cancel)
	defer stopEarly()
	// Everything up to HelloAck is bounded: a gateway that took the
	// connection and says nothing (half-open, wedged) is dialled again.
	helloTimer := time.AfterFunc(a.cfg.HelloTimeout, cancel)
	defer helloTimer.Stop()
	stream, err := agentv1.NewAgentServiceClient(conn).Session(sctx)
	if err != nil {
		return false, a.openError(helloTimer, "open session", err)
	}
	s := &session{stream: stream, cancel: cancel, conn: conn, gateway: gw}
	a.mu.Lock()
	if a.cmdTrust != nil {
		node := a.node
		s.sign = func(m proto.Message) error {
			c := presented.Load()
			if c == nil {
				return errors.New("no certificate presented yet")
			}
			key, ok := c.PrivateKey.(crypto.Signer)
			if !ok {
				return fmt.Errorf("the node key is %T", c.PrivateKey)
			}
			return nodesig.Sign(key, node.TrustDomain, node.NodeID, m)
		}
	}
	a.mu.Unlock()
	a.mu.Lock()
	hello := &agentv1.Hello{
		AgentVersion:    a.cfg.Version,
		Mode:            a.cfg.Mode,
		Capabilities:    a.capabilities(),
		LastAppliedSeq:  a.cmds.LastAppliedSeq,
		InventoryDigest: digest,
		TrustVersion:    a.trustVersionLocked(),
	}
	if a.cfg.Mode == agentv1.AgentMode_AGENT_MODE_SITE {
		hello.BmcDrivers = a.cfg.BMCDrivers
	}
	a.mu.Unlock()
	sent := a.cfg.Clock.Now()
	if err := s.send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Hello{Hello: hello}}); err != nil {
		return false, a.openError(helloTimer, "send hello", err)
	}
	first, err := stream.Recv()
	if err != nil {
		return false, a.openError(helloTimer, "await hello ack", err)
	}
	if !helloTimer.Stop() {
		return false, fmt.Errorf("%w (%v)", ErrHelloTimeout, a.cfg.HelloTimeout)
	}
	ack := first.GetHelloAck()
	if ack == nil {
		return false, errors.New("gateway sent something other than HelloAck first")
	}
	a.metrics.heartbeatRTT.Set(a.cfg.Clock.Now().Sub(sent).Seconds())
	if id := ack.GetNodeId(); id != "" && id != a.NodeID() {
		return false, fmt.Errorf("gateway knows this node as %q, not %q", id, a.NodeID())
	}
	if !stopEarly() {
		// ctx ended while the session opened; it is already cancelled.
		return true, nil
	}
	// From here a stopping agent leaves with a goodbye.
	stopWatch := context.AfterFunc(ctx, func() { a.leave(s) })
	defer stopWatch()
	interval := time.Duration(ack.GetHeartbeatSeconds()) * time.Second
	if a.cfg.HeartbeatInterval > 0 {
		interval = a.cfg.HeartbeatInterval
	}
	if interval <= 0 {
		interval = defaultHeartbeat
	}

	a.mu.Lock()
	a.sess = s
	a.mu.Unlock()
	a.metrics.connected.Set(1)
	defer func() {
		a.mu.Lock()
		if a.sess == s {
			a.sess = nil
		}
		a.mu.Unlock()
		a.metrics.connected.Set(0)
	}()
	a.log.Info("session established", "node_id", a.NodeID(), "gateway", gw.addr, "heartbeat", interval)
	// Before any command arrives on it: a session keeps a new binary.
	a.confirmUpgrade()

	if err := a.flushUnreported(s); err != nil {
		return true, err
	}
	if err := a.flushKube(s); err != nil {
		return true, err
	}
	// Each session opens with the whole set of findings as of now.
	if _, err := a.pollFindings(ctx); err != nil {
		a.log.Warn("gpu health not read", "err", err)
	}
	if err := s.send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Status{Status: a.status()}}); err != nil {
		return true, fmt.Errorf("send status: %w", err)
	}
	a.mu.Lock()
	changed := digest != "" && digest != a.cmds.InventoryDigest
	a.mu.Unlock()
	if changed {
		if err := a.sendInventory(s, sections, digest); err != nil {
			return true, err
		}
	}

	errc := make(chan error, 1)
	go func() { errc <- a.heartbeats(sctx, s, interval) }()
	recvErr := a.receive(sctx, s)
	cancel()
	hbErr := <-errc
	return true, errors.Join(recvErr, hbErr)
}

// openError words a failure before HelloAck: when the hello timer fired,
// the failure is its doing.
func (a *Agent) openError(helloTimer *time.Timer, what string, err error) error {
	if !helloTimer.Stop() {
		return fmt.Errorf("%w (%v): %s: %w", ErrHelloTimeout, a.cfg.HelloTimeout, what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// leave says goodbye on s and gives the gateway GoodbyeTimeout to close the
// session before the stream is cancelled.
func (a *Agent) leave(s *session) {
	a.log.Info("stopping: saying goodbye to the gateway")
	if err := s.goodbye("shutdown"); err != nil {
		a.log.Warn("goodbye not sent", "err", err)
		s.cancel()
		return
	}
	time.AfterFunc(a.cfg.GoodbyeTimeout, s.cancel)
}

func (a *Agent) heartbeats(ctx context.Context, s *session, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		err := s.send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Heartbeat{Heartbeat: &agentv1.Heartbeat{
			Time: timestamppb.New(a.cfg.Clock.Now()), Gpus: a.gpuTelemetry(ctx),
		}}})
		if errors.Is(err, errLeaving) {
			return nil
		}
		if err != nil {
			s.cancel()
			return fmt.Errorf("send heartbeat: %w", err)
		}
		a.metrics.heartbeats.Inc()
		if n%statusEvery == 0 {
			err := s.send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Status{Status: a.status()}})
			if errors.Is(err, errLeaving) {
				return nil
			}
			if err != nil {
				s.cancel()
				return fmt.Errorf("send status: %w", err)
			}
		}
	}
}

func (a *Agent) receive(ctx context.Context, s *session) error {
	for {
		m, err := s.stream.Recv()
		if err != nil {
			if s.isLeaving() {
				if errors.Is(err, io.EOF) {
					a.log.Info("session closed: the gateway took the goodbye")
				} else {
					a.log.Warn("session ended before the gateway took the goodbye", "err", err)
				}
				return nil
			}
			if ctx.Err() != nil {
				return nil //nolint:nilerr // the session was asked to end; the receive error is its consequence
			}
			return fmt.Errorf("session receive: %w", err)
		}
		switch msg := m.GetMsg().(type) {
		case *agentv1.GatewayMessage_Command:
			if s.isLeaving() {
				// Not taken: it is redelivered to the next session.
				continue
			}
			select {
			case a.queue <- msg.Command:
			case <-ctx.Done():
				return nil
			}
		case *agentv1.GatewayMessage_Cancel:
			a.cancelCommand(msg.Cancel)
		case *agentv1.GatewayMessage_InventoryRequest:
			sections, digest, err := a.inventory(ctx)
			if err != nil {
				a.log.Warn("inventory", "err", err)
				continue
			}
			if err := a.sendInventory(s, sections, digest); err != nil && !errors.Is(err, errLeaving) {
				return err
			}
		case *agentv1.GatewayMessage_HelloAck:
			a.log.Warn("unexpected second HelloAck")
		}
	}
}

// CapKubernetes: the kubelet can be handed this node's booked GPUs (bcd's
// device plugin or DRA driver is registered with it).
const CapKubernetes = "binding.kubernetes"

// capabilities are what the agent supports: the isolation ones only as
// far as the start-up probe found them enforced, the instance ones as far
// as the hypervisor enforces them, binding.kubernetes only while the
// kubelet plugins are registered.
func (a *Agent) capabilities() []string {
	caps := append([]string{"inventory.sections", "commands.cancel"}, a.iso.capabilities()...)
	if a.cfg.Instances != nil {
		caps = append(caps, a.cfg.Instances.Capabilities()...)
	}
	if a.cfg.KubeletPluginsRegistered != nil && a.cfg.KubeletPluginsRegistered() {
		caps = append(caps, CapKubernetes)
	}
	// A ramdisk runs ramdisk commands only: it is booted, never upgraded.
	if (len(a.cfg.ReleaseKeys) > 0 || a.cfg.DaemonCommands != nil) && a.cfg.Mode != agentv1.AgentMode_AGENT_MODE_RAMDISK {
		caps = append(caps, CapDaemonUpgrade)
	}
	return caps
}

func (a *Agent) status() *agentv1.StatusReport {
	r := &agentv1.StatusReport{Health: "ok"}
	if p, ok := a.fs.Pressure(); ok {
		r.Pressure = p
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.events) > 0 {
		r.Health = "degraded"
		r.Events = append(r.Events, a.events...)
	}
	a.statusFindingsLocked(r)
	return r
}

// currentSession is the established session, nil between sessions.
func (a *Agent) currentSession() *session {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.sess
}
