package tenancy

import (
	"context"
	"fmt"

	"connectrpc.com/connect"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/store"
)

// Cleaner removes one module's rows of a tenant. Each module lists and
// deletes its own tables through its own store functions (a module never
// touches another's tables); the wiring hands the TenantService the
// cleaners in the order the cascade walks them, and the tenant row goes
// last.
type Cleaner struct {
	// Name is the module, for errors.
	Name string
	// Rows lists what Delete removes, in order: the dry run.
	Rows func(ctx context.Context, q store.Querier, tenantID string) ([]store.TenantRow, error)
	// Delete removes exactly what Rows lists.
	Delete func(ctx context.Context, tx store.Tx, tenantID string) error
	// Busy, when set, names live work that must end before the tenant can
	// go (a reservation still holding capacity on a host); the delete is
	// refused while it lists any.
	Busy func(ctx context.Context, q store.Querier, tenantID string) ([]string, error)
}

// Active reports whether a tenant's principals may mutate: false for a
// suspended tenant and one that no longer exists. It answers from the
// directory cache at the request's version when it can (TenantSetState
// moves the version on, so a suspension holds on every replica's next
// request).
func Active(ctx context.Context, q store.Querier, tenantID string) (bool, error) {
	t, found, err := CachedTenant(ctx, q, tenantID)
	if err != nil || !found {
		return false, err
	}
	return t.State == TenantActive, nil
}

// ActiveCached is Active answered from the directory cache alone, without
// a querier: known is false on a miss (ask Active then). It spares the
// interceptor a transaction on every mutation of a tenant it has seen at
// this directory version.
func ActiveCached(ctx context.Context, tenantID string) (active, known bool) {
	t, ok := tenants.Get(ctx, tenantID)
	return ok && t.State == TenantActive, ok
}

// SetCleaners sets the delete cascade, in order.
func (s *TenantService) SetCleaners(cs []Cleaner) { s.cleaners = cs }

// Suspend refuses every mutation of the tenant's principals from now on.
func (s *TenantService) Suspend(ctx context.Context, req *connect.Request[apiv1.SuspendTenantRequest]) (*connect.Response[apiv1.SuspendTenantResponse], error) {
	return envelope.Mutate(ctx, s.env, req, stateChange(req.Msg.GetTenant(), TenantSuspended, "tenant.suspended",
		func(t Tenant) *apiv1.SuspendTenantResponse {
			return &apiv1.SuspendTenantResponse{Tenant: TenantProto(t)}
		}))
}

// Resume lifts a suspension.
func (s *TenantService) Resume(ctx context.Context, req *connect.Request[apiv1.ResumeTenantRequest]) (*connect.Response[apiv1.ResumeTenantResponse], error) {
	return envelope.Mutate(ctx, s.env, req, stateChange(req.Msg.GetTenant(), TenantActive, "tenant.resumed",
		func(t Tenant) *apiv1.ResumeTenantResponse { return &apiv1.ResumeTenantResponse{Tenant: TenantProto(t)} }))
}

// tenantDraft decides on the tenant a lifecycle request names; a tenant
// that does not exist is decided as a platform-level resource, so only a
// platform principal goes on to hear NOT_FOUND (see LookupTenant).
func tenantDraft(ref string) func(ctx context.Context, q store.Querier) (iam.Resource, error) {
	return func(ctx context.Context, q store.Querier) (iam.Resource, error) {
		t, _, err := LookupTenant(ctx, q, ref)
		return TenantResource(t), err
	}
}

// stateChange moves a tenant between active and suspended. Asking for the
// state it is in is no error (a repeated suspend answers the same).
func stateChange[Res any](ref, to, event string, res func(Tenant) *Res) envelope.Mutation[Res] {
	return envelope.Mutation[Res]{
		Validate: func() error {
			var vs envelope.Violations
			vs.Ref("tenant", ref, "tnt")
			return vs.Err()
		},
		Draft: tenantDraft(ref),
		Apply: func(ctx context.Context, tx *envelope.Tx) (*Res, error) {
			t, err := ResolveTenant(ctx, tx, ref)
			if err != nil {
				return nil, err
			}
			if t.State != to {
				if _, err := TenantSetState(ctx, tx, t.ID, to); err != nil {
					return nil, err
				}
				t.State = to
				tx.Emit(envelope.Event{Type: event, TenantID: t.ID, ResourceType: "Tenant", ResourceID: t.ID, Data: map[string]any{"name": t.Name}})
			}
			return res(t), nil
		},
	}
}

// Delete removes a tenant and everything it owns but its audit rows, in
// one transaction: a crash before the commit leaves the tenant whole (and
// the same request may be repeated), after it leaves nothing. The tenant
// must be suspended first, so nothing new starts while the operator reads
// the dry run, and must hold no live work (Cleaner.Busy). The dry run lists
// exactly the rows the delete removes; both walk the same cleaners.
func (s *TenantService) Delete(ctx context.Context, req *connect.Request[apiv1.DeleteTenantRequest]) (*connect.Response[apiv1.DeleteTenantResponse], error) {
	msg := req.Msg
	return envelope.Mutate(ctx, s.env, req, envelope.Mutation[apiv1.DeleteTenantResponse]{
		Validate: func() error {
			var vs envelope.Violations
			vs.Ref("tenant", msg.GetTenant(), "tnt")
			return vs.Err()
		},
		Draft:   tenantDraft(msg.GetTenant()),
		Context: func() map[string]any { return map[string]any{"dryRun": msg.GetDryRun()} },
		Apply: func(ctx context.Context, tx *envelope.Tx) (*apiv1.DeleteTenantResponse, error) {
			t, err := ResolveTenant(ctx, tx, msg.GetTenant())
			if err != nil {
				return nil, err
			}
			if t.State == TenantActive {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "tenant %q is active: suspend it first (tenants suspend %s)", t.Name, t.Name)
			}
			rows, err := s.plan(ctx, tx, t.ID)
			if err != nil {
				return nil, err
			}
			out := &apiv1.DeleteTenantResponse{DryRun: msg.GetDryRun()}
			for _, r := range rows {
				out.Rows = append(out.Rows, &apiv1.TenantRow{Table: r.Table, Id: r.ID})
			}
			for _, c := range s.cleaners {
				if c.Busy == nil {
					continue
				}
				busy, err := c.Busy(ctx, tx, t.ID)
				if err != nil {
					return nil, fmt.Errorf("tenancy: %s busy: %w", c.Name, err)
				}
				for _, b := range busy {
					out.Blocking = append(out.Blocking, c.Name+" "+b)
				}
			}
			if msg.GetDryRun() {
				return out, nil
			}
			if len(out.Blocking) > 0 {
				return nil, envelope.Errorf(envelope.CodeFailedPrecondition, "tenant %q still has live work: %s (end it first)", t.Name, joinBounded(out.Blocking, 10))
			}
			for _, c := range s.cleaners {
				if err := c.Delete(ctx, tx, t.ID); err != nil {
					return nil, fmt.Errorf("tenancy: delete %s rows: %w", c.Name, err)
				}
			}
			if err := TenantDelete(ctx, tx, t.ID); err != nil {
				return nil, err
			}
			tx.SetAuditDetail(fmt.Sprintf("deleted tenant %s (%s) and %d rows", t.Name, t.ID, len(rows)-1))
			// No event: an event is a row of its tenant, and the tenant's
			// rows are gone; the audit row (kept) records the delete.
			return out, nil
		},
	})
}

// plan lists what a delete of the tenant removes, in the cascade's order:
// every cleaner's rows, then the tenant's projects and the tenant row.
func (s *TenantService) plan(ctx context.Context, q store.Querier, tenantID string) ([]store.TenantRow, error) {
	var out []store.TenantRow
	for _, c := range s.cleaners {
		rows, err := c.Rows(ctx, q, tenantID)
		if err != nil {
			return nil, fmt.Errorf("tenancy: %s rows: %w", c.Name, err)
		}
		out = append(out, rows...)
	}
	projects, err := ProjectIDs(ctx, q, tenantID)
	if err != nil {
		return nil, err
	}
	for _, id := range projects {
		out = append(out, store.TenantRow{Table: "projects", ID: id})
	}
	return append(out, store.TenantRow{Table: "tenants", ID: tenantID}), nil
}

func joinBounded(ss []string, n int) string {
	if len(ss) <= n {
		return fmt.Sprint(ss)
	}
	return fmt.Sprintf("%v and %d more", ss[:n], len(ss)-n)
}
