package webhooks

import (
	"context"
	"errors"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/riverqueue/river"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/client/webhook"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/events"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// Sealer seals endpoint secrets at rest (the PKI's sealer).
type Sealer interface {
	Seal(ref string, plaintext []byte) ([]byte, error)
	Open(ref string, sealed []byte) ([]byte, error)
}

// Request bounds.
const (
	MaxURLLen         = 2048
	MaxTypes          = 32
	MaxDescriptionLen = 256
	// DefaultOverlap is how long a rotated secret keeps signing.
	DefaultOverlap = 24 * time.Hour
	MaxOverlap     = 7 * 24 * time.Hour
)

// typeRE is an event type glob: dotted names, * for any run of characters
// (commandBatch.* has the one capital of the event types).
var typeRE = regexp.MustCompile(`^[a-zA-Z0-9_*][a-zA-Z0-9_.*-]{0,127}$`)

// EventFamilies are the first words of the event types the control plane
// emits (reservation.created is of family reservation). A subscription's
// type or glob must start with one, or with a wildcard: a typo such as
// reservaton.* would otherwise match nothing, silently. TestEventFamilies
// keeps the list with the code that emits events.
var EventFamilies = []string{
	"allocation", "apikey", "approverSet", "budget", "capacity", "command", "commandBatch", "confirmation", "fleet", "flavor", "gpu", "health",
	"image", "instance", "ip_pool", "join_request", "jointoken", "machine", "machine_lease", "node", "platform", "policy",
	"pool", "profile", "project", "provider", "provider_account", "quota", "release", "reservation", "rollout", "sandbox", "sandbox_template",
	"secret", "signerkey", "site", "tenant", "trust_anchor", "usage", "volume", "webhook", "workflow", "workload",
}

// unknownFamily returns the family of glob g when it is no known one ("" when
// g starts with a wildcard or a known family).
func unknownFamily(g string) string {
	fam, _, _ := strings.Cut(g, ".")
	if strings.ContainsAny(fam, "*?[") || slices.Contains(EventFamilies, fam) {
		return ""
	}
	return fam
}

// Matches reports whether an event type matches any of the globs (none:
// every type). A glob is path.Match's: reservation.* matches
// reservation.created; * alone matches everything.
func Matches(typ string, globs []string) bool {
	if len(globs) == 0 {
		return true
	}
	for _, g := range globs {
		if ok, _ := path.Match(g, typ); ok {
			return true
		}
	}
	return false
}

// Service serves the WebhookService API.
type Service struct {
	env    *envelope.Envelope
	sealer Sealer
	guard  *Guard
}

// Enqueuer enqueues a delivery job in the caller's transaction.
type Enqueuer interface {
	InsertTx(ctx context.Context, tx store.Tx, args river.JobArgs, opts *river.InsertOpts) error
}

var _ apiv1connect.WebhookServiceHandler = (*Service)(nil)

// NewService returns the handlers. sealer may be nil (no
// BETTER_COMPUTE_SECRET): endpoints then cannot be created.
func NewService(env *envelope.Envelope, sealer Sealer, guard *Guard) *Service {
	return &Service{env: env, sealer: sealer, guard: guard}
}

// Resource projects an endpoint into the authorization model.
func Resource(w Webhook) iam.Resource {
	return iam.Resource{Type: "Webhook", ID: w.ID, TenantID: w.TenantID}
}

// Proto converts an endpoint for the API (never its secrets).
func Proto(w Webhook) *apiv1.Webhook {
	out := &apiv1.Webhook{Id: w.ID, TenantId: w.TenantID, Url: w.URL, Types: w.Types, Description: w.Description,
		State: w.State, DisabledReason: w.DisabledReason, CreateTime: timestamppb.New(w.CreateTime),
		UpdateTime: timestamppb.New(w.UpdateTime)}
	if w.PreviousExpireTime != nil {
		out.PreviousSecretExpireTime = timestamppb.New(*w.PreviousExpireTime)
	}
	return out
}

// DeliveryProto converts a delivery for the API.
func DeliveryProto(d Delivery) *apiv1.WebhookDelivery {
	return &apiv1.WebhookDelivery{Id: d.ID, WebhookId: d.WebhookID, EventId: d.EventID, EventType: d.EventType, State: d.State,
		Attempts: int32(d.Attempts), LastStatus: int32(d.LastStatus), LastError: d.LastError,
		NextAttemptTime: timestamppb.New(d.NextAttemptTime), CreateTime: timestamppb.New(d.CreateTime),
		UpdateTime: timestamppb.New(d.UpdateTime)}
}

func (s *Service) checkURL(ctx context.Context, vs *envelope.Violations, raw string) {
	switch {
	case raw == "":
		vs.Add("url", "is required")
	case len(raw) > MaxURLLen:
		vs.Add("url", "must be at most %d bytes", MaxURLLen)
	default:
		if why := s.guard.CheckURL(ctx, raw); why != "" {
			vs.Add("url", "%s", why)
		}
	}
}

func checkTypes(vs *envelope.Violations, types []string) {
	if len(types) > MaxTypes {
		vs.Add("types", "at most %d types", MaxTypes)
		return
	}
	for i, t := range types {
		if _, err := path.Match(t, ""); err != nil || !typeRE.MatchString(t) {
			vs.Add("types["+strconv.Itoa(i)+"]", "must be an event type or glob like reservation.* (letters, digits, . _ - *), got %q", t)
		} else if fam := unknownFamily(t); fam != "" {
			vs.Add("types["+strconv.Itoa(i)+"]", "no event type starts with %q: the families are %s", fam, strings.Join(EventFamilies, ", "))
		}
	}
}

// seal seals a fresh secret for endpoint id.
func (s *Service) seal(id, secret string) ([]byte, error) {
	if s.sealer == nil {
		return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "webhooks need BETTER_COMPUTE_SECRET on the control plane to seal their signing secrets")
	}
	return s.sealer.Seal("webhook/"+id, []byte(secret))
}

// lookup resolves a tenant and one of its endpoints; misses are reported
// after the decision.
func lookup(ctx context.Context, q store.Querier, tenant, id string) (t tenancy.Tenant, w Webhook, tfound, wfound bool, err error) {
	if t, tfound, err = tenancy.LookupTenant(ctx, q, tenant); err != nil || !tfound {
		return
	}
	w, err = WebhookGet(ctx, q, t.ID, id)
	if errors.Is(err, store.ErrNotFound) {
		return t, w, tfound, false, nil
	}
	return t, w, tfound, err == nil, err
}

// draft is the resource a mutation of an existing endpoint is decided on:
// the endpoint, or its tenant when it does not exist.
func draft(t tenancy.Tenant, w Webhook, wfound bool) iam.Resource {
	if wfound {
		return Resource(w)
	}
	return iam.Resource{Type: "Webhook", ID: envelope.UnknownResourceID, TenantID: t.ID}
}

func missing(tfound, wfound bool, tenant, id string) error {
	switch {
	case !tfound:
		return envelope.NotFound("tenant", tenant)
	case !wfound:
		return envelope.NotFound("webhook", id)
	}
	return nil
}

// Create registers an endpoint and returns its secret once.
func (s *Service) Create(ctx context.Context, req *connect.Request[apiv1.CreateWebhookRequest]) (*connect.Response[apiv1.CreateWebhookResponse], error) {
	msg := req.Msg
	var (
		t      tenancy.Tenant
		tfound bool
	)
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.CreateWebhookResponse]{
		Validate: func() error {
			var vs envelope.Violations
			vs.Ref("tenant", msg.GetTenant(), "tnt")
			s.checkURL(ctx, &vs, msg.GetUrl())
			checkTypes(&vs, msg.GetTypes())
			vs.MaxLen("description", msg.GetDescription(), MaxDescriptionLen)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			t, tfound, err = tenancy.LookupTenant(ctx, q, msg.GetTenant())
			return iam.Resource{Type: "Webhook", ID: iam.DraftID, TenantID: t.ID}, err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.CreateWebhookResponse, error) {
			if !tfound {
				return nil, envelope.NotFound("tenant", msg.GetTenant())
			}
			now := tx.Now()
			secret, err := webhook.NewSecret()
			if err != nil {
				return nil, err
			}
			w := Webhook{ID: envelope.NewID(IDPrefix, now), TenantID: t.ID, URL: msg.GetUrl(), Types: msg.GetTypes(),
				Description: msg.GetDescription(), State: StateEnabled, CreatedBy: tx.Caller().Principal.ID, CreateTime: now, UpdateTime: now}
			if w.Secret, err = s.seal(w.ID, secret); err != nil {
				return nil, err
			}
			// New events only: the endpoint starts at the outbox's end.
			if w.Cursor, err = events.LastSeq(ctx, tx); err != nil {
				return nil, err
			}
			if err := WebhookInsert(ctx, tx, &w); err != nil {
				return nil, err
			}
			tx.SetResource(w.ID, "")
			tx.Emit(envelope.Event{Type: "webhook.created", TenantID: w.TenantID, ResourceType: "Webhook", ResourceID: w.ID,
				Data: map[string]any{"url": w.URL}})
			return &apiv1.CreateWebhookResponse{Webhook: Proto(w), Secret: secret}, nil
		},
		Replayable: func(res *apiv1.CreateWebhookResponse) *apiv1.CreateWebhookResponse {
			return &apiv1.CreateWebhookResponse{Webhook: res.GetWebhook()}
		},
	})
}

// Get reads an endpoint.
func (s *Service) Get(ctx context.Context, req *connect.Request[apiv1.GetWebhookRequest]) (*connect.Response[apiv1.GetWebhookResponse], error) {
	w, err := s.read(ctx, req.Msg.GetTenant(), req.Msg.GetWebhook())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&apiv1.GetWebhookResponse{Webhook: Proto(w)}), nil
}

// read validates, resolves and decides a read of one endpoint.
func (s *Service) read(ctx context.Context, tenant, id string) (Webhook, error) {
	var vs envelope.Violations
	vs.Ref("tenant", tenant, "tnt")
	vs.ID("webhook", id, IDPrefix)
	if err := vs.Err(); err != nil {
		return Webhook{}, s.env.Fail(ctx, err)
	}
	var (
		t              tenancy.Tenant
		w              Webhook
		tfound, wfound bool
	)
	if err := s.env.Resolve(ctx, "webhook", func(ctx context.Context, q store.Querier) (err error) {
		t, w, tfound, wfound, err = lookup(ctx, q, tenant, id)
		return err
	}); err != nil {
		return Webhook{}, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, draft(t, w, wfound)); err != nil {
		return Webhook{}, err
	}
	if err := missing(tfound, wfound, tenant, id); err != nil {
		return Webhook{}, s.env.Fail(ctx, err)
	}
	return w, nil
}

// List lists a tenant's endpoints.
func (s *Service) List(ctx context.Context, req *connect.Request[apiv1.ListWebhooksRequest]) (*connect.Response[apiv1.ListWebhooksResponse], error) {
	msg := req.Msg
	// No tenant: the caller's own, as every tenant-scoped listing does.
	tenantRef := msg.GetTenant()
	if tenantRef == "" {
		c, _ := envelope.CallerFrom(ctx)
		tenantRef = c.Principal.TenantID
	}
	var vs envelope.Violations
	if tenantRef == "" {
		vs.Add("tenant", "is required: webhooks belong to a tenant, name one")
	} else {
		vs.Ref("tenant", tenantRef, "tnt")
	}
	vs.PageSize("page_size", msg.GetPageSize())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	after, err := envelope.DecodePageToken("page_token", msg.GetPageToken(), msg.GetTenant())
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var (
		t      tenancy.Tenant
		tfound bool
	)
	if err := s.env.Resolve(ctx, "tenant", func(ctx context.Context, q store.Querier) (err error) {
		t, tfound, err = tenancy.LookupTenant(ctx, q, tenantRef)
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, tenancy.TenantResource(t)); err != nil {
		return nil, err
	}
	if !tfound {
		return nil, s.env.Fail(ctx, envelope.NotFound("tenant", tenantRef))
	}
	limit := envelope.PageSize(msg.GetPageSize())
	var ws []Webhook
	if err := s.env.Resolve(ctx, "webhooks", func(ctx context.Context, q store.Querier) (err error) {
		ws, err = WebhookList(ctx, q, &WebhookListParams{TenantID: t.ID, After: after, Limit: limit + 1})
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.ListWebhooksResponse{}
	if len(ws) > limit {
		out.NextPageToken = envelope.EncodePageToken(ws[limit-1].ID, msg.GetTenant())
		ws = ws[:limit]
	}
	for _, w := range ws {
		out.Webhooks = append(out.Webhooks, Proto(w))
	}
	return connect.NewResponse(out), nil
}

// mutateOne runs a mutation of one existing endpoint: validate the
// reference (and extra fields), decide on the endpoint, re-read it under
// the transaction and apply.
func mutateOne[Req, Res any](ctx context.Context, s *Service, req *connect.Request[Req], tenant, id string,
	validate func(vs *envelope.Violations), apply func(ctx context.Context, tx *envelope.Tx, w *Webhook) (*Res, error)) (*connect.Response[Res], error) {
	var (
		t              tenancy.Tenant
		w              Webhook
		tfound, wfound bool
	)
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[Res]{
		Validate: func() error {
			var vs envelope.Violations
			vs.Ref("tenant", tenant, "tnt")
			vs.ID("webhook", id, IDPrefix)
			if validate != nil {
				validate(&vs)
			}
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			t, w, tfound, wfound, err = lookup(ctx, q, tenant, id)
			return draft(t, w, wfound), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*Res, error) {
			if err := missing(tfound, wfound, tenant, id); err != nil {
				return nil, err
			}
			cur, err := WebhookLock(ctx, tx, w.ID)
			if errors.Is(err, store.ErrNotFound) {
				return nil, envelope.NotFound("webhook", id)
			} else if err != nil {
				return nil, err
			}
			tx.SetResource(cur.ID, "")
			return apply(ctx, tx, &cur)
		},
	})
}

// Update changes an endpoint's settings.
func (s *Service) Update(ctx context.Context, req *connect.Request[apiv1.UpdateWebhookRequest]) (*connect.Response[apiv1.UpdateWebhookResponse], error) {
	msg := req.Msg
	return mutateOne(ctx, s, req, msg.GetTenant(), msg.GetWebhook(), func(vs *envelope.Violations) {
		if msg.Url != nil {
			s.checkURL(ctx, vs, msg.GetUrl())
		}
		if msg.GetUpdateTypes() {
			checkTypes(vs, msg.GetTypes())
		} else if len(msg.GetTypes()) > 0 {
			vs.Add("types", "set update_types to replace the types")
		}
		if msg.Description != nil {
			vs.MaxLen("description", msg.GetDescription(), MaxDescriptionLen)
		}
		if msg.State != nil && msg.GetState() != StateEnabled && msg.GetState() != StateDisabled {
			vs.Add("state", "must be enabled or disabled, got %q", msg.GetState())
		}
	}, func(ctx context.Context, tx *envelope.Tx, w *Webhook) (*apiv1.UpdateWebhookResponse, error) {
		if msg.Url != nil {
			w.URL = msg.GetUrl()
		}
		if msg.GetUpdateTypes() {
			w.Types = msg.GetTypes()
		}
		if msg.Description != nil {
			w.Description = msg.GetDescription()
		}
		if msg.State != nil && msg.GetState() != w.State {
			w.State = msg.GetState()
			w.DisabledReason = ""
			w.FailingSince = nil
			if w.State == StateDisabled {
				w.DisabledReason = "disabled by " + tx.Caller().Principal.ID
			}
		}
		w.UpdateTime = tx.Now()
		if err := WebhookUpdate(ctx, tx, w); err != nil {
			return nil, err
		}
		tx.Emit(envelope.Event{Type: "webhook.updated", TenantID: w.TenantID, ResourceType: "Webhook", ResourceID: w.ID,
			Data: map[string]any{"url": w.URL, "state": w.State}})
		return &apiv1.UpdateWebhookResponse{Webhook: Proto(*w)}, nil
	})
}

// Delete deletes an endpoint and its deliveries.
func (s *Service) Delete(ctx context.Context, req *connect.Request[apiv1.DeleteWebhookRequest]) (*connect.Response[apiv1.DeleteWebhookResponse], error) {
	msg := req.Msg
	return mutateOne(ctx, s, req, msg.GetTenant(), msg.GetWebhook(), nil,
		func(ctx context.Context, tx *envelope.Tx, w *Webhook) (*apiv1.DeleteWebhookResponse, error) {
			if err := WebhookDelete(ctx, tx, w.TenantID, w.ID); err != nil {
				return nil, err
			}
			tx.Emit(envelope.Event{Type: "webhook.deleted", TenantID: w.TenantID, ResourceType: "Webhook", ResourceID: w.ID})
			return &apiv1.DeleteWebhookResponse{}, nil
		})
}

// Test queues a webhook.test event for this endpoint alone.
func (s *Service) Test(ctx context.Context, req *connect.Request[apiv1.TestWebhookRequest]) (*connect.Response[apiv1.TestWebhookResponse], error) {
	msg := req.Msg
	return mutateOne(ctx, s, req, msg.GetTenant(), msg.GetWebhook(), nil,
		func(ctx context.Context, tx *envelope.Tx, w *Webhook) (*apiv1.TestWebhookResponse, error) {
			now := tx.Now()
			id := envelope.NewID(DeliveryIDPrefix, now)
			payload, err := CloudEvent(events.Stored{Event: envelope.Event{Type: "webhook.test", TenantID: w.TenantID,
				ResourceType: "Webhook", ResourceID: w.ID, Time: now, Data: map[string]any{"message": "a test event from Better Compute"}}}, id)
			if err != nil {
				return nil, err
			}
			d := Delivery{ID: id, WebhookID: w.ID, TenantID: w.TenantID, EventID: id, EventType: "webhook.test", Payload: payload,
				State: DeliveryPending, NextAttemptTime: now, CreateTime: now, UpdateTime: now}
			if err := DeliveryInsert(ctx, tx, &d); err != nil {
				return nil, err
			}
			if err := tx.Enqueue(ctx, DeliverArgs{WebhookID: w.ID}, DeliverOpts()); err != nil {
				return nil, err
			}
			return &apiv1.TestWebhookResponse{Delivery: DeliveryProto(d)}, nil
		})
}

// RotateSecret makes a new secret; the old one signs too until the overlap
// ends.
func (s *Service) RotateSecret(ctx context.Context, req *connect.Request[apiv1.RotateWebhookSecretRequest]) (*connect.Response[apiv1.RotateWebhookSecretResponse], error) {
	msg := req.Msg
	overlap := DefaultOverlap
	return mutateOne(ctx, s, req, msg.GetTenant(), msg.GetWebhook(), func(vs *envelope.Violations) {
		// Bounded on the seconds, before they become a Duration: a huge
		// count overflows into a negative one that passes a Duration bound.
		if o := msg.GetOverlapSeconds(); o != 0 {
			if o < 0 || o > int64(MaxOverlap/time.Second) {
				vs.Add("overlap_seconds", "must be between 1 and %d (7 days), got %d", int64(MaxOverlap/time.Second), o)
				return
			}
			overlap = time.Duration(o) * time.Second
		}
	}, func(ctx context.Context, tx *envelope.Tx, w *Webhook) (*apiv1.RotateWebhookSecretResponse, error) {
		now := tx.Now()
		secret, err := webhook.NewSecret()
		if err != nil {
			return nil, err
		}
		sealed, err := s.seal(w.ID, secret)
		if err != nil {
			return nil, err
		}
		exp := now.Add(overlap)
		w.PreviousSecret, w.PreviousExpireTime, w.Secret, w.UpdateTime = w.Secret, &exp, sealed, now
		if err := WebhookUpdate(ctx, tx, w); err != nil {
			return nil, err
		}
		tx.Emit(envelope.Event{Type: "webhook.secret_rotated", TenantID: w.TenantID, ResourceType: "Webhook", ResourceID: w.ID,
			Data: map[string]any{"previous_secret_expire_time": exp.UTC().Format(time.RFC3339)}})
		return &apiv1.RotateWebhookSecretResponse{Webhook: Proto(*w), Secret: secret}, nil
	})
}

// ListDeliveries lists an endpoint's deliveries in queue order.
func (s *Service) ListDeliveries(ctx context.Context, req *connect.Request[apiv1.ListWebhookDeliveriesRequest]) (*connect.Response[apiv1.ListWebhookDeliveriesResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	vs.PageSize("page_size", msg.GetPageSize())
	switch msg.GetState() {
	case "", DeliveryPending, DeliverySucceeded, DeliveryDead:
	default:
		vs.Add("state", "must be pending, succeeded or dead, got %q", msg.GetState())
	}
	filter := msg.GetWebhook() + "/" + msg.GetState()
	tok, terr := envelope.DecodePageToken("page_token", msg.GetPageToken(), filter)
	if terr != nil {
		return nil, s.env.Fail(ctx, terr)
	}
	var after int64
	if tok != "" {
		n, err := strconv.ParseInt(tok, 10, 64)
		if err != nil {
			vs.Add("page_token", "is not a token this listing gave")
		}
		after = n
	}
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	w, err := s.read(ctx, msg.GetTenant(), msg.GetWebhook())
	if err != nil {
		return nil, err
	}
	limit := envelope.PageSize(msg.GetPageSize())
	var ds []Delivery
	if err := s.env.Resolve(ctx, "deliveries", func(ctx context.Context, q store.Querier) (err error) {
		ds, err = DeliveryList(ctx, q, &DeliveryListParams{WebhookID: w.ID, State: msg.GetState(), After: after, Limit: limit + 1})
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.ListWebhookDeliveriesResponse{}
	if len(ds) > limit {
		out.NextPageToken = envelope.EncodePageToken(strconv.FormatInt(ds[limit-1].Seq, 10), filter)
		ds = ds[:limit]
	}
	for _, d := range ds {
		out.Deliveries = append(out.Deliveries, DeliveryProto(d))
	}
	return connect.NewResponse(out), nil
}

// Redeliver sends a dead or delivered delivery again. It keeps its place
// in the event order, so it goes before the endpoint's newer pending ones.
func (s *Service) Redeliver(ctx context.Context, req *connect.Request[apiv1.RedeliverWebhookRequest]) (*connect.Response[apiv1.RedeliverWebhookResponse], error) {
	msg := req.Msg
	return mutateOne(ctx, s, req, msg.GetTenant(), msg.GetWebhook(), func(vs *envelope.Violations) {
		vs.ID("delivery", msg.GetDelivery(), DeliveryIDPrefix)
	}, func(ctx context.Context, tx *envelope.Tx, w *Webhook) (*apiv1.RedeliverWebhookResponse, error) {
		d, err := DeliveryGet(ctx, tx, w.ID, msg.GetDelivery())
		if errors.Is(err, store.ErrNotFound) {
			return nil, envelope.NotFound("delivery", msg.GetDelivery())
		} else if err != nil {
			return nil, err
		}
		if d.State == DeliveryPending {
			return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "delivery %s is still pending: it is sent without a redelivery", d.ID)
		}
		now := tx.Now()
		d.State, d.Attempts, d.FirstAttemptTime, d.NextAttemptTime, d.UpdateTime = DeliveryPending, 0, nil, now, now
		if err := DeliveryUpdate(ctx, tx, &d); err != nil {
			return nil, err
		}
		if err := tx.Enqueue(ctx, DeliverArgs{WebhookID: w.ID}, DeliverOpts()); err != nil {
			return nil, err
		}
		tx.Emit(envelope.Event{Type: "webhook.redelivered", TenantID: w.TenantID, ResourceType: "Webhook", ResourceID: w.ID,
			Data: map[string]any{"delivery": d.ID, "event_id": d.EventID}})
		return &apiv1.RedeliverWebhookResponse{Delivery: DeliveryProto(d)}, nil
	})
}
