package envelope

import (
	"context"
	"time"

	"github.com/better-compute/better-compute/internal/iam"
)

// ReadFilter decides which rows of a list or watch the caller may read.
// The decision on the request's scope (the tenant, the platform, or the one
// resource a watch follows) lets the call start; rows that sit in a project
// are then decided per distinct project, with the request's own catalog
// action on the Project entity, so a policy forbidding a project is honoured
// by List and Watch as it is by Get. Each project is decided once per filter
// (through the read cache), not once per row.
//
// A watch calls Recheck on every turn of its loop: once the envelope's
// WatchRecheck interval has passed it decides the scope again, ending the
// stream with PERMISSION_DENIED if that now denies, and forgets the
// per-project decisions so the next rows are decided afresh.
//
// A ReadFilter belongs to one request and is not safe for concurrent use.
type ReadFilter struct {
	env     *Envelope
	scope   iam.Resource
	decided map[resourceRef]bool
	checked time.Time
}

type resourceRef struct{ typ, tenantID, id string }

// NewReadFilter returns the row filter of a read whose scope decision
// (AuthorizeRead on scope) the caller has already made and passed.
func (e *Envelope) NewReadFilter(scope iam.Resource) *ReadFilter {
	return &ReadFilter{env: e, scope: scope, decided: map[resourceRef]bool{}, checked: e.cfg.Clock.Now()}
}

// ProjectResource is the entity a row in a project is filtered on.
func ProjectResource(tenantID, projectID string) iam.Resource {
	return iam.Resource{Type: "Project", ID: projectID, TenantID: tenantID}
}

// Readable reports whether the caller may read rows of tenantID's project
// projectID. A row outside any project (projectID "") is covered by the
// scope decision. The error is a Connect error, returned only when no
// decision could be made: a read fails closed.
func (f *ReadFilter) Readable(ctx context.Context, tenantID, projectID string) (bool, error) {
	if projectID == "" {
		return true, nil
	}
	return f.ReadableResource(ctx, ProjectResource(tenantID, projectID))
}

// ReadableResource reports whether the caller may read res, deciding each
// resource (by type, tenant and id) once per filter. A list of projects
// passes each project with its attributes.
func (f *ReadFilter) ReadableResource(ctx context.Context, res iam.Resource) (bool, error) {
	ref := resourceRef{res.Type, res.TenantID, res.ID}
	if allowed, ok := f.decided[ref]; ok {
		return allowed, nil
	}
	allowed, err := f.env.decideRead(ctx, res)
	if err != nil {
		f.env.logError(ctx, err)
		return false, ToConnect(err)
	}
	f.decided[ref] = allowed
	return allowed, nil
}

// Recheck decides the scope again once the WatchRecheck interval has passed
// on the envelope's clock since the last check, and then forgets the
// per-project decisions. It returns a Connect error (PERMISSION_DENIED when
// the scope is now denied) that should end the stream.
func (f *ReadFilter) Recheck(ctx context.Context) error {
	now := f.env.cfg.Clock.Now()
	if now.Sub(f.checked) < f.env.cfg.WatchRecheck {
		return nil
	}
	f.checked = now
	clear(f.decided)
	if err := f.env.authorizeRead(ctx, f.scope); err != nil {
		f.env.logError(ctx, err)
		return ToConnect(err)
	}
	return nil
}

// RequireProject refuses with PERMISSION_DENIED when the caller may not read
// rows of the project a request names as its filter: an empty answer would
// hide that the policy, not the data, stands in the way.
func (f *ReadFilter) RequireProject(ctx context.Context, tenantID, projectID string) error {
	allowed, err := f.Readable(ctx, tenantID, projectID)
	if err != nil || allowed {
		return err
	}
	caller, _ := CallerFrom(ctx)
	refusal := f.env.refusal(ctx, caller, InfoFrom(ctx).Method.Action, ProjectResource(tenantID, projectID))
	f.env.logError(ctx, refusal)
	return ToConnect(refusal)
}

// KeepReadable returns the rows the caller may read, in order; where names
// the tenant and project a row sits in. rows itself is left as it was, so a
// list can still take its cursor from the last row it read.
func KeepReadable[T any](ctx context.Context, f *ReadFilter, rows []T, where func(T) (tenantID, projectID string)) ([]T, error) {
	out := make([]T, 0, len(rows))
	for _, r := range rows {
		tenantID, projectID := where(r)
		ok, err := f.Readable(ctx, tenantID, projectID)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, r)
		}
	}
	return out, nil
}
