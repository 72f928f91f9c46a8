package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"

	bcapp "github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/authn"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/tracing"
)

// Options are the settings serve and dev share, one field per flag of
// theirs: the CLI fills them from flags and the environment.
type Options struct {
	WebhookAllowPrivate          bool
	EventRetention, SSEHeartbeat time.Duration
	// AuditCheckpointEvery and AuditCheckpointInterval: a signed
	// checkpoint of the audit log every N entries or T.
	AuditCheckpointEvery                               int
	AuditCheckpointInterval                            time.Duration
	Listen, StateDir, DatabaseURL, LogFormat, LogLevel string
	Roles                                              []string
	PDP, AuthZENURL, AuthZENToken                      string
	AuthZENTimeout, ShutdownTimeout                    time.Duration
	OIDC                                               authn.OIDCConfig
	WorkloadIssuer                                     string
	BootstrapKeyFile                                   string
	DownloadsDir                                       string
	ImagesDir                                          string
	MaxImageBytes                                      int64
	// ReleasePubkeys are files of release public keys published releases
	// must be signed by.
	ReleasePubkeys []string
	// PublicURL is the API's URL as nodes reach it (rollout downloads).
	PublicURL                  string
	GatewayListen, TrustDomain string
	// AdvertiseURL is where peers forward the mutations of pools whose
	// placer runs here.
	AdvertiseURL string
	// ReplicaListen is the mutual TLS listener peers forward to.
	ReplicaListen                                  string
	GatewayHosts                                   []string
	HeartbeatInterval, UnreachableAfter, LostAfter time.Duration
	// DBStatementTimeout and DBLockTimeout bound every PostgreSQL
	// statement and lock wait (0 turns a bound off).
	DBStatementTimeout, DBLockTimeout time.Duration
	// MaxConnections caps the API's open connections; RequestRate,
	// RequestBurst and MaxStreams bound each principal.
	MaxConnections, RequestBurst, MaxStreams int
	RequestRate                              float64
	// TrustedProxies is --trusted-proxies: CIDRs or addresses whose
	// X-Forwarded-For names the client in audit rows.
	TrustedProxies string
	// OTLPEndpoint turns tracing on (else the standard OTEL_EXPORTER_OTLP_*
	// variables may); OTLPInsecure sends to a host:port without TLS.
	OTLPEndpoint string
	OTLPInsecure bool
	// Secret is BETTER_COMPUTE_SECRET (for dev, else <state-dir>/secret);
	// never a flag, so it stays out of ps.
	Secret string
}

// A FlagError is a setting the process refuses, named by its flag so the
// CLI can say which flag to change.
type FlagError struct {
	Flag, Reason string
}

func (e *FlagError) Error() string { return "invalid --" + e.Flag + ": " + e.Reason }

func invalid(flag, reason string) error { return &FlagError{Flag: flag, Reason: reason} }

// CheckLiveness refuses liveness timeouts the gateway would refuse, naming
// the flags rather than the gateway's settings.
func (o *Options) CheckLiveness() error {
	switch {
	case o.DBStatementTimeout < 0:
		return invalid("db-statement-timeout", "must not be negative (0 turns the limit off)")
	case o.DBLockTimeout < 0:
		return invalid("db-lock-timeout", "must not be negative (0 turns the limit off)")
	case o.HeartbeatInterval <= 0:
		return invalid("heartbeat-interval", "must be positive")
	case o.UnreachableAfter < 2*o.HeartbeatInterval:
		return invalid("unreachable-after", fmt.Sprintf("must be at least twice --heartbeat-interval (%v), not %v", o.HeartbeatInterval, o.UnreachableAfter))
	case o.TrustedProxies != "" && o.trustedProxies() == nil:
		_, err := envelope.ParseTrustedProxies(o.TrustedProxies)
		return invalid("trusted-proxies", fmt.Sprintf("must be a comma-separated list of CIDRs or addresses: %v", err))
	case o.LostAfter <= o.UnreachableAfter:
		return invalid("lost-after", fmt.Sprintf("must be longer than --unreachable-after (%v), not %v; to try node loss quickly pass e.g. --heartbeat-interval 2s --unreachable-after 5s --lost-after 15s", o.UnreachableAfter, o.LostAfter))
	}
	return nil
}

func (o *Options) trustedProxies() []netip.Prefix {
	p, err := envelope.ParseTrustedProxies(o.TrustedProxies)
	if err != nil {
		return nil
	}
	return p
}

// Bind opens the API listener and, when gateway is set, the agent
// gateway's, before anything is written to the database: a start that
// cannot serve must not create the platform (dev would otherwise never show
// the admin key). A port in use is refused with the flag that picks another;
// both ports are checked so one failed start names every flag to change.
func (o *Options) Bind(a *bcapp.App, api, gateway bool) (net.Listener, net.Addr, error) {
	var (
		ln     net.Listener
		gwAddr net.Addr
		msgs   []string
		err    error
	)
	if api {
		if ln, err = a.Listen(); err != nil {
			msgs = append(msgs, listenError(err, o.Listen, "listen"))
		}
	}
	if gateway {
		if len(msgs) == 0 {
			if gwAddr, err = a.ListenGateway(); err != nil {
				msgs = append(msgs, listenError(err, o.GatewayListen, "gateway-listen"))
			}
		} else if probe, err := net.Listen("tcp", o.GatewayListen); err != nil {
			// The start fails anyway; only learn whether this port is free
			// too, without binding the gateway for good.
			msgs = append(msgs, listenError(err, o.GatewayListen, "gateway-listen"))
		} else {
			_ = probe.Close()
		}
	}
	if len(msgs) > 0 {
		if ln != nil {
			_ = ln.Close()
		}
		return nil, nil, Unavailable(errors.New(strings.Join(msgs, "; ")))
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

// Logger is the process's logger, writing to w in --log-format at
// --log-level.
func (o *Options) Logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.LogLevel)); err != nil {
		return nil, invalid("log-level", "must be debug, info, warn or error")
	}
	opts := &slog.HandlerOptions{Level: level}
	switch o.LogFormat {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, invalid("log-format", "must be text or json")
}

// AppConfig is the app's configuration for these options.
func (o *Options) AppConfig(logger *slog.Logger) bcapp.Config {
	return bcapp.Config{
		Roles: o.Roles, Listen: o.Listen, StateDir: o.StateDir, DatabaseURL: o.DatabaseURL,
		PDP: o.PDP, AuthZENURL: o.AuthZENURL, AuthZENTimeout: o.AuthZENTimeout, AuthZENToken: o.AuthZENToken,
		OIDC: o.OIDC, WorkloadIssuer: o.WorkloadIssuer, ShutdownTimeout: o.ShutdownTimeout, Logger: logger, DownloadsDir: o.DownloadsDir, PublicURL: o.PublicURL,
		ImagesDir: o.ImagesDir, MaxImageBytes: o.MaxImageBytes, ReleasePubkeys: o.ReleasePubkeys,
		GatewayListen: o.GatewayListen, ReplicaListen: o.ReplicaListen, GatewayHosts: o.GatewayHosts, TrustDomain: o.TrustDomain, Secret: o.Secret,
		HeartbeatInterval: o.HeartbeatInterval, UnreachableAfter: o.UnreachableAfter, LostAfter: o.LostAfter,
		MaxConnections:     o.MaxConnections,
		DBStatementTimeout: offIfZero(o.DBStatementTimeout), DBLockTimeout: offIfZero(o.DBLockTimeout),
		Limits:              envelope.Limits{RequestRate: o.RequestRate, RequestBurst: o.RequestBurst, MaxStreams: o.MaxStreams},
		WebhookAllowPrivate: o.WebhookAllowPrivate, EventRetention: o.EventRetention, SSEHeartbeat: o.SSEHeartbeat,
		AuditCheckpointEvery: o.AuditCheckpointEvery, AuditCheckpointInterval: o.AuditCheckpointInterval,
		TrustedProxies: o.trustedProxies(),
		Tracing:        tracing.Config{Endpoint: o.OTLPEndpoint, Insecure: o.OTLPInsecure, ServiceName: "better-compute"},
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

// Serve runs the serve process until ctx ends: the roles in o.Roles on
// their listeners, after bootstrapping an empty database (its first admin
// key goes only to --bootstrap-key-file). It logs to logw.
func Serve(ctx context.Context, o Options, logw io.Writer) error {
	logger, err := o.Logger(logw)
	if err != nil {
		return err
	}
	if err := o.CheckLiveness(); err != nil {
		return err
	}
	if slices.Contains(o.Roles, bcapp.RoleGateway) && strings.TrimSpace(o.Secret) == "" {
		return invalid("roles", "the gateway role needs "+pki.SecretEnv+": base64 of 32 random bytes (openssl rand -base64 32), the same on every replica")
	}
	a, err := bcapp.New(ctx, o.AppConfig(logger))
	if err != nil {
		return Unavailable(err)
	}
	defer CloseApp(a, logger)
	ln, gwAddr, err := o.Bind(a, slices.Contains(o.Roles, bcapp.RoleAPI), slices.Contains(o.Roles, bcapp.RoleGateway))
	if err != nil {
		return err
	}
	// Peers forward to the replica listener only, over mutual TLS.
	var replicaAddr net.Addr
	if ln != nil {
		if replicaAddr, err = a.ListenReplica(); err != nil {
			_ = ln.Close()
			return Unavailable(errors.New(listenError(err, o.ReplicaListen, "replica-listen")))
		}
	}
	if ln != nil {
		// Webhooks never call this replica's own API.
		a.WebhookGuard.AddSelfURL("http://" + ln.Addr().String())
		// MCP's exec_sandbox tunnels through this listener.
		a.SetSelfURL("http://" + ln.Addr().String())
	}
	switch {
	case replicaAddr == nil:
	case o.AdvertiseURL != "":
		if !strings.HasPrefix(o.AdvertiseURL, "https://") {
			_ = ln.Close()
			return invalid("advertise-url", "must be the https:// URL of --replica-listen: peers forward over mutual TLS")
		}
		a.SetAPIURL(o.AdvertiseURL)
	default:
		a.SetAPIURL("https://" + replicaAddr.String())
	}
	if replicaAddr != nil {
		// SSH tunnels reach the node's gateway session on any
		// replica, through the same listener.
		url := cmp.Or(o.AdvertiseURL, "https://"+replicaAddr.String())
		if err := a.EnableReplicaTunnels(ctx, url); err != nil {
			_ = ln.Close()
			return Unavailable(err)
		}
	}
	keyFile := o.BootstrapKeyFile
	if keyFile == "" {
		keyFile = filepath.Join(o.StateDir, "admin.key")
	}
	_, created, err := a.Bootstrap(ctx, func(secret string) error {
		// Never replace a key file: it may belong to another database.
		return WriteSecretFile(keyFile, secret, false)
	})
	if err != nil {
		if ln != nil {
			_ = ln.Close()
		}
		return Unavailable(fmt.Errorf("bootstrap the platform: %w", err))
	}
	if created {
		logger.Info("platform created; the first admin key was written", "file", keyFile)
	}
	if gwAddr != nil {
		logger.Info("agent gateway listening", "addr", gwAddr.String(), "trust_domain", a.PKI.TrustDomain(), "pin", a.PKI.Pin())
	}
	if ln != nil {
		logger.Info("serving", "api", "http://"+ln.Addr().String(), "roles", strings.Join(o.Roles, ","))
	} else {
		logger.Info("serving", "roles", strings.Join(o.Roles, ","))
	}
	return Unavailable(IgnoreCanceled(a.Run(ctx, ln)))
}

// CloseApp closes the database after the roles stopped; a failure there is
// worth a log line but not a different exit code.
func CloseApp(a *bcapp.App, logger *slog.Logger) {
	if err := a.Close(); err != nil {
		logger.Error("closing the database", "err", err)
	}
}

// IgnoreCanceled reads a run ended by its context as a clean stop.
func IgnoreCanceled(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// Unavailable labels a failure of the server itself (a port in use, an
// unreachable database) so the CLI prints it as UNAVAILABLE rather than as a
// usage mistake. Errors that already carry a code keep it.
func Unavailable(err error) error {
	var ce *connect.Error
	if err == nil || errors.As(err, &ce) {
		return err
	}
	return connect.NewError(connect.CodeUnavailable, err)
}

// WriteSecretFile writes a secret readable by its owner only. Unless replace
// is set it refuses to overwrite a file, so a key is never silently lost.
func WriteSecretFile(path, secret string, replace bool) error {
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
