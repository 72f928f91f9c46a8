package console

import (
	"cmp"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/a-h/templ"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// Paths of the reservation form: the preview fragment the form asks for as
// it changes, and the page a refused create answers with.
const (
	PathReservationPreview = PathReservations + "/preview"
	PathReservationNew     = PathReservations + "/new"
)

// reserveForm is the reservation form as the browser sent it, kept as text
// so a refused form comes back as it was typed.
type reserveForm struct {
	Tenant, Project, Pool, GPUs, Model, MIG, Slots, VCPU, MemoryGiB, Hugepages, Duration, Binding string
	SingleTenant                                                                                  bool
	// IdempotencyKey is drawn when the form is drawn: sending the same
	// form twice (a double click, a retried post) books once.
	IdempotencyKey string
}

// newReserveForm is an empty form with a fresh idempotency key.
func newReserveForm() reserveForm {
	return reserveForm{GPUs: "1", Duration: "4h", Binding: "node", IdempotencyKey: client.NewIdempotencyKey()}
}

func reserveFormOf(r *http.Request) reserveForm {
	v := r.PostForm
	f := reserveForm{Tenant: v.Get("tenant"), Project: v.Get("project"), Pool: v.Get("pool"), GPUs: v.Get("gpus"), Model: v.Get("model"),
		MIG: v.Get("mig_profile"), Slots: v.Get("slots"), VCPU: v.Get("vcpu"), MemoryGiB: v.Get("memory_gib"),
		Hugepages: v.Get("hugepages_1gi"), Duration: v.Get("duration"), Binding: v.Get("binding"),
		SingleTenant: v.Get("single_tenant") != "", IdempotencyKey: v.Get("idempotency_key")}
	for _, s := range []*string{&f.Tenant, &f.Project, &f.Pool, &f.GPUs, &f.Model, &f.MIG, &f.Slots, &f.VCPU, &f.MemoryGiB, &f.Hugepages, &f.Duration, &f.Binding} {
		*s = strings.TrimSpace(*s)
	}
	return f
}

// fieldRefusal is a refusal of the form itself, before the API is asked, in
// the API's words (field: reason, INVALID_ARGUMENT).
func fieldRefusal(field, reason string) *apiError {
	return &apiError{Code: "INVALID_ARGUMENT", Message: field + ": " + reason}
}

// request is the CreateReservationRequest the form asks for; tenant is the
// tenant it acts in. Only what the browser cannot send as a number or a
// span is checked here; the API checks the rest.
func (f reserveForm) request(tenant string) (*apiv1.CreateReservationRequest, *apiError) {
	req := &apiv1.CreateReservationRequest{Tenant: tenant, Project: f.Project, Pool: f.Pool, Model: f.Model,
		MigProfile: f.MIG, Binding: f.Binding, SingleTenant: f.SingleTenant}
	for _, n := range []struct {
		field, text string
		to          *int32
	}{
		{"gpus", f.GPUs, &req.Gpus}, {"slots", f.Slots, &req.Slots}, {"vcpu", f.VCPU, &req.Vcpu},
		{"memory_gib", f.MemoryGiB, &req.MemoryGib}, {"hugepages_1gi", f.Hugepages, &req.Hugepages_1Gi},
	} {
		if n.text == "" {
			continue
		}
		v, err := strconv.ParseInt(n.text, 10, 32)
		if err != nil || v < 0 {
			return nil, fieldRefusal(n.field, fmt.Sprintf("must be a whole number, 0 or more, got %q", n.text))
		}
		*n.to = int32(v)
	}
	d, err := parseTenantSpan(f.Duration)
	if err != nil {
		return nil, fieldRefusal("duration", fmt.Sprintf("must be a span such as 90m, 4h or 1d, got %q", f.Duration))
	}
	req.DurationSeconds = int64(d / time.Second)
	return req, nil
}

// parseTenantSpan reads a duration that may also count days: 90m, 4h, 1d, 1d12h.
func parseTenantSpan(s string) (time.Duration, error) {
	var days time.Duration
	if i := strings.IndexByte(s, 'd'); i > 0 {
		n, err := strconv.Atoi(s[:i])
		if err != nil || n < 0 {
			return 0, fmt.Errorf("bad day count %q", s[:i])
		}
		days, s = time.Duration(n)*24*time.Hour, s[i+1:]
		if s == "" {
			return days, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("bad span %q", s)
	}
	return days + d, nil
}

// reserveNew draws the form on a page of its own (the reservations page
// carries it too).
func (c *Console) reserveNew(w http.ResponseWriter, r *http.Request, s *session) {
	p := page{Title: "Reserve GPUs", Nav: navReservations, Viewer: &s.viewer, CSRF: s.row.CSRFToken}
	c.render(w, r, http.StatusOK, reservePage(p, newReserveForm(), nil))
}

// previewView is what the preview fragment shows of PreviewReservation's
// answer, or why there is none.
type previewView struct {
	// Hint: the form is not filled in enough to ask yet.
	Hint string
	Err  *apiError
	// Asked: the API answered.
	Asked, Feasible     bool
	Node, Atoms, Cpuset string
	NUMA, Island        string
	Score               string
	Start, End          string
	Explanation         *explanationView
	Quota               []quotaLine
	QuotaExceeded       bool
	Cost, CostPerHour   string
	Budget              string
	BudgetExceeded      bool
}

// explanationView is the API's explanation: why each class of nodes was
// rejected.
type explanationView struct {
	Evaluated, Feasible int32
	Summary             string
	Lines               []explanationLine
}

// Text is the explanation's counts and the API's summary in one line.
func (e explanationView) Text() string {
	s := fmt.Sprintf("%d nodes evaluated, %d could take it", e.Evaluated, e.Feasible)
	if e.Summary != "" {
		s += ": " + e.Summary
	}
	return s
}

type explanationLine struct {
	Class, Reason string
	Nodes         int32
}

type quotaLine struct {
	Scope, GPUs, GPUHours string
	Exceeded              bool
}

func explanationOf(e *apiv1.Explanation) *explanationView {
	if e == nil {
		return nil
	}
	v := &explanationView{Evaluated: e.GetEvaluated(), Feasible: e.GetFeasible(), Summary: e.GetSummary()}
	for _, l := range e.GetLines() {
		v.Lines = append(v.Lines, explanationLine{Class: l.GetClass(), Reason: l.GetReason(), Nodes: l.GetNodes()})
	}
	return v
}

func placementIndex(i int32, several string) string {
	if i < 0 {
		return several
	}
	return strconv.Itoa(int(i))
}

func quotaLimitText(v float64) string {
	if v < 0 {
		return "unlimited"
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

func previewViewOf(res *apiv1.PreviewReservationResponse) previewView {
	v := previewView{Asked: true, Feasible: res.GetFeasible(), Explanation: explanationOf(res.GetExplanation())}
	if pl := res.GetPlacement(); pl != nil && res.GetFeasible() {
		v.Node = cmp.Or(pl.GetNodeName(), pl.GetNodeId())
		v.Atoms = strings.Join(pl.GetAtoms(), ", ")
		v.Cpuset = cmp.Or(pl.GetCpuset(), "—")
		v.NUMA = placementIndex(pl.GetNuma(), "spans several")
		v.Island = placementIndex(pl.GetIsland(), "none or several")
		if sc := pl.GetScore(); sc != nil {
			v.Score = strconv.FormatFloat(sc.GetTotal(), 'f', 2, 64)
		}
	}
	if res.GetStartTime() != nil || res.GetEndTime() != nil {
		v.Start, v.End = when(res.GetStartTime()), when(res.GetEndTime())
	}
	if q := res.GetQuota(); q != nil {
		v.QuotaExceeded = q.GetExceeded()
		for _, u := range q.GetUses() {
			v.Quota = append(v.Quota, quotaLine{Scope: u.GetScope(),
				GPUs:     fmt.Sprintf("%d + %d of %s", u.GetGpusUsed(), u.GetGpusRequested(), quotaLimitText(float64(u.GetGpusLimit()))),
				GPUHours: fmt.Sprintf("%.1f + %.1f of %s", u.GetGpuHoursUsed(), u.GetGpuHoursRequested(), quotaLimitText(u.GetGpuHoursLimit())),
				Exceeded: u.GetExceeded()})
		}
	}
	if b := res.GetBudget(); b != nil {
		v.Cost, v.CostPerHour = b.GetCost(), b.GetCostPerHour()
		if b.GetHasBudget() {
			v.Budget = fmt.Sprintf("%s budget %s: %s committed, %s requested, %s left", b.GetEnforcement(), b.GetAmount(),
				b.GetCommitted(), b.GetRequested(), b.GetLeft())
			v.BudgetExceeded = b.GetExceeded()
		}
	}
	return v
}

// reservePreview answers the form's live preview: where Create would place
// the request now and why other nodes do not fit, as a fragment the page
// swaps in. It books nothing.
func (c *Console) reservePreview(w http.ResponseWriter, r *http.Request, s *session) {
	f := reserveFormOf(r)
	if f.Pool == "" {
		c.render(w, r, http.StatusOK, reservePreviewBox(previewView{Hint: "Name a pool to see where the reservation would go."}))
		return
	}
	req, bad := f.request(tenantOf(r, s))
	if bad != nil {
		c.render(w, r, http.StatusOK, reservePreviewBox(previewView{Err: bad}))
		return
	}
	res, err := s.api.Reservations.Preview(r.Context(), connect.NewRequest(&apiv1.PreviewReservationRequest{Request: req}))
	if err != nil {
		// The fragment answers 200 so the preview box always shows the
		// refusal in place; the API's code says what it was.
		e := apiErrorOf(err)
		c.render(w, r, http.StatusOK, reservePreviewBox(previewView{Err: &e}))
		return
	}
	c.render(w, r, http.StatusOK, reservePreviewBox(previewViewOf(res.Msg)))
}

// reserve creates the reservation with the viewer's key and the form's
// idempotency key, then shows it; a refusal draws the form again with the
// API's message and code (and, for lack of capacity, its explanation).
func (c *Console) reserve(w http.ResponseWriter, r *http.Request, s *session) {
	f := reserveFormOf(r)
	tenant := tenantOf(r, s)
	p := page{Title: "Reserve GPUs", Nav: navReservations, Viewer: &s.viewer, CSRF: s.row.CSRFToken}
	req, bad := f.request(tenant)
	if bad != nil {
		f.IdempotencyKey = cmp.Or(f.IdempotencyKey, client.NewIdempotencyKey())
		c.render(w, r, http.StatusBadRequest, reservePage(p, f, &previewView{Err: bad}))
		return
	}
	creq := connect.NewRequest(req)
	if f.IdempotencyKey != "" {
		creq.Header().Set(client.HeaderIdempotencyKey, f.IdempotencyKey)
	}
	res, err := s.api.Reservations.Create(r.Context(), creq)
	if err != nil {
		e := apiErrorOf(err)
		v := previewView{Err: &e}
		if d := client.Detail(err); d != nil {
			v.Explanation = explanationOf(d.GetExplanation())
		}
		// A refused create booked nothing: the same form may be sent
		// again, so it keeps its key.
		c.render(w, r, httpStatus(err), reservePage(p, f, &v))
		return
	}
	rsv := res.Msg.GetReservation()
	to := reservationURL(rsv.GetId(), "")
	if s.viewer.TenantID == "" {
		to = reservationURL(rsv.GetId(), rsv.GetTenantId())
	}
	http.Redirect(w, r, string(to), http.StatusSeeOther)
}

// timelineEntry is one dated line of a reservation's timeline.
type timelineEntry struct {
	Time   time.Time
	Label  string
	Detail string
}

func (e timelineEntry) When() string     { return e.Time.UTC().Format("2006-01-02 15:04:05 UTC") }
func (e timelineEntry) Datetime() string { return e.Time.UTC().Format(time.RFC3339) }

// endedStates are the states a reservation ends in.
var endedStates = []string{"released", "expired", "failed", "canceled"}

// timelineOf is the reservation's timeline from the times the API gives:
// created, its window's start, each condition's change, a kubernetes
// release, its end, and its last change, oldest first.
func timelineOf(x *apiv1.Reservation) []timelineEntry {
	var out []timelineEntry
	add := func(ts *timestamppb.Timestamp, label, detail string) {
		if ts != nil {
			out = append(out, timelineEntry{Time: ts.AsTime(), Label: label, Detail: detail})
		}
	}
	add(x.GetCreateTime(), "Created", "by "+cmp.Or(x.GetCreatedBy(), "—"))
	placed := "window starts"
	if n := cmp.Or(x.GetPlacement().GetNodeName(), x.GetPlacement().GetNodeId()); n != "" {
		placed += ", placed on " + n
	}
	add(x.GetStartTime(), "Starts", placed)
	for _, cd := range x.GetConditions() {
		add(cd.GetUpdateTime(), "Condition "+cd.GetType()+" "+cd.GetStatus(), strings.TrimSpace(cd.GetReason()+" "+cd.GetMessage()))
	}
	add(x.GetReleaseTime(), "Releasing", "the node's pods still hold its GPUs; it ends as "+cmp.Or(x.GetEndsAs(), "released"))
	ended := slices.Contains(endedStates, x.GetState())
	if ended {
		// An ended reservation's end_time is when it ended.
		add(x.GetEndTime(), "Ended", x.GetState())
	} else {
		add(x.GetEndTime(), "Ends", "the booking's end")
	}
	if !ended {
		add(x.GetUpdateTime(), "Now "+x.GetState(), "its last change")
	}
	slices.SortStableFunc(out, func(a, b timelineEntry) int { return a.Time.Compare(b.Time) })
	return out
}

func previewURL() string { return PathReservationPreview }

func reserveURL() templ.SafeURL { return templ.SafeURL(PathReservations) }
