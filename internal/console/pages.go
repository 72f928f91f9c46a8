package console

import (
	"cmp"
	"net/http"
	"net/url"
	"slices"

	"connectrpc.com/connect"
	"github.com/a-h/templ"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// pageSize is how many reservations one page lists.
const pageSize = 50

// capacityRow is one pool and model's line of the fleet overview.
type capacityRow struct {
	Pool, Model, Kind                         string
	Total, Free, Booked, Quarantined, Pending int32
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request, s *session) {
	p := page{Title: "Fleet overview", Nav: navOverview, Viewer: &s.viewer, CSRF: s.row.CSRFToken}
	// A platform key (no tenant) reads every tenant's pools.
	res, err := s.api.Capacity.ByPool(r.Context(), connect.NewRequest(&apiv1.CapacityByPoolRequest{Tenant: s.viewer.TenantID}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	var rows []capacityRow
	var total capacityRow
	for _, x := range res.Msg.GetRows() {
		row := capacityRow{Pool: x.GetPool(), Model: x.GetModel(), Kind: x.GetKind(), Total: x.GetTotal(), Free: x.GetFree(),
			Booked: x.GetBooked(), Quarantined: x.GetQuarantined(), Pending: x.GetPending()}
		rows = append(rows, row)
		total.Total += row.Total
		total.Free += row.Free
		total.Booked += row.Booked
		total.Quarantined += row.Quarantined
		total.Pending += row.Pending
	}
	slices.SortFunc(rows, func(a, b capacityRow) int {
		return cmp.Or(cmp.Compare(a.Pool, b.Pool), cmp.Compare(a.Model, b.Model), cmp.Compare(a.Kind, b.Kind))
	})
	// The chart of the last 24 hours (p-ops, ops_chart.go).
	chart, err := c.overviewChart(r, s, res.Msg.GetRows())
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	c.render(w, r, http.StatusOK, overviewPage(p, rows, total, chart))
}

// reservationRow is a reservation as the console lists it.
type reservationRow struct {
	ID, Pool, State, Model, Node, Start, End, CreatedBy string
	GPUs                                                int32
	// Live: not ended yet, so it may be released.
	Live bool
	// TenantQuery names the reservation's tenant in links and forms, for a
	// platform key only; a tenant's viewer always acts in their own.
	TenantQuery string
}

func reservationRowOf(v *viewer, x *apiv1.Reservation) reservationRow {
	row := reservationRow{ID: x.GetId(), Pool: x.GetPool(), State: x.GetState(), Model: x.GetSpec().GetModel(),
		Node: x.GetPlacement().GetNodeId(), Start: when(x.GetStartTime()), End: when(x.GetEndTime()),
		CreatedBy: x.GetCreatedBy(), GPUs: x.GetSpec().GetGpus()}
	if row.Model == "" {
		row.Model = "any model"
	}
	switch row.State {
	case "pending", "placed", "binding", "active":
		row.Live = true
	}
	if v.TenantID == "" {
		row.TenantQuery = x.GetTenantId()
	}
	return row
}

func when(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "—"
	}
	return ts.AsTime().UTC().Format("2006-01-02 15:04 UTC")
}

func (c *Console) reservations(w http.ResponseWriter, r *http.Request, s *session) {
	p := page{Title: "My reservations", Nav: navReservations, Viewer: &s.viewer, CSRF: s.row.CSRFToken}
	if s.viewer.TenantID == "" {
		p.Title = "Reservations"
	}
	res, err := s.api.Reservations.List(r.Context(), connect.NewRequest(&apiv1.ListReservationsRequest{
		Tenant: s.viewer.TenantID, PageSize: pageSize, PageToken: r.URL.Query().Get("page")}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	rows := make([]reservationRow, 0, len(res.Msg.GetReservations()))
	for _, x := range res.Msg.GetReservations() {
		rows = append(rows, reservationRowOf(&s.viewer, x))
	}
	c.render(w, r, http.StatusOK, reservationsPage(p, rows, res.Msg.GetNextPageToken(), newReserveForm()))
}

// tenantOf is the tenant a request acts in: the viewer's own, or for a
// platform key the one the link or form names.
func tenantOf(r *http.Request, s *session) string {
	if s.viewer.TenantID != "" {
		return s.viewer.TenantID
	}
	return r.FormValue("tenant")
}

func (c *Console) reservation(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	res, err := s.api.Reservations.Get(r.Context(), connect.NewRequest(&apiv1.GetReservationRequest{Tenant: tenantOf(r, s), Reservation: id}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	p := page{Title: "Reservation " + id, Nav: navReservations, Viewer: &s.viewer, CSRF: s.row.CSRFToken}
	c.render(w, r, http.StatusOK, reservationPage(p, reservationRowOf(&s.viewer, res.Msg.GetReservation()), timelineOf(res.Msg.GetReservation())))
}

// release asks the API to release the reservation with the viewer's key
// (one decision, one audit row), then shows it.
func (c *Console) release(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	tenant := tenantOf(r, s)
	_, err := s.api.Reservations.Release(r.Context(), connect.NewRequest(&apiv1.ReleaseReservationRequest{Tenant: tenant, Reservation: id}))
	if err != nil {
		c.fail(w, r, s, httpStatus(err), apiErrorOf(err))
		return
	}
	to := reservationURL(id, "")
	if s.viewer.TenantID == "" {
		to = reservationURL(id, tenant)
	}
	http.Redirect(w, r, string(to), http.StatusSeeOther)
}

func reservationURL(id, tenant string) templ.SafeURL {
	u := PathReservations + "/" + url.PathEscape(id)
	if tenant != "" {
		u += "?tenant=" + url.QueryEscape(tenant)
	}
	return templ.SafeURL(u)
}

func releaseURL(id string) templ.SafeURL {
	return templ.SafeURL(PathReservations + "/" + url.PathEscape(id) + "/release")
}

func nextPageURL(token string) templ.SafeURL {
	return templ.SafeURL(PathReservations + "?page=" + url.QueryEscape(token))
}
