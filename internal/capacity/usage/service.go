package usage

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

// MaxExportWindows bounds one export; a larger one is refused with
// RESOURCE_EXHAUSTED and asks for a narrower time range.
const MaxExportWindows = 100_000

// Service serves the UsageService API.
type Service struct {
	env     *envelope.Envelope
	sources []IntervalSource
}

// NewService returns the usage handlers; sources are the other modules'
// intervals the open hour adds (as the rollup's job passes them).
func NewService(env *envelope.Envelope, sources ...IntervalSource) *Service {
	return &Service{env: env, sources: sources}
}

var _ apiv1connect.UsageServiceHandler = (*Service)(nil)

// filter is a request's validated filters.
type filter struct {
	tenant, project, metric string
	start, end              time.Time
}

// key fingerprints the filters for page tokens.
func (f filter) key() string {
	return strings.Join([]string{f.tenant, f.project, f.metric, timeKey(f.start), timeKey(f.end)}, "/")
}

func timeKey(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// validateFilter checks the filters both methods share, naming tenant,
// project, start_time and end_time.
func validateFilter(vs *envelope.Violations, tenant, project string, start, end *timestamppb.Timestamp) filter {
	f := filter{tenant: tenant, project: project}
	if tenant != "" {
		vs.Ref("tenant", tenant, "tnt")
	}
	if project != "" {
		vs.Ref("project", project, "prj")
		if tenant == "" {
			vs.Add("tenant", "is required with project")
		}
	}
	if start != nil {
		if err := start.CheckValid(); err != nil {
			vs.Add("start_time", "is not a valid time: %v", err)
		} else {
			f.start = start.AsTime().UTC()
		}
	}
	if end != nil {
		if err := end.CheckValid(); err != nil {
			vs.Add("end_time", "is not a valid time: %v", err)
		} else {
			f.end = end.AsTime().UTC()
		}
	}
	if !f.start.IsZero() && !f.end.IsZero() && !f.end.After(f.start) {
		vs.Add("end_time", "must be after start_time")
	}
	return f
}

// authorize makes the read decision on the tenant the request names (the
// platform when none) and resolves the project filter, returning the
// tenant's and the project's ids and the filter that decides each window's
// project (a project the request names is decided up front).
func (s *Service) authorize(ctx context.Context, f filter) (tenantID, projectID string, rf *envelope.ReadFilter, err error) {
	if f.tenant == "" {
		scope := tenancy.PlatformResource()
		if err := s.env.AuthorizeRead(ctx, scope); err != nil {
			return "", "", nil, err
		}
		return "", "", s.env.NewReadFilter(scope), nil
	}
	t, err := tenancy.AuthorizeTenantRead(ctx, s.env, f.tenant)
	if err != nil {
		return "", "", nil, err
	}
	rf = s.env.NewReadFilter(tenancy.TenantResource(t))
	if f.project == "" {
		return t.ID, "", rf, nil
	}
	var p tenancy.Project
	if err := s.env.Resolve(ctx, "project", func(ctx context.Context, q store.Querier) (err error) {
		p, err = tenancy.ProjectGet(ctx, q, t.ID, f.project)
		if errors.Is(err, store.ErrNotFound) {
			return envelope.NotFound("project", f.project)
		}
		return err
	}); err != nil {
		return "", "", nil, s.env.Fail(ctx, err)
	}
	if err := rf.RequireProject(ctx, t.ID, p.ID); err != nil {
		return "", "", nil, err
	}
	return t.ID, p.ID, rf, nil
}

// windowWhere names the tenant and project a window sits in.
func windowWhere(w UsageWindow) (string, string) { return w.TenantID, w.ProjectID }

// List lists usage windows by window start, reservation and metric: a
// tenant's, or every tenant's for platform administrators.
func (s *Service) List(ctx context.Context, req *connect.Request[apiv1.ListUsageRequest]) (*connect.Response[apiv1.ListUsageResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	f := validateFilter(&vs, msg.GetTenant(), msg.GetProject(), msg.GetStartTime(), msg.GetEndTime())
	if m := msg.GetMetric(); m != "" && !ValidMetric(m) {
		vs.Add("metric", "must be gpu.<model>.hours, instance.<flavor>.hours, vcpu.hours or memoryGiB.hours, got %q", truncate(m))
	}
	f.metric = msg.GetMetric()
	vs.PageSize("page_size", msg.GetPageSize())
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	token, err := envelope.DecodePageToken("page_token", msg.GetPageToken(), f.key())
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	var after *Cursor
	if token != "" {
		c, err := ParseCursor(token)
		if err != nil {
			return nil, s.env.Fail(ctx, envelope.Invalid(envelope.Violation{Field: "page_token", Reason: "is not a token this server issued"}))
		}
		after = &c
	}
	tenantID, projectID, rf, err := s.authorize(ctx, f)
	if err != nil {
		return nil, err
	}
	limit := envelope.PageSize(msg.GetPageSize())
	var windows []UsageWindow
	if err := s.env.Resolve(ctx, "usage", func(ctx context.Context, q store.Querier) (err error) {
		windows, err = List(ctx, q, &ListParams{TenantID: tenantID, ProjectID: projectID, Metric: f.metric,
			Start: f.start, End: f.end, After: after, Limit: limit + 1})
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out := &apiv1.ListUsageResponse{}
	if len(windows) > limit {
		// The cursor follows the windows read, not those shown, so a page
		// thinned by a project the caller may not read still leads on.
		last := windows[limit-1]
		out.NextPageToken = envelope.EncodePageToken(Cursor{WindowStart: last.WindowStart, ReservationID: last.ReservationID, Metric: last.Metric}.String(), f.key())
		windows = windows[:limit]
	}
	if windows, err = envelope.KeepReadable(ctx, rf, windows, windowWhere); err != nil {
		return nil, err
	}
	for _, w := range windows {
		out.Windows = append(out.Windows, Proto(w))
	}
	// The last page ends with the hour still open, as far as it has gone,
	// when the range covers it: usage shows up before the hour closes.
	now := s.env.Clock().Now().UTC()
	if h := now.Truncate(Window); out.NextPageToken == "" && !h.Before(f.start) && (f.end.IsZero() || h.Before(f.end)) {
		var open []UsageWindow
		if err := s.env.Resolve(ctx, "usage", func(ctx context.Context, q store.Querier) (err error) {
			open, err = OpenHour(ctx, q, tenantID, projectID, f.metric, now, s.sources...)
			return err
		}); err != nil {
			return nil, s.env.Fail(ctx, err)
		}
		if open, err = envelope.KeepReadable(ctx, rf, open, windowWhere); err != nil {
			return nil, err
		}
		for _, w := range open {
			pw := Proto(w)
			pw.Partial = true
			out.Windows = append(out.Windows, pw)
		}
	}
	return connect.NewResponse(out), nil
}

// Export returns every window matching the filters in one document: CSV
// (the default), JSON lines of windows, or CloudEvents as JSON lines.
func (s *Service) Export(ctx context.Context, req *connect.Request[apiv1.ExportUsageRequest]) (*connect.Response[apiv1.ExportUsageResponse], error) {
	msg := req.Msg
	var vs envelope.Violations
	f := validateFilter(&vs, msg.GetTenant(), msg.GetProject(), msg.GetStartTime(), msg.GetEndTime())
	format := msg.GetFormat()
	switch format {
	case "", FormatCSV:
		format = FormatCSV
	case FormatCloudEvents, FormatJSONL:
	default:
		vs.Add("format", "must be csv, jsonl or cloudevents, got %q", truncate(format))
	}
	if err := vs.Err(); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	tenantID, projectID, rf, err := s.authorize(ctx, f)
	if err != nil {
		return nil, err
	}
	var windows []UsageWindow
	if err := s.env.Resolve(ctx, "usage", func(ctx context.Context, q store.Querier) (err error) {
		windows, err = List(ctx, q, &ListParams{TenantID: tenantID, ProjectID: projectID,
			Start: f.start, End: f.end, Limit: MaxExportWindows + 1})
		return err
	}); err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	if len(windows) > MaxExportWindows {
		return nil, s.env.Fail(ctx, envelope.Errorf(envelope.CodeResourceExhaustedLimit,
			"the export holds more than %d windows: narrow start_time and end_time", MaxExportWindows))
	}
	if windows, err = envelope.KeepReadable(ctx, rf, windows, windowWhere); err != nil {
		return nil, err
	}
	var (
		buf bytes.Buffer
		out = &apiv1.ExportUsageResponse{}
	)
	switch format {
	case FormatCloudEvents:
		out.ContentType = ContentTypeCloudEvents
		err = WriteCloudEvents(&buf, windows)
	case FormatJSONL:
		out.ContentType = ContentTypeJSONL
		err = WriteJSONL(&buf, windows)
	default:
		out.ContentType = ContentTypeCSV
		err = WriteCSV(&buf, windows)
	}
	if err != nil {
		return nil, s.env.Fail(ctx, err)
	}
	out.Data = buf.Bytes()
	return connect.NewResponse(out), nil
}

// Proto converts a window for the API.
func Proto(w UsageWindow) *apiv1.UsageWindow {
	return &apiv1.UsageWindow{TenantId: w.TenantID, ProjectId: w.ProjectID, ReservationId: w.ReservationID,
		Metric: w.Metric, WindowStart: timestamppb.New(w.WindowStart), Quantity: w.Quantity}
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
