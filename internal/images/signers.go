package images

import (
	"context"
	"errors"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/imagesig"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// SignerService serves the SignerKeyService API.
type SignerService struct {
	env *envelope.Envelope
}

// NewSignerService returns the signer allowlist handlers.
func NewSignerService(env *envelope.Envelope) *SignerService { return &SignerService{env: env} }

var _ apiv1connect.SignerKeyServiceHandler = (*SignerService)(nil)

// SignerResource projects a signer key into the authorization model.
func SignerResource(k SignerKey) iam.Resource {
	return iam.Resource{Type: "SignerKey", ID: k.ID, TenantID: k.TenantID, Attrs: map[string]any{"name": k.Name}}
}

// maxPublicKeyPEM bounds a PEM public key: an ECDSA P-256 one is ~180 bytes.
const maxPublicKeyPEM = 4096

// Add puts a public key on an allowlist.
func (s *SignerService) Add(ctx context.Context, req *connect.Request[apiv1.AddSignerKeyRequest]) (*connect.Response[apiv1.AddSignerKeyResponse], error) {
	msg := req.Msg
	var (
		sc  scope
		pub imagesig.PublicKey
	)
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.AddSignerKeyResponse]{
		Validate: func() error {
			var vs envelope.Violations
			tenancy.ValidateScope(&vs, msg.GetTenant())
			vs.Name("name", msg.GetName())
			switch {
			case msg.GetPublicKey() == "":
				vs.Add("public_key", "is required: a PEM \"PUBLIC KEY\" block (Ed25519 or ECDSA P-256)")
			case len(msg.GetPublicKey()) > maxPublicKeyPEM:
				vs.Add("public_key", "must be at most %d bytes", maxPublicKeyPEM)
			default:
				var err error
				if pub, err = imagesig.ParsePublicKeyPEM([]byte(msg.GetPublicKey())); err != nil {
					vs.Add("public_key", "%s", err.Error())
				}
			}
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			if sc, err = tenancy.LookupScope(ctx, q, msg.GetTenant()); err != nil || !sc.Found {
				return iam.Resource{Type: "SignerKey", ID: iam.DraftID}, err
			}
			return iam.Resource{Type: "SignerKey", ID: iam.DraftID, TenantID: sc.ID(), Attrs: map[string]any{"name": msg.GetName()}}, nil
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.AddSignerKeyResponse, error) {
			if err := sc.NotFound(); err != nil {
				return nil, err
			}
			now := tx.Now()
			k := SignerKey{ID: envelope.NewID(SignerIDPrefix, now), TenantID: sc.ID(), Name: msg.GetName(), Algorithm: pub.Algorithm,
				Fingerprint: pub.Fingerprint, PublicKey: pub.DER, CreatedBy: tx.Caller().Principal.ID, CreateTime: now}
			if err := SignerKeyInsert(ctx, tx, &k); err != nil {
				if errors.Is(err, store.ErrUnique) {
					return nil, envelope.Errorf(envelope.CodeAlreadyExists, "signer key %q or one with fingerprint %s is already on %s's allowlist",
						k.Name, k.Fingerprint, sc.Name())
				}
				return nil, err
			}
			tx.SetResource(k.ID, "")
			tx.Emit(envelope.Event{Type: "signerkey.added", TenantID: k.TenantID, ResourceType: "SignerKey", ResourceID: k.ID,
				Data: map[string]any{"name": k.Name, "fingerprint": k.Fingerprint, "algorithm": k.Algorithm}})
			return &apiv1.AddSignerKeyResponse{SignerKey: SignerProto(k)}, nil
		},
	})
}

// List lists an allowlist.
func (s *SignerService) List(ctx context.Context, req *connect.Request[apiv1.ListSignerKeysRequest]) (*connect.Response[apiv1.ListSignerKeysResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	tenancy.ValidateScope(&vs, msg.GetTenant())
	vs.PageSize("page_size", msg.GetPageSize())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	after, err := envelope.DecodePageToken("page_token", msg.GetPageToken(), msg.GetTenant())
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var sc scope
	if err := s.env.Resolve(ctx, "tenant", func(ctx context.Context, q store.Querier) (err error) {
		sc, err = tenancy.LookupScope(ctx, q, msg.GetTenant())
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, sc.Resource()); err != nil {
		return nil, err
	}
	if err := sc.NotFound(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	limit := envelope.PageSize(msg.GetPageSize())
	var keys []SignerKey
	if err := s.env.Resolve(ctx, "signer keys", func(ctx context.Context, q store.Querier) (err error) {
		keys, err = SignerKeyList(ctx, q, sc.ID(), after, limit+1)
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.ListSignerKeysResponse{}
	for n, k := range keys {
		if n == limit {
			out.NextPageToken = envelope.EncodePageToken(keys[n-1].ID, msg.GetTenant())
			break
		}
		out.SignerKeys = append(out.SignerKeys, SignerProto(k))
	}
	return connect.NewResponse(out), nil
}

// Remove takes a key off its allowlist; its signatures stop counting.
func (s *SignerService) Remove(ctx context.Context, req *connect.Request[apiv1.RemoveSignerKeyRequest]) (*connect.Response[apiv1.RemoveSignerKeyResponse], error) {
	msg := req.Msg
	var (
		sc    scope
		k     SignerKey
		found bool
	)
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.RemoveSignerKeyResponse]{
		Validate: func() error {
			var vs envelope.Violations
			tenancy.ValidateScope(&vs, msg.GetTenant())
			if key := msg.GetKey(); !imagesig.ValidDigest(key) {
				vs.Ref("key", key, SignerIDPrefix)
			}
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			if sc, err = tenancy.LookupScope(ctx, q, msg.GetTenant()); err != nil || !sc.Found {
				return iam.Resource{Type: "SignerKey", ID: envelope.UnknownResourceID}, err
			}
			k, err = SignerKeyGet(ctx, q, sc.ID(), msg.GetKey())
			if errors.Is(err, store.ErrNotFound) {
				return iam.Resource{Type: "SignerKey", ID: envelope.UnknownResourceID, TenantID: sc.ID()}, nil
			}
			found = err == nil
			return SignerResource(k), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.RemoveSignerKeyResponse, error) {
			if err := sc.NotFound(); err != nil {
				return nil, err
			}
			if !found {
				return nil, envelope.NotFound("signer key", msg.GetKey())
			}
			ok, err := SignerKeyDelete(ctx, tx, k.TenantID, k.ID)
			if err != nil {
				return nil, err
			}
			if !ok {
				return nil, envelope.NotFound("signer key", msg.GetKey())
			}
			tx.Emit(envelope.Event{Type: "signerkey.removed", TenantID: k.TenantID, ResourceType: "SignerKey", ResourceID: k.ID,
				Data: map[string]any{"name": k.Name, "fingerprint": k.Fingerprint}})
			return &apiv1.RemoveSignerKeyResponse{}, nil
		},
	})
}

// SignerProto converts a signer key for the API.
func SignerProto(k SignerKey) *apiv1.SignerKey {
	pub, err := imagesig.ParsePublicKeyDER(k.PublicKey)
	pemText := ""
	if err == nil {
		pemText = pub.PEM()
	}
	return &apiv1.SignerKey{Id: k.ID, TenantId: k.TenantID, Name: k.Name, Algorithm: k.Algorithm, Fingerprint: k.Fingerprint,
		PublicKey: pemText, CreatedBy: k.CreatedBy, CreateTime: timestamppb.New(k.CreateTime)}
}
