package gateway

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/execrelay"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tunnel"
)

// Limits of the wire protocol.
const (
	// MaxFrameBytes is the largest message the gateway accepts; larger
	// frames are refused by grpc with RESOURCE_EXHAUSTED.
	MaxFrameBytes = 4 << 20
	// MaxSectionBytes is the largest inventory section.
	MaxSectionBytes = 1 << 20
	// MinNonceBytes is the shortest renew nonce.
	MinNonceBytes = 16
)

// Hooks is what the gateway tells another module, inside the transaction
// that records the report, so both commit or neither does. Fleet paths make
// no authorization call, and neither may a hook.
type Hooks interface {
	// NodeChanged: the node's inventory or device health changed.
	NodeChanged(ctx context.Context, tx store.Tx, nodeID string) error
	// AllocationBound: the agent applied an allocation.bind; the report
	// names the cgroup and what the node enforces.
	AllocationBound(ctx context.Context, tx store.Tx, nodeID string, b *agentv1.AllocationBound) error
	// AllocationReleased: the agent killed what was left and removed the
	// allocation.
	AllocationReleased(ctx context.Context, tx store.Tx, nodeID string, r *agentv1.AllocationReleased) error
	// NodeCapabilitiesChanged: the node's agent advertises other
	// capabilities than before (e.g. devices.limits, which placement
	// requires of reservations bcd binds).
	NodeCapabilitiesChanged(ctx context.Context, tx store.Tx, nodeID string) error
	// NodesLost: the liveness sweep marked these nodes lost.
	NodesLost(ctx context.Context, tx store.Tx, nodeIDs []string) error
	// NodesStateChanged: these nodes started or stopped taking work (a
	// goodbye, a hello or heartbeat reviving them, the unreachable sweep,
	// joining → active), so what places on them reads them again.
	NodesStateChanged(ctx context.Context, tx store.Tx, nodeIDs []string) error
}

// Health records what nodes' status reports find (the health module), in
// the transaction that records the report.
type Health interface {
	// Report: events are new findings (XIDs), findings the node's standing
	// ones, the whole set when complete.
	Report(ctx context.Context, tx store.Tx, nodeID string, events, findings []*agentv1.HealthEvent, complete bool) error
	// HasOpenStanding: the node has standing findings a complete report
	// could clear.
	HasOpenStanding(ctx context.Context, q store.Querier, nodeID string) (bool, error)
}

// SiteHooks act for site agents (bcd --mode site, certificate role site):
// the machine lifecycle's boot lease and BMC commands. Like Hooks, they
// make no authorization call.
type SiteHooks interface {
	// SiteAlive: a site agent's session opened or it sent a heartbeat; the
	// site's boot lease is renewed, taken, or left to its holder.
	SiteAlive(ctx context.Context, nodeID string) error
	// SiteCommandParams are the params a site agent's command goes out
	// with (secrets opened for delivery only). On an error a pending
	// command is failed instead of sent (STALE_EPOCH for
	// fleet.ErrCommandFenced); one already delivered goes out as stored.
	SiteCommandParams(ctx context.Context, nodeID string, c fleet.Command) (string, error)
	// SiteCommandEnded: a site agent's command reached a final state (c
	// holds it), in the transaction that records it.
	SiteCommandEnded(ctx context.Context, tx store.Tx, c fleet.Command) error
	// SiteDrivers: a site agent's session opened with these BMC drivers
	// (its Hello's bmc_drivers; none from an agent that predates the
	// report). They replace what the agent reported before.
	SiteDrivers(ctx context.Context, nodeID string, drivers []*agentv1.BMCDriver) error
}

// Config configures a Gateway. Zero values take the defaults noted.
type Config struct {
	DB *store.DB
	// PoolAttestor, when set, says which attestor the tenant's pool named
	// by a join token requires ("" for none), read in the join's
	// transaction; capacity owns pools.
	PoolAttestor func(ctx context.Context, q store.Querier, tenantID, pool string) (string, error)
	// Sites, when set, act for site agents' sessions.
	Sites SiteHooks
	// Hooks, when set, act on what nodes report in the gateway's own
	// transactions (capacity keeps atoms and reservations in step).
	Hooks Hooks
	// Health, when set, records the findings of status reports.
	Health Health
	// Exec, when set, receives the output and end of process.exec commands
	// whose sessions this replica holds, for the API calls waiting on them.
	Exec *execrelay.Hub
	// Tunnels, when set, matches the tunnels nodes open (Tunnel) to the
	// API requests waiting for them.
	Tunnels *tunnel.Hub
	// SiteImages, when set, serves deploying machines' images to site
	// agents (FetchSiteImage).
	SiteImages SiteImages
	// OpenNodeSecret, when set, serves FetchSecret: in the fetch's
	// transaction it opens the secret ref names for a node of tenantID,
	// or answers an error matching ErrSecretNotFound for anything that
	// node may not read (secrets.OpenForNode).
	OpenNodeSecret func(ctx context.Context, q store.Querier, tenantID, ref string) (NodeSecret, error)
	// Authority is the PKI. It may be nil in a process that does not
	// serve (an api or worker replica): the gateway then only wakes
	// sessions (NotifyCommand) and runs the sweeps; Run fails.
	Authority Authority
	// Tracing records each command's span when its node reports it done;
	// nil records none.
	Tracing trace.TracerProvider
	// Recorder writes outbox events in the gateway's transactions.
	Recorder envelope.Recorder
	// Discovery admits commissioning ramdisks joining with a machine's
	// discovery token; nil refuses such tokens.
	Discovery Discovery
	// OpenParams opens, per command kind, what another module sealed in
	// a command's params (vps: an instance's seed), at delivery only.
	OpenParams fleet.ParamsOpeners
	// CommandDone, when set, is told of each command that ends (succeeded,
	// failed, canceled), in the transaction that records it: the machine
	// lifecycle completes the step a ramdisk command carried.
	CommandDone func(ctx context.Context, tx store.Tx, c fleet.Command, state, message string, result map[string]any) error
	Clock       clock.Clock
	Logger      *slog.Logger
	// Listen is the gRPC address; default 127.0.0.1:8443.
	Listen string
	// Hosts are the serving certificate's names; default the listen host
	// and "localhost".
	Hosts []string
	// ReplicaID names this replica as a session owner; default
	// hostname-<random>.
	ReplicaID string
	// HeartbeatInterval is what HelloAck tells agents; default 10s.
	HeartbeatInterval time.Duration
	// UnreachableAfter without a heartbeat a ready node turns unreachable;
	// default 30s.
	UnreachableAfter time.Duration
	// LostAfter without a heartbeat a node is lost; default 5m.
	LostAfter time.Duration
	// LivenessInterval is how often the liveness and command sweeps run;
	// default 5s.
	LivenessInterval time.Duration
	// FlushInterval is how often batched heartbeats are written; default 1s.
	FlushInterval time.Duration
	// RecheckInterval is how often a session looks at its node's commands
	// and certificate without being woken (a missed notification, a
	// revocation); default 60s.
	RecheckInterval time.Duration
	// HelloTimeout bounds the wait for a session's first message; default 30s.
	HelloTimeout time.Duration
	// CertTTL is the lifetime of node certificates; default 24h.
	CertTTL time.Duration
	// RenewSkew is how far a renew request's time may be from now; default 5m.
	RenewSkew time.Duration
	// JoinRetryAfter is what a deferred join is told to wait; default 30s.
	JoinRetryAfter time.Duration
	// HandshakeTimeout bounds a new connection's TLS handshake and HTTP/2
	// preface: a client that connects and never finishes them is dropped;
	// default 60s. It counts from accept, so in a reconnect storm it also
	// counts the wait behind every other handshake: at 10 s most of 10,000
	// agents connecting at once were dropped after their handshake was
	// done, and came back to do it again (docs/benchmarks.md).
	HandshakeTimeout time.Duration
	// IdleConnTimeout closes a connection that has had no open stream for
	// this long: an agent's connection holds its session, so what goes is a
	// caller that joined and idles, or one that never authenticated;
	// default 2m.
	IdleConnTimeout time.Duration
	// RefusalLogInterval is the least time between two log lines about
	// refused handshakes; the lines in between are counted, not written
	// (a scan must not flood the log); default 10s.
	RefusalLogInterval time.Duration
	// Metrics, when set, registers the gateway's counters (the app's
	// /metrics registry).
	Metrics prometheus.Registerer
	// MaxStreamsPerConn bounds concurrent streams on one connection;
	// default 32 (an agent needs one session, an occasional unary call,
	// and one stream per open SSH tunnel).
	MaxStreamsPerConn uint32
	// ShutdownTimeout bounds the graceful stop; default 10s.
	ShutdownTimeout time.Duration
	// RefreshInterval is how often revocations made on other replicas are
	// loaded, when the Authority can (FromPKI's can); default 30s.
	RefreshInterval time.Duration
	// CommandsExpired, when set, is told of the commands a sweep expired
	// (their deadline passed before the node answered), in the sweep's
	// transaction: instances converge from it as from an answer.
	CommandsExpired func(ctx context.Context, tx store.Tx, expired []fleet.Command) error
}

func (c *Config) defaults() error {
	if c.DB == nil || c.Recorder == nil {
		return errors.New("gateway: DB and Recorder are required")
	}
	c.Clock = cmp.Or[clock.Clock](c.Clock, c.DB.Clock())
	c.Logger = cmp.Or(c.Logger, slog.Default())
	c.Listen = cmp.Or(c.Listen, "127.0.0.1:8443")
	host, _, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return fmt.Errorf("gateway: listen address %q: %w", c.Listen, err)
	}
	if len(c.Hosts) == 0 {
		c.Hosts = DefaultHosts(host)
	}
	if c.ReplicaID == "" {
		name, _ := os.Hostname()
		var b [4]byte
		_, _ = rand.Read(b[:])
		c.ReplicaID = cmp.Or(name, "gateway") + "-" + hex.EncodeToString(b[:])
	}
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, 10*time.Second)
	c.UnreachableAfter = cmp.Or(c.UnreachableAfter, 30*time.Second)
	c.LostAfter = cmp.Or(c.LostAfter, 5*time.Minute)
	c.LivenessInterval = cmp.Or(c.LivenessInterval, 5*time.Second)
	c.FlushInterval = cmp.Or(c.FlushInterval, time.Second)
	c.RecheckInterval = cmp.Or(c.RecheckInterval, time.Minute)
	c.HelloTimeout = cmp.Or(c.HelloTimeout, 30*time.Second)
	c.CertTTL = cmp.Or(c.CertTTL, 24*time.Hour)
	c.RenewSkew = cmp.Or(c.RenewSkew, 5*time.Minute)
	c.JoinRetryAfter = cmp.Or(c.JoinRetryAfter, 30*time.Second)
	c.HandshakeTimeout = cmp.Or(c.HandshakeTimeout, time.Minute)
	c.IdleConnTimeout = cmp.Or(c.IdleConnTimeout, 2*time.Minute)
	c.RefusalLogInterval = cmp.Or(c.RefusalLogInterval, 10*time.Second)
	c.MaxStreamsPerConn = cmp.Or(c.MaxStreamsPerConn, 32)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, 10*time.Second)
	c.RefreshInterval = cmp.Or(c.RefreshInterval, 30*time.Second)
	return c.Validate()
}

// Validate checks the durations against each other.
func (c *Config) Validate() error {
	switch {
	case c.HeartbeatInterval < time.Second || c.HeartbeatInterval > time.Hour:
		return fmt.Errorf("gateway: heartbeat interval %v must be between 1s and 1h", c.HeartbeatInterval)
	case c.UnreachableAfter < 2*c.HeartbeatInterval:
		return fmt.Errorf("gateway: unreachable-after %v must be at least twice the heartbeat interval %v", c.UnreachableAfter, c.HeartbeatInterval)
	case c.LostAfter <= c.UnreachableAfter:
		return fmt.Errorf("gateway: lost-after %v must be longer than unreachable-after %v", c.LostAfter, c.UnreachableAfter)
	case c.LivenessInterval <= 0 || c.FlushInterval <= 0 || c.RecheckInterval <= 0:
		return errors.New("gateway: liveness, flush and recheck intervals must be positive")
	case c.HandshakeTimeout < 0 || c.IdleConnTimeout < 0 || c.RefusalLogInterval < 0:
		return errors.New("gateway: handshake timeout, idle connection timeout and refusal log interval must not be negative")
	case c.CertTTL > 24*time.Hour:
		return fmt.Errorf("gateway: node certificates live at most 24h, got %v", c.CertTTL)
	}
	return nil
}

// DefaultHosts is the serving certificate's default names for a listen
// host: the host itself (unless it is a wildcard) and "localhost".
func DefaultHosts(listenHost string) []string {
	var hosts []string
	if ip := net.ParseIP(listenHost); listenHost != "" && (ip == nil || !ip.IsUnspecified()) {
		hosts = append(hosts, listenHost)
	}
	if listenHost != "localhost" {
		hosts = append(hosts, "localhost")
	}
	return hosts
}

// Gateway serves the agent protocol.
type Gateway struct {
	agentv1.UnimplementedAgentServiceServer

	cfg Config
	log *slog.Logger
	hub *hub
	// signerChains caches command signers' chains by serial (they never
	// change once issued).
	signerChains sync.Map
	beats        *batcher
	// hellos group-commits session openings.
	hellos *helloBatch
	// metrics count what happens below the sessions (refused handshakes);
	// refusals rate-limits their log lines.
	metrics  *metrics
	refusals *sampler

	mu  sync.Mutex
	ln  net.Listener
	srv *grpc.Server
}

var _ fleet.CommandNotifier = (*Gateway)(nil)

// New validates cfg and returns a Gateway; Run serves it.
func New(cfg Config) (*Gateway, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	g := &Gateway{
		cfg:   cfg,
		log:   cfg.Logger.With("component", "gateway", "replica", cfg.ReplicaID),
		hub:   newHub(),
		beats: newBatcher(),
	}
	g.hellos = newHelloBatch(g)
	g.metrics = newMetrics(g)
	if cfg.Metrics != nil {
		if err := g.metrics.register(cfg.Metrics); err != nil {
			return nil, fmt.Errorf("gateway: register metrics: %w", err)
		}
	}
	g.refusals = newSampler(cfg.Clock, cfg.RefusalLogInterval)
	return g, nil
}

// Config returns the effective configuration.
func (g *Gateway) Config() Config { return g.cfg }

// ReplicaID is the session owner this replica writes on nodes.
func (g *Gateway) ReplicaID() string { return g.cfg.ReplicaID }

// Listen binds the configured address, so that callers learn the port
// (127.0.0.1:0 in tests) before Run. Run listens itself when not called.
func (g *Gateway) Listen() (net.Addr, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ln != nil {
		return g.ln.Addr(), nil
	}
	ln, err := net.Listen("tcp", g.cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("gateway: listen on %s: %w", g.cfg.Listen, err)
	}
	g.ln = ln
	return ln.Addr(), nil
}

// Addr is the bound address, or nil before Listen.
func (g *Gateway) Addr() net.Addr {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ln == nil {
		return nil
	}
	return g.ln.Addr()
}

// Sessions is the number of sessions this replica holds.
func (g *Gateway) Sessions() int { return g.hub.count() }

// Connected reports whether this replica holds a session of nodeID.
func (g *Gateway) Connected(nodeID string) bool { return g.hub.get(nodeID) != nil }

// NotifyCommand wakes the session of nodeID after tx commits: in process
// through the hub, and on PostgreSQL with pg_notify in tx so the replica
// owning the session wakes too. The fleet API calls it when it writes or
// cancels a command.
func (g *Gateway) NotifyCommand(tx store.Tx, nodeID string) {
	if err := fleet.CommandNotify(context.Background(), tx, nodeID); err != nil {
		g.log.Error("notify command", "node", nodeID, "err", err)
	}
	tx.AfterCommit(func() { g.hub.wake(nodeID) })
}

// ServerOptions are the gRPC server's options (exported for tests and
// benchmarks that host the service themselves). Handshakes through creds
// that fail are counted and logged.
func (g *Gateway) ServerOptions(creds credentials.TransportCredentials) []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.Creds(&watchedCreds{TransportCredentials: creds, g: g}),
		grpc.ForceServerCodecV2(newAgentCodec()),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time: 30 * time.Second, Timeout: 10 * time.Second, MaxConnectionIdle: g.cfg.IdleConnTimeout,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.MaxRecvMsgSize(MaxFrameBytes),
		grpc.MaxConcurrentStreams(g.cfg.MaxStreamsPerConn),
		grpc.ConnectionTimeout(g.cfg.HandshakeTimeout),
		grpc.ChainUnaryInterceptor(g.unaryInterceptor),
		grpc.ChainStreamInterceptor(g.streamInterceptor),
	}
	return append(opts, bufferOptions()...)
}

// Run serves until ctx is done, then stops: sessions are told to reconnect
// (UNAVAILABLE), in-flight calls get ShutdownTimeout, and pending
// heartbeats are written.
func (g *Gateway) Run(ctx context.Context) error {
	if g.cfg.Authority == nil {
		return errors.New("gateway: no certificate authority configured (is BETTER_COMPUTE_SECRET set?)")
	}
	if _, err := g.Listen(); err != nil {
		return err
	}
	g.mu.Lock()
	ln := g.ln
	g.mu.Unlock()
	cert, err := g.cfg.Authority.IssueServing(g.cfg.Hosts)
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("gateway: serving certificate: %w", err)
	}
	srv := grpc.NewServer(g.ServerOptions(credentials.NewTLS(g.cfg.Authority.GatewayTLSConfig(cert)))...)
	agentv1.RegisterAgentServiceServer(srv, g)
	g.mu.Lock()
	g.srv = srv
	g.mu.Unlock()

	bgCtx, stopBg := context.WithCancel(context.WithoutCancel(ctx))
	var bg sync.WaitGroup
	bg.Go(func() { g.runHeartbeats(bgCtx) })
	bg.Go(func() { g.hellos.run(bgCtx) })
	if g.cfg.DB.SupportsListener() {
		bg.Go(func() { g.runListener(bgCtx) })
	}
	if r, ok := g.cfg.Authority.(refresher); ok {
		bg.Go(func() { g.runRefresh(bgCtx, r) })
	}

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	g.log.Info("gateway serving", "addr", ln.Addr().String(), "hosts", g.cfg.Hosts)

	var serveErr error
	select {
	case serveErr = <-errc:
	case <-ctx.Done():
	}
	// Sessions never end on their own: end them so GracefulStop can finish;
	// agents reconnect to another replica.
	g.hub.closeAll(status.Error(codes.Unavailable, "gateway shutting down; reconnect"))
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(g.cfg.ShutdownTimeout):
		srv.Stop()
		<-stopped
	}
	if serveErr == nil {
		serveErr = <-errc
	}
	stopBg()
	bg.Wait()
	if serveErr != nil && !errors.Is(serveErr, grpc.ErrServerStopped) {
		return fmt.Errorf("gateway: serve: %w", serveErr)
	}
	return nil
}

// refresher is an Authority that can reload its revocation set.
type refresher interface {
	Refresh(ctx context.Context) error
}

func (g *Gateway) runRefresh(ctx context.Context, r refresher) {
	t := time.NewTicker(g.cfg.RefreshInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := r.Refresh(ctx); err != nil && ctx.Err() == nil {
				g.log.Warn("refresh revocations", "err", err)
			}
		}
	}
}
