package fleet

import (
	"context"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/attestor"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// TrustAnchorService serves the TrustAnchorService API.
type TrustAnchorService struct {
	env *envelope.Envelope
}

// NewTrustAnchorService returns the trust anchor handlers.
func NewTrustAnchorService(env *envelope.Envelope) *TrustAnchorService {
	return &TrustAnchorService{env: env}
}

var _ apiv1connect.TrustAnchorServiceHandler = (*TrustAnchorService)(nil)

// Trust anchor limits.
const (
	maxAnchorPEM   = 64 << 10
	maxAnchorCerts = 16
)

// TrustAnchorResource projects a trust anchor into the authorization model.
func TrustAnchorResource(a TrustAnchor) iam.Resource {
	return iam.Resource{Type: "TrustAnchor", ID: a.ID, TenantID: a.TenantID, Attrs: map[string]any{"attestor": a.Attestor}}
}

// TrustAnchorProto converts a trust anchor for the API.
func TrustAnchorProto(a TrustAnchor) *apiv1.TrustAnchor {
	return &apiv1.TrustAnchor{
		Id: a.ID, TenantId: a.TenantID, Name: a.Name, Attestor: a.Attestor, CertificatesPem: a.CertificatesPEM,
		EkPublicSha256: a.EKPublicSHA256, CloudAccount: a.CloudAccount, CloudRegion: a.CloudRegion,
		CreatedBy: a.CreatedBy, CreateTime: timestamppb.New(a.CreateTime),
	}
}

// ParseCertificatesPEM parses a PEM bundle of certificates, refusing
// anything else in it.
func ParseCertificatesPEM(b string) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	rest := []byte(b)
	for {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("a %q PEM block is not a certificate", blk.Type)
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", len(out)+1, err)
		}
		out = append(out, c)
	}
	if strings.TrimSpace(string(rest)) != "" {
		return nil, errors.New("text after the last PEM block")
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	if len(out) > maxAnchorCerts {
		return nil, fmt.Errorf("more than %d certificates", maxAnchorCerts)
	}
	return out, nil
}

// issuedBy names what an anchor's CA certificates issue, for refusals.
var issuedBy = map[string]string{
	attestor.X509:    "machine certificates",
	attestor.Kubelet: "kubelets' client certificates (the cluster CA, /etc/kubernetes/pki/ca.crt on kubeadm)",
}

func validateTrustAnchor(msg *apiv1.CreateTrustAnchorRequest) error {
	var vs envelope.Violations
	vs.Ref("tenant", msg.GetTenant(), "tnt")
	vs.Name("name", msg.GetName())
	if !attestor.Valid(msg.GetAttestor()) {
		vs.Add("attestor", "must be one of %s, got %q", strings.Join(attestor.Kinds, ", "), truncate(msg.GetAttestor()))
	}
	pemText, pin := msg.GetCertificatesPem(), msg.GetEkPublicSha256()
	if len(pemText) > maxAnchorPEM {
		vs.Add("certificates_pem", "longer than %d bytes", maxAnchorPEM)
	} else if pemText != "" {
		certs, err := ParseCertificatesPEM(pemText)
		if err != nil {
			vs.Add("certificates_pem", "%v", err)
		}
		if msg.GetAttestor() == attestor.X509 || msg.GetAttestor() == attestor.Kubelet {
			for _, c := range certs {
				if !c.IsCA {
					vs.Add("certificates_pem", "%q is not a CA certificate: register the CA that issues the %s", truncate(c.Subject.String()), issuedBy[msg.GetAttestor()])
					break
				}
			}
		}
	}
	switch msg.GetAttestor() {
	case attestor.TPM:
		switch {
		case pin != "" && pemText != "":
			vs.Add("ek_public_sha256", "give EK CA certificates or one pinned EK, not both")
		case pin == "" && pemText == "":
			vs.Add("certificates_pem", "required: the TPM EK CA certificates (or ek_public_sha256 for a TPM without an EK certificate)")
		case pin != "":
			if b, err := hex.DecodeString(pin); err != nil || len(b) != 32 || strings.ToLower(pin) != pin {
				vs.Add("ek_public_sha256", "must be 64 lowercase hex digits (SHA-256 of the EK public key, PKIX DER)")
			}
		}
	case attestor.X509, attestor.Cloud, attestor.Kubelet:
		if pemText == "" {
			vs.Add("certificates_pem", "required for a %s trust anchor", msg.GetAttestor())
		}
		if pin != "" {
			vs.Add("ek_public_sha256", "only a tpm trust anchor pins an EK")
		}
	}
	if msg.GetAttestor() == attestor.Cloud {
		if msg.GetCloudAccount() == "" {
			vs.Add("cloud_account", "required: the account id the instance documents must name")
		}
		vs.MaxLen("cloud_account", msg.GetCloudAccount(), 128)
		vs.MaxLen("cloud_region", msg.GetCloudRegion(), 64)
	} else if msg.GetCloudAccount() != "" || msg.GetCloudRegion() != "" {
		vs.Add("cloud_account", "only a cloud trust anchor names an account or region")
	}
	return vs.Err()
}

// Create registers a trust anchor.
func (s *TrustAnchorService) Create(ctx context.Context, req *connect.Request[apiv1.CreateTrustAnchorRequest]) (*connect.Response[apiv1.CreateTrustAnchorResponse], error) {
	msg := req.Msg
	var tenant tenancy.Tenant
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.CreateTrustAnchorResponse]{
		Validate: func() error { return validateTrustAnchor(msg) },
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			t, found, err := tenancy.LookupTenant(ctx, q, msg.GetTenant())
			if err != nil || !found {
				return iam.Resource{Type: "TrustAnchor", ID: iam.DraftID}, err
			}
			tenant = t
			return iam.Resource{Type: "TrustAnchor", ID: iam.DraftID, TenantID: t.ID, Attrs: map[string]any{"attestor": msg.GetAttestor()}}, nil
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.CreateTrustAnchorResponse, error) {
			if tenant.ID == "" {
				return nil, envelope.NotFound("tenant", msg.GetTenant())
			}
			now := tx.Now()
			a := TrustAnchor{
				ID: envelope.NewID(TrustAnchorIDPrefix, now), TenantID: tenant.ID, Name: msg.GetName(), Attestor: msg.GetAttestor(),
				CertificatesPEM: msg.GetCertificatesPem(), EKPublicSHA256: msg.GetEkPublicSha256(),
				CloudAccount: msg.GetCloudAccount(), CloudRegion: msg.GetCloudRegion(),
				CreatedBy: tx.Caller().Principal.ID, CreateTime: now,
			}
			if err := TrustAnchorInsert(ctx, tx, &a); err != nil {
				if errors.Is(err, store.ErrUnique) {
					return nil, envelope.Errorf(envelope.CodeAlreadyExists, "trust anchor %q already exists in tenant %s", a.Name, tenant.Name)
				}
				return nil, err
			}
			tx.SetResource(a.ID, "")
			tx.Emit(envelope.Event{Type: "trust_anchor.created", TenantID: a.TenantID, ResourceType: "TrustAnchor", ResourceID: a.ID,
				Data: map[string]any{"name": a.Name, "attestor": a.Attestor}})
			return &apiv1.CreateTrustAnchorResponse{TrustAnchor: TrustAnchorProto(a)}, nil
		},
	})
}

// List lists a tenant's trust anchors.
func (s *TrustAnchorService) List(ctx context.Context, req *connect.Request[apiv1.ListTrustAnchorsRequest]) (*connect.Response[apiv1.ListTrustAnchorsResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	vs.Ref("tenant", msg.GetTenant(), "tnt")
	vs.PageSize("page_size", msg.GetPageSize())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	after, err := envelope.DecodePageToken("page_token", msg.GetPageToken(), msg.GetTenant())
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	t, found, res, err := container(ctx, s.env, msg.GetTenant())
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if err := s.env.AuthorizeRead(ctx, res); err != nil {
		return nil, err
	}
	if !found {
		return nil, s.env.Fail(ctx, envelope.NotFound("tenant", msg.GetTenant()))
	}
	limit := envelope.PageSize(msg.GetPageSize())
	var anchors []TrustAnchor
	if err := s.env.Resolve(ctx, "trust anchors", func(ctx context.Context, q store.Querier) (err error) {
		anchors, err = TrustAnchorList(ctx, q, &TrustAnchorListParams{TenantID: t.ID, After: after, Limit: limit + 1})
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.ListTrustAnchorsResponse{}
	if len(anchors) > limit {
		out.NextPageToken = envelope.EncodePageToken(anchors[limit-1].ID, msg.GetTenant())
		anchors = anchors[:limit]
	}
	for _, a := range anchors {
		out.TrustAnchors = append(out.TrustAnchors, TrustAnchorProto(a))
	}
	return connect.NewResponse(out), nil
}

// Delete removes a trust anchor: joins it would have vouched for are
// refused from then on; nodes it admitted stay.
func (s *TrustAnchorService) Delete(ctx context.Context, req *connect.Request[apiv1.DeleteTrustAnchorRequest]) (*connect.Response[apiv1.DeleteTrustAnchorResponse], error) {
	msg := req.Msg
	var (
		a     TrustAnchor
		found bool
		t     tenancy.Tenant
	)
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.DeleteTrustAnchorResponse]{
		Validate: func() error {
			var vs envelope.Violations
			vs.Ref("tenant", msg.GetTenant(), "tnt")
			vs.Ref("trust_anchor", msg.GetTrustAnchor(), TrustAnchorIDPrefix)
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var tfound bool
			var err error
			t, tfound, err = tenancy.LookupTenant(ctx, q, msg.GetTenant())
			if err != nil || !tfound {
				return iam.Resource{Type: "TrustAnchor", ID: "unknown"}, err
			}
			a, err = TrustAnchorGet(ctx, q, t.ID, msg.GetTrustAnchor())
			if errors.Is(err, store.ErrNotFound) {
				return iam.Resource{Type: "TrustAnchor", ID: "unknown", TenantID: t.ID}, nil
			}
			found = err == nil
			return TrustAnchorResource(a), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.DeleteTrustAnchorResponse, error) {
			switch {
			case t.ID == "":
				return nil, envelope.NotFound("tenant", msg.GetTenant())
			case !found:
				return nil, envelope.NotFound("trust anchor", msg.GetTrustAnchor())
			}
			ok, err := TrustAnchorDelete(ctx, tx, a.TenantID, a.ID)
			if err != nil {
				return nil, err
			}
			if !ok {
				return nil, envelope.NotFound("trust anchor", msg.GetTrustAnchor())
			}
			tx.Emit(envelope.Event{Type: "trust_anchor.deleted", TenantID: a.TenantID, ResourceType: "TrustAnchor", ResourceID: a.ID,
				Data: map[string]any{"name": a.Name, "attestor": a.Attestor}})
			return &apiv1.DeleteTrustAnchorResponse{TrustAnchor: TrustAnchorProto(a)}, nil
		},
	})
}
