package console

import (
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"

	"connectrpc.com/connect"
	"github.com/a-h/templ"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// The events page (p-events): the outbox's stored events, newest first,
// through EventService.List.

// eventsFilter is the events page's GET form, as EventService.List takes it.
type eventsFilter struct {
	Tenant, Type, ResourceType, ResourceID string
}

// eventRow is an event as the page's table shows it.
type eventRow struct {
	ID, Time, Type, Tenant, Resource, Summary string
	// Link is the console page of the resource; empty when it has none.
	Link templ.SafeURL
}

func (c *Console) events(w http.ResponseWriter, r *http.Request, s *session) {
	tenant, size, ok := c.listStart(w, r, s)
	if !ok {
		return
	}
	q := r.URL.Query()
	f := eventsFilter{Tenant: tenant, Type: strings.TrimSpace(q.Get("type")), ResourceType: strings.TrimSpace(q.Get("resource_type")),
		ResourceID: strings.TrimSpace(q.Get("resource_id"))}
	req := &apiv1.ListEventsRequest{Tenant: f.Tenant, ResourceType: f.ResourceType, ResourceId: f.ResourceID, PageSize: size,
		PageToken: q.Get("page")}
	if f.Type != "" {
		req.TypePrefixes = []string{f.Type}
	}
	res, err := s.api.Events.List(r.Context(), connect.NewRequest(req))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	rows := make([]eventRow, 0, len(res.Msg.GetEvents()))
	for _, ev := range res.Msg.GetEvents() {
		rows = append(rows, eventRow{
			ID: ev.GetId(), Time: when(ev.GetTime()), Type: ev.GetType(), Tenant: ev.GetTenantId(),
			Resource: strings.TrimSpace(ev.GetResourceType() + " " + ev.GetResourceId()),
			Summary:  eventSummary(ev), Link: resourceLink(s, ev),
		})
	}
	p := page{Title: "Events", Nav: "events", Viewer: &s.viewer, CSRF: s.row.CSRFToken}
	c.render(w, r, http.StatusOK, eventsPage(p, f, rows, nextOf(r, PathEvents, res.Msg.GetNextPageToken())))
}

// resourceLink is the console page of an event's resource, where the
// console has one; a platform viewer's link names the event's tenant.
func resourceLink(s *session, ev *apiv1.Event) templ.SafeURL {
	var base string
	switch ev.GetResourceType() {
	case "Reservation":
		base = PathReservations
	case "Node":
		base = PathNodes
	case "Machine":
		base = PathMachines
	case "Instance":
		base = PathInstances
	case "Sandbox":
		base = PathSandboxes
	default:
		return ""
	}
	if ev.GetResourceId() == "" {
		return ""
	}
	u := base + "/" + url.PathEscape(ev.GetResourceId())
	if s.viewer.TenantID == "" && ev.GetTenantId() != "" {
		u += "?tenant=" + url.QueryEscape(ev.GetTenantId())
	}
	return templ.SafeURL(u)
}

// eventSummary is a short line of an event's data: its first keys in order,
// cut at 120 characters.
func eventSummary(ev *apiv1.Event) string {
	m := ev.GetData().AsMap()
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%v", k, m[k]))
	}
	out := strings.Join(parts, " ")
	if r := []rune(out); len(r) > 120 {
		out = string(r[:119]) + "…"
	}
	return out
}
