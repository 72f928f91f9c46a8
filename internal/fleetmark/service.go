package fleetmark

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"regexp"
	"unicode"

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
	MaxSpecBytes = 64 << 10
	maxNameLen   = 253
)

// kindPattern is a document kind: a capitalized word (Pool, IPPool).
var kindPattern = regexp.MustCompile(`^[A-Z][A-Za-z0-9]{0,39}$`)

// Service serves FleetConfigService.
type Service struct {
	env *envelope.Envelope
}

// NewService returns the handlers.
func NewService(env *envelope.Envelope) *Service { return &Service{env: env} }

var _ apiv1connect.FleetConfigServiceHandler = (*Service)(nil)

// Resource projects a mark into the authorization model.
func Resource(m Mark) iam.Resource {
	return iam.Resource{Type: "ManagedMark", ID: m.ID, TenantID: m.TenantID, Attrs: map[string]any{"name": m.Name, "kind": m.Kind}}
}

// Digest is the digest of a spec: sha256 of its JSON as sent.
func Digest(specJSON string) string {
	sum := sha256.Sum256([]byte(specJSON))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// target is a mark a request names, resolved in its scope.
type target struct {
	sc    tenancy.Scope
	m     Mark
	found bool
}

func (t target) resource(kind, name string) iam.Resource {
	if t.found {
		return Resource(t.m)
	}
	if !t.sc.Found {
		return iam.Resource{Type: "ManagedMark", ID: iam.DraftID}
	}
	return iam.Resource{Type: "ManagedMark", ID: iam.DraftID, TenantID: t.sc.ID(), Attrs: map[string]any{"name": name, "kind": kind}}
}

func lookup(ctx context.Context, q store.Querier, tenantRef, kind, name, lock string) (target, error) {
	var t target
	var err error
	if t.sc, err = tenancy.LookupScope(ctx, q, tenantRef); err != nil || !t.sc.Found {
		return t, err
	}
	t.m, err = Get(ctx, q, t.sc.ID(), kind, name, lock)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return t, nil
	case err != nil:
		return t, err
	}
	t.found = true
	return t, nil
}

// validateObject checks a request's kind and name.
func validateObject(vs *envelope.Violations, kind, name string) {
	if !kindPattern.MatchString(kind) {
		vs.Add("kind", "must be a document kind such as Pool (a capital letter, then letters and digits, at most 40)")
	}
	switch {
	case name == "":
		vs.Add("name", "is required")
	case len(name) > maxNameLen:
		vs.Add("name", "at most %d bytes", maxNameLen)
	default:
		for _, r := range name {
			if !unicode.IsPrint(r) || unicode.IsSpace(r) {
				vs.Add("name", "must be printable, without spaces")
				break
			}
		}
	}
}

// SetMark records the spec fleet apply applied to an object.
func (s *Service) SetMark(ctx context.Context, req *connect.Request[apiv1.SetManagedMarkRequest]) (*connect.Response[apiv1.SetManagedMarkResponse], error) {
	msg := req.Msg
	var t target
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.SetManagedMarkResponse]{
		Validate: func() error {
			var vs envelope.Violations
			tenancy.ValidateScope(&vs, msg.GetTenant())
			validateObject(&vs, msg.GetKind(), msg.GetName())
			var obj map[string]any
			switch spec := msg.GetSpecJson(); {
			case len(spec) > MaxSpecBytes:
				vs.Add("spec_json", "at most %d bytes, got %d", MaxSpecBytes, len(spec))
			case json.Unmarshal([]byte(spec), &obj) != nil || obj == nil:
				vs.Add("spec_json", "must be a JSON object")
			}
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			t, err = lookup(ctx, q, msg.GetTenant(), msg.GetKind(), msg.GetName(), "")
			return t.resource(msg.GetKind(), msg.GetName()), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.SetManagedMarkResponse, error) {
			if err := t.sc.NotFound(); err != nil {
				return nil, err
			}
			now := tx.Now()
			cur, err := Get(ctx, tx, t.sc.ID(), msg.GetKind(), msg.GetName(), store.ForUpdate(tx))
			found := err == nil
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return nil, err
			}
			row := cur
			if !found {
				row = Mark{ID: envelope.NewID(IDPrefix, now), TenantID: t.sc.ID(), Kind: msg.GetKind(), Name: msg.GetName()}
			}
			row.SpecJSON = msg.GetSpecJson()
			row.Digest = Digest(row.SpecJSON)
			row.ApplyTime = now
			row.AppliedBy = tx.Caller().Principal.ID
			if found {
				err = Update(ctx, tx, &row)
			} else {
				err = Insert(ctx, tx, &row)
			}
			if errors.Is(err, store.ErrUnique) {
				// Two first marks of one object raced; the loser retries as an update.
				return nil, envelope.Errorf(envelope.CodeConflict, "%s %s was marked concurrently: retry", row.Kind, row.Name)
			}
			if err != nil {
				return nil, err
			}
			tx.SetResource(row.ID, "")
			tx.Emit(envelope.Event{Type: "fleet.marked", TenantID: row.TenantID, ResourceType: "ManagedMark", ResourceID: row.ID,
				Data: map[string]any{"kind": row.Kind, "name": row.Name, "digest": row.Digest}})
			return &apiv1.SetManagedMarkResponse{Mark: Proto(row)}, nil
		},
	})
}

// ListMarks lists the scope's marks.
func (s *Service) ListMarks(ctx context.Context, req *connect.Request[apiv1.ListManagedMarksRequest]) (*connect.Response[apiv1.ListManagedMarksResponse], error) {
	rows, next, err := tenancy.ListPage(ctx, s.env, req.Msg, "marks",
		func(ctx context.Context, q store.Querier, sc tenancy.Scope, after string, limit int) ([]Mark, error) {
			return List(ctx, q, sc.ID(), after, limit)
		}, func(m Mark) string { return m.ID })
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListManagedMarksResponse{NextPageToken: next}
	for _, r := range rows {
		out.Marks = append(out.Marks, Proto(r))
	}
	return connect.NewResponse(out), nil
}

// DeleteMark forgets an object's mark; a mark that is not there is
// already forgotten.
func (s *Service) DeleteMark(ctx context.Context, req *connect.Request[apiv1.DeleteManagedMarkRequest]) (*connect.Response[apiv1.DeleteManagedMarkResponse], error) {
	msg := req.Msg
	var t target
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.DeleteManagedMarkResponse]{
		Validate: func() error {
			var vs envelope.Violations
			tenancy.ValidateScope(&vs, msg.GetTenant())
			validateObject(&vs, msg.GetKind(), msg.GetName())
			return vs.Err()
		},
		Draft: func(ctx context.Context, q store.Querier) (iam.Resource, error) {
			var err error
			t, err = lookup(ctx, q, msg.GetTenant(), msg.GetKind(), msg.GetName(), "")
			return t.resource(msg.GetKind(), msg.GetName()), err
		},
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.DeleteManagedMarkResponse, error) {
			if err := t.sc.NotFound(); err != nil {
				return nil, err
			}
			row, err := Get(ctx, tx, t.sc.ID(), msg.GetKind(), msg.GetName(), store.ForUpdate(tx))
			if errors.Is(err, store.ErrNotFound) {
				return &apiv1.DeleteManagedMarkResponse{}, nil
			}
			if err != nil {
				return nil, err
			}
			if err := Delete(ctx, tx, row.ID); err != nil {
				return nil, err
			}
			tx.SetResource(row.ID, "")
			tx.Emit(envelope.Event{Type: "fleet.unmarked", TenantID: row.TenantID, ResourceType: "ManagedMark", ResourceID: row.ID,
				Data: map[string]any{"kind": row.Kind, "name": row.Name}})
			return &apiv1.DeleteManagedMarkResponse{}, nil
		},
	})
}

// Proto converts a mark for the API.
func Proto(m Mark) *apiv1.ManagedMark {
	return &apiv1.ManagedMark{TenantId: m.TenantID, Kind: m.Kind, Name: m.Name, Digest: m.Digest, SpecJson: m.SpecJSON,
		ApplyTime: timestamppb.New(m.ApplyTime), AppliedBy: m.AppliedBy}
}
