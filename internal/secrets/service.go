package secrets

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// Limits.
const (
	MaxValueBytes     = 64 << 10
	maxDescriptionLen = 1024
)

// RefScheme is how templates and user data name a secret: secret://<name>.
const RefScheme = "secret://"

// Sealer seals values at rest (the PKI's sealer).
type Sealer interface {
	Seal(ref string, plaintext []byte) ([]byte, error)
	Open(ref string, sealed []byte) ([]byte, error)
}

// sealRef is the associated data a value is sealed under: a value moved to
// another row (another tenant's) does not open.
func sealRef(id string) string { return "secret/" + id }

// Service serves SecretService.
type Service struct {
	env    *envelope.Envelope
	sealer Sealer
}

// NewService returns the handlers; without a sealer (no deployment secret)
// Put answers FAILED_PRECONDITION.
func NewService(env *envelope.Envelope, sealer Sealer) *Service {
	return &Service{env: env, sealer: sealer}
}

var _ apiv1connect.SecretServiceHandler = (*Service)(nil)

// Resource projects a secret into the authorization model.
func Resource(s Secret) iam.Resource {
	return iam.Resource{Type: "Secret", ID: s.ID, TenantID: s.TenantID, Attrs: map[string]any{"name": s.Name}}
}

// target is a secret a request names, resolved in its scope.
type target struct {
	sc    tenancy.Scope
	s     Secret
	found bool
}

func (t target) resource() iam.Resource {
	if t.found {
		return Resource(t.s)
	}
	return t.sc.Missing("Secret")
}

func lookup(ctx context.Context, q store.Querier, tenantRef, ref, lock string) (target, error) {
	var t target
	var err error
	if t.sc, err = tenancy.LookupScope(ctx, q, tenantRef); err != nil || !t.sc.Found {
		return t, err
	}
	t.s, err = Get(ctx, q, t.sc.ID(), ref, lock)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return t, nil
	case err != nil:
		return t, err
	}
	t.found = true
	return t, nil
}

// Put creates a secret or replaces its value under the next version.
func (s *Service) Put(ctx context.Context, req *connect.Request[apiv1.PutSecretRequest]) (*connect.Response[apiv1.PutSecretResponse], error) {
	msg := req.Msg
	var t target
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.PutSecretResponse]{
		Validate: func() error {
			var vs envelope.Violations
			tenancy.ValidateScope(&vs, msg.GetTenant())
			vs.Name("name", msg.GetName())
			switch n := len(msg.GetValue()); {
			case n == 0:
				vs.Add("value", "is required")
			case n > MaxValueBytes:
				vs.Add("value", "at most %d bytes, got %d", MaxValueBytes, n)
			}
			vs.MaxLen("description", msg.GetDescription(), maxDescriptionLen)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			if t, err = lookup(ctx, q, msg.GetTenant(), msg.GetName(), ""); err != nil || !t.sc.Found {
				return iam.Resource{Type: "Secret", ID: iam.DraftID}, err
			}
			if t.found {
				return t.resource(), nil
			}
			return iam.Resource{Type: "Secret", ID: iam.DraftID, TenantID: t.sc.ID(), Attrs: map[string]any{"name": msg.GetName()}}, nil
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.PutSecretResponse, error) {
			if err := t.sc.NotFound(); err != nil {
				return nil, err
			}
			if msg.GetNodeReadable() && t.sc.Platform {
				// Nodes belong to tenants: a platform secret has no node to go to.
				var vs envelope.Violations
				vs.Add("node_readable", "a platform secret is never delivered to nodes")
				return nil, vs.Err()
			}
			if s.sealer == nil {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "secrets need the deployment secret (BC_SECRET) to seal values")
			}
			now := tx.Now()
			cur, err := Get(ctx, tx, t.sc.ID(), msg.GetName(), store.ForUpdate(tx))
			found := err == nil
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return nil, err
			}
			row := cur
			if !found {
				row = Secret{ID: envelope.NewID(IDPrefix, now), TenantID: t.sc.ID(), Name: msg.GetName(), CreateTime: now}
			}
			row.Version++
			row.SizeBytes = int64(len(msg.GetValue()))
			row.Description = msg.GetDescription()
			row.UpdateTime = now
			if msg.NodeReadable != nil {
				row.NodeReadable = msg.GetNodeReadable()
			}
			if row.Value, err = s.sealer.Seal(sealRef(row.ID), msg.GetValue()); err != nil {
				return nil, fmt.Errorf("seal secret: %w", err)
			}
			if found {
				err = Update(ctx, tx, &row)
			} else {
				err = Insert(ctx, tx, &row)
			}
			if errors.Is(err, store.ErrUnique) {
				// Two first puts of one name raced; the loser retries as an update.
				return nil, envelope.Errorf(envelope.CodeConflict, "secret %q was created concurrently: retry", row.Name)
			}
			if err != nil {
				return nil, err
			}
			tx.SetResource(row.ID, "")
			// Events and audit rows carry the name and version, never the value.
			tx.Emit(envelope.Event{Type: "secret.put", TenantID: row.TenantID, ResourceType: "Secret", ResourceID: row.ID,
				Data: map[string]any{"name": row.Name, "version": row.Version, "ref": RefScheme + row.Name, "node_readable": row.NodeReadable}})
			return &apiv1.PutSecretResponse{Secret: Proto(row)}, nil
		},
	})
}

// Get reads a secret's metadata.
func (s *Service) Get(ctx context.Context, req *connect.Request[apiv1.GetSecretRequest]) (*connect.Response[apiv1.GetSecretResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	tenancy.ValidateScope(&vs, msg.GetTenant())
	vs.Ref("secret", msg.GetSecret(), IDPrefix)
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var t target
	if err := s.env.Resolve(ctx, "secret", func(ctx context.Context, q store.Querier) (err error) {
		t, err = lookup(ctx, q, msg.GetTenant(), msg.GetSecret(), "")
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, t.resource()); err != nil {
		return nil, err
	}
	if err := t.sc.NotFound(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if !t.found {
		return nil, s.env.Fail(ctx, envelope.NotFound("secret", msg.GetSecret()))
	}
	return connect.NewResponse(&apiv1.GetSecretResponse{Secret: Proto(t.s)}), nil
}

// List lists the scope's secrets.
func (s *Service) List(ctx context.Context, req *connect.Request[apiv1.ListSecretsRequest]) (*connect.Response[apiv1.ListSecretsResponse], error) {
	rows, next, err := tenancy.ListPage(ctx, s.env, req.Msg, "secrets",
		func(ctx context.Context, q store.Querier, sc tenancy.Scope, after string, limit int) ([]Secret, error) {
			return List(ctx, q, sc.ID(), after, limit)
		}, func(s Secret) string { return s.ID })
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListSecretsResponse{NextPageToken: next}
	for _, r := range rows {
		out.Secrets = append(out.Secrets, Proto(r))
	}
	return connect.NewResponse(out), nil
}

// Delete removes a secret; workloads built from it keep what they were
// given.
func (s *Service) Delete(ctx context.Context, req *connect.Request[apiv1.DeleteSecretRequest]) (*connect.Response[apiv1.DeleteSecretResponse], error) {
	msg := req.Msg
	var t target
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.DeleteSecretResponse]{
		Validate: func() error {
			var vs envelope.Violations
			tenancy.ValidateScope(&vs, msg.GetTenant())
			vs.Ref("secret", msg.GetSecret(), IDPrefix)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			t, err = lookup(ctx, q, msg.GetTenant(), msg.GetSecret(), "")
			return t.resource(), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.DeleteSecretResponse, error) {
			if err := t.sc.NotFound(); err != nil {
				return nil, err
			}
			if !t.found {
				return nil, envelope.NotFound("secret", msg.GetSecret())
			}
			row, err := Get(ctx, tx, t.s.TenantID, t.s.ID, store.ForUpdate(tx))
			if errors.Is(err, store.ErrNotFound) {
				return nil, envelope.NotFound("secret", msg.GetSecret())
			}
			if err != nil {
				return nil, err
			}
			if err := Delete(ctx, tx, row.ID); err != nil {
				return nil, err
			}
			tx.Emit(envelope.Event{Type: "secret.deleted", TenantID: row.TenantID, ResourceType: "Secret", ResourceID: row.ID,
				Data: map[string]any{"name": row.Name, "version": row.Version}})
			return &apiv1.DeleteSecretResponse{}, nil
		},
	})
}

// Proto converts a secret's metadata for the API; the value never leaves.
func Proto(s Secret) *apiv1.Secret {
	return &apiv1.Secret{Id: s.ID, TenantId: s.TenantID, Name: s.Name, Version: s.Version, SizeBytes: s.SizeBytes,
		Ref: RefScheme + s.Name, Description: s.Description, CreateTime: timestamppb.New(s.CreateTime),
		UpdateTime: timestamppb.New(s.UpdateTime), NodeReadable: s.NodeReadable}
}

// Errors of Open and OpenForNode.
var (
	// ErrNotFound: no secret of that tenant (that it may read) under the ref.
	ErrNotFound = errors.New("secrets: not found")
	// ErrBadRef: the ref is not secret://<name> with a valid name.
	ErrBadRef = errors.New("secrets: not a secret://<name> reference")
)

// ParseRef reads secret://<name>; ok is false for anything else.
func ParseRef(ref string) (name string, ok bool) {
	name, ok = strings.CutPrefix(ref, RefScheme)
	return name, ok && nameOK(name)
}

func nameOK(name string) bool {
	var vs envelope.Violations
	vs.Name("name", name)
	return len(vs) == 0
}

// Value is an opened secret.
type Value struct {
	ID      string
	Name    string
	Version int64
	Bytes   []byte
}

// Open opens a tenant's secret named by ref (secret://<name>) for a
// workload the caller has already authorized for that tenant. Only the
// tenant's own secrets open: a platform one, or another tenant's, is
// ErrNotFound to a tenant (tenantID "" is never looked up).
func Open(ctx context.Context, q store.Querier, sealer Sealer, tenantID, ref string) (Value, error) {
	name, ok := ParseRef(ref)
	if !ok {
		return Value{}, fmt.Errorf("%w: %q", ErrBadRef, ref)
	}
	if tenantID == "" {
		return Value{}, fmt.Errorf("secrets: %w: %s (only a tenant's own secrets are opened for workloads)", ErrNotFound, ref)
	}
	row, err := Get(ctx, q, tenantID, name, "")
	if errors.Is(err, store.ErrNotFound) {
		return Value{}, fmt.Errorf("%w: %s", ErrNotFound, ref)
	}
	if err != nil {
		return Value{}, err
	}
	if sealer == nil {
		return Value{}, errors.New("secrets: no sealer to open values with")
	}
	b, err := sealer.Open(sealRef(row.ID), row.Value)
	if err != nil {
		return Value{}, fmt.Errorf("secrets: open %s: %w", ref, err)
	}
	return Value{ID: row.ID, Name: row.Name, Version: row.Version, Bytes: b}, nil
}

// OpenForNode opens a secret for a node of tenantID that asked for it by
// ref (AgentService.FetchSecret): only the tenant's own secret, and only
// one the tenant marked node-readable. No such name, a secret not marked,
// and a platform node's ask are all ErrNotFound, so a node cannot tell
// what exists that it may not read. The gateway has already checked that
// the node is the one asking.
func OpenForNode(ctx context.Context, q store.Querier, sealer Sealer, tenantID, ref string) (Value, error) {
	name, ok := ParseRef(ref)
	if !ok {
		return Value{}, fmt.Errorf("%w: %q", ErrBadRef, ref)
	}
	if tenantID == "" {
		return Value{}, fmt.Errorf("%w: %s", ErrNotFound, ref)
	}
	row, err := Get(ctx, q, tenantID, name, "")
	if errors.Is(err, store.ErrNotFound) || (err == nil && !row.NodeReadable) {
		return Value{}, fmt.Errorf("%w: %s", ErrNotFound, ref)
	}
	if err != nil {
		return Value{}, err
	}
	if sealer == nil {
		return Value{}, errors.New("secrets: no sealer to open values with")
	}
	b, err := sealer.Open(sealRef(row.ID), row.Value)
	if err != nil {
		return Value{}, fmt.Errorf("secrets: open %s: %w", ref, err)
	}
	return Value{ID: row.ID, Name: row.Name, Version: row.Version, Bytes: b}, nil
}
