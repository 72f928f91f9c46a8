package cli

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
)

// fake is an in-memory API that speaks the real Connect protocol, so the
// CLI's requests go through real HTTP, headers and error details.
type fake struct {
	mu sync.Mutex
	// calls records each request's procedure and headers, in order.
	calls []call
	// pageSize is how many items each List page holds.
	pageSize int
	// failCreates answers this many creates with UNAVAILABLE (no detail),
	// as a network failure would look.
	failCreates int

	me            *apiv1.WhoAmIResponse
	tenants       []*apiv1.Tenant
	projects      []*apiv1.Project
	keys          []*apiv1.ApiKey
	policies      []*apiv1.Policy
	confirmations []*apiv1.Confirmation
	audit         []*apiv1.AuditEntry
	events        []*apiv1.Event
	// revokes records each key revocation's request.
	revokes []*apiv1.RevokeApiKeyRequest
	// denyTenant is a tenant whose projects List refuses.
	denyTenant string
	// protected projects refuse deletion with CONFIRMATION_REQUIRED unless
	// the request carries the approved confirmation id.
	protected map[string]string
}

type call struct {
	procedure string
	header    http.Header
}

var created = timestamppb.New(time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC))

func newFake() *fake {
	return &fake{
		pageSize: 2,
		me:       &apiv1.WhoAmIResponse{PrincipalId: "usr_root", Kind: "user", Name: "root", Role: "platform-admin", AuthenticatedBy: "api-key"},
		tenants: []*apiv1.Tenant{
			{Id: "ten_1", Name: "acme", DisplayName: "Acme Corp", State: "active", CreateTime: created},
			{Id: "ten_2", Name: "globex", State: "suspended", CreateTime: created},
			{Id: "ten_3", Name: "initech", State: "active", CreateTime: created},
		},
		events: []*apiv1.Event{
			{Id: "1", Type: "tenant.created", TenantId: "ten_1", ResourceType: "Tenant", ResourceId: "ten_1", Time: created},
			{Id: "2", Type: "project.created", TenantId: "ten_1", ResourceType: "Project", ResourceId: "prj_1", Time: created},
		},
		protected: map[string]string{},
	}
}

func (f *fake) record(procedure string, h http.Header) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call{procedure: procedure, header: h.Clone()})
}

// callsTo returns the recorded calls of one procedure (e.g. "TenantService/Create").
func (f *fake) callsTo(suffix string) []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []call
	for _, c := range f.calls {
		if len(c.procedure) >= len(suffix) && c.procedure[len(c.procedure)-len(suffix):] == suffix {
			out = append(out, c)
		}
	}
	return out
}

// unavailable reports whether this create should fail as a network error would.
func (f *fake) unavailable() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failCreates > 0 {
		f.failCreates--
		return connect.NewError(connect.CodeUnavailable, errors.New("connection reset"))
	}
	return nil
}

// apiError builds an error the way the server does: a Connect code plus an
// ErrorDetail with the machine code.
func apiError(code connect.Code, machine, msg, confirmationID string, violations ...*apiv1.FieldViolation) error {
	cerr := connect.NewError(code, errors.New(msg))
	d, err := connect.NewErrorDetail(&apiv1.ErrorDetail{Code: machine, Message: msg, ConfirmationId: confirmationID, Violations: violations})
	if err != nil {
		panic(err)
	}
	cerr.AddDetail(d)
	return cerr
}

// page returns one page of items for a page token that is the offset.
func page[T any](f *fake, items []T, token string, size int32) ([]T, string) {
	off, _ := strconv.Atoi(token)
	n := f.pageSize
	if size > 0 && int(size) < n {
		n = int(size)
	}
	end := min(off+n, len(items))
	next := ""
	if end < len(items) {
		next = strconv.Itoa(end)
	}
	return items[off:end], next
}

// recorder records every request's headers, unary and streaming.
type recorder struct{ f *fake }

func (r recorder) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		r.f.record(req.Spec().Procedure, req.Header())
		if req.Header().Get("Authorization") == "" {
			return nil, apiError(connect.CodeUnauthenticated, "UNAUTHENTICATED", "missing Authorization: Bearer <api key or OIDC token>", "")
		}
		return next(ctx, req)
	}
}

func (r recorder) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (r recorder) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		r.f.record(conn.Spec().Procedure, conn.RequestHeader())
		return next(ctx, conn)
	}
}

func (f *fake) serve(t *testing.T) *httptest.Server {
	t.Helper()
	opt := connect.WithInterceptors(recorder{f})
	mux := http.NewServeMux()
	mux.Handle(apiv1connect.NewTenantServiceHandler(tenantSvc{f: f}, opt))
	mux.Handle(apiv1connect.NewProjectServiceHandler(projectSvc{f}, opt))
	mux.Handle(apiv1connect.NewApiKeyServiceHandler(keySvc{f}, opt))
	mux.Handle(apiv1connect.NewIdentityServiceHandler(identitySvc{f}, opt))
	mux.Handle(apiv1connect.NewPolicyServiceHandler(policySvc{f}, opt))
	mux.Handle(apiv1connect.NewConfirmationServiceHandler(confirmationSvc{f}, opt))
	mux.Handle(apiv1connect.NewAuditServiceHandler(auditSvc{f: f}, opt))
	mux.Handle(apiv1connect.NewEventServiceHandler(eventSvc{f}, opt))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

type tenantSvc struct {
	apiv1connect.UnimplementedTenantServiceHandler
	f *fake
}

func (s tenantSvc) Create(_ context.Context, req *connect.Request[apiv1.CreateTenantRequest]) (*connect.Response[apiv1.CreateTenantResponse], error) {
	if err := s.f.unavailable(); err != nil {
		return nil, err
	}
	if req.Msg.GetName() == "" || req.Msg.GetName() == "Bad Name" {
		return nil, apiError(connect.CodeInvalidArgument, "INVALID_ARGUMENT", "invalid name: must match [a-z0-9-]{1,63}", "",
			&apiv1.FieldViolation{Field: "name", Reason: "must match [a-z0-9-]{1,63}"})
	}
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	t := &apiv1.Tenant{Id: fmt.Sprintf("ten_%d", len(s.f.tenants)+1), Name: req.Msg.GetName(), DisplayName: req.Msg.GetDisplayName(), CreateTime: created}
	s.f.tenants = append(s.f.tenants, t)
	return connect.NewResponse(&apiv1.CreateTenantResponse{Tenant: t}), nil
}

func (s tenantSvc) Get(_ context.Context, req *connect.Request[apiv1.GetTenantRequest]) (*connect.Response[apiv1.GetTenantResponse], error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	for _, t := range s.f.tenants {
		if t.GetName() == req.Msg.GetTenant() || t.GetId() == req.Msg.GetTenant() {
			return connect.NewResponse(&apiv1.GetTenantResponse{Tenant: t}), nil
		}
	}
	return nil, apiError(connect.CodeNotFound, "NOT_FOUND", fmt.Sprintf("tenant %q not found", req.Msg.GetTenant()), "")
}

func (s tenantSvc) List(_ context.Context, req *connect.Request[apiv1.ListTenantsRequest]) (*connect.Response[apiv1.ListTenantsResponse], error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	items, next := page(s.f, s.f.tenants, req.Msg.GetPageToken(), req.Msg.GetPageSize())
	return connect.NewResponse(&apiv1.ListTenantsResponse{Tenants: items, NextPageToken: next}), nil
}

type projectSvc struct{ f *fake }

func (s projectSvc) Create(_ context.Context, req *connect.Request[apiv1.CreateProjectRequest]) (*connect.Response[apiv1.CreateProjectResponse], error) {
	if err := s.f.unavailable(); err != nil {
		return nil, err
	}
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	p := &apiv1.Project{Id: fmt.Sprintf("prj_%d", len(s.f.projects)+1), TenantId: req.Msg.GetTenant(), Name: req.Msg.GetName(), DisplayName: req.Msg.GetDisplayName(), CreateTime: created}
	s.f.projects = append(s.f.projects, p)
	return connect.NewResponse(&apiv1.CreateProjectResponse{Project: p}), nil
}

func (s projectSvc) Get(_ context.Context, req *connect.Request[apiv1.GetProjectRequest]) (*connect.Response[apiv1.GetProjectResponse], error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	for _, p := range s.f.projects {
		if p.GetTenantId() == req.Msg.GetTenant() && p.GetName() == req.Msg.GetProject() {
			return connect.NewResponse(&apiv1.GetProjectResponse{Project: p}), nil
		}
	}
	return nil, apiError(connect.CodeNotFound, "NOT_FOUND", "project not found", "")
}

func (s projectSvc) List(_ context.Context, req *connect.Request[apiv1.ListProjectsRequest]) (*connect.Response[apiv1.ListProjectsResponse], error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	if s.f.denyTenant != "" && req.Msg.GetTenant() == s.f.denyTenant {
		return nil, apiError(connect.CodePermissionDenied, "PERMISSION_DENIED", "key key_m (member of acme) may not projects.list on tenant "+s.f.denyTenant, "")
	}
	var mine []*apiv1.Project
	for _, p := range s.f.projects {
		if p.GetTenantId() == req.Msg.GetTenant() {
			mine = append(mine, p)
		}
	}
	items, next := page(s.f, mine, req.Msg.GetPageToken(), req.Msg.GetPageSize())
	return connect.NewResponse(&apiv1.ListProjectsResponse{Projects: items, NextPageToken: next}), nil
}

func (s projectSvc) Delete(_ context.Context, req *connect.Request[apiv1.DeleteProjectRequest]) (*connect.Response[apiv1.DeleteProjectResponse], error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	if id, ok := s.f.protected[req.Msg.GetProject()]; ok && req.Header().Get("Bc-Confirmation-Id") != id {
		return nil, apiError(connect.CodeFailedPrecondition, "CONFIRMATION_REQUIRED", "deleting a production project needs a human's approval", id,
			&apiv1.FieldViolation{Field: "project", Reason: "labelled production"})
	}
	for i, p := range s.f.projects {
		if p.GetTenantId() == req.Msg.GetTenant() && p.GetName() == req.Msg.GetProject() {
			s.f.projects = append(s.f.projects[:i], s.f.projects[i+1:]...)
			return connect.NewResponse(&apiv1.DeleteProjectResponse{}), nil
		}
	}
	return nil, apiError(connect.CodeNotFound, "NOT_FOUND", "project not found", "")
}

type keySvc struct{ f *fake }

func (s keySvc) Create(_ context.Context, req *connect.Request[apiv1.CreateApiKeyRequest]) (*connect.Response[apiv1.CreateApiKeyResponse], error) {
	if err := s.f.unavailable(); err != nil {
		return nil, err
	}
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	k := &apiv1.ApiKey{Id: fmt.Sprintf("key_%d", len(s.f.keys)+1), TenantId: req.Msg.GetTenant(), Name: req.Msg.GetName(), Role: req.Msg.GetRole(), Kind: "service", Prefix: "bc_abcd", CreateTime: created}
	if ttl := req.Msg.GetTtlSeconds(); ttl > 0 {
		k.ExpireTime = timestamppb.New(created.AsTime().Add(time.Duration(ttl) * time.Second))
	}
	s.f.keys = append(s.f.keys, k)
	return connect.NewResponse(&apiv1.CreateApiKeyResponse{ApiKey: k, Secret: "bc_abcdSECRETSECRET"}), nil
}

func (s keySvc) List(_ context.Context, req *connect.Request[apiv1.ListApiKeysRequest]) (*connect.Response[apiv1.ListApiKeysResponse], error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	var out []*apiv1.ApiKey
	for _, k := range s.f.keys {
		if k.GetTenantId() == req.Msg.GetTenant() && (k.GetRevokeTime() == nil || req.Msg.GetIncludeRevoked()) {
			out = append(out, k)
		}
	}
	items, next := page(s.f, out, req.Msg.GetPageToken(), req.Msg.GetPageSize())
	return connect.NewResponse(&apiv1.ListApiKeysResponse{ApiKeys: items, NextPageToken: next}), nil
}

func (s keySvc) Revoke(_ context.Context, req *connect.Request[apiv1.RevokeApiKeyRequest]) (*connect.Response[apiv1.RevokeApiKeyResponse], error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	s.f.revokes = append(s.f.revokes, req.Msg)
	for _, k := range s.f.keys {
		if k.GetId() == req.Msg.GetId() {
			k.RevokeTime = created
			return connect.NewResponse(&apiv1.RevokeApiKeyResponse{ApiKey: k}), nil
		}
	}
	return nil, apiError(connect.CodeNotFound, "NOT_FOUND", "api key not found", "")
}

type identitySvc struct{ f *fake }

func (s identitySvc) WhoAmI(context.Context, *connect.Request[apiv1.WhoAmIRequest]) (*connect.Response[apiv1.WhoAmIResponse], error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	return connect.NewResponse(s.f.me), nil
}

type policySvc struct{ f *fake }

func (s policySvc) Get(_ context.Context, req *connect.Request[apiv1.GetPolicyRequest]) (*connect.Response[apiv1.GetPolicyResponse], error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	for _, p := range s.f.policies {
		if p.GetId() == req.Msg.GetId() {
			return connect.NewResponse(&apiv1.GetPolicyResponse{Policy: p}), nil
		}
	}
	return nil, apiError(connect.CodeNotFound, "NOT_FOUND", "policy not found", "")
}

func (s policySvc) Put(_ context.Context, req *connect.Request[apiv1.PutPolicyRequest]) (*connect.Response[apiv1.PutPolicyResponse], error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	p := &apiv1.Policy{TenantId: req.Msg.GetTenant(), Id: req.Msg.GetId(), Text: req.Msg.GetText(), UpdateTime: created}
	s.f.policies = append(s.f.policies, p)
	return connect.NewResponse(&apiv1.PutPolicyResponse{Policy: p}), nil
}

func (s policySvc) List(_ context.Context, req *connect.Request[apiv1.ListPoliciesRequest]) (*connect.Response[apiv1.ListPoliciesResponse], error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	items, next := page(s.f, s.f.policies, req.Msg.GetPageToken(), req.Msg.GetPageSize())
	return connect.NewResponse(&apiv1.ListPoliciesResponse{Policies: items, NextPageToken: next}), nil
}

type confirmationSvc struct{ f *fake }

func (s confirmationSvc) List(_ context.Context, req *connect.Request[apiv1.ListConfirmationsRequest]) (*connect.Response[apiv1.ListConfirmationsResponse], error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	var out []*apiv1.Confirmation
	for _, c := range s.f.confirmations {
		if req.Msg.GetState() == "" || c.GetState() == req.Msg.GetState() {
			out = append(out, c)
		}
	}
	items, next := page(s.f, out, req.Msg.GetPageToken(), req.Msg.GetPageSize())
	return connect.NewResponse(&apiv1.ListConfirmationsResponse{Confirmations: items, NextPageToken: next}), nil
}

func (s confirmationSvc) Approve(_ context.Context, req *connect.Request[apiv1.ApproveConfirmationRequest]) (*connect.Response[apiv1.ApproveConfirmationResponse], error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	for _, c := range s.f.confirmations {
		if c.GetId() == req.Msg.GetId() {
			c.State, c.ApprovedBy = "approved", "usr_root"
			return connect.NewResponse(&apiv1.ApproveConfirmationResponse{Confirmation: c}), nil
		}
	}
	return nil, apiError(connect.CodeNotFound, "NOT_FOUND", "confirmation not found", "")
}

// auditSvc fakes List; the tree's methods are tested against a real
// control plane (audit_test.go).
type auditSvc struct {
	apiv1connect.UnimplementedAuditServiceHandler
	f *fake
}

func (s auditSvc) List(_ context.Context, req *connect.Request[apiv1.ListAuditRequest]) (*connect.Response[apiv1.ListAuditResponse], error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	var out []*apiv1.AuditEntry
	for _, e := range s.f.audit {
		if (req.Msg.GetAction() == "" || e.GetAction() == req.Msg.GetAction()) && (req.Msg.GetTenant() == "" || e.GetTenantId() == req.Msg.GetTenant()) {
			out = append(out, e)
		}
	}
	items, next := page(s.f, out, req.Msg.GetPageToken(), req.Msg.GetPageSize())
	return connect.NewResponse(&apiv1.ListAuditResponse{Entries: items, NextPageToken: next}), nil
}

type eventSvc struct{ f *fake }

// List filters the fake's events by tenant (name or id), type prefix and
// resource, newest first.
func (s eventSvc) List(_ context.Context, req *connect.Request[apiv1.ListEventsRequest]) (*connect.Response[apiv1.ListEventsResponse], error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	m := req.Msg
	var out []*apiv1.Event
	for i := len(s.f.events) - 1; i >= 0; i-- {
		ev := s.f.events[i]
		typeOK := len(m.GetTypePrefixes()) == 0
		for _, p := range m.GetTypePrefixes() {
			typeOK = typeOK || strings.HasPrefix(ev.GetType(), p)
		}
		tenantOK := m.GetTenant() == "" || ev.GetTenantId() == m.GetTenant()
		for _, t := range s.f.tenants {
			if t.GetName() == m.GetTenant() {
				tenantOK = ev.GetTenantId() == t.GetId()
			}
		}
		if typeOK && tenantOK && (m.GetResourceType() == "" || ev.GetResourceType() == m.GetResourceType()) &&
			(m.GetResourceId() == "" || ev.GetResourceId() == m.GetResourceId()) {
			out = append(out, ev)
		}
	}
	items, next := page(s.f, out, m.GetPageToken(), m.GetPageSize())
	return connect.NewResponse(&apiv1.ListEventsResponse{Events: items, NextPageToken: next}), nil
}

// Watch sends the events after the cursor and ends the stream, so a test's
// watch returns instead of waiting for Ctrl-C.
func (s eventSvc) Watch(_ context.Context, req *connect.Request[apiv1.WatchEventsRequest], stream *connect.ServerStream[apiv1.WatchEventsResponse]) error {
	s.f.mu.Lock()
	evs := append([]*apiv1.Event(nil), s.f.events...)
	s.f.mu.Unlock()
	after, _ := strconv.Atoi(req.Msg.GetAfter())
	for _, ev := range evs {
		if id, _ := strconv.Atoi(ev.GetId()); id <= after {
			continue
		}
		if err := stream.Send(&apiv1.WatchEventsResponse{Event: ev}); err != nil {
			return err
		}
	}
	return nil
}
