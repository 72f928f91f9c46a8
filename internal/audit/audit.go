// Package audit keeps the audit log: one row per mutation attempt (who,
// what, which resource, the decision, request and trace ids), written in the
// mutation's own transaction, and the AuditService that reads it.
//
// The log is also an RFC 6962 Merkle tree (log.go): a sequencer gives each
// committed row its leaf index, checkpoints are signed notes, and proofs of
// inclusion and consistency verify offline with the log's public key
// (verify.go, which needs nothing but the bytes and the key). docs/audit.md
// specifies the leaf encoding for third parties.
//
// It must never update or delete an audit row, a leaf, a node or a
// checkpoint (the database refuses it too), and never give a row a second
// leaf index.
package audit

import (
	"context"
	"embed"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

//go:embed migrations
var migrationsFS embed.FS

// Migrations returns the module's tables.
func Migrations() store.Migrations {
	return store.Embedded("audit", migrationsFS)
}

// ListParams filters List. AllTenants lists the platform-wide log.
type ListParams struct {
	TenantID   string
	AllTenants bool
	Action     string
	Before     string
	Limit      int
}

// Service serves the AuditService API.
type Service struct {
	env *envelope.Envelope
	log *Log
}

var _ apiv1connect.AuditServiceHandler = (*Service)(nil)

// NewService returns the audit handlers; log serves checkpoints and proofs.
func NewService(env *envelope.Envelope, log *Log) *Service { return &Service{env: env, log: log} }

// List lists a tenant's audit log, or the whole log for platform principals
// when no tenant is named.
func (s *Service) List(ctx context.Context, req *connect.Request[apiv1.ListAuditRequest]) (*connect.Response[apiv1.ListAuditResponse], error) {
	var vs envelope.Violations
	if req.Msg.GetTenant() != "" {
		vs.Ref("tenant", req.Msg.GetTenant(), "tnt")
	}
	vs.PageSize("page_size", req.Msg.GetPageSize())
	vs.MaxLen("action", req.Msg.GetAction(), 100)
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	filter := req.Msg.GetTenant() + "/" + req.Msg.GetAction()
	before, err := envelope.DecodePageToken("page_token", req.Msg.GetPageToken(), filter)
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	p := ListParams{Action: req.Msg.GetAction(), Before: before, Limit: envelope.PageSize(req.Msg.GetPageSize()) + 1}
	res := tenancy.PlatformResource()
	if req.Msg.GetTenant() == "" {
		p.AllTenants = true
	} else {
		var (
			t      tenancy.Tenant
			tfound bool
		)
		if err := s.env.Resolve(ctx, "tenant", func(ctx context.Context, q store.Querier) (err error) {
			t, tfound, err = tenancy.LookupTenant(ctx, q, req.Msg.GetTenant())
			return err
		}); err != nil {
			return nil, s.env.Fail(ctx, err)
		}
		res = iam.Resource{Type: "AuditLog", ID: t.ID, TenantID: t.ID}
		// A deleted tenant keeps its audit log: asked for by id, the log
		// is read as the tenant's (only a platform principal can: the
		// tenant's own keys went with it).
		deleted := !tfound && envelope.IsID(req.Msg.GetTenant(), "tnt")
		switch {
		case deleted:
			t.ID = req.Msg.GetTenant()
			res = iam.Resource{Type: "AuditLog", ID: t.ID, TenantID: t.ID}
		case !tfound:
			res = iam.Resource{Type: "AuditLog", ID: "unknown"}
		}
		if err := s.env.AuthorizeRead(ctx, res); err != nil {
			return nil, err
		}
		if !tfound && !deleted {
			return nil, s.env.Fail(ctx, envelope.NotFound("tenant", req.Msg.GetTenant()))
		}
		p.TenantID = t.ID
	}
	if p.AllTenants {
		if err := s.env.AuthorizeRead(ctx, res); err != nil {
			return nil, err
		}
	}
	var es []envelope.AuditEntry
	if err := s.env.Resolve(ctx, "audit log", func(ctx context.Context, q store.Querier) (err error) {
		es, err = List(ctx, q, p)
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.ListAuditResponse{}
	for i, e := range es {
		if i == p.Limit-1 {
			out.NextPageToken = envelope.EncodePageToken(es[i-1].ID, filter)
			break
		}
		out.Entries = append(out.Entries, EntryProto(e))
	}
	return connect.NewResponse(out), nil
}

// EntryProto is an audit row as the API shows it.
func EntryProto(e envelope.AuditEntry) *apiv1.AuditEntry {
	return &apiv1.AuditEntry{
		Id: e.ID, Time: timestamppb.New(e.Time), TenantId: e.TenantID, PrincipalId: e.PrincipalID, PrincipalKind: e.PrincipalKind,
		Action: e.Action, ResourceType: e.ResourceType, ResourceId: e.ResourceID, Decision: e.Decision,
		RequestId: e.RequestID, TraceId: e.TraceID, Result: e.Result, Detail: e.Detail, ClientAddr: e.ClientAddr,
	}
}
