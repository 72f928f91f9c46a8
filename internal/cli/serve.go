package cli

import (
	"errors"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	bcapp "github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/server"
	"github.com/better-compute/better-compute/internal/store"
)

func init() {
	register(newServeCommand)
	register(newDevCommand)
}

// serverFlags are the flags serve and dev share, read into the options of
// package server.
type serverFlags struct {
	server.Options
}

func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

func (f *serverFlags) register(cmd *cobra.Command, full bool) {
	fl := cmd.Flags()
	fl.StringVar(&f.Listen, "listen", envOr("BETTER_COMPUTE_LISTEN", "127.0.0.1:8080"), "API listen address (env BETTER_COMPUTE_LISTEN)")
	fl.StringVar(&f.StateDir, "state-dir", envOr("BETTER_COMPUTE_STATE_DIR", ".better-compute"), "state directory: the SQLite database and the bootstrap key (env BETTER_COMPUTE_STATE_DIR)")
	fl.StringVar(&f.LogFormat, "log-format", "text", "log format: text or json")
	fl.StringVar(&f.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	fl.DurationVar(&f.ShutdownTimeout, "shutdown-timeout", 15*time.Second, "how long in-flight requests get to finish on SIGTERM")
	fl.StringVar(&f.DownloadsDir, "downloads-dir", "", "bcd builds served at /downloads/bcd/{version}/linux-{arch} (default <state-dir>/downloads)")
	fl.StringVar(&f.PublicURL, "public-url", envOr("BETTER_COMPUTE_PUBLIC_URL", ""), "http(s):// URL nodes reach the API listener by: rollouts send bcd <URL>/downloads/bcd/... (env BETTER_COMPUTE_PUBLIC_URL; default the --workload-issuer URL, else the listen address)")
	fl.StringVar(&f.ImagesDir, "images-dir", "", "image catalog blobs (sha256/<hex>) and uploads in flight; replicas taking pushes must share it (default <state-dir>/images)")
	fl.StringArrayVar(&f.ReleasePubkeys, "release-pubkey", nil, "release public key (release keygen's release.pub) a published release must be signed by (repeatable; none: releases create is refused)")
	fl.Int64Var(&f.MaxImageBytes, "max-image-bytes", 64<<30, "largest image a push may upload, in bytes")
	fl.StringVar(&f.GatewayListen, "gateway-listen", envOr("BETTER_COMPUTE_GATEWAY_LISTEN", "127.0.0.1:8443"), "agent gateway (gRPC, mutual TLS) listen address (env BETTER_COMPUTE_GATEWAY_LISTEN)")
	fl.IntVar(&f.MaxConnections, "max-connections", bcapp.DefaultMaxConnections, "most open connections to the API; more are closed at accept")
	fl.Float64Var(&f.RequestRate, "request-rate", 100, "API requests per second one principal may make over time (0: no limit); beyond, RESOURCE_EXHAUSTED with a retry delay")
	fl.IntVar(&f.RequestBurst, "request-burst", 0, "API requests one principal may make at once (default twice --request-rate)")
	fl.IntVar(&f.MaxStreams, "max-streams", 16, "watch streams (Connect watches and /v1/events/stream) one principal may hold open (0: no limit); beyond, TOO_MANY_STREAMS (HTTP 429)")
	fl.BoolVar(&f.WebhookAllowPrivate, "webhook-allow-private", false, "let webhook endpoints resolve to loopback, private, shared and benchmarking addresses (the API's own listener, unspecified, link-local, cloud metadata, multicast and reserved addresses stay refused)")
	fl.DurationVar(&f.EventRetention, "event-retention", 7*24*time.Hour, "keep outbox events this long once every webhook has received them (SSE and watch clients resume within it)")
	fl.DurationVar(&f.SSEHeartbeat, "sse-heartbeat", 15*time.Second, "how often an idle /v1/events/stream gets a heartbeat comment line")
	fl.IntVar(&f.AuditCheckpointEvery, "audit-checkpoint-every", 1000, "sign a checkpoint of the audit log's Merkle tree once this many entries were added since the last")
	fl.DurationVar(&f.AuditCheckpointInterval, "audit-checkpoint-interval", time.Minute, "sign a checkpoint of the audit log when the last is this old and entries were added since")
	fl.DurationVar(&f.HeartbeatInterval, "heartbeat-interval", 10*time.Second, "how often agents are told to send heartbeats")
	fl.DurationVar(&f.UnreachableAfter, "unreachable-after", 30*time.Second, "a node without a heartbeat this long is unreachable (at least twice --heartbeat-interval)")
	fl.StringVar(&f.OTLPEndpoint, "otlp-endpoint", "", "export OpenTelemetry traces to this OTLP/gRPC collector (host:port, or an http:// or https:// URL); empty: off unless OTEL_EXPORTER_OTLP_ENDPOINT is set")
	fl.BoolVar(&f.OTLPInsecure, "otlp-insecure", false, "send traces to a host:port --otlp-endpoint without TLS")
	fl.DurationVar(&f.LostAfter, "lost-after", 5*time.Minute, "a node without a heartbeat this long is lost and its reservations are released (longer than --unreachable-after)")
	if !full {
		return
	}
	fl.StringSliceVar(&f.Roles, "roles", strings.Split(envOr("BETTER_COMPUTE_ROLES", "api,worker,gateway"), ","), "roles to run: api, worker, gateway (env BETTER_COMPUTE_ROLES)")
	fl.StringSliceVar(&f.GatewayHosts, "gateway-host", nil, "name or IP agents reach the gateway by, put in its serving certificate (repeatable; default the listen host and localhost)")
	fl.StringVar(&f.TrustDomain, "trust-domain", envOr("BETTER_COMPUTE_TRUST_DOMAIN", ""), "SPIFFE trust domain of the PKI created on an empty database (env BETTER_COMPUTE_TRUST_DOMAIN)")
	fl.StringVar(&f.AdvertiseURL, "advertise-url", envOr("BETTER_COMPUTE_ADVERTISE_URL", ""), "https:// URL other replicas reach this one's replica listener by, to forward the pools it places (env BETTER_COMPUTE_ADVERTISE_URL; default https://<replica listen address>)")
	fl.StringVar(&f.ReplicaListen, "replica-listen", envOr("BETTER_COMPUTE_REPLICA_LISTEN", "127.0.0.1:8444"), "replica listener address: mutual TLS with internal CA certificates, where other replicas forward the pools this one places (PostgreSQL with BETTER_COMPUTE_SECRET; env BETTER_COMPUTE_REPLICA_LISTEN; empty: none)")
	fl.StringVar(&f.TrustedProxies, "trusted-proxies", envOr("BETTER_COMPUTE_TRUSTED_PROXIES", ""), "reverse proxies (comma-separated CIDRs or addresses) whose X-Forwarded-For names the client recorded in audit rows; anyone else's is ignored (env BETTER_COMPUTE_TRUSTED_PROXIES)")
	fl.StringVar(&f.DatabaseURL, "database-url", envOr("BETTER_COMPUTE_DATABASE_URL", ""), "PostgreSQL URL (postgres://…); empty uses SQLite in --state-dir (env BETTER_COMPUTE_DATABASE_URL)")
	fl.DurationVar(&f.DBStatementTimeout, "db-statement-timeout", store.DefaultStatementTimeout, "PostgreSQL statement_timeout of every connection (0: no limit); a statement past it fails UNAVAILABLE, retryable")
	fl.DurationVar(&f.DBLockTimeout, "db-lock-timeout", store.DefaultLockTimeout, "PostgreSQL lock_timeout of every connection (0: no limit); a lock wait past it fails UNAVAILABLE, retryable")
	fl.StringVar(&f.BootstrapKeyFile, "bootstrap-key-file", "", "where an empty database's first admin key is written, mode 0600 (default <state-dir>/admin.key)")
	fl.StringVar(&f.PDP, "pdp", "cedar", "policy decision point: cedar (embedded) or authzen (remote)")
	fl.StringVar(&f.AuthZENURL, "authzen-url", envOr("BETTER_COMPUTE_AUTHZEN_URL", ""), "base URL of the AuthZEN PDP (env BETTER_COMPUTE_AUTHZEN_URL)")
	fl.StringVar(&f.AuthZENToken, "authzen-token", "", "bearer token for the AuthZEN PDP (prefer env BETTER_COMPUTE_AUTHZEN_TOKEN)")
	fl.DurationVar(&f.AuthZENTimeout, "authzen-timeout", 2*time.Second, "AuthZEN decision timeout; a timeout denies")
	fl.StringVar(&f.OIDC.Issuer, "oidc-issuer", envOr("BETTER_COMPUTE_OIDC_ISSUER", ""), "OIDC issuer URL for user bearer tokens (env BETTER_COMPUTE_OIDC_ISSUER)")
	fl.StringVar(&f.OIDC.ClientID, "oidc-client-id", envOr("BETTER_COMPUTE_OIDC_CLIENT_ID", ""), "audience OIDC tokens must carry (env BETTER_COMPUTE_OIDC_CLIENT_ID)")
	fl.StringVar(&f.OIDC.TenantClaim, "oidc-tenant-claim", "bc_tenant", "claim naming the user's tenant")
	fl.StringVar(&f.OIDC.RoleClaim, "oidc-role-claim", "bc_role", "claim naming the user's role: admin, operator, member or viewer")
	fl.StringVar(&f.WorkloadIssuer, "workload-issuer", envOr("BETTER_COMPUTE_WORKLOAD_ISSUER", ""), "public https:// URL of the control plane: the iss of workload tokens, with the JWKS at <URL>/.well-known/jwks.json (env BETTER_COMPUTE_WORKLOAD_ISSUER; empty: workload identity off)")
	fl.StringSliceVar(&f.OIDC.PlatformAdmins, "oidc-platform-admin", nil, "OIDC subject that is a platform administrator (repeatable)")
}

// options are the flags' settings with what comes only from the
// environment: the secret (never a flag, so it stays out of ps) and the
// AuthZEN token when no flag gave one.
func (f *serverFlags) options() server.Options {
	o := f.Options
	if o.AuthZENToken == "" {
		o.AuthZENToken = os.Getenv("BETTER_COMPUTE_AUTHZEN_TOKEN")
	}
	return o
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
			o := f.options()
			o.Secret = os.Getenv(pki.SecretEnv)
			return optionError(server.Serve(cmd.Context(), o, cmd.ErrOrStderr()))
		},
	}
	f.register(cmd, true)
	return cmd
}

// optionError prints a setting the server or the dev rig refused as the
// CLI's INVALID_ARGUMENT naming the flag, as every other command does.
func optionError(err error) error {
	var fe *server.FlagError
	if errors.As(err, &fe) {
		return invalidArg(fe.Flag, fe.Reason)
	}
	return err
}
