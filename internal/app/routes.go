package app

import (
	"context"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/audit"
	"github.com/better-compute/better-compute/internal/authn"
	"github.com/better-compute/better-compute/internal/capacity/budget"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/capacity/quota"
	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/capacity/usage"
	"github.com/better-compute/better-compute/internal/capacity/views"
	"github.com/better-compute/better-compute/internal/confirmation"
	"github.com/better-compute/better-compute/internal/console"
	"github.com/better-compute/better-compute/internal/downloads"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/events"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/health"
	"github.com/better-compute/better-compute/internal/images"
	"github.com/better-compute/better-compute/internal/mcp"
	"github.com/better-compute/better-compute/internal/metal"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/policy"
	"github.com/better-compute/better-compute/internal/profiles"
	"github.com/better-compute/better-compute/internal/provideraccounts"
	"github.com/better-compute/better-compute/internal/providerpools"
	"github.com/better-compute/better-compute/internal/releases"
	"github.com/better-compute/better-compute/internal/rollout"
	// The built-in provider types register themselves: the accounts
	// service checks accounts against their manifests.
	"github.com/better-compute/better-compute/internal/fleetmark"
	_ "github.com/better-compute/better-compute/internal/providers/hcloud"
	_ "github.com/better-compute/better-compute/internal/providers/proxmox"
	_ "github.com/better-compute/better-compute/internal/providers/robot"
	"github.com/better-compute/better-compute/internal/quorum"
	"github.com/better-compute/better-compute/internal/secrets"
	"github.com/better-compute/better-compute/internal/tenancy"
	"github.com/better-compute/better-compute/internal/tunnel"
	"github.com/better-compute/better-compute/internal/vps"
	"github.com/better-compute/better-compute/internal/webhooks"
	"github.com/better-compute/better-compute/internal/workloadid"
)

// MaxRequestBytes caps every request body; larger ones are refused before
// they are decoded.
const MaxRequestBytes = 1 << 20

// MaxExecRequestBytes caps the body of ReservationService.Exec.
const MaxExecRequestBytes = 2 << 20

// strictJSON is Connect's JSON codec without DiscardUnknown: a field the
// server does not know is an error, not silently dropped.
type strictJSON struct{}

func (strictJSON) Name() string { return "json" }

func (strictJSON) Marshal(v any) ([]byte, error) {
	return protojson.MarshalOptions{}.Marshal(v.(proto.Message))
}

func (strictJSON) Unmarshal(b []byte, v any) error {
	if len(b) == 0 {
		// An empty body is an empty message, as in Connect's own codec.
		return nil
	}
	m := v.(proto.Message)
	err := protojson.UnmarshalOptions{DiscardUnknown: false}.Unmarshal(b, m)
	if err != nil {
		// Invalid UTF-8 or a lone surrogate: decoded with U+FFFF in its
		// place, the interceptor refuses it naming the field.
		if fixed, ok := envelope.RepairJSONText(b); ok && protojson.Unmarshal(fixed, m) == nil {
			return nil
		}
	}
	return err
}

// textProto is Connect's binary codec, except that a string field holding
// invalid UTF-8 decodes with U+FFFF in its place, so the interceptor's
// text check refuses it as a violation naming the field rather than the
// decoder refusing the whole body anonymously.
type textProto struct{}

func (textProto) Name() string { return "proto" }

func (textProto) Marshal(v any) ([]byte, error) { return proto.Marshal(v.(proto.Message)) }

func (textProto) Unmarshal(b []byte, v any) error {
	m := v.(proto.Message)
	err := proto.Unmarshal(b, m)
	if err != nil {
		if fixed, ok := envelope.RepairProtoText(b, m.ProtoReflect().Descriptor()); ok && proto.Unmarshal(fixed, m) == nil {
			return nil
		}
	}
	return err
}

// CompressMinBytes is the smallest response the API compresses when the
// caller accepts it: about one Ethernet frame, below which compression
// saves no packet.
const CompressMinBytes = 1400

func (a *App) routes(validator policy.Validator, metrics *envelope.PromMetrics) (http.Handler, error) {
	interceptor := envelope.NewInterceptor(a.Envelope, a.Authn, metrics)
	opts := connect.WithHandlerOptions(
		connect.WithInterceptors(interceptor),
		// Compressing a small response costs more CPU than the bytes it
		// saves (gzip was a tenth of a create's CPU): only responses of
		// CompressMinBytes or more are compressed.
		connect.WithCompressMinBytes(CompressMinBytes),
		connect.WithReadMaxBytes(MaxRequestBytes),
		connect.WithCodec(strictJSON{}),
		connect.WithCodec(textProto{}),
	)
	mux := http.NewServeMux()
	tenants := tenancy.NewTenantService(a.Envelope)
	tenants.SetCleaners(tenantCleaners(a.Sandboxes))
	mux.Handle(apiv1connect.NewTenantServiceHandler(tenants, opts))
	mux.Handle(apiv1connect.NewProjectServiceHandler(tenancy.NewProjectService(a.Envelope), opts))
	mux.Handle(apiv1connect.NewApiKeyServiceHandler(authn.NewApiKeyService(a.Envelope), opts))
	mux.Handle(apiv1connect.NewIdentityServiceHandler(authn.NewIdentityService(a.Envelope), opts))
	mux.Handle(apiv1connect.NewPolicyServiceHandler(policy.NewService(a.Envelope, validator), opts))
	mux.Handle(apiv1connect.NewConfirmationServiceHandler(confirmation.NewService(a.Envelope), opts))
	mux.Handle(apiv1connect.NewAuditServiceHandler(audit.NewService(a.Envelope, a.AuditLog), opts))
	eventService := events.NewService(a.Envelope, a.hub, a.cfg.EventPoll)
	mux.Handle(apiv1connect.NewEventServiceHandler(eventService, opts))
	// Server-Sent Events: the watch's procedure row authorizes it
	// (events.watch) and its streams count against the same limit.
	mux.Handle("GET "+events.SSEPath, interceptor.HTTPStream(apiv1connect.EventServiceWatchProcedure,
		func(ctx context.Context, w http.ResponseWriter, r *http.Request) error {
			return eventService.SSE(ctx, w, r, a.cfg.SSEHeartbeat)
		}, events.SSEError))
	var sealer webhooks.Sealer
	if a.sealer != nil {
		sealer = a.sealer
	}
	mux.Handle(apiv1connect.NewWebhookServiceHandler(webhooks.NewService(a.Envelope, sealer, a.WebhookGuard), opts))
	// a.PKI is nil when no secret is configured: join token creation and
	// node deletion then answer INTERNAL. a.Gateway always wakes sessions.
	fd := fleetDeps(a.PKI, a.Gateway)
	fd.Signer = a.cmdSigner
	fd.States = &a.fleetHooks
	fd.Sites = a.Metal.Sites
	mux.Handle(apiv1connect.NewNodeServiceHandler(fleet.NewNodeService(a.Envelope, fd), opts))
	mux.Handle(apiv1connect.NewCommandServiceHandler(fleet.NewCommandService(a.Envelope, fd), opts))
	mux.Handle(apiv1connect.NewJoinTokenServiceHandler(fleet.NewJoinTokenService(a.Envelope, fd), opts))
	mux.Handle(apiv1connect.NewTrustAnchorServiceHandler(fleet.NewTrustAnchorService(a.Envelope), opts))
	// A batch carries up to 8 MiB of params: its service alone reads a body
	// that large, so a batch past it is refused with its field and reason.
	trustDomain := ""
	if a.PKI != nil {
		trustDomain = a.PKI.TrustDomain()
	}
	qd := quorum.Deps{TrustDomain: trustDomain, Notifier: a.Gateway, Signer: a.cmdSigner}
	if a.Metal != nil {
		qd.Machines = a.Metal
	}
	mux.Handle(apiv1connect.NewCommandBatchServiceHandler(quorum.NewService(a.Envelope, qd), opts, connect.WithReadMaxBytes(quorum.MaxRequestBytes)))
	mux.Handle(apiv1connect.NewJoinRequestServiceHandler(fleet.NewJoinRequestService(a.Envelope), opts))
	mux.Handle(apiv1connect.NewInventoryServiceHandler(fleet.NewInventoryService(a.Envelope), opts))
	mux.Handle(apiv1connect.NewHealthServiceHandler(health.NewService(a.Envelope, a.Health), opts))
	mux.Handle(apiv1connect.NewRolloutServiceHandler(rollout.NewService(a.Envelope, a.Rollouts), opts))
	mux.Handle(apiv1connect.NewPoolServiceHandler(pool.NewService(a.Envelope, a.Capacity.Hooks().PoolChanged, a.Capacity.Hooks().PoolLiveReservations), opts))
	rsv := reservation.NewService(a.Envelope, a.Capacity.Engine, reservationEvents{hub: a.hub})
	mux.Handle(apiv1connect.NewReservationServiceHandler(rsv, opts))
	// Exec alone takes a body up to MaxExecRequestBytes, so that a command
	// line past its 64 KiB limit (a 1 MiB argument list) is refused with
	// the field that is wrong rather than as an oversized body.
	execMethod := apiv1.File_bettercompute_api_v1_reservations_proto.Services().ByName("ReservationService").Methods().ByName("Exec")
	mux.Handle(apiv1connect.ReservationServiceExecProcedure, connect.NewServerStreamHandler(apiv1connect.ReservationServiceExecProcedure,
		rsv.Exec, connect.WithSchema(execMethod), opts, connect.WithReadMaxBytes(MaxExecRequestBytes)))
	mux.Handle(apiv1connect.NewQuotaServiceHandler(quota.NewService(a.Envelope), opts))
	mux.Handle(apiv1connect.NewBudgetServiceHandler(budget.NewService(a.Envelope), opts))
	mux.Handle(apiv1connect.NewCapacityServiceHandler(views.NewService(a.Envelope), opts))
	mux.Handle(apiv1connect.NewUsageServiceHandler(usage.NewService(a.Envelope, providerpools.Intervals), opts))
	mux.Handle(apiv1connect.NewImageServiceHandler(images.NewService(a.Envelope, a.Blobs, a.cfg.MaxImageBytes, a.cfg.Logger), opts))
	mux.Handle(apiv1connect.NewSignerKeyServiceHandler(images.NewSignerService(a.Envelope), opts))
	mux.Handle(apiv1connect.NewReleaseServiceHandler(releases.NewService(a.Envelope, a.Blobs, a.releaseKeys, a.cfg.Logger).SetInUse(rollout.ActiveUsing), opts))
	mux.Handle(apiv1connect.NewSiteServiceHandler(metal.NewSiteService(a.Envelope), opts))
	mux.Handle(apiv1connect.NewMachineServiceHandler(metal.NewMachineService(a.Envelope, a.Metal), opts))
	mux.Handle(apiv1connect.NewFlavorServiceHandler(vps.NewFlavorService(a.Envelope), opts))
	mux.Handle(apiv1connect.NewIPPoolServiceHandler(vps.NewIPPoolService(a.Envelope), opts))
	mux.Handle(apiv1connect.NewInstanceServiceHandler(a.Instances, opts))
	mux.Handle(apiv1connect.NewVolumeServiceHandler(vps.NewVolumeService(a.Instances), opts))
	mux.Handle(apiv1connect.NewSandboxTemplateServiceHandler(a.Sandboxes.Templates(), opts))
	mux.Handle(apiv1connect.NewSandboxServiceHandler(a.Sandboxes, opts))
	var secretSealer secrets.Sealer // a nil *pki.Sealer must stay a nil interface
	if a.sealer != nil {
		secretSealer = a.sealer
	}
	mux.Handle(apiv1connect.NewSecretServiceHandler(secrets.NewService(a.Envelope, secretSealer), opts))
	mux.Handle(apiv1connect.NewFleetConfigServiceHandler(fleetmark.NewService(a.Envelope), opts))
	mux.Handle(apiv1connect.NewProviderAccountServiceHandler(provideraccounts.NewService(a.Envelope), opts))
	mux.Handle(apiv1connect.NewProfileServiceHandler(profiles.NewService(a.Envelope, profiles.ServiceConfig{
		Catalog: a.Metal.ProfileCatalog, NamedBy: metal.MachineNamingHardwareProfile}), opts))
	var workloadKeys *pki.WorkloadKeys
	if a.sealer != nil {
		workloadKeys = pki.NewWorkloadKeys(a.DB, a.sealer)
	}
	wid := workloadid.NewService(a.Envelope, workloadKeys, a.cfg.WorkloadIssuer)
	mux.Handle(apiv1connect.NewWorkloadIdentityServiceHandler(wid, opts))
	// What a workload's verifier fetches: no credentials.
	mux.HandleFunc("GET "+workloadid.JWKSPath, wid.JWKS)
	mux.HandleFunc("GET "+workloadid.DiscoveryPath, wid.Discovery)
	// SSH tunnels: the ticket is the credential (see vps.TunnelHandler).
	mux.Handle("GET "+tunnel.Path, a.Instances.TunnelHandler(a.cfg.Logger))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := a.DB.Ping(ctx); err != nil {
			http.Error(w, "database unavailable", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.Registry, promhttp.HandlerOpts{}))
	// bcd builds for the install script, which pins their sha256.
	// Published releases first, then the directory for other versions.
	mux.Handle("GET /downloads/", downloads.Handler(a.cfg.DownloadsDir, releases.Downloads{DB: a.DB, Blobs: a.Blobs}))
	// MCP for AI agents: its tools call the handlers above in process, so
	// each passes the envelope as the agent's key.
	agents, err := mcp.Handler(mcp.HTTPConfig{API: mux, Authn: a.Authn, MaxRequestBytes: MaxRequestBytes,
		APIURL: func() string { u, _ := a.selfURL.Load().(string); return u }})
	if err != nil {
		return nil, err
	}
	mux.Handle(mcp.Path, agents)
	// The web console: its pages call the handlers above in process with
	// the signed-in person's own key.
	var consoleSealer console.Sealer // a nil *pki.Sealer must stay a nil interface
	if a.sealer != nil {
		consoleSealer = a.sealer
	}
	web, err := console.New(console.Config{API: mux, DB: a.DB, Sealer: consoleSealer, Clock: a.cfg.Clock, Logger: a.cfg.Logger,
		OIDC: console.OIDC{Issuer: a.cfg.OIDC.Issuer, ClientID: a.cfg.OIDC.ClientID}})
	if err != nil {
		return nil, err
	}
	mux.Handle(console.Path, web)
	mux.Handle(console.PathHome, web)
	return mux, nil
}

// fleetDeps adapts the PKI authority and the gateway's notifier to the fleet
// API's ports. A nil authority leaves join token creation and node deletion
// unwired; a nil notifier leaves new commands for the node's next poll.
func fleetDeps(authority *pki.Authority, notifier fleet.CommandNotifier) fleet.Deps {
	d := fleet.Deps{Notifier: notifier}
	if authority != nil {
		d.Revoker, d.Sealer = authority, joinTokenSealer{authority}
	}
	return d
}

// joinTokenSealer seals the fleet's join claims with the PKI: the two claim
// types match field for field.
type joinTokenSealer struct{ authority *pki.Authority }

func (s joinTokenSealer) SealJoinToken(c fleet.JoinClaims) (string, error) {
	return s.authority.SealJoinToken(pki.JoinClaims(c))
}
