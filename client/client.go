// Package client is the public Go SDK for the better-compute API.
//
// It wires the generated ConnectRPC clients for every service behind one
// Client that authenticates each call with a bearer token, and it gives
// callers the stable machine code of an error (Code, Detail) so they can
// branch on CONFIRMATION_REQUIRED or PERMISSION_DENIED without parsing
// messages.
//
// The SDK must never log, print or otherwise echo the token it is given: it
// only places it in the Authorization header of outgoing requests. It holds
// no state besides its configuration, so a Client is safe for concurrent use.
package client

import (
	"context"
	"crypto/rand"
	"errors"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
)

// Request headers the API reads besides Authorization.
const (
	// HeaderIdempotencyKey makes a Create safe to retry: the server answers a
	// replay of the same key with the first response instead of creating twice.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderConfirmationID replays a request that was refused with
	// CONFIRMATION_REQUIRED, once a human approved the confirmation.
	HeaderConfirmationID = "Bc-Confirmation-Id"
)

// Client holds one generated client per API service, all sharing the same
// HTTP client, protocol and credentials.
type Client struct {
	Tenants        apiv1connect.TenantServiceClient
	Projects       apiv1connect.ProjectServiceClient
	ApiKeys        apiv1connect.ApiKeyServiceClient
	Identity       apiv1connect.IdentityServiceClient
	Policies       apiv1connect.PolicyServiceClient
	Confirmations  apiv1connect.ConfirmationServiceClient
	Audit          apiv1connect.AuditServiceClient
	Events         apiv1connect.EventServiceClient
	Nodes          apiv1connect.NodeServiceClient
	Commands       apiv1connect.CommandServiceClient
	CommandBatches apiv1connect.CommandBatchServiceClient
	JoinTokens     apiv1connect.JoinTokenServiceClient
	TrustAnchors   apiv1connect.TrustAnchorServiceClient
	JoinRequests   apiv1connect.JoinRequestServiceClient
	Inventory      apiv1connect.InventoryServiceClient
	Health         apiv1connect.HealthServiceClient
	Rollouts       apiv1connect.RolloutServiceClient
	Pools          apiv1connect.PoolServiceClient
	Reservations   apiv1connect.ReservationServiceClient
	Quotas         apiv1connect.QuotaServiceClient
	Budgets        apiv1connect.BudgetServiceClient
	Capacity       apiv1connect.CapacityServiceClient
	Usage          apiv1connect.UsageServiceClient
	// WorkloadIdentity issues workload tokens (docs/workload-identity.md).
	WorkloadIdentity apiv1connect.WorkloadIdentityServiceClient
	Images           apiv1connect.ImageServiceClient
	SignerKeys       apiv1connect.SignerKeyServiceClient
	Releases         apiv1connect.ReleaseServiceClient
	Webhooks         apiv1connect.WebhookServiceClient
	Sites            apiv1connect.SiteServiceClient
	Machines         apiv1connect.MachineServiceClient
	Flavors          apiv1connect.FlavorServiceClient
	IPPools          apiv1connect.IPPoolServiceClient
	Instances        apiv1connect.InstanceServiceClient
	Volumes          apiv1connect.VolumeServiceClient
	Secrets          apiv1connect.SecretServiceClient
	FleetConfig      apiv1connect.FleetConfigServiceClient
	// ProviderAccounts are the tenant's accounts at server providers.
	ProviderAccounts apiv1connect.ProviderAccountServiceClient
	// Profiles are deploy and hardware profile documents.
	Profiles apiv1connect.ProfileServiceClient
	// SandboxTemplates and Sandboxes run short-lived guests from templates.
	SandboxTemplates apiv1connect.SandboxTemplateServiceClient
	Sandboxes        apiv1connect.SandboxServiceClient
}

type options struct {
	httpClient *http.Client
	grpc       bool
	header     http.Header
	// rateLimitWait is the most a unary call waits out RATE_LIMITED.
	rateLimitWait time.Duration
}

// Option configures New.
type Option func(*options)

// WithHTTPClient sets the HTTP client; the default is http.DefaultClient.
// gRPC (WithGRPC) needs one that speaks HTTP/2 to the server.
func WithHTTPClient(c *http.Client) Option {
	return func(o *options) { o.httpClient = c }
}

// WithGRPC speaks gRPC instead of the Connect protocol.
func WithGRPC() Option {
	return func(o *options) { o.grpc = true }
}

// WithHeader sets a header on every request, e.g. a User-Agent, replacing
// the value the request would otherwise carry. It cannot set Authorization,
// which New owns.
func WithHeader(key, value string) Option {
	return func(o *options) { o.header.Add(key, value) }
}

// WithRateLimitRetry makes a unary call refused RATE_LIMITED wait the
// delay the refusal names (its google.rpc.RetryInfo; 1s without one) and
// try again, until it has waited maxWait in all. Any call may be retried:
// the API limits a principal before its handler runs, so a refused call
// did nothing.
func WithRateLimitRetry(maxWait time.Duration) Option {
	return func(o *options) { o.rateLimitWait = maxWait }
}

// New returns a Client for the API at baseURL (e.g. https://bc.example.com)
// that authenticates with token: an API key (bc_...) or an OIDC token. An
// empty token sends no Authorization header, for unauthenticated calls.
func New(baseURL, token string, opts ...Option) *Client {
	o := options{httpClient: http.DefaultClient, header: http.Header{}}
	for _, opt := range opts {
		opt(&o)
	}
	o.header.Del("Authorization")
	if token != "" {
		o.header.Set("Authorization", "Bearer "+token)
	}
	copts := []connect.ClientOption{connect.WithInterceptors(headerInterceptor(o.header))}
	if o.rateLimitWait > 0 {
		copts = append(copts, connect.WithInterceptors(rateLimitRetry(o.rateLimitWait)))
	}
	if o.grpc {
		copts = append(copts, connect.WithGRPC())
	}
	baseURL = strings.TrimRight(baseURL, "/")
	h := o.httpClient
	return &Client{
		Tenants:          apiv1connect.NewTenantServiceClient(h, baseURL, copts...),
		Projects:         apiv1connect.NewProjectServiceClient(h, baseURL, copts...),
		ApiKeys:          apiv1connect.NewApiKeyServiceClient(h, baseURL, copts...),
		Identity:         apiv1connect.NewIdentityServiceClient(h, baseURL, copts...),
		Policies:         apiv1connect.NewPolicyServiceClient(h, baseURL, copts...),
		Confirmations:    apiv1connect.NewConfirmationServiceClient(h, baseURL, copts...),
		Audit:            apiv1connect.NewAuditServiceClient(h, baseURL, copts...),
		Events:           apiv1connect.NewEventServiceClient(h, baseURL, copts...),
		Nodes:            apiv1connect.NewNodeServiceClient(h, baseURL, copts...),
		Commands:         apiv1connect.NewCommandServiceClient(h, baseURL, copts...),
		CommandBatches:   apiv1connect.NewCommandBatchServiceClient(h, baseURL, copts...),
		JoinTokens:       apiv1connect.NewJoinTokenServiceClient(h, baseURL, copts...),
		TrustAnchors:     apiv1connect.NewTrustAnchorServiceClient(h, baseURL, copts...),
		Health:           apiv1connect.NewHealthServiceClient(h, baseURL, copts...),
		Rollouts:         apiv1connect.NewRolloutServiceClient(h, baseURL, copts...),
		Pools:            apiv1connect.NewPoolServiceClient(h, baseURL, copts...),
		Reservations:     apiv1connect.NewReservationServiceClient(h, baseURL, copts...),
		Quotas:           apiv1connect.NewQuotaServiceClient(h, baseURL, copts...),
		Budgets:          apiv1connect.NewBudgetServiceClient(h, baseURL, copts...),
		Capacity:         apiv1connect.NewCapacityServiceClient(h, baseURL, copts...),
		Usage:            apiv1connect.NewUsageServiceClient(h, baseURL, copts...),
		WorkloadIdentity: apiv1connect.NewWorkloadIdentityServiceClient(h, baseURL, copts...),
		Images:           apiv1connect.NewImageServiceClient(h, baseURL, copts...),
		SignerKeys:       apiv1connect.NewSignerKeyServiceClient(h, baseURL, copts...),
		Releases:         apiv1connect.NewReleaseServiceClient(h, baseURL, copts...),
		JoinRequests:     apiv1connect.NewJoinRequestServiceClient(h, baseURL, copts...),
		Inventory:        apiv1connect.NewInventoryServiceClient(h, baseURL, copts...),
		Webhooks:         apiv1connect.NewWebhookServiceClient(h, baseURL, copts...),
		Sites:            apiv1connect.NewSiteServiceClient(h, baseURL, copts...),
		Machines:         apiv1connect.NewMachineServiceClient(h, baseURL, copts...),
		Flavors:          apiv1connect.NewFlavorServiceClient(h, baseURL, copts...),
		IPPools:          apiv1connect.NewIPPoolServiceClient(h, baseURL, copts...),
		Instances:        apiv1connect.NewInstanceServiceClient(h, baseURL, copts...),
		Volumes:          apiv1connect.NewVolumeServiceClient(h, baseURL, copts...),
		Secrets:          apiv1connect.NewSecretServiceClient(h, baseURL, copts...),
		FleetConfig:      apiv1connect.NewFleetConfigServiceClient(h, baseURL, copts...),
		ProviderAccounts: apiv1connect.NewProviderAccountServiceClient(h, baseURL, copts...),
		Profiles:         apiv1connect.NewProfileServiceClient(h, baseURL, copts...),
		SandboxTemplates: apiv1connect.NewSandboxTemplateServiceClient(h, baseURL, copts...),
		Sandboxes:        apiv1connect.NewSandboxServiceClient(h, baseURL, copts...),
	}
}

// headerInterceptor sets the fixed headers on unary and streaming calls
// alike; connect.UnaryInterceptorFunc alone would miss the event stream.
type headerInterceptor http.Header

func (h headerInterceptor) set(dst http.Header) {
	for k, vs := range h {
		dst[k] = append([]string(nil), vs...)
	}
}

func (h headerInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			h.set(req.Header())
		}
		return next(ctx, req)
	}
}

func (h headerInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		h.set(conn.RequestHeader())
		return conn
	}
}

func (h headerInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// NewIdempotencyKey returns a fresh random key for HeaderIdempotencyKey.
// Generate one per logical operation and reuse it on every retry of it.
func NewIdempotencyKey() string {
	return rand.Text()
}

// Detail returns the ErrorDetail the server attached to err, or nil when err
// is not an API error or carries none (e.g. a network failure).
func Detail(err error) *apiv1.ErrorDetail {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil
	}
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if derr != nil {
			continue
		}
		if ed, ok := v.(*apiv1.ErrorDetail); ok {
			return ed
		}
	}
	return nil
}

// Code returns err's stable machine code: the server's ErrorDetail code when
// present (e.g. CONFIRMATION_REQUIRED, which travels as the Connect code
// failed_precondition), else the Connect code in upper snake case (e.g.
// UNAVAILABLE for a network failure), and "" for a nil error.
func Code(err error) string {
	if err == nil {
		return ""
	}
	if d := Detail(err); d != nil && d.GetCode() != "" {
		return d.GetCode()
	}
	return strings.ToUpper(connect.CodeOf(err).String())
}

// Watch sends req and calls fn for each event until the stream ends, fn
// returns an error, or ctx is done. It returns fn's error, or the stream's
// (nil when the server closed it cleanly). To resume after a failure, call
// Watch again with req.After set to the id of the last event fn saw.
func (c *Client) Watch(ctx context.Context, req *apiv1.WatchEventsRequest, fn func(*apiv1.Event) error) error {
	// A cancel of our own closes the stream if fn stops the watch early, so
	// the HTTP connection is not left half-read.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.Events.Watch(ctx, connect.NewRequest(req))
	if err != nil {
		return err
	}
	defer func() { _ = stream.Close() }()
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if ev == nil {
			continue
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
	return stream.Err()
}

// rateLimitRetry retries unary calls refused RATE_LIMITED (WithRateLimitRetry).
func rateLimitRetry(maxWait time.Duration) connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			waited := time.Duration(0)
			for {
				res, err := next(ctx, req)
				if err == nil || Code(err) != "RATE_LIMITED" {
					return res, err
				}
				delay := retryDelay(err)
				if waited+delay > maxWait {
					return res, err
				}
				t := time.NewTimer(delay)
				select {
				case <-ctx.Done():
					t.Stop()
					return res, err
				case <-t.C:
				}
				waited += delay
			}
		}
	}
}

// retryDelay is the delay a refusal's google.rpc.RetryInfo names, else 1s.
func retryDelay(err error) time.Duration {
	var ce *connect.Error
	if errors.As(err, &ce) {
		for _, d := range ce.Details() {
			if v, derr := d.Value(); derr == nil {
				if ri, ok := v.(*errdetails.RetryInfo); ok && ri.GetRetryDelay().AsDuration() > 0 {
					return ri.GetRetryDelay().AsDuration()
				}
			}
		}
	}
	return time.Second
}
