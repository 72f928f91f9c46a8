package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	crand "crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent"
)

// lightAgent speaks the real agent protocol with no hardware behind it:
// join, one mTLS session, heartbeats, and an immediate SUCCEEDED for every
// command. It keeps per-session memory small so that one harness process
// can hold ten thousand of them.
type lightAgent struct {
	gateway string
	key     *ecdsa.PrivateKey
	nodeID  string
	cert    tls.Certificate
	roots   *x509.CertPool

	connected atomic.Bool
	sessions  atomic.Int64 // sessions established, over the agent's life
	dropped   atomic.Int64 // sessions that ended while not shutting down
	failed    atomic.Int64 // attempts that ended before the HelloAck
	lastSeq   atomic.Uint64

	// received carries the arrival time of each command the harness awaits.
	received chan time.Time
	awaiting atomic.Bool
}

var dialOpts = []grpc.DialOption{
	grpc.WithInitialWindowSize(64 << 10),
	grpc.WithInitialConnWindowSize(64 << 10),
	grpc.WithReadBufferSize(4 << 10),
	grpc.WithWriteBufferSize(4 << 10),
}

func newLightAgent(gateway string) (*lightAgent, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), crand.Reader)
	if err != nil {
		return nil, err
	}
	return &lightAgent{gateway: gateway, key: key, received: make(chan time.Time, 1)}, nil
}

// join exchanges a token for a certificate, trusting the gateway by the
// pin the token carries.
func (a *lightAgent) join(ctx context.Context, token string, i int) error {
	pin, err := agent.TokenPin(token)
	if err != nil {
		return err
	}
	csr, err := x509.CreateCertificateRequest(crand.Reader, &x509.CertificateRequest{}, a.key)
	if err != nil {
		return err
	}
	creds := credentials.NewTLS(&tls.Config{
		MinVersion:            tls.VersionTLS13,
		InsecureSkipVerify:    true, //nolint:gosec // the pin below is the verification
		VerifyPeerCertificate: agent.PinVerifier(pin, time.Now),
	})
	conn, err := grpc.NewClient(a.gateway, append(dialOpts, grpc.WithTransportCredentials(creds))...)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	res, err := agentv1.NewAgentServiceClient(conn).Join(ctx, &agentv1.JoinRequest{
		Token:        token,
		CsrDer:       csr,
		AgentVersion: "bench",
		Mode:         agentv1.AgentMode_AGENT_MODE_NODE,
		Identity: &agentv1.HardwareIdentity{
			DmiProductUuid:   fmt.Sprintf("6b0c5c2e-0000-4000-8000-%012d", i),
			DmiProductSerial: fmt.Sprintf("BENCH%08d", i),
			DmiBoardSerial:   fmt.Sprintf("BOARD%08d", i),
			Hostname:         fmt.Sprintf("bench-%05d", i),
		},
	})
	if err != nil {
		return err
	}
	if res.GetStatus() != agentv1.JoinStatus_JOIN_STATUS_ADMITTED {
		return fmt.Errorf("join not admitted: %s %s", res.GetStatus(), res.GetReason())
	}
	a.nodeID = res.GetNodeId()
	// The leaf alone, as bcd presents it: the gateway trusts the node CA.
	a.cert = tls.Certificate{Certificate: res.GetCertificateChain()[:1], PrivateKey: a.key}
	a.roots = x509.NewCertPool()
	if !a.roots.AppendCertsFromPEM(res.GetTrustBundlePem()) {
		return errors.New("join: empty trust bundle")
	}
	return nil
}

// run keeps a session up until ctx ends, reconnecting with jittered
// backoff, as bcd does.
//
// ramp, when not nil, bounds the sessions being opened at once in the
// first connect: a slot is taken before the first attempt and given back
// once a session is up (or the attempt failed).
func (a *lightAgent) run(ctx context.Context, heartbeat time.Duration, ramp chan struct{}) {
	host, _, _ := net.SplitHostPort(a.gateway)
	creds := credentials.NewTLS(&tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{a.cert},
		RootCAs:      a.roots,
		ServerName:   host,
	})
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		var release func()
		if ramp != nil {
			select {
			case ramp <- struct{}{}:
			case <-ctx.Done():
				return
			}
			var once sync.Once
			release = func() { once.Do(func() { <-ramp }) }
		}
		established := a.session(ctx, creds, heartbeat, release)
		if release != nil {
			release()
			if established {
				ramp = nil
			}
		}
		if ctx.Err() != nil {
			return
		}
		if established {
			a.dropped.Add(1)
			backoff = 100 * time.Millisecond
		}
		sleep := backoff/2 + time.Duration(rand.Int64N(int64(backoff)))
		select {
		case <-ctx.Done():
			return
		case <-time.After(sleep):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

func (a *lightAgent) session(ctx context.Context, creds credentials.TransportCredentials, heartbeat time.Duration, up func()) (established bool) {
	conn, err := grpc.NewClient(a.gateway, append(dialOpts, grpc.WithTransportCredentials(creds))...)
	if err != nil {
		return false
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := agentv1.NewAgentServiceClient(conn).Session(ctx)
	if err != nil {
		a.fail(err)
		return false
	}
	var sendMu sync.Mutex
	send := func(m *agentv1.AgentMessage) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(m)
	}
	if err := send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Hello{Hello: &agentv1.Hello{
		AgentVersion: "bench", Mode: agentv1.AgentMode_AGENT_MODE_NODE, LastAppliedSeq: a.lastSeq.Load(),
	}}}); err != nil {
		a.fail(err)
		return false
	}
	first, err := stream.Recv()
	if err != nil || first.GetHelloAck() == nil {
		a.fail(err)
		return false
	}
	if up != nil {
		up()
	}
	a.connected.Store(true)
	a.sessions.Add(1)
	defer a.connected.Store(false)
	go func() {
		t := time.NewTicker(heartbeat)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Heartbeat{Heartbeat: &agentv1.Heartbeat{Time: timestamppb.Now()}}}) != nil {
					cancel()
					return
				}
			}
		}
	}()
	for {
		m, err := stream.Recv()
		if err != nil {
			return true
		}
		cmd := m.GetCommand()
		if cmd == nil {
			continue
		}
		if a.awaiting.CompareAndSwap(true, false) {
			select {
			case a.received <- time.Now():
			default:
			}
		}
		if cmd.GetSeq() > a.lastSeq.Load() {
			a.lastSeq.Store(cmd.GetSeq())
		}
		if err := send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_CommandUpdate{CommandUpdate: &agentv1.CommandUpdate{
			CommandId: cmd.GetId(), Seq: cmd.GetSeq(), State: agentv1.CommandState_COMMAND_STATE_SUCCEEDED, Progress: 100,
		}}}); err != nil {
			return true
		}
	}
}

// await arms the probe before the harness commits a command.
func (a *lightAgent) await() {
	select {
	case <-a.received:
	default:
	}
	a.awaiting.Store(true)
}

// failures counts failed session attempts by their error, digits and
// addresses left out, so the harness can say why attempts failed.
var failures struct {
	sync.Mutex
	by map[string]int
}

var digits = regexp.MustCompile(`[0-9]+`)

func (a *lightAgent) fail(err error) {
	a.failed.Add(1)
	msg := "no hello ack"
	if err != nil {
		msg = digits.ReplaceAllString(err.Error(), "N")
	}
	failures.Lock()
	defer failures.Unlock()
	if failures.by == nil {
		failures.by = map[string]int{}
	}
	failures.by[msg]++
}

// takeFailures returns the failures counted since the last call, most
// frequent first, at most n, and forgets them.
func takeFailures(n int) []string {
	failures.Lock()
	by := failures.by
	failures.by = nil
	failures.Unlock()
	msgs := make([]string, 0, len(by))
	for m := range by {
		msgs = append(msgs, m)
	}
	slices.SortFunc(msgs, func(a, b string) int { return by[b] - by[a] })
	out := make([]string, 0, n)
	for _, m := range msgs[:min(n, len(msgs))] {
		out = append(out, fmt.Sprintf("%d× %s", by[m], m))
	}
	return out
}
