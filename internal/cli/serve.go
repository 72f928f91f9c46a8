package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	bcapp "github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/authn"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tracing"
)

func init() {
	register(newServeCommand)
	register(newDevCommand)
}

// serverFlags are the flags serve and dev share.
type serverFlags struct {
	webhookAllowPrivate                                bool
	eventRetention, sseHeartbeat                       time.Duration
	listen, stateDir, databaseURL, logFormat, logLevel string
	roles                                              []string
	pdp, authzenURL, authzenToken                      string
	authzenTimeout, shutdownTimeout                    time.Duration
	oidc                                               authn.OIDCConfig
	bootstrapKeyFile                                   string
	downloadsDir                                       string
	imagesDir                                          string
	maxImageBytes                                      int64
	gatewayListen, trustDomain                         string
	// advertiseURL is where peers forward the mutations of pools whose
	// placer runs here.
	advertiseURL string
	// replicaListen is the mutual TLS listener peers forward to.
	replicaListen                                  string
	gatewayHosts                                   []string
	heartbeatInterval, unreachableAfter, lostAfter time.Duration
	// dbStatementTimeout and dbLockTimeout bound every PostgreSQL
	// statement and lock wait (0 turns a bound off).
	dbStatementTimeout, dbLockTimeout time.Duration
	// maxConnections caps the API's open connections; requestRate,
	// requestBurst and maxStreams bound each principal.
	maxConnections, requestBurst, maxStreams int
	requestRate                              float64
	// otlpEndpoint turns tracing on (else the standard OTEL_EXPORTER_OTLP_*
	// variables may); otlpInsecure sends to a host:port without TLS.
	otlpEndpoint string
	otlpInsecure bool
	// secret is BETTER_COMPUTE_SECRET, read from the environment (or, for
	// dev, from <state-dir>/secret); never a flag, so it stays out of ps.
	secret string
}

func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

func (f *serverFlags) register(cmd *cobra.Command, full bool) {
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", envOr("BETTER_COMPUTE_LISTEN", "127.0.0.1:8080"), "API listen address (env BETTER_COMPUTE_LISTEN)")
	fl.StringVar(&f.stateDir, "state-dir", envOr("BETTER_COMPUTE_STATE_DIR", ".better-compute"), "state directory: the SQLite database and the bootstrap key (env BETTER_COMPUTE_STATE_DIR)")
	fl.StringVar(&f.logFormat, "log-format", "text", "log format: text or json")
	fl.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fl.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 15*time.Second, "how long in-flight requests get to finish on SIGTERM")
	fl.StringVar(&f.downloadsDir, "downloads-dir", "", "bcd builds served at /downloads/bcd/{version}/linux-{arch} (default <state-dir>/downloads)")
	fl.StringVar(&f.imagesDir, "images-dir", "", "image catalog blobs (sha256/<hex>) and uploads in flight; replicas taking pushes must share it (default <state-dir>/images)")
	fl.Int64Var(&f.maxImageBytes, "max-image-bytes", 64<<30, "largest image a push may upload, in bytes")
	fl.StringVar(&f.gatewayListen, "gateway-listen", envOr("BETTER_COMPUTE_GATEWAY_LISTEN", "127.0.0.1:8443"), "agent gateway (gRPC, mutual TLS) listen address (env BETTER_COMPUTE_GATEWAY_LISTEN)")
	fl.IntVar(&f.maxConnections, "max-connections", bcapp.DefaultMaxConnections, "most open connections to the API; more are closed at accept")
	fl.Float64Var(&f.requestRate, "request-rate", 100, "API requests per second one principal may make over time (0: no limit); beyond, RESOURCE_EXHAUSTED with a retry delay")
	fl.IntVar(&f.requestBurst, "request-burst", 0, "API requests one principal may make at once (default twice --request-rate)")
	fl.IntVar(&f.maxStreams, "max-streams", 16, "watch streams (Connect watches and /v1/events/stream) one principal may hold open (0: no limit); beyond, TOO_MANY_STREAMS (HTTP 429)")
	fl.BoolVar(&f.webhookAllowPrivate, "webhook-allow-private", false, "let webhook endpoints resolve to loopback, private, shared and benchmarking addresses (the API's own listener, unspecified, link-local, cloud metadata, multicast and reserved addresses stay refused)")
	fl.DurationVar(&f.eventRetention, "event-retention", 7*24*time.Hour, "keep outbox events this long once every webhook has received them (SSE and watch clients resume within it)")
	fl.DurationVar(&f.sseHeartbeat, "sse-heartbeat", 15*time.Second, "how often an idle /v1/events/stream gets a heartbeat comment line")
	fl.DurationVar(&f.heartbeatInterval, "heartbeat-interval", 10*time.Second, "how often agents are told to send heartbeats")
	fl.DurationVar(&f.unreachableAfter, "unreachable-after", 30*time.Second, "a node without a heartbeat this long is unreachable (at least twice --heartbeat-interval)")
	fl.StringVar(&f.otlpEndpoint, "otlp-endpoint", "", "export OpenTelemetry traces to this OTLP/gRPC collector (host:port, or an http:// or https:// URL); empty: off unless OTEL_EXPORTER_OTLP_ENDPOINT is set")
	fl.BoolVar(&f.otlpInsecure, "otlp-insecure", false, "send traces to a host:port --otlp-endpoint without TLS")
	fl.DurationVar(&f.lostAfter, "lost-after", 5*time.Minute, "a node without a heartbeat this long is lost and its reservations are released (longer than --unreachable-after)")
	if !full {
		return
	}
	fl.StringSliceVar(&f.roles, "roles", strings.Split(envOr("BETTER_COMPUTE_ROLES", "api,worker,gateway"), ","), "roles to run: api, worker, gateway (env BETTER_COMPUTE_ROLES)")
	fl.StringSliceVar(&f.gatewayHosts, "gateway-host", nil, "name or IP agents reach the gateway by, put in its serving certificate (repeatable; default the listen host and localhost)")
	fl.StringVar(&f.trustDomain, "trust-domain", envOr("BETTER_COMPUTE_TRUST_DOMAIN", ""), "SPIFFE trust domain of the PKI created on an empty database (env BETTER_COMPUTE_TRUST_DOMAIN)")
	fl.StringVar(&f.advertiseURL, "advertise-url", envOr("BETTER_COMPUTE_ADVERTISE_URL", ""), "https:// URL other replicas reach this one's replica listener by, to forward the pools it places (env BETTER_COMPUTE_ADVERTISE_URL; default https://<replica listen address>)")
	fl.StringVar(&f.replicaListen, "replica-listen", envOr("BETTER_COMPUTE_REPLICA_LISTEN", "127.0.0.1:8444"), "replica listener address: mutual TLS with internal CA certificates, where other replicas forward the pools this one places (PostgreSQL with BETTER_COMPUTE_SECRET; env BETTER_COMPUTE_REPLICA_LISTEN; empty: none)")
	fl.StringVar(&f.databaseURL, "database-url", envOr("BETTER_COMPUTE_DATABASE_URL", ""), "PostgreSQL URL (postgres://…); empty uses SQLite in --state-dir (env BETTER_COMPUTE_DATABASE_URL)")
	fl.DurationVar(&f.dbStatementTimeout, "db-statement-timeout", store.DefaultStatementTimeout, "PostgreSQL statement_timeout of every connection (0: no limit); a statement past it fails UNAVAILABLE, retryable")
	fl.DurationVar(&f.dbLockTimeout, "db-lock-timeout", store.DefaultLockTimeout, "PostgreSQL lock_timeout of every connection (0: no limit); a lock wait past it fails UNAVAILABLE, retryable")
	fl.StringVar(&f.bootstrapKeyFile, "bootstrap-key-file", "", "where an empty database's first admin key is written, mode 0600 (default <state-dir>/admin.key)")
	fl.StringVar(&f.pdp, "pdp", "cedar", "policy decision point: cedar (embedded) or authzen (remote)")
	fl.StringVar(&f.authzenURL, "authzen-url", envOr("BETTER_COMPUTE_AUTHZEN_URL", ""), "base URL of the AuthZEN PDP (env BETTER_COMPUTE_AUTHZEN_URL)")
	fl.StringVar(&f.authzenToken, "authzen-token", "", "bearer token for the AuthZEN PDP (prefer env BETTER_COMPUTE_AUTHZEN_TOKEN)")
	fl.DurationVar(&f.authzenTimeout, "authzen-timeout", 2*time.Second, "AuthZEN decision timeout; a timeout denies")
	fl.StringVar(&f.oidc.Issuer, "oidc-issuer", envOr("BETTER_COMPUTE_OIDC_ISSUER", ""), "OIDC issuer URL for user bearer tokens (env BETTER_COMPUTE_OIDC_ISSUER)")
	fl.StringVar(&f.oidc.ClientID, "oidc-client-id", envOr("BETTER_COMPUTE_OIDC_CLIENT_ID", ""), "audience OIDC tokens must carry (env BETTER_COMPUTE_OIDC_CLIENT_ID)")
	fl.StringVar(&f.oidc.TenantClaim, "oidc-tenant-claim", "bc_tenant", "claim naming the user's tenant")
	fl.StringVar(&f.oidc.RoleClaim, "oidc-role-claim", "bc_role", "claim naming the user's role: admin, member or viewer")
	fl.StringSliceVar(&f.oidc.PlatformAdmins, "oidc-platform-admin", nil, "OIDC subject that is a platform administrator (repeatable)")
}

// checkLiveness refuses liveness timeouts the gateway would refuse, naming
// the flags rather than the gateway's settings.
func (f *serverFlags) checkLiveness() error {
	switch {
	case f.dbStatementTimeout < 0:
		return invalidArg("db-statement-timeout", "must not be negative (0 turns the limit off)")
	case f.dbLockTimeout < 0:
		return invalidArg("db-lock-timeout", "must not be negative (0 turns the limit off)")
	case f.heartbeatInterval <= 0:
		return invalidArg("heartbeat-interval", "must be positive")
	case f.unreachableAfter < 2*f.heartbeatInterval:
		return invalidArg("unreachable-after", fmt.Sprintf("must be at least twice --heartbeat-interval (%v), not %v", f.heartbeatInterval, f.unreachableAfter))
	case f.lostAfter <= f.unreachableAfter:
		return invalidArg("lost-after", fmt.Sprintf("must be longer than --unreachable-after (%v), not %v; to try node loss quickly pass e.g. --heartbeat-interval 2s --unreachable-after 5s --lost-after 15s", f.unreachableAfter, f.lostAfter))
	}
	return nil
}

// bind opens the API listener and, when gateway is set, the agent
// gateway's, before anything is written to the database: a start that
// cannot serve must not create the platform (dev would otherwise never show
// the admin key). A port in use is refused with the flag that picks another;
// both ports are checked so one failed start names every flag to change.
func (f *serverFlags) bind(a *bcapp.App, api, gateway bool) (net.Listener, net.Addr, error) {
	var (
		ln     net.Listener
		gwAddr net.Addr
		msgs   []string
		err    error
	)
	if api {
		if ln, err = a.Listen(); err != nil {
			msgs = append(msgs, listenError(err, f.listen, "listen"))
		}
	}
	if gateway {
		if len(msgs) == 0 {
			if gwAddr, err = a.ListenGateway(); err != nil {
				msgs = append(msgs, listenError(err, f.gatewayListen, "gateway-listen"))
			}
		} else if probe, err := net.Listen("tcp", f.gatewayListen); err != nil {
			// The start fails anyway; only learn whether this port is free
			// too, without binding the gateway for good.
			msgs = append(msgs, listenError(err, f.gatewayListen, "gateway-listen"))
		} else {
			_ = probe.Close()
		}
	}
	if len(msgs) > 0 {
		if ln != nil {
			_ = ln.Close()
		}
		return nil, nil, serverError(errors.New(strings.Join(msgs, "; ")))
	}
	return ln, gwAddr, nil
}

// listenError says what failed and which flag picks another address.
func listenError(err error, addr, flag string) string {
	if errors.Is(err, syscall.EADDRINUSE) {
		if _, port, perr := net.SplitHostPort(addr); perr == nil {
			return fmt.Sprintf("port %s is in use: pass --%s 127.0.0.1:0 or another port", port, flag)
		}
		return fmt.Sprintf("%s is in use: pass --%s 127.0.0.1:0 or another address", addr, flag)
	}
	return fmt.Sprintf("%v: pass --%s to listen elsewhere", err, flag)
}

func (f *serverFlags) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return nil, invalidArg("log-level", "must be debug, info, warn or error")
	}
	opts := &slog.HandlerOptions{Level: level}
	switch f.logFormat {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, invalidArg("log-format", "must be text or json")
}

func (f *serverFlags) config(logger *slog.Logger) bcapp.Config {
	token := f.authzenToken
	if token == "" {
		token = os.Getenv("BETTER_COMPUTE_AUTHZEN_TOKEN")
	}
	return bcapp.Config{
		Roles: f.roles, Listen: f.listen, StateDir: f.stateDir, DatabaseURL: f.databaseURL,
		PDP: f.pdp, AuthZENURL: f.authzenURL, AuthZENTimeout: f.authzenTimeout, AuthZENToken: token,
		OIDC: f.oidc, ShutdownTimeout: f.shutdownTimeout, Logger: logger, DownloadsDir: f.downloadsDir,
		ImagesDir: f.imagesDir, MaxImageBytes: f.maxImageBytes,
		GatewayListen: f.gatewayListen, ReplicaListen: f.replicaListen, GatewayHosts: f.gatewayHosts, TrustDomain: f.trustDomain, Secret: f.secret,
		HeartbeatInterval: f.heartbeatInterval, UnreachableAfter: f.unreachableAfter, LostAfter: f.lostAfter,
		MaxConnections:     f.maxConnections,
		DBStatementTimeout: offIfZero(f.dbStatementTimeout), DBLockTimeout: offIfZero(f.dbLockTimeout),
		Limits:              envelope.Limits{RequestRate: f.requestRate, RequestBurst: f.requestBurst, MaxStreams: f.maxStreams},
		WebhookAllowPrivate: f.webhookAllowPrivate, EventRetention: f.eventRetention, SSEHeartbeat: f.sseHeartbeat,
		Tracing: tracing.Config{Endpoint: f.otlpEndpoint, Insecure: f.otlpInsecure, ServiceName: "better-compute"},
	}
}

// offIfZero turns a flag's "0: no limit" into the store's "negative: off"
// (the store reads 0 as "the default").
func offIfZero(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

func newServeCommand() *cobra.Command {
	var f serverFlags
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the control plane (any subset of the api, worker and gateway roles)",
		Long: `serve runs the control plane. All replicas share one database: SQLite in
--state-dir for a single node, or PostgreSQL with --database-url for several.

On an empty database it creates the platform and writes the first admin API
key only to --bootstrap-key-file (mode 0600), never to the logs.

The gateway role (the agents' gRPC endpoint) needs BETTER_COMPUTE_SECRET, the
key that seals the PKI in the database (base64 of 32 random bytes: openssl
rand -base64 32); every replica needs the same one. On a database without a
PKI, serve creates one with the root key sealed in the database; for an
offline root run "better-compute pki init" before the first serve.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := f.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if err := f.checkLiveness(); err != nil {
				return err
			}
			f.secret = os.Getenv(pki.SecretEnv)
			if slices.Contains(f.roles, bcapp.RoleGateway) && strings.TrimSpace(f.secret) == "" {
				return invalidArg("roles", "the gateway role needs "+pki.SecretEnv+": base64 of 32 random bytes (openssl rand -base64 32), the same on every replica")
			}
			ctx := cmd.Context()
			a, err := bcapp.New(ctx, f.config(logger))
			if err != nil {
				return serverError(err)
			}
			defer closeApp(a, logger)
			ln, gwAddr, err := f.bind(a, slices.Contains(f.roles, bcapp.RoleAPI), slices.Contains(f.roles, bcapp.RoleGateway))
			if err != nil {
				return err
			}
			// Peers forward to the replica listener only, over mutual TLS.
			var replicaAddr net.Addr
			if ln != nil {
				if replicaAddr, err = a.ListenReplica(); err != nil {
					_ = ln.Close()
					return serverError(errors.New(listenError(err, f.replicaListen, "replica-listen")))
				}
			}
			if ln != nil {
				// Webhooks never call this replica's own API.
				a.WebhookGuard.AddSelfURL("http://" + ln.Addr().String())
			}
			switch {
			case replicaAddr == nil:
			case f.advertiseURL != "":
				if !strings.HasPrefix(f.advertiseURL, "https://") {
					_ = ln.Close()
					return invalidArg("advertise-url", "must be the https:// URL of --replica-listen: peers forward over mutual TLS")
				}
				a.SetAPIURL(f.advertiseURL)
			default:
				a.SetAPIURL("https://" + replicaAddr.String())
			}
			if replicaAddr != nil {
				// SSH tunnels reach the node's gateway session on any
				// replica, through the same listener.
				url := cmp.Or(f.advertiseURL, "https://"+replicaAddr.String())
				if err := a.EnableReplicaTunnels(cmd.Context(), url); err != nil {
					_ = ln.Close()
					return serverError(err)
				}
			}
			keyFile := f.bootstrapKeyFile
			if keyFile == "" {
				keyFile = filepath.Join(f.stateDir, "admin.key")
			}
			_, created, err := a.Bootstrap(ctx, func(secret string) error {
				// Never replace a key file: it may belong to another database.
				return writeSecretFile(keyFile, secret, false)
			})
			if err != nil {
				if ln != nil {
					_ = ln.Close()
				}
				return serverError(fmt.Errorf("bootstrap the platform: %w", err))
			}
			if created {
				logger.Info("platform created; the first admin key was written", "file", keyFile)
			}
			if gwAddr != nil {
				logger.Info("agent gateway listening", "addr", gwAddr.String(), "trust_domain", a.PKI.TrustDomain(), "pin", a.PKI.Pin())
			}
			if ln != nil {
				logger.Info("serving", "api", "http://"+ln.Addr().String(), "roles", strings.Join(f.roles, ","))
			} else {
				logger.Info("serving", "roles", strings.Join(f.roles, ","))
			}
			return serverError(ignoreCanceled(a.Run(ctx, ln)))
		},
	}
	f.register(cmd, true)
	return cmd
}

// closeApp closes the database after the roles stopped; a failure there is
// worth a log line but not a different exit code.
func closeApp(a *bcapp.App, logger *slog.Logger) {
	if err := a.Close(); err != nil {
		logger.Error("closing the database", "err", err)
	}
}

func ignoreCanceled(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// serverError labels a failure of the server itself (a port in use, an
// unreachable database) so the CLI prints it as UNAVAILABLE rather than as a
// usage mistake.
func serverError(err error) error {
	var ce *connect.Error
	if err == nil || errors.As(err, &ce) {
		return err
	}
	return connect.NewError(connect.CodeUnavailable, err)
}

// writeSecretFile writes a secret readable by its owner only. Unless replace
// is set it refuses to overwrite a file, so a key is never silently lost.
func writeSecretFile(path, secret string, replace bool) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
	if replace {
		flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(secret + "\n"); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
