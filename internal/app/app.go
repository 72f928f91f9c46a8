// Package app wires the control plane together: it opens the store, applies
// every module's migrations, builds the authorizer, the envelope, the API
// handlers and the background runtime, and runs the chosen roles under one
// task runner with a clean shutdown.
//
// It must never hold business rules: those live in the modules it wires.
package app

import (
	"cmp"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/riverqueue/river"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/audit"
	"github.com/better-compute/better-compute/internal/authn"
	"github.com/better-compute/better-compute/internal/capacity/booking"
	"github.com/better-compute/better-compute/internal/capacity/budget"
	"github.com/better-compute/better-compute/internal/capacity/migauto"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/capacity/quota"
	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/capacity/usage"
	"github.com/better-compute/better-compute/internal/clock"
	"github.com/better-compute/better-compute/internal/console"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/events"
	"github.com/better-compute/better-compute/internal/execrelay"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/fleetmark"
	"github.com/better-compute/better-compute/internal/gateway"
	"github.com/better-compute/better-compute/internal/health"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/images"
	"github.com/better-compute/better-compute/internal/jobs"
	"github.com/better-compute/better-compute/internal/metal"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/policy"
	"github.com/better-compute/better-compute/internal/profiles"
	"github.com/better-compute/better-compute/internal/provideraccounts"
	"github.com/better-compute/better-compute/internal/providerpools"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/quorum"
	"github.com/better-compute/better-compute/internal/release"
	"github.com/better-compute/better-compute/internal/releases"
	"github.com/better-compute/better-compute/internal/replica"
	"github.com/better-compute/better-compute/internal/rollout"
	"github.com/better-compute/better-compute/internal/sandbox"
	"github.com/better-compute/better-compute/internal/secrets"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/store/storeopen"
	"github.com/better-compute/better-compute/internal/tenancy"
	"github.com/better-compute/better-compute/internal/tracing"
	"github.com/better-compute/better-compute/internal/tunnel"
	"github.com/better-compute/better-compute/internal/vmcmd"
	"github.com/better-compute/better-compute/internal/vps"
	"github.com/better-compute/better-compute/internal/webhooks"
)

// Roles a process can run.
const (
	RoleAPI     = "api"
	RoleWorker  = "worker"
	RoleGateway = "gateway"
)

// DefaultMaxConnections is the API listener's connection cap unless
// configured.
const DefaultMaxConnections = 1024

// KnownRoles lists the roles this build serves.
var KnownRoles = []string{RoleAPI, RoleWorker, RoleGateway}

// DefaultRoles are the roles a process runs when none are named.
var DefaultRoles = []string{RoleAPI, RoleWorker, RoleGateway}

// Config configures the control plane.
type Config struct {
	// Roles to run; default api and worker.
	Roles []string
	// Listen is the API address; default 127.0.0.1:8080.
	Listen string
	// StateDir holds the SQLite database (and, by default, the bootstrap
	// key file); default ./.better-compute.
	StateDir string
	// DatabaseURL selects PostgreSQL (postgres://…); empty means SQLite.
	DatabaseURL string
	// DBStatementTimeout and DBLockTimeout bound every PostgreSQL statement
	// and lock wait (store.Config: 0 takes the default, negative is off).
	DBStatementTimeout, DBLockTimeout time.Duration
	// PDP is "cedar" (embedded, default) or "authzen" (remote).
	PDP            string
	AuthZENURL     string
	AuthZENTimeout time.Duration
	AuthZENToken   string
	OIDC           authn.OIDCConfig
	// EventPoll is how often watchers look for other replicas' events.
	EventPoll time.Duration
	// JobPoll is how often SQLite workers look for jobs.
	JobPoll time.Duration
	// ShutdownTimeout bounds how long in-flight requests get on shutdown.
	ShutdownTimeout time.Duration
	// DownloadsDir holds the bcd builds served at
	// /downloads/bcd/{version}/linux-{arch} for the install script;
	// default <state-dir>/downloads.
	DownloadsDir string
	// ImagesDir is the image catalog's blob directory (sha256/<hex> and
	// uploads/); default <state-dir>/images. Replicas that take pushes must
	// share it.
	ImagesDir string
	// ReleasePubkeys are the files of the release public keys a published
	// release must be signed by (--release-pubkey); none refuses every
	// releases create.
	ReleasePubkeys []string
	// MaxImageBytes bounds one image push; default 64 GiB.
	MaxImageBytes int64
	Clock         clock.Clock
	Logger        *slog.Logger
	// WrapAuthorizer lets tests instrument the authorizer (counting calls).
	WrapAuthorizer func(iam.Authorizer) iam.Authorizer

	// GatewayListen is the agent gateway's gRPC address; default
	// 127.0.0.1:8443.
	GatewayListen string
	// ReplicaListen is the replica listener's address: mutual TLS with
	// certificates from the internal CA, where other replicas forward the
	// mutations of pools this one places (PostgreSQL, with a PKI, api
	// role). Empty: none; peers cannot forward here.
	ReplicaListen string
	// ProviderGateway is the gateway's HOST:PORT as a provider pool's
	// servers reach it (their bcd joins there); default the gateway's
	// first certificate name and its listening port.
	ProviderGateway string
	// GatewayHosts are the names in the gateway's serving certificate;
	// default the listen host (unless a wildcard) and "localhost".
	GatewayHosts []string
	// Secret is the value of BETTER_COMPUTE_SECRET: the key that seals the
	// PKI's CA keys in the database. The gateway role requires it; without
	// it other roles run with no PKI (join tokens cannot be created).
	Secret string
	// TrustDomain is the SPIFFE trust domain of a PKI created on first
	// start (default pki.DefaultTrustDomain); an existing PKI keeps its own.
	TrustDomain string
	// HeartbeatInterval is what agents are told to beat at; default 10s.
	HeartbeatInterval time.Duration
	// UnreachableAfter and LostAfter without a heartbeat mark a node
	// unreachable (default 30s) and lost (default 5m).
	UnreachableAfter time.Duration
	LostAfter        time.Duration
	// BindTimeout bounds an allocation.bind before it is re-sent; default 60s.
	BindTimeout time.Duration
	// GuestImages are the guest image names hosts hold (bcd
	// --guest-images); instances naming another are refused. Default
	// vps.DefaultGuestImages.
	GuestImages []string
	// CapacityTick is how often reservations are started, expired and
	// re-bound, and the queue looked at; default 5s.
	CapacityTick time.Duration
	// HealthInterval is the health reconciler's period; 0 takes 15 s.
	HealthInterval time.Duration
	// RolloutInterval is the rollout controller's period; 0 takes 10 s.
	RolloutInterval time.Duration
	// PublicURL is the control plane's API URL as nodes reach it: rollouts
	// tell bcd to download releases from PublicURL/downloads/bcd/...
	// Default this replica's own API URL.
	PublicURL string
	// PlacerLinger is the longest a pool's placer waits for more work when
	// its queue holds fewer than placer.LingerBatch mutations, so that a
	// commit carries more of them; it waits no longer than its recent
	// commits took. Default placer.DefaultLinger; negative turns it off.
	PlacerLinger time.Duration
	// LivenessInterval is how often the liveness and command sweeps run;
	// default 5s.
	LivenessInterval time.Duration
	// GatewayReplicaID names this replica as a session owner; default
	// hostname-<random>.
	GatewayReplicaID string
	// TrustedProxies are the reverse proxies whose X-Forwarded-For names
	// the client recorded in audit rows (serve --trusted-proxies).
	TrustedProxies []netip.Prefix
	// MaxConnections caps the API listener's open connections; more are
	// closed at accept. Default 1024.
	MaxConnections int
	// ReadHeaderTimeout bounds a request's headers (default 10s),
	// RequestBodyTimeout a unary request's body (default 30s; watches are
	// exempt), and IdleTimeout a kept-alive connection between requests
	// (default 2m).
	ReadHeaderTimeout  time.Duration
	RequestBodyTimeout time.Duration
	IdleTimeout        time.Duration
	// Limits cap each principal's request rate and open watch streams;
	// zero means no limit (serve and dev set defaults from flags).
	Limits envelope.Limits
	// RefusalAuditLimit refusals of one principal per RefusalAuditWindow
	// are written to the audit log (default 30 a minute).
	RefusalAuditLimit  int
	RefusalAuditWindow time.Duration
	// WatchRecheck is how often a watch stream is decided again, on the
	// clock (default 30s).
	WatchRecheck time.Duration
	// GatewayHandshakeTimeout bounds a gateway connection's TLS handshake
	// (default 60s); GatewayIdleConnTimeout closes one without a stream for
	// that long (default 2m).
	GatewayHandshakeTimeout time.Duration
	GatewayIdleConnTimeout  time.Duration
	// WebhookAllowPrivate lets webhook endpoints resolve to loopback,
	// private, shared and benchmarking addresses (--webhook-allow-private);
	// WebhookAllowLoopback allows loopback alone (dev). The API's own
	// listener, unspecified, link-local, metadata, multicast and reserved
	// addresses are refused either way.
	WebhookAllowPrivate  bool
	WebhookAllowLoopback bool
	// WorkloadIssuer is the public URL of the control plane as workloads'
	// verifiers reach it: the iss of workload tokens, whose JWKS and OIDC
	// discovery document are served under it at /.well-known/. Empty (or no
	// Secret) turns workload identity off.
	WorkloadIssuer string
	// WebhookResolver resolves webhook hosts, when endpoints are checked
	// and when deliveries dial (default the system's resolver).
	WebhookResolver *net.Resolver
	// EventRetention is how long outbox events are kept once every webhook
	// cursor has passed them (default 7 days).
	EventRetention time.Duration
	// SSEHeartbeat is how often an idle event stream gets a comment line
	// (default 15s).
	SSEHeartbeat time.Duration
	// AuditCheckpointEvery and AuditCheckpointInterval: the audit log's
	// tree gets a signed checkpoint once this many entries were added, or
	// when the last is this old and entries were added (defaults 1,000
	// and 1m). AuditSequenceInterval is how often the sequencer job runs
	// (default 5s).
	AuditCheckpointEvery                           int
	AuditCheckpointInterval, AuditSequenceInterval time.Duration
	// Tracing exports OpenTelemetry traces over OTLP when it names an
	// endpoint (--otlp-endpoint or OTEL_EXPORTER_OTLP_ENDPOINT); off
	// otherwise.
	Tracing tracing.Config
}

func (c *Config) defaults() error {
	if len(c.Roles) == 0 {
		c.Roles = slices.Clone(DefaultRoles)
	}
	for _, r := range c.Roles {
		if !slices.Contains(KnownRoles, r) {
			return fmt.Errorf("unknown role %q (this build serves %s)", r, strings.Join(KnownRoles, ", "))
		}
	}
	c.Listen = cmp.Or(c.Listen, "127.0.0.1:8080")
	c.StateDir = cmp.Or(c.StateDir, ".better-compute")
	c.DownloadsDir = cmp.Or(c.DownloadsDir, filepath.Join(c.StateDir, "downloads"))
	c.ImagesDir = cmp.Or(c.ImagesDir, filepath.Join(c.StateDir, "images"))
	if c.MaxImageBytes < 0 {
		return fmt.Errorf("max image bytes must not be negative, got %d", c.MaxImageBytes)
	}
	c.PDP = cmp.Or(c.PDP, "cedar")
	if c.PDP != "cedar" && c.PDP != "authzen" {
		return fmt.Errorf("pdp must be cedar or authzen, got %q", c.PDP)
	}
	if c.PDP == "authzen" && c.AuthZENURL == "" {
		return errors.New("the authzen pdp needs --authzen-url")
	}
	if slices.Contains(c.Roles, RoleGateway) && strings.TrimSpace(c.Secret) == "" {
		return fmt.Errorf("the gateway role needs %s: base64 of 32 random bytes (generate one with `openssl rand -base64 32`); it seals the PKI's keys", pki.SecretEnv)
	}
	c.GatewayListen = cmp.Or(c.GatewayListen, "127.0.0.1:8443")
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, 15*time.Second)
	c.MaxConnections = cmp.Or(c.MaxConnections, DefaultMaxConnections)
	if c.MaxConnections < 0 {
		return fmt.Errorf("max connections must be positive, got %d", c.MaxConnections)
	}
	c.ReadHeaderTimeout = cmp.Or(c.ReadHeaderTimeout, 10*time.Second)
	c.RequestBodyTimeout = cmp.Or(c.RequestBodyTimeout, 30*time.Second)
	c.IdleTimeout = cmp.Or(c.IdleTimeout, 2*time.Minute)
	if c.Limits.RequestRate < 0 || c.Limits.RequestBurst < 0 || c.Limits.MaxStreams < 0 {
		return errors.New("request rate, burst and stream limits must not be negative (0 means no limit)")
	}
	c.EventRetention = cmp.Or(c.EventRetention, 7*24*time.Hour)
	c.SSEHeartbeat = cmp.Or(c.SSEHeartbeat, 15*time.Second)
	if c.EventRetention < time.Hour {
		return fmt.Errorf("event retention must be at least 1h, got %s", c.EventRetention)
	}
	if c.AuditCheckpointEvery < 0 || c.AuditCheckpointInterval < 0 || c.AuditSequenceInterval < 0 {
		return errors.New("audit checkpoint every, checkpoint interval and sequence interval must not be negative")
	}
	c.Clock = cmp.Or[clock.Clock](c.Clock, clock.Real{})
	c.Logger = cmp.Or(c.Logger, slog.Default())
	return nil
}

// App is a wired control plane.
type App struct {
	cfg      Config
	DB       *store.DB
	Envelope *envelope.Envelope
	Authn    *authn.Authenticator
	Authz    iam.Authorizer
	Jobs     *jobs.Runtime
	Registry *prometheus.Registry
	Handler  http.Handler
	// PKI is the certificate authority; nil when no Secret was given.
	PKI *pki.Authority
	// cmdSigner signs every command this replica inserts; nil without a
	// PKI.
	cmdSigner fleet.CommandSigner
	// Replica is this replica's identity among its peers (nil without a
	// PKI): the transport it forwards with and its replica listener's TLS.
	Replica   *replica.Identity
	replicaLn net.Listener
	// Gateway serves the agent protocol (gateway role); in every process it
	// also wakes sessions when commands are written and runs the sweeps.
	Gateway    *gateway.Gateway
	hub        *events.Hub
	recorder   recorder
	fleetHooks lateHooks
	siteHooks  lateSites
	execHub    *execrelay.Hub
	// tunnels holds the tunnels waiting for their node (tickets are rows).
	tunnels *tunnel.Hub
	// peers finds the replica holding a node's session, for tunnels.
	peers     *replicaPeers
	discovery *discovery
	conns     *connMetrics
	// Capacity is the reservation runner: the queued placer, the tick and
	// the fleet hooks.
	Capacity *reservation.Runner
	// MIG repartitions the MIG layouts of pools with mig: auto
	// (capacity.mig_repartition).
	MIG *migauto.Repartitioner
	// selfURL is the API listener's URL (SetSelfURL).
	selfURL atomic.Value
	// ProviderPools runs the instances of provider pools: servers rented
	// through a provider account.
	ProviderPools *providerpools.Module
	// Instances runs virtual machines through capacity and the fleet's
	// command path, and converges them from bcd's answers.
	Instances *vps.InstanceService
	// Sandboxes runs sandboxes on instances: templates, warm pools, TTL
	// expiry and snapshots.
	Sandboxes *sandbox.Service
	// Blobs is the image catalog's blob directory; published releases'
	// files are kept there too.
	Blobs       *images.Blobs
	releaseKeys []release.PublicKey
	// Webhooks is the outbox consumer that queues webhook deliveries; it
	// runs with the worker role (RunWebhooks).
	Webhooks *webhooks.Dispatcher
	// WebhookGuard is the SSRF guard of webhook endpoints.
	WebhookGuard *webhooks.Guard
	// Metal is the machine lifecycle: the provision engine with the
	// machine profiles and the site agents its steps go to.
	Metal *metal.Runtime
	// Health records GPU health findings, quarantines GPUs and runs
	// remediations on the machine lifecycle's provision engine.
	Health *health.Module
	// Rollouts rolls bcd releases out to pools in waves; its release
	// store is set with Rollouts.SetReleases.
	Rollouts *rollout.Module
	// Tracing is the tracer provider: OTLP when configured, no-op when
	// not.
	Tracing *tracing.Provider
	// AuditLog is the audit log's Merkle tree: sequencer, checkpoints,
	// proofs.
	AuditLog *audit.Log
	sealer   *pki.Sealer
}

// Modules lists every module's migrations in dependency order.
func Modules() []store.Migrations {
	return []store.Migrations{
		tenancy.Migrations(), authn.Migrations(), policy.Migrations(),
		envelope.Migrations(), audit.Migrations(), events.Migrations(), webhooks.Migrations(),
		fleet.Migrations(), pool.Migrations(), booking.Migrations(), reservation.Migrations(),
		// Quotas read the reservations table; keep them after its module.
		quota.Migrations(),
		// Budgets price the reservations table at check time; after it too.
		budget.Migrations(),
		// Usage reads reservations at run time only; keep it last of the
		// capacity modules all the same.
		usage.Migrations(),
		images.Migrations(),
		releases.Migrations(),
		// Machines run workflows on the provision engine.
		provision.Migrations(), metal.Migrations(),
		vps.Migrations(), secrets.Migrations(), provideraccounts.Migrations(), providerpools.Migrations(),
		// Fleet marks name objects by kind and name only; no table joins them.
		fleetmark.Migrations(),
		// Sandboxes claim warm instances by joining the instances table.
		sandbox.Migrations(),
		quorum.Migrations(),
		// Profile documents: a deploy reads them, nothing else joins them.
		profiles.Migrations(),
		// Health reads nodes and pools and starts workflows.
		health.Migrations(),
		// Rollouts read nodes, pools and health findings.
		rollout.Migrations(),
		// Console sessions: read by the console alone.
		console.Migrations(),
	}
}

// recorder writes audit rows and outbox events for the envelope.
type recorder struct{ hub *events.Hub }

func (r recorder) InsertAudits(ctx context.Context, tx store.Tx, entries []envelope.AuditEntry) error {
	return audit.Insert(ctx, tx, entries...)
}

func (r recorder) InsertEvents(ctx context.Context, tx store.Tx, evs []envelope.Event) error {
	return events.Insert(ctx, tx, r.hub, evs)
}

// New opens the store, migrates it and wires every component. Close it.
func New(ctx context.Context, cfg Config) (*App, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	db, err := storeopen.Open(ctx, store.Config{URL: cfg.DatabaseURL, StateDir: cfg.StateDir, Clock: cfg.Clock, Logger: cfg.Logger,
		StatementTimeout: cfg.DBStatementTimeout, LockTimeout: cfg.DBLockTimeout, Exclusive: true})
	if err != nil {
		return nil, err
	}
	a, err := build(ctx, cfg, db)
	if err != nil {
		return nil, errors.Join(err, db.Close())
	}
	return a, nil
}

// NewWithDB wires the control plane on an already open store (tests).
func NewWithDB(ctx context.Context, cfg Config, db *store.DB) (*App, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	return build(ctx, cfg, db)
}

func build(ctx context.Context, cfg Config, db *store.DB) (*App, error) {
	if err := db.Migrate(ctx, Modules()...); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	if err := db.Migrate(ctx, pki.Migrations()); err != nil {
		return nil, fmt.Errorf("migrate pki: %w", err)
	}
	if err := jobs.Migrations(ctx, db); err != nil {
		return nil, fmt.Errorf("migrate jobs: %w", err)
	}
	a := &App{cfg: cfg, DB: db, hub: events.NewHub(), Registry: prometheus.NewRegistry()}
	a.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a.recorder = recorder{hub: a.hub}
	if err := a.buildTracing(ctx); err != nil {
		return nil, err
	}

	// Before the gateway: its status reports go to the health module.
	hm, err := health.New(health.Config{DB: db, Recorder: a.recorder, Clock: cfg.Clock, Logger: cfg.Logger, Interval: cfg.HealthInterval})
	if err != nil {
		return nil, err
	}
	a.Health = hm
	a.Registry.MustRegister(a.Health.Collectors()...)
	if err := a.buildGateway(ctx); err != nil {
		return nil, err
	}

	if err := a.buildAuditLog(ctx); err != nil {
		return nil, err
	}

	cedar, err := iam.NewCedar(policy.Source{DB: db})
	if err != nil {
		return nil, fmt.Errorf("cedar: %w", err)
	}
	var authz iam.Authorizer = cedar
	if cfg.PDP == "authzen" {
		authz = iam.NewAuthZEN(iam.AuthZENConfig{URL: cfg.AuthZENURL, Timeout: cfg.AuthZENTimeout, Token: cfg.AuthZENToken})
		cfg.Logger.Warn("decisions come from the remote AuthZEN PDP: tenant policies stored through PolicyService are validated and kept, but only the embedded Cedar PDP evaluates them", "url", cfg.AuthZENURL)
	}
	if cfg.WrapAuthorizer != nil {
		authz = cfg.WrapAuthorizer(authz)
	}
	a.Authz = authz

	if a.Authn, err = authn.New(ctx, db, cfg.Clock, cfg.OIDC); err != nil {
		return nil, err
	}

	metrics := envelope.NewPromMetrics(a.Registry)
	jm := newJobMetrics(a.Registry)
	workers := river.NewWorkers()
	river.AddWorker(workers, &expireConfirmationWorker{db: db, rec: a.recorder, metrics: jm})
	river.AddWorker(workers, &pruneIdempotencyWorker{db: db, metrics: jm})
	periodic := []*river.PeriodicJob{
		river.NewPeriodicJob(river.PeriodicInterval(10*time.Minute),
			func() (river.JobArgs, *river.InsertOpts) { return pruneIdempotencyArgs{}, nil },
			&river.PeriodicJobOpts{RunOnStart: true}),
	}
	a.Gateway.AddWorkers(workers)
	periodic = append(periodic, a.Gateway.PeriodicJobs()...)
	a.WebhookGuard = &webhooks.Guard{AllowPrivate: cfg.WebhookAllowPrivate, AllowLoopback: cfg.WebhookAllowLoopback,
		Resolver: cfg.WebhookResolver}
	a.WebhookGuard.AddSelf(cfg.Listen)
	periodic = append(periodic, a.addWebhookJobs(workers, jm)...)
	a.Capacity = a.buildCapacity()
	a.Health.SetCapacity(healthCapacity{hooks: &a.fleetHooks, rn: a.Capacity})
	a.Health.SetFleet(fleet.Deps{Notifier: a.Gateway, Signer: a.cmdSigner, States: &a.fleetHooks})
	if err := a.buildReplica(); err != nil {
		return nil, err
	}
	a.registerMetrics()
	a.Capacity.AddWorkers(workers)
	periodic = append(periodic, a.Capacity.PeriodicJobs()...)
	a.MIG = &migauto.Repartitioner{DB: db, Reconciler: &a.Capacity.Engine.Reconciler,
		Commands: commandSender{notifier: a.Gateway, signer: a.cmdSigner}, Log: cfg.Logger}
	a.MIG.AddWorkers(workers)
	periodic = append(periodic, a.MIG.PeriodicJobs(0)...)
	periodic = append(periodic, addCapacityViewJobs(workers, db, a.recorder, jm)...)
	river.AddWorker(workers, &reconcileInstancesWorker{app: a, metrics: jm})
	periodic = append(periodic, river.NewPeriodicJob(river.PeriodicInterval(vps.ReconcileInterval),
		func() (river.JobArgs, *river.InsertOpts) { return reconcileInstancesArgs{}, nil }, nil))
	periodic = append(periodic, a.addRecreateJobs(workers, jm)...)
	if a.Metal, err = a.buildMetal(); err != nil {
		return nil, err
	}
	a.Metal.AddWorkers(workers)
	// binding machine: capacity offers the machine behind a node under a
	// lease, and the lease binds (or fails) the reservation.
	a.Capacity.Engine.Machines = a.Metal
	ch := a.Capacity.Hooks()
	a.Metal.LeaseHooks = metal.LeaseHooks{Deploying: ch.MachineLeaseDeploying, Active: ch.MachineLeaseActive,
		Failed: ch.MachineLeaseFailed, Live: ch.ReservationLive}
	a.Metal.Sites.SetNotifier(a.Gateway)
	a.Metal.Sites.SetSigner(a.cmdSigner)
	// A BMC rotation's new password becomes current only on a report
	// signed by a site agent's node key that chains to the node CA (the
	// PKI is loaded after the metal runtime is built).
	a.Metal.SetNodeRoots(func() *x509.CertPool {
		if a.PKI == nil {
			return nil
		}
		return a.PKI.NodeCAPool()
	})
	a.siteHooks.s = a.Metal.Sites
	periodic = append(periodic, a.Metal.PeriodicJobs()...)
	a.ProviderPools = a.buildProviderPools()
	a.ProviderPools.AddWorkers(workers)
	periodic = append(periodic, a.ProviderPools.PeriodicJobs()...)
	if a.Rollouts, err = rollout.New(rollout.Config{DB: db, Recorder: a.recorder, Clock: cfg.Clock, Logger: cfg.Logger,
		Fleet: fleet.Deps{Notifier: a.Gateway, Signer: a.cmdSigner}, Interval: cfg.RolloutInterval,
		DownloadBase: a.downloadBase, Releases: publishedReleases{}}); err != nil {
		return nil, err
	}
	a.Registry.MustRegister(a.Rollouts.Collectors()...)
	a.Rollouts.AddWorkers(workers)
	periodic = append(periodic, a.Rollouts.PeriodicJobs()...)
	a.Health.SetEngine(a.Metal.Engine)
	a.Health.AddWorkers(workers)
	periodic = append(periodic, a.Health.PeriodicJobs()...)
	periodic = append(periodic, a.addSandboxJobs(workers, jm)...)
	periodic = append(periodic, a.addAuditJobs(workers, jm)...)
	if a.Jobs, err = jobs.New(db, workers, periodic, jobs.Config{
		Worker: slices.Contains(cfg.Roles, RoleWorker), PollInterval: cfg.JobPoll, Logger: cfg.Logger, Clock: cfg.Clock,
		Tracing: a.Tracing.IfEnabled(),
	}); err != nil {
		return nil, err
	}

	a.Metal.SetEnqueue(a.Jobs.InsertTx)
	a.Health.SetEnqueue(a.Jobs.InsertTx)
	a.Rollouts.SetEnqueue(a.Jobs.InsertTx)
	a.ProviderPools.SetEnqueue(a.Jobs.InsertTx)

	if a.Envelope, err = envelope.New(envelope.Config{
		DB: db, Authz: authz, Recorder: a.recorder, Jobs: a.Jobs, Clock: cfg.Clock, Logger: cfg.Logger, Metrics: metrics,
		RefusalAuditLimit: cfg.RefusalAuditLimit, RefusalAuditWindow: cfg.RefusalAuditWindow, Limits: cfg.Limits,
		WatchRecheck: cfg.WatchRecheck, Tracing: a.Tracing, TrustedProxies: cfg.TrustedProxies,
		TenantName: func(ctx context.Context, id string) (name string, err error) {
			err = db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
				t, err := tenancy.TenantGet(ctx, tx, id)
				name = t.Name
				return err
			})
			return name, err
		},
		TenantActive: func(ctx context.Context, id string) (active bool, err error) {
			if active, known := tenancy.ActiveCached(ctx, id); known {
				return active, nil
			}
			err = db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
				active, err = tenancy.Active(ctx, tx, id)
				return err
			})
			return active, err
		},
	}); err != nil {
		return nil, err
	}
	var instanceSealer vps.Sealer // a nil *pki.Sealer must stay a nil interface
	if a.sealer != nil {
		instanceSealer = a.sealer
	}
	a.Instances = vps.NewInstanceService(vps.InstanceConfig{Env: a.Envelope, Engine: a.Capacity.Engine,
		Events: reservationEvents{hub: a.hub}, Recorder: a.recorder, GuestImages: cfg.GuestImages, Sealer: instanceSealer, Tunnels: a.tunnels, Peers: a.peers})
	a.fleetHooks.instances = a.Instances
	a.Instances.SetProviders(a.ProviderPools)
	a.Instances.SetRecreateQueue(a.queueRecreate)
	var sandboxSealer secrets.Sealer // a nil *pki.Sealer must stay a nil interface
	if a.sealer != nil {
		sandboxSealer = a.sealer
	}
	a.Sandboxes = sandbox.New(sandbox.Config{Env: a.Envelope, DB: a.DB, Instances: a.Instances, Sealer: sandboxSealer, Recorder: a.recorder})
	if a.Blobs, err = images.OpenBlobs(cfg.ImagesDir); err != nil {
		return nil, err
	}
	// Published releases keep their files in the same blob store.
	a.Blobs.AddCounter(releases.FileCountBySHA256)
	if a.releaseKeys, err = loadReleaseKeys(cfg.ReleasePubkeys); err != nil {
		return nil, err
	}
	routes, err := a.routes(cedar, metrics)
	if err != nil {
		return nil, err
	}
	a.Handler = bodyDeadline(routes, cfg.RequestBodyTimeout)
	a.conns = newConnMetrics(a.Registry)
	return a, nil
}

// buildGateway opens the PKI when a secret is configured — creating it on a
// database without one, for serve as for dev (an operator who wants an
// offline root runs `better-compute pki init` before the first serve),
// reseals every module's values an earlier release sealed under the raw
// secret (resealLegacy), and builds the gateway.
func (a *App) buildGateway(ctx context.Context) error {
	cfg := a.cfg
	var authority gateway.Authority
	if strings.TrimSpace(cfg.Secret) != "" {
		sealer, err := pki.NewSealer(cfg.Secret)
		if err != nil {
			return err
		}
		pa, created, err := pki.LoadOrInit(ctx, a.DB, sealer, cfg.Clock, pki.InitOptions{TrustDomain: cfg.TrustDomain})
		if err != nil {
			return fmt.Errorf("pki: %w", err)
		}
		if created {
			cfg.Logger.Info("created the PKI", "trust_domain", pa.TrustDomain(), "pin", pa.Pin())
		}
		if err := resealLegacy(ctx, a.DB, sealer, cfg.Logger); err != nil {
			return err
		}
		a.PKI = pa
		a.sealer = sealer
		authority = gateway.FromPKI(pa)
	}
	a.execHub = execrelay.New()
	a.tunnels = tunnel.New()
	a.discovery = &discovery{}
	gw, err := gateway.New(gateway.Config{
		DB: a.DB, PoolAttestor: pool.RequiredAttestor, Hooks: &a.fleetHooks, Health: a.Health, Sites: &a.siteHooks, Exec: a.execHub, Tunnels: a.tunnels, SiteImages: siteImages{a}, OpenNodeSecret: openNodeSecret(a.sealer), Authority: authority, Recorder: a.recorder, Clock: cfg.Clock, Logger: cfg.Logger,
		Listen: cfg.GatewayListen, Hosts: cfg.GatewayHosts, ReplicaID: cfg.GatewayReplicaID,
		HeartbeatInterval: cfg.HeartbeatInterval, UnreachableAfter: cfg.UnreachableAfter, LostAfter: cfg.LostAfter,
		LivenessInterval: cfg.LivenessInterval, ShutdownTimeout: cfg.ShutdownTimeout,
		HandshakeTimeout: cfg.GatewayHandshakeTimeout, IdleConnTimeout: cfg.GatewayIdleConnTimeout, Metrics: a.Registry,
		Tracing: a.Tracing, Discovery: a.discovery, OpenParams: openParams(a.sealer), CommandDone: a.commandDone(commandDone(func() *metal.Runtime { return a.discovery.rt })),
		CommandsExpired: func(ctx context.Context, tx store.Tx, expired []fleet.Command) error {
			if a.Instances == nil {
				return nil
			}
			if err := a.Instances.CommandsExpired(ctx, tx, expired); err != nil || a.Sandboxes == nil {
				return err
			}
			return a.Sandboxes.CommandsExpired(ctx, tx, expired)
		},
	})
	if err != nil {
		return err
	}
	a.Gateway = gw
	if a.PKI != nil {
		// Named as the gateway names this replica: the worker
		// certificate says which replica signed a command.
		a.cmdSigner = a.PKI.NewCommandSigner(gw.ReplicaID())
	}
	a.peers = &replicaPeers{db: a.DB, gw: gw}
	return nil
}

// openParams are the gateway's openers of sealed command params: an
// instance's seed (user data, host key) is opened only for its host.
func openParams(sealer *pki.Sealer) fleet.ParamsOpeners {
	var s vps.Sealer // a nil *pki.Sealer must stay a nil interface
	if sealer != nil {
		s = sealer
	}
	return fleet.ParamsOpeners{vmcmd.KindInstanceCreate: vps.OpenCreateParams(s)}
}

// buildMetal builds the machine lifecycle; without a secret BMC passwords
// cannot be sealed, so enrolment is refused.
func (a *App) buildMetal() (*metal.Runtime, error) {
	var sealer metal.Sealer
	if a.sealer != nil {
		sealer = a.sealer
	}
	cfg := metal.Config{DB: a.DB, Recorder: a.recorder, Sealer: sealer, Clock: a.cfg.Clock, Logger: a.cfg.Logger}
	if a.PKI != nil {
		// Ramdisks dial the gateway pinned to this PKI's trust anchor.
		cfg.DiscoveryPin = a.PKI.Pin
	}
	retire := retireRamdiskNodes(a.recorder, a.DB.Clock())
	cfg.RamdiskEnded = func(ctx context.Context, tx store.Tx, nodeIDs []string) error {
		if err := retire(ctx, tx, nodeIDs); err != nil {
			return err
		}
		// A retired node takes no more work: its pool's placer reads it
		// again (a leased machine's platform node is one).
		return a.Capacity.Hooks().NodesStateChanged(ctx, tx, nodeIDs)
	}
	if a.PKI != nil {
		cfg.NodeTokens = deployNodeTokens(joinTokenSealer{a.PKI}, a.recorder, a.DB.Clock())
	}
	// The health module's remediations run on the same engine, against
	// nodes, as signed commands to their agents.
	cfg.ExtraProfiles = health.Profiles()
	runner := &health.NodeCommands{DB: a.DB, Signer: a.cmdSigner, Notifier: a.Gateway, MachineOf: metal.MachineOfNode}
	cfg.ExtraRunners = map[string]provision.StepRunner{health.KindGPUReset: runner, health.KindNodeReboot: runner}
	cfg.OtherEnded = a.Health.WorkflowEnded
	rt, err := metal.NewRuntime(cfg)
	if err == nil {
		// An unresponsive machine's node is rebooted by its BMC.
		runner.BMC = rt.BMCRunner()
	}
	if err != nil {
		return nil, err
	}
	rt.Ramdisk = &ramdiskCommands{db: a.DB, notify: a.Gateway, signer: a.cmdSigner, rt: rt}
	a.fleetHooks.metal = rt
	a.discovery.rt = rt
	return rt, nil
}

// Recorder returns the audit and outbox writer (bootstrap uses it).
func (a *App) Recorder() envelope.Recorder { return a.recorder }

// Bootstrap creates the first platform admin key on an empty database;
// persist (may be nil) keeps the secret before the key is committed.
func (a *App) Bootstrap(ctx context.Context, persist func(secret string) error) (secret string, created bool, err error) {
	return authn.Bootstrap(ctx, a.DB, a.recorder, persist)
}

// Close closes the store.
func (a *App) Close() error {
	a.Stop()
	return a.DB.Close()
}

// Stop stops the placers, handing this replica's pools back (their locks'
// session is released) before the database closes.
func (a *App) Stop() {
	if a.Capacity != nil {
		a.Capacity.Engine.Stop()
	}
	a.stopTracing()
}

// lateSites hands the gateway the machine lifecycle's site hooks, which
// are built after it.
type lateSites struct{ s *metal.SiteCommands }

func (l *lateSites) SiteAlive(ctx context.Context, nodeID string) error {
	if l.s == nil {
		return errors.New("the machine lifecycle is not built yet")
	}
	return l.s.SiteAlive(ctx, nodeID)
}

func (l *lateSites) SiteCommandParams(ctx context.Context, nodeID string, c fleet.Command) (string, error) {
	if l.s == nil {
		return "", errors.New("the machine lifecycle is not built yet")
	}
	return l.s.SiteCommandParams(ctx, nodeID, c)
}

func (l *lateSites) SiteCommandEnded(ctx context.Context, tx store.Tx, c fleet.Command) error {
	if l.s == nil {
		return nil
	}
	return l.s.SiteCommandEnded(ctx, tx, c)
}

func (l *lateSites) SiteDrivers(ctx context.Context, nodeID string, ds []*agentv1.BMCDriver) error {
	if l.s == nil {
		return errors.New("the machine lifecycle is not built yet")
	}
	out := make([]metal.SiteDriver, 0, len(ds))
	for _, d := range ds {
		out = append(out, metal.SiteDriver{Name: d.GetName(), Reports: d.GetReports(), Version: d.GetVersion(), BuiltIn: d.GetBuiltIn(),
			Path: d.GetPath(), Capabilities: d.GetCapabilities()})
	}
	return l.s.SiteDrivers(ctx, nodeID, out)
}

// lateHooks hands the gateway capacity's hooks, which are built after it,
// and the instance service's, which follow capacity's. A deployed
// machine's node reporting its inventory also ends its deploy
// (metal.Runtime.NodeReported).
type lateHooks struct {
	h         gateway.Hooks
	instances *vps.InstanceService
	metal     *metal.Runtime
}

// publishedReleases is the release store (internal/releases) as the
// rollout module reads it: the two packages do not import each other.
type publishedReleases struct{}

func (publishedReleases) Get(ctx context.Context, q store.Querier, version string) (rollout.Release, error) {
	// Read in a transaction, the row is held FOR SHARE until it commits:
	// a release delete (FOR UPDATE, then its in-use check) waits for the
	// rollout it would strand, or the rollout finds the release gone.
	var lock []string
	if tx, ok := q.(store.Tx); ok {
		lock = append(lock, store.ForShare(tx))
	}
	r, err := releases.Get(ctx, q, version, lock...)
	if errors.Is(err, releases.ErrNotFound) {
		return rollout.Release{}, fmt.Errorf("%w: %w", rollout.ErrReleaseNotFound, err)
	}
	if err != nil {
		return rollout.Release{}, err
	}
	return rollout.Release{Version: r.Version, Manifest: r.Manifest, Platforms: r.Platforms}, nil
}

// commandDone tells the instance service of each command that ends, after
// metal's hook.
func (a *App) commandDone(metalDone func(ctx context.Context, tx store.Tx, c fleet.Command, state, message string, result map[string]any) error) func(ctx context.Context, tx store.Tx, c fleet.Command, state, message string, result map[string]any) error {
	return func(ctx context.Context, tx store.Tx, c fleet.Command, state, message string, result map[string]any) error {
		if err := metalDone(ctx, tx, c, state, message, result); err != nil {
			return err
		}
		if a.Health != nil {
			if err := a.Health.CommandDone(ctx, tx, c.NodeID, c.Kind, state); err != nil {
				return err
			}
		}
		if a.Rollouts != nil {
			if err := a.Rollouts.CommandDone(ctx, tx, c.Kind); err != nil {
				return err
			}
		}
		if a.Instances == nil {
			return nil
		}
		if err := a.Instances.CommandDone(ctx, tx, c, state, message, result); err != nil {
			return err
		}
		if a.Sandboxes == nil {
			return nil
		}
		return a.Sandboxes.CommandDone(ctx, tx, c, state)
	}
}

func (l *lateHooks) NodeChanged(ctx context.Context, tx store.Tx, nodeID string) error {
	if l.metal != nil {
		if err := l.metal.NodeReported(ctx, tx, nodeID); err != nil {
			return err
		}
	}
	if l.h == nil {
		return nil
	}
	return l.h.NodeChanged(ctx, tx, nodeID)
}

func (l *lateHooks) AllocationBound(ctx context.Context, tx store.Tx, nodeID string, b *agentv1.AllocationBound) error {
	if l.h == nil {
		return nil
	}
	return l.h.AllocationBound(ctx, tx, nodeID, b)
}

func (l *lateHooks) AllocationReleased(ctx context.Context, tx store.Tx, nodeID string, r *agentv1.AllocationReleased) error {
	if l.h == nil {
		return nil
	}
	return l.h.AllocationReleased(ctx, tx, nodeID, r)
}

func (l *lateHooks) NodeCapabilitiesChanged(ctx context.Context, tx store.Tx, nodeID string) error {
	if l.h == nil {
		return nil
	}
	return l.h.NodeCapabilitiesChanged(ctx, tx, nodeID)
}

func (l *lateHooks) NodesStateChanged(ctx context.Context, tx store.Tx, nodeIDs []string) error {
	if l.h == nil {
		return nil
	}
	return l.h.NodesStateChanged(ctx, tx, nodeIDs)
}

func (l *lateHooks) NodesLost(ctx context.Context, tx store.Tx, nodeIDs []string) error {
	if l.h != nil {
		// Capacity first: it releases the lost instances' bookings.
		if err := l.h.NodesLost(ctx, tx, nodeIDs); err != nil {
			return err
		}
	}
	if l.instances == nil {
		return nil
	}
	return l.instances.NodesLost(ctx, tx, nodeIDs)
}

// CommandSigner is what signs the commands this replica inserts (nil without
// a PKI): whoever inserts a command outside the modules (tests, tools)
// signs it with this, or bcd refuses it.
func (a *App) CommandSigner() fleet.CommandSigner { return a.cmdSigner }

// commandSender is the fleet's command path as capacity's port.
type commandSender struct {
	notifier fleet.CommandNotifier
	signer   fleet.CommandSigner
}

func (c commandSender) Send(ctx context.Context, tx store.Tx, cmd reservation.Command) (string, error) {
	return fleet.SendSystemCommand(ctx, tx, c.notifier, fleet.SystemCommand{
		TenantID: cmd.TenantID, NodeID: cmd.NodeID, Kind: cmd.Kind, Params: cmd.Params, IdempotencyKey: cmd.IdempotencyKey,
		CreatedBy: cmd.CreatedBy, TTL: cmd.TTL, Time: cmd.Time, Signer: c.signer,
	})
}

// execPath is the fleet's side of reservations.exec: the gateway's sessions
// on this replica, the replica holding a node's session elsewhere, the
// relay hub, and the command rows.
type execPath struct {
	gw    *gateway.Gateway
	peers *replicaPeers
	hub   *execrelay.Hub
	db    *store.DB
}

func (p execPath) Connected(nodeID string) bool { return p.gw.Connected(nodeID) }

func (p execPath) SessionReplica(ctx context.Context, nodeID string) (string, error) {
	url, err := p.peers.SessionReplica(ctx, nodeID)
	if errors.Is(err, errNoReplicaURL) {
		// The owner cannot be reached from here (yet): as when the node
		// is unreachable, the caller retries.
		return "", &envelope.Error{Code: envelope.CodeUnavailable, Message: "node " + nodeID + "'s session is on a replica that peers cannot reach; retry",
			Err: err, RetryAfter: time.Second}
	}
	return url, err
}

func (p execPath) Subscribe(commandID string) *execrelay.Subscription {
	return p.hub.Subscribe(commandID)
}

func (p execPath) Cancel(ctx context.Context, commandID, message string) error {
	return p.db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		c, err := fleet.CommandGet(ctx, tx, "", commandID)
		if err != nil {
			return err
		}
		n, err := fleet.CommandCancel(ctx, tx, &fleet.CommandCancelParams{ID: commandID, Message: message})
		if err != nil || n == 0 {
			return err
		}
		p.gw.NotifyCommand(tx, c.NodeID)
		return nil
	})
}

func (p execPath) EndAllocation(ctx context.Context, tx store.Tx, nodeID, allocationID string) error {
	cmds, err := fleet.CommandListOpenForAllocation(ctx, tx, nodeID, reservation.KindProcessExec, allocationID)
	if err != nil {
		return err
	}
	canceled := false
	for _, c := range cmds {
		var params struct {
			AllocationID string `json:"allocation_id"`
		}
		if json.Unmarshal([]byte(c.Params), &params) != nil || params.AllocationID != allocationID {
			continue
		}
		n, err := fleet.CommandCancel(ctx, tx, &fleet.CommandCancelParams{ID: c.ID, Message: "the reservation ended"})
		if err != nil {
			return err
		}
		canceled = canceled || n > 0
	}
	if canceled {
		p.gw.NotifyCommand(tx, nodeID)
	}
	return nil
}

func (p execPath) Ended(ctx context.Context, commandID string) (*execrelay.Exit, error) {
	var c fleet.Command
	err := p.db.Read(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		c, err = fleet.CommandGet(ctx, tx, "", commandID)
		return err
	})
	if err != nil || slices.Contains(fleet.OpenCommandStates, c.State) {
		return nil, err
	}
	e := &execrelay.Exit{State: c.State, Message: c.Message, FailureCode: c.FailureCode}
	if c.Result != "" {
		_ = json.Unmarshal([]byte(c.Result), &e.Result)
	}
	return e, nil
}

// buildCapacity wires the reservation engine to the fleet's command path,
// the job runtime and the gateway's hooks.
func (a *App) buildCapacity() *reservation.Runner {
	e := reservation.NewEngine(a.DB, a.cfg.Clock, a.Tracing)
	e.SetLinger(a.cfg.PlacerLinger)
	e.Commands = commandSender{notifier: a.Gateway, signer: a.cmdSigner}
	e.Enqueue = func(ctx context.Context, tx store.Tx, args river.JobArgs, opts *river.InsertOpts) error {
		return a.Jobs.InsertTx(ctx, tx, args, opts)
	}
	e.BindTimeout = a.cfg.BindTimeout
	e.Exec = execPath{gw: a.Gateway, peers: a.peers, hub: a.execHub, db: a.DB}
	rn := &reservation.Runner{DB: a.DB, Rec: a.recorder, Engine: e, Log: a.cfg.Logger, TickInterval: a.cfg.CapacityTick}
	if a.DB.PgxPool() != nil {
		// Several replicas may share the database: each pool's queue is
		// run by the replica that owns its placer.
		rn.RunQueuesWhereOwned()
	}
	a.fleetHooks.h = rn.Hooks()
	return rn
}

// buildReplica gives this replica its certificate from the internal CA:
// it forwards pools' mutations (and the callers' credentials in them) only
// over mutual TLS with it, never through a proxy, and serves its replica
// listener with it. Without a PKI it does neither.
func (a *App) buildReplica() error {
	if a.PKI == nil {
		return nil
	}
	id, err := replica.New(replica.Config{Authority: a.PKI, ReplicaID: a.Capacity.Engine.ReplicaID(), Now: a.cfg.Clock.Now})
	if err != nil {
		return err
	}
	a.Replica = id
	a.Capacity.Engine.SetForwardClient(id.Client(time.Minute))
	return nil
}

// SetAPIURL sets the URL other replicas reach this replica's API by: they
// forward the mutations of pools whose placer runs here to it.
// SetSelfURL records the API listener's own URL: MCP's exec_sandbox opens
// its SSH tunnel there (in process, over loopback).
func (a *App) SetSelfURL(url string) { a.selfURL.Store(url) }

// downloadBase is the URL nodes download bcd releases from: PublicURL
// when configured, else the workload issuer (the control plane's public
// URL), else this replica's API URL.
func (a *App) downloadBase() string {
	if u := cmp.Or(a.cfg.PublicURL, a.cfg.WorkloadIssuer); u != "" {
		return u
	}
	if u, _ := a.selfURL.Load().(string); u != "" {
		return u
	}
	return "http://" + a.cfg.Listen
}

func (a *App) SetAPIURL(url string) {
	a.WebhookGuard.AddSelfURL(url)
	if a.Capacity != nil {
		a.Capacity.Engine.SetURL(url)
	}
}

// reservationEvents reads the outbox for ReservationService.Watch.
type reservationEvents struct{ hub *events.Hub }

func (r reservationEvents) After(ctx context.Context, q store.Querier, tenantID string, after int64, limit int) ([]envelope.Event, []int64, error) {
	evs, err := events.ListAfter(ctx, q, tenantID, false, after, limit)
	if errors.Is(err, events.ErrUnknownCursor) {
		return nil, nil, envelope.Invalid(envelope.Violation{Field: "cursor", Reason: fmt.Sprintf("no event with id %d", after)})
	}
	if err != nil {
		return nil, nil, err
	}
	out := make([]envelope.Event, len(evs))
	seqs := make([]int64, len(evs))
	for i, ev := range evs {
		out[i], seqs[i] = ev.Event, ev.Seq
	}
	return out, seqs, nil
}

func (r reservationEvents) Last(ctx context.Context, q store.Querier) (int64, error) {
	return events.LastSeq(ctx, q)
}

func (r reservationEvents) Wait() <-chan struct{} { return r.hub.Wait() }

// healthCapacity is what the health module tells capacity: the node's
// atoms change (through the fleet hooks, as a report's do) and the
// reservations on a bad GPU.
type healthCapacity struct {
	hooks *lateHooks
	rn    *reservation.Runner
}

func (h healthCapacity) NodeChanged(ctx context.Context, tx store.Tx, nodeID string) error {
	return h.hooks.NodeChanged(ctx, tx, nodeID)
}

func (h healthCapacity) GPUUnhealthy(ctx context.Context, tx store.Tx, nodeID, gpuUUID, reason string, move bool) (int, int, error) {
	return h.rn.Hooks().GPUUnhealthy(ctx, tx, nodeID, gpuUUID, reason, move)
}

// buildProviderPools wires the provider pools' instances: accounts'
// credentials open with the secrets' sealer, join tokens seal with the
// PKI, and servers join at ProviderGateway.
func (a *App) buildProviderPools() *providerpools.Module {
	cfg := providerpools.Config{DB: a.DB, Recorder: a.recorder, Clock: a.cfg.Clock, Logger: a.cfg.Logger,
		Gateway: a.providerGateway}
	if a.sealer != nil {
		cfg.Secrets = a.sealer
	}
	if a.PKI != nil {
		cfg.Tokens = joinTokenSealer{a.PKI}
		// The trust domain names this deployment: two sharing an account
		// keep their servers apart (providers.ManagedLabel).
		cfg.ControlPlaneID = a.PKI.TrustDomain()
	}
	return providerpools.New(cfg)
}

// providerGateway is where a provider's server joins: ProviderGateway, or
// the gateway's first certificate name with the port it listens on.
func (a *App) providerGateway() string {
	if a.cfg.ProviderGateway != "" {
		return a.cfg.ProviderGateway
	}
	addr := a.cfg.GatewayListen
	if a.Gateway != nil && a.Gateway.Addr() != nil {
		addr = a.Gateway.Addr().String()
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if len(a.cfg.GatewayHosts) > 0 {
		host = a.cfg.GatewayHosts[0]
	}
	return net.JoinHostPort(host, port)
}
