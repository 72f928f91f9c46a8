package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
)

// reservationsFake is an in-memory ReservationService behind the generated
// Connect handler: it records what the CLI sent and answers with canned
// reservations, or with the error a test set.
type reservationsFake struct {
	f *fake

	mu       sync.Mutex
	creates  []*apiv1.CreateReservationRequest
	arrays   []*apiv1.CreateReservationsRequest
	previews []*apiv1.PreviewReservationRequest
	lists    []*apiv1.ListReservationsRequest
	extends  []*apiv1.ExtendReservationRequest
	watches  []*apiv1.WatchReservationsRequest
	byID     map[string]*apiv1.Reservation
	order    []string
	// moving are the reservations a test created; each Get moves them
	// one step along path.
	moving map[string]bool
	// createErr answers every create when set.
	createErr error
	// path is the states a reservation moves through, one per Get;
	// pending → placed → active unless a test says otherwise.
	path []string
	// preview is the canned Preview answer.
	preview *apiv1.PreviewReservationResponse
	execs   []*apiv1.ExecReservationRequest
	// execEvents is what every Exec streams.
	execEvents []*apiv1.ExecReservationResponse
}

var (
	rsvStart = timestamppb.New(time.Date(2025, 1, 2, 4, 0, 0, 0, time.UTC))
	rsvEnd   = timestamppb.New(time.Date(2025, 1, 2, 8, 0, 0, 0, time.UTC))
)

func placedOnGPU1() *apiv1.Placement {
	return &apiv1.Placement{NodeId: "nod_1", NodeName: "gpu-1", GpuModel: "H100", Atoms: []string{"GPU-aaa", "GPU-bbb"},
		Numa: 0, Cpuset: "0-15", Island: -1, Score: &apiv1.PlacementScore{Binpack: 0.8, Topology: 1, Fragmentation: 0.9, Spread: 0.5, Total: 0.85}}
}

func noCapacity() *apiv1.Explanation {
	return &apiv1.Explanation{Evaluated: 15, Feasible: 0, Summary: "12 nodes: not enough NVLink-connected GPUs; 3 nodes: tainted dedicated=acme",
		Lines: []*apiv1.ExplanationLine{
			{Class: "H100/h100/8gpu", Reason: "not enough NVLink-connected GPUs", Nodes: 12},
			{Class: "H100/h100/4gpu", Reason: "tainted dedicated=acme", Nodes: 3},
		}}
}

func setupReservations(t *testing.T) (*bundle, *reservationsFake) {
	t.Helper()
	rf := &reservationsFake{f: newFake(), byID: map[string]*apiv1.Reservation{}, moving: map[string]bool{}, path: []string{"pending", "placed", "active"}}
	for i, state := range []string{"active", "pending", "released"} {
		r := &apiv1.Reservation{Id: fmt.Sprintf("rsv_%d", i+1), TenantId: "ten_1", ProjectId: "prj_1", PoolId: "pol_1", Pool: "h100", State: state,
			Spec: &apiv1.ReservationSpec{Gpus: 2, Model: "H100", Vcpu: 16, MemoryGib: 128, Binding: "node"}, StartTime: rsvStart, EndTime: rsvEnd,
			CreatedBy: "usr_root", CreateTime: created, UpdateTime: created}
		if state == "active" {
			r.Placement = placedOnGPU1()
			r.Conditions = []*apiv1.ReservationCondition{{Type: "DevicesHeld", Status: "true", Reason: "CgroupApplied", Message: "2 GPUs held", UpdateTime: created}}
		}
		if state == "pending" {
			r.Explanation = noCapacity()
		}
		rf.add(r)
	}
	opt := connect.WithInterceptors(recorder{rf.f})
	mux := http.NewServeMux()
	mux.Handle(apiv1connect.NewIdentityServiceHandler(identitySvc{rf.f}, opt))
	mux.Handle(apiv1connect.NewReservationServiceHandler(fakeReservations{rf}, opt))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	b := &bundle{f: rf.f, srv: srv, cfgPath: filepath.Join(dir, "cfg", "config.yaml"), env: map[string]string{"HOME": dir}}
	// A tenant's key: --tenant defaults to the token's tenant.
	b.f.me = &apiv1.WhoAmIResponse{PrincipalId: "svc_1", Kind: "service", Role: "member", TenantId: "ten_1", TenantName: "acme"}
	return b, rf
}

func (rf *reservationsFake) add(r *apiv1.Reservation) {
	rf.byID[r.GetId()] = r
	rf.order = append(rf.order, r.GetId())
}

// locked runs fn with the fake's lock held, for a test to set up answers
// or read what was recorded.
func (rf *reservationsFake) locked(fn func()) {
	rf.mu.Lock()
	defer rf.mu.Unlock()
	fn()
}

func (rf *reservationsFake) lastCreate(t *testing.T) *apiv1.CreateReservationRequest {
	t.Helper()
	rf.mu.Lock()
	defer rf.mu.Unlock()
	require.NotEmpty(t, rf.creates)
	return rf.creates[len(rf.creates)-1]
}

type fakeReservations struct{ rf *reservationsFake }

func (s fakeReservations) get(id string) (*apiv1.Reservation, error) {
	r, ok := s.rf.byID[id]
	if !ok {
		return nil, apiError(connect.CodeNotFound, "NOT_FOUND", "reservation "+id+" not found", "")
	}
	return r, nil
}

func (s fakeReservations) Create(_ context.Context, req *connect.Request[apiv1.CreateReservationRequest]) (*connect.Response[apiv1.CreateReservationResponse], error) {
	if err := s.rf.f.unavailable(); err != nil {
		return nil, err
	}
	s.rf.mu.Lock()
	defer s.rf.mu.Unlock()
	m := req.Msg
	s.rf.creates = append(s.rf.creates, m)
	if s.rf.createErr != nil {
		return nil, s.rf.createErr
	}
	r := &apiv1.Reservation{Id: fmt.Sprintf("rsv_%d", len(s.rf.order)+1), TenantId: "ten_1", Pool: m.GetPool(), State: s.rf.path[0],
		Spec:      &apiv1.ReservationSpec{Gpus: m.GetGpus(), Model: m.GetModel(), MigProfile: m.GetMigProfile(), Slots: m.GetSlots(), Binding: "node"},
		StartTime: rsvStart, EndTime: rsvEnd, CreateTime: created, UpdateTime: created}
	s.rf.add(r)
	s.rf.moving[r.GetId()] = true
	return connect.NewResponse(&apiv1.CreateReservationResponse{Reservation: r}), nil
}

// CreateReservations books min_count (else count) placed reservations,
// saying why the rest were not when it books fewer.
func (s fakeReservations) CreateReservations(_ context.Context, req *connect.Request[apiv1.CreateReservationsRequest]) (*connect.Response[apiv1.CreateReservationsResponse], error) {
	s.rf.mu.Lock()
	defer s.rf.mu.Unlock()
	m := req.Msg
	s.rf.arrays = append(s.rf.arrays, m)
	if s.rf.createErr != nil {
		return nil, s.rf.createErr
	}
	n, out := m.GetCount(), &apiv1.CreateReservationsResponse{}
	if m.GetMinCount() > 0 && m.GetMinCount() < n {
		n = m.GetMinCount()
		out.Shortfall = fmt.Sprintf("%d of %d booked: no room now", n, m.GetCount())
	}
	for range n {
		r := &apiv1.Reservation{Id: fmt.Sprintf("rsv_%d", len(s.rf.order)+1), TenantId: "ten_1", Pool: m.GetTemplate().GetPool(), State: "placed",
			Spec:      &apiv1.ReservationSpec{Gpus: m.GetTemplate().GetGpus(), Binding: "node"},
			Placement: placedOnGPU1(), StartTime: rsvStart, EndTime: rsvEnd, CreateTime: created, UpdateTime: created}
		s.rf.add(r)
		out.Reservations = append(out.Reservations, r)
	}
	return connect.NewResponse(out), nil
}

func (s fakeReservations) Preview(_ context.Context, req *connect.Request[apiv1.PreviewReservationRequest]) (*connect.Response[apiv1.PreviewReservationResponse], error) {
	s.rf.mu.Lock()
	defer s.rf.mu.Unlock()
	s.rf.previews = append(s.rf.previews, req.Msg)
	return connect.NewResponse(s.rf.preview), nil
}

// Get moves a reservation the test created one step along path per read.
func (s fakeReservations) Get(_ context.Context, req *connect.Request[apiv1.GetReservationRequest]) (*connect.Response[apiv1.GetReservationResponse], error) {
	s.rf.mu.Lock()
	defer s.rf.mu.Unlock()
	r, err := s.get(req.Msg.GetReservation())
	if err != nil {
		return nil, err
	}
	if !s.rf.moving[r.GetId()] {
		return connect.NewResponse(&apiv1.GetReservationResponse{Reservation: r}), nil
	}
	for i, st := range s.rf.path[:len(s.rf.path)-1] {
		if r.GetState() == st {
			r.State = s.rf.path[i+1]
			break
		}
	}
	switch r.GetState() {
	case "placed", "active":
		r.Placement = placedOnGPU1()
	case "failed":
		r.Conditions = []*apiv1.ReservationCondition{{Type: "BindTimeout", Status: "true", Reason: "AgentSilent", Message: "the agent did not bind within 2m"}}
	}
	return connect.NewResponse(&apiv1.GetReservationResponse{Reservation: r}), nil
}

func (s fakeReservations) List(_ context.Context, req *connect.Request[apiv1.ListReservationsRequest]) (*connect.Response[apiv1.ListReservationsResponse], error) {
	s.rf.mu.Lock()
	defer s.rf.mu.Unlock()
	s.rf.lists = append(s.rf.lists, req.Msg)
	var out []*apiv1.Reservation
	for _, id := range s.rf.order {
		r := s.rf.byID[id]
		if req.Msg.GetState() == "" || strings.Contains(","+req.Msg.GetState()+",", ","+r.GetState()+",") {
			out = append(out, r)
		}
	}
	items, next := page(s.rf.f, out, req.Msg.GetPageToken(), req.Msg.GetPageSize())
	return connect.NewResponse(&apiv1.ListReservationsResponse{Reservations: items, NextPageToken: next}), nil
}

// Watch sends one change per reservation after the cursor (an index) and
// ends the stream, so a test's watch returns instead of waiting for Ctrl-C.
func (s fakeReservations) Watch(_ context.Context, req *connect.Request[apiv1.WatchReservationsRequest], stream *connect.ServerStream[apiv1.WatchReservationsResponse]) error {
	s.rf.mu.Lock()
	s.rf.watches = append(s.rf.watches, req.Msg)
	var evs []*apiv1.WatchReservationsResponse
	after, _ := strconv.Atoi(req.Msg.GetCursor())
	for i, id := range s.rf.order {
		if i+1 <= after || (req.Msg.GetReservation() != "" && id != req.Msg.GetReservation()) {
			continue
		}
		r := s.rf.byID[id]
		evs = append(evs, &apiv1.WatchReservationsResponse{Type: "reservation." + r.GetState(), Reservation: r, Cursor: strconv.Itoa(i + 1)})
	}
	s.rf.mu.Unlock()
	for _, ev := range evs {
		if err := stream.Send(ev); err != nil {
			return err
		}
	}
	return nil
}

func (s fakeReservations) Exec(_ context.Context, req *connect.Request[apiv1.ExecReservationRequest], stream *connect.ServerStream[apiv1.ExecReservationResponse]) error {
	s.rf.mu.Lock()
	s.rf.execs = append(s.rf.execs, req.Msg)
	evs := s.rf.execEvents
	_, err := s.get(req.Msg.GetReservation())
	s.rf.mu.Unlock()
	if err != nil {
		return err
	}
	for _, ev := range evs {
		if err := stream.Send(ev); err != nil {
			return err
		}
	}
	return nil
}

func (s fakeReservations) Extend(_ context.Context, req *connect.Request[apiv1.ExtendReservationRequest]) (*connect.Response[apiv1.ExtendReservationResponse], error) {
	s.rf.mu.Lock()
	defer s.rf.mu.Unlock()
	s.rf.extends = append(s.rf.extends, req.Msg)
	r, err := s.get(req.Msg.GetReservation())
	if err != nil {
		return nil, err
	}
	if req.Msg.GetExtendSeconds() > 100*3600 {
		return nil, quotaExceeded()
	}
	end := r.GetEndTime().AsTime().Add(time.Duration(req.Msg.GetExtendSeconds()) * time.Second)
	if req.Msg.GetEndTime() != nil {
		end = req.Msg.GetEndTime().AsTime()
	}
	r.EndTime = timestamppb.New(end)
	return connect.NewResponse(&apiv1.ExtendReservationResponse{Reservation: r}), nil
}

func (s fakeReservations) Release(_ context.Context, req *connect.Request[apiv1.ReleaseReservationRequest]) (*connect.Response[apiv1.ReleaseReservationResponse], error) {
	if err := s.rf.f.unavailable(); err != nil {
		return nil, err
	}
	s.rf.mu.Lock()
	defer s.rf.mu.Unlock()
	r, err := s.get(req.Msg.GetReservation())
	if err != nil {
		return nil, err
	}
	r.State = "released"
	return connect.NewResponse(&apiv1.ReleaseReservationResponse{Reservation: r}), nil
}

func (s fakeReservations) Cancel(_ context.Context, req *connect.Request[apiv1.CancelReservationRequest]) (*connect.Response[apiv1.CancelReservationResponse], error) {
	s.rf.mu.Lock()
	defer s.rf.mu.Unlock()
	r, err := s.get(req.Msg.GetReservation())
	if err != nil {
		return nil, err
	}
	if r.GetState() == "active" {
		return nil, apiError(connect.CodeFailedPrecondition, "FAILED_PRECONDITION", "reservation "+r.GetId()+" is active: release it instead", "")
	}
	r.State = "canceled"
	return connect.NewResponse(&apiv1.CancelReservationResponse{Reservation: r}), nil
}

// detailError is a refusal as the server sends it: a Connect code and an
// ErrorDetail carrying the machine code and its explanation or quota.
func detailError(code connect.Code, d *apiv1.ErrorDetail) error {
	cerr := connect.NewError(code, errors.New(d.GetMessage()))
	ed, err := connect.NewErrorDetail(d)
	if err != nil {
		panic(err)
	}
	cerr.AddDetail(ed)
	return cerr
}

func quotaExceeded() error {
	return detailError(connect.CodeResourceExhausted, &apiv1.ErrorDetail{Code: "QUOTA_EXCEEDED", Message: "quota exceeded: tenant gpu-hours",
		Quota: &apiv1.QuotaEffect{Exceeded: true, Uses: []*apiv1.QuotaUse{
			{QuotaId: "quo_1", Scope: "tenant", GpusLimit: 16, GpusUsed: 8, GpusRequested: 2, GpuHoursLimit: 1000, GpuHoursUsed: 995.5, GpuHoursRequested: 8, Exceeded: true},
			{QuotaId: "quo_2", Scope: "project/prj_1/model=H100", GpusLimit: -1, GpusUsed: 2, GpusRequested: 2, GpuHoursLimit: -1, GpuHoursUsed: 10, GpuHoursRequested: 8},
		}}})
}

func requireProto(t *testing.T, want, got proto.Message) {
	t.Helper()
	require.True(t, proto.Equal(want, got), "want:\n%s\ngot:\n%s", prototext.Format(want), prototext.Format(got))
}

func TestReserveFlagsToRequest(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want *apiv1.CreateReservationRequest
	}{
		{
			name: "duration and defaults",
			args: []string{"reserve", "--pool", "h100", "--gpus", "2", "--for", "1h"},
			want: &apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Gpus: 2, DurationSeconds: 3600},
		},
		{
			name: "window, model, host resources and binding",
			args: []string{"reservations", "create", "--tenant", "globex", "--project", "train", "--pool", "h100", "--gpus", "8", "--model", "H100",
				"--start", "2025-01-02T04:00:00Z", "--end", "2025-01-02T08:00:00+01:00", "--vcpu", "32", "--memory-gib", "256", "--hugepages-1gi", "4",
				"--binding", "kubernetes", "--single-tenant"},
			want: &apiv1.CreateReservationRequest{Tenant: "globex", Project: "train", Pool: "h100", Gpus: 8, Model: "H100",
				StartTime: rsvStart, EndTime: timestamppb.New(time.Date(2025, 1, 2, 7, 0, 0, 0, time.UTC)),
				Vcpu: 32, MemoryGib: 256, Hugepages_1Gi: 4, Binding: "kubernetes", SingleTenant: true},
		},
		{
			name: "mig",
			args: []string{"reserve", "--pool", "a100", "--gpus", "3", "--mig", "1g.10gb", "--for", "90m"},
			want: &apiv1.CreateReservationRequest{Tenant: "acme", Pool: "a100", Gpus: 3, MigProfile: "1g.10gb", DurationSeconds: 5400},
		},
		{
			name: "slots",
			args: []string{"reserve", "--pool", "shared", "--slots", "4", "--binding", "none"},
			want: &apiv1.CreateReservationRequest{Tenant: "acme", Pool: "shared", Slots: 4, Binding: "none"},
		},
		{
			name: "zero gpus is the server's to refuse",
			args: []string{"reserve", "--pool", "h100", "--gpus", "0", "--for", "1h"},
			want: &apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", DurationSeconds: 3600},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, rf := setupReservations(t)
			b.ok(t, tt.args...)
			requireProto(t, tt.want, rf.lastCreate(t))
			calls := b.f.callsTo("ReservationService/Create")
			require.Len(t, calls, 1)
			require.NotEmpty(t, calls[0].header.Get("Idempotency-Key"), "create carries an Idempotency-Key")
		})
	}
}

func TestReserveArray(t *testing.T) {
	t.Parallel()
	b, rf := setupReservations(t)
	out := b.ok(t, "reserve", "--pool", "h100", "--gpus", "2", "--for", "1h", "--count", "4")
	var got *apiv1.CreateReservationsRequest
	rf.locked(func() {
		got = rf.arrays[len(rf.arrays)-1]
		require.Empty(t, rf.creates, "an array is one CreateReservations")
	})
	requireProto(t, &apiv1.CreateReservationsRequest{Count: 4,
		Template: &apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Gpus: 2, DurationSeconds: 3600}}, got)
	calls := b.f.callsTo("ReservationService/CreateReservations")
	require.Len(t, calls, 1)
	require.NotEmpty(t, calls[0].header.Get("Idempotency-Key"), "an array carries an Idempotency-Key")
	require.Equal(t, 5, strings.Count(out, "\n"), "a header and one row each: %s", out)
	for _, id := range []string{"rsv_4", "rsv_5", "rsv_6", "rsv_7"} {
		require.Contains(t, out, id)
	}

	// --min: a partial answer prints the rows booked and why not the rest.
	r := b.run(t, "", "reserve", "--pool", "h100", "--gpus", "1", "--count", "3", "--min", "2")
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	require.Contains(t, r.stderr, "partial array: 2 of 3 booked")
	require.Equal(t, 3, strings.Count(r.stdout, "\n"), r.stdout)

	// An array is answered at once: --wait does not apply.
	stderr := b.fail(t, "reserve", "--pool", "h100", "--gpus", "1", "--count", "3", "--wait", "1m")
	require.Contains(t, stderr, "invalid --wait: does not apply to an array")

	// A refusal prints like a create's.
	rf.locked(func() {
		rf.createErr = apiError(connect.CodeResourceExhausted, "NO_CAPACITY", "no capacity in pool h100: 1 of the array's 4 fit now", "")
	})
	stderr = b.fail(t, "reserve", "--pool", "h100", "--gpus", "8", "--count", "4")
	require.Contains(t, stderr, "NO_CAPACITY")
}

func TestReserveRelativeTimes(t *testing.T) {
	t.Parallel()
	b, rf := setupReservations(t)
	// Days: --for 1d, +1d.
	b.ok(t, "reserve", "--pool", "h100", "--gpus", "1", "--for", "1d")
	require.Equal(t, int64(24*3600), rf.lastCreate(t).GetDurationSeconds())
	b.ok(t, "reserve", "--pool", "h100", "--gpus", "1", "--for", "1d12h")
	require.Equal(t, int64(36*3600), rf.lastCreate(t).GetDurationSeconds())
	before := time.Now()
	b.ok(t, "reserve", "--pool", "h100", "--gpus", "1", "--start", "+1d", "--end", "+1d2h")
	require.WithinDuration(t, before.Add(24*time.Hour), rf.lastCreate(t).GetStartTime().AsTime(), time.Minute)
	require.WithinDuration(t, before.Add(26*time.Hour), rf.lastCreate(t).GetEndTime().AsTime(), time.Minute)

	before = time.Now()
	b.ok(t, "reserve", "--pool", "h100", "--gpus", "1", "--start", "+2h", "--end", "+6h30m")
	after := time.Now()
	got := rf.lastCreate(t)
	require.WithinRange(t, got.GetStartTime().AsTime(), before.Add(2*time.Hour), after.Add(2*time.Hour))
	require.WithinRange(t, got.GetEndTime().AsTime(), before.Add(6*time.Hour+30*time.Minute), after.Add(6*time.Hour+30*time.Minute))
	require.Zero(t, got.GetDurationSeconds())

	// The same relative start in preview.
	rf.locked(func() { rf.preview = &apiv1.PreviewReservationResponse{Feasible: true, Placement: placedOnGPU1()} })
	b.ok(t, "reservations", "preview", "--pool", "h100", "--gpus", "1", "--start", "+1h", "--end", "+2h")
	rf.locked(func() {
		require.WithinDuration(t, time.Now().Add(time.Hour), rf.previews[0].GetRequest().GetStartTime().AsTime(), time.Minute)
	})
}

func TestReserveTenantDefaults(t *testing.T) {
	t.Parallel()
	b, rf := setupReservations(t)

	// From the context, without asking the server who we are.
	b.env[envServer], b.env[envToken] = "", ""
	cfg := &Config{}
	cfg.Upsert(Context{Name: "globex", Server: b.srv.URL, Token: "ctx-token", Tenant: "globex"}, true)
	require.NoError(t, cfg.Save(b.cfgPath))
	b.ok(t, "reserve", "--pool", "h100", "--gpus", "1")
	require.Equal(t, "globex", rf.lastCreate(t).GetTenant())
	require.Empty(t, b.f.callsTo("WhoAmI"))

	// A platform token has no tenant: reserving needs --tenant.
	b.env[envServer], b.env[envToken] = b.srv.URL, token
	require.NoError(t, (&Config{}).Save(b.cfgPath))
	b.f.me = &apiv1.WhoAmIResponse{PrincipalId: "usr_root", Role: "platform-admin"}
	r := b.run(t, "", "reserve", "--pool", "h100", "--gpus", "1")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "invalid --tenant: required")
}

func TestReserveOutput(t *testing.T) {
	t.Parallel()
	b, rf := setupReservations(t)
	rf.locked(func() { rf.path = []string{"placed"} })

	out := b.ok(t, "reserve", "--pool", "h100", "--gpus", "2", "--model", "H100", "--for", "4h")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2)
	require.Equal(t, []string{"ID", "STATE", "POOL", "NODE", "GPUS", "ATOMS", "START", "END"}, strings.Fields(lines[0]))
	require.Equal(t, []string{"rsv_4", "placed", "h100", "-", "2", "×", "H100", "-", "2025-01-02T04:00:00Z", "2025-01-02T08:00:00Z"}, strings.Fields(lines[1]))

	var js struct {
		Reservation struct {
			ID, State, Pool string
			Spec            struct{ Gpus int32 }
		} `json:"reservation"`
	}
	out = b.ok(t, "reserve", "--pool", "h100", "--gpus", "2", "-o", "json")
	require.NoError(t, json.Unmarshal([]byte(out), &js))
	require.Equal(t, "rsv_5", js.Reservation.ID)
	require.Equal(t, "placed", js.Reservation.State)
	require.EqualValues(t, 2, js.Reservation.Spec.Gpus)
}

func TestReserveRetriesWithTheSameKey(t *testing.T) {
	t.Parallel()
	b, rf := setupReservations(t)
	b.f.failCreates = 2
	b.ok(t, "reserve", "--pool", "h100", "--gpus", "1")
	calls := b.f.callsTo("ReservationService/Create")
	require.Len(t, calls, 3)
	key := calls[0].header.Get("Idempotency-Key")
	require.NotEmpty(t, key)
	for _, c := range calls {
		require.Equal(t, key, c.header.Get("Idempotency-Key"))
	}
	rf.locked(func() { require.Len(t, rf.creates, 1, "the failed tries never reached the service") })
}

func TestReserveNoCapacity(t *testing.T) {
	t.Parallel()
	b, rf := setupReservations(t)
	rf.locked(func() {
		rf.createErr = detailError(connect.CodeResourceExhausted, &apiv1.ErrorDetail{Code: "NO_CAPACITY", Message: "no node of pool h100 fits 4 GPUs",
			Explanation: noCapacity()})
	})

	r := b.run(t, "", "reserve", "--pool", "h100", "--gpus", "4", "--for", "1h")
	require.Equal(t, 1, r.code)
	require.Empty(t, r.stdout)
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	require.Len(t, lines, 5, r.stderr)
	require.Equal(t, []string{"CLASS", "NODES", "REASON"}, strings.Fields(lines[0]))
	require.Regexp(t, `^H100/h100/8gpu\s+12\s+not enough NVLink-connected GPUs$`, lines[1])
	require.Regexp(t, `^H100/h100/4gpu\s+3\s+tainted dedicated=acme$`, lines[2])
	require.Equal(t, "15 nodes evaluated, 0 feasible: 12 nodes: not enough NVLink-connected GPUs; 3 nodes: tainted dedicated=acme", lines[3])
	require.Equal(t, "Error: NO_CAPACITY: no node of pool h100 fits 4 GPUs", lines[4])

	rf.locked(func() { rf.createErr = quotaExceeded() })
	r = b.run(t, "", "reservations", "create", "--pool", "h100", "--gpus", "2", "--for", "4h", "-o", "json")
	require.Equal(t, 1, r.code)
	require.Empty(t, r.stdout)
	// -o json: the refusal's detail as JSON, then the one-line error.
	detail, _, ok := strings.Cut(r.stderr, "\nError: ")
	require.True(t, ok, r.stderr)
	var d struct {
		Code  string
		Quota struct{ Uses []struct{ Scope string } }
	}
	require.NoError(t, json.Unmarshal([]byte(detail), &d), r.stderr)
	require.Equal(t, "QUOTA_EXCEEDED", d.Code)
	require.Len(t, d.Quota.Uses, 2)
	require.Equal(t, "project/prj_1/model=H100", d.Quota.Uses[1].Scope)
	require.Contains(t, r.stderr, "Error: QUOTA_EXCEEDED: quota exceeded: tenant gpu-hours")
	r = b.run(t, "", "reservations", "create", "--pool", "h100", "--gpus", "2", "--for", "4h")
	require.Regexp(t, `(?m)^SCOPE\s+GPUS\s+GPU-HOURS\s+EXCEEDED$`, r.stderr)
	require.Regexp(t, `(?m)^tenant\s+8\+2/16\s+995\.5\+8/1000\s+yes$`, r.stderr)
	require.Regexp(t, `(?m)^project/prj_1/model=H100\s+2\+2/unlimited\s+10\+8/unlimited\s+no$`, r.stderr)

	// Any other refusal prints just the error.
	rf.locked(func() {
		rf.createErr = apiError(connect.CodeInvalidArgument, "INVALID_ARGUMENT", "invalid gpus: must be at least 1", "",
			&apiv1.FieldViolation{Field: "gpus", Reason: "must be at least 1"})
	})
	r = b.run(t, "", "reserve", "--pool", "h100", "--gpus", "0")
	require.Equal(t, 1, r.code)
	require.Equal(t, "Error: INVALID_ARGUMENT: invalid --gpus: must be at least 1\n", r.stderr)
}

// TestReserveGang: --nodes, --gpus-per-node and --topology make one
// CreateReservations with a gang; preview sends the same fields and
// prints the gang's placements.
func TestReserveGang(t *testing.T) {
	t.Parallel()
	b, rf := setupReservations(t)
	b.ok(t, "reserve", "--pool", "h100", "--nodes", "4", "--gpus-per-node", "8", "--topology", "rack", "--for", "1h")
	var got *apiv1.CreateReservationsRequest
	rf.locked(func() {
		got = rf.arrays[len(rf.arrays)-1]
		require.Empty(t, rf.creates, "a gang is one CreateReservations")
	})
	requireProto(t, &apiv1.CreateReservationsRequest{Count: 4, Gang: &apiv1.Gang{Topology: "rack"},
		Template: &apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Gpus: 8, DurationSeconds: 3600}}, got)

	b.run(t, "", "reservations", "preview", "--pool", "h100", "--nodes", "16", "--gpus-per-node", "8", "--topology", "spine")
	rf.locked(func() {
		p := rf.previews[len(rf.previews)-1]
		require.Equal(t, int32(16), p.GetGangNodes())
		require.Equal(t, "spine", p.GetGangTopology())
		require.Equal(t, int32(8), p.GetRequest().GetGpus())
	})
	var out strings.Builder
	previewTable(&out, &apiv1.PreviewReservationResponse{Feasible: true, GangDomain: "r2", GangPlacements: []*apiv1.Placement{
		{NodeName: "n1", Atoms: []string{"g1"}}, {NodeName: "n2", Atoms: []string{"g2"}}}})
	require.Contains(t, out.String(), "would place the gang of 2 in domain r2:")
	require.Contains(t, out.String(), "  n2: atoms g2")
}

func TestReserveBadFlags(t *testing.T) {
	t.Parallel()
	b, rf := setupReservations(t)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"reserve", "--pool", "h100", "--gpus", "1", "--for", "1h", "--start", "+1h"}, "invalid --for: give either --for or a --start/--end window, not both"},
		{[]string{"reserve", "--pool", "h100", "--gpus", "1", "--for", "1h", "--end", "+1h"}, "invalid --for: give either --for or a --start/--end window, not both"},
		{[]string{"reserve", "--pool", "h100", "--gpus", "1", "--start", "tomorrow"}, "invalid --start: must be RFC 3339"},
		{[]string{"reserve", "--pool", "h100", "--gpus", "1", "--start", "+soon"}, "invalid --start: relative time must be +DURATION"},
		{[]string{"reserve", "--pool", "h100", "--gpus", "1", "--start", "-2h", "--for", "0"}, "invalid --start: -2h is in the past"},
		{[]string{"reserve", "--pool", "h100", "--gpus", "1", "--start", "-2h"}, "invalid --start: -2h is in the past"},
		{[]string{"reservations", "extend", "rsv_1", "--until", "-1d"}, "invalid --until: -1d is in the past"},
		{[]string{"reserve", "--pool", "h100", "--gpus", "1", "--for", "1x"}, `invalid argument "1x" for "--for" flag: must be a duration such as 90m, 4h or 1d`},
		{[]string{"reserve", "--pool", "h100", "--gpus", "1", "--for", "-1h"}, "invalid --for: must not be negative"},
		{[]string{"reserve", "--pool", "h100", "--gpus", "many"}, `invalid argument "many" for "--gpus"`},
		{[]string{"reserve", "--pool", "h100", "--gpus", "1", "--wait", "-1s"}, "invalid --wait: must not be negative"},
		{[]string{"reservations", "preview", "--pool", "h100", "--for", "1h", "--start", "+1h"}, "invalid --for: give either"},
		{[]string{"reserve", "extra"}, `unexpected argument "extra"`},
		{[]string{"reserve", "--pool", "h100", "--gpus-per-node", "8"}, "invalid --gpus-per-node: applies to a gang: give --nodes too"},
		{[]string{"reserve", "--pool", "h100", "--gpus", "8", "--topology", "rack"}, "invalid --topology: applies to a gang"},
		{[]string{"reserve", "--pool", "h100", "--nodes", "2", "--gpus", "4", "--gpus-per-node", "8"}, "invalid --gpus-per-node: give --gpus or --gpus-per-node, not both"},
		{[]string{"reserve", "--pool", "h100", "--nodes", "2", "--gpus-per-node", "8", "--count", "3"}, "invalid --count: a gang (--nodes) is its own count"},
		{[]string{"reserve", "--pool", "h100", "--nodes", "2", "--gpus-per-node", "8", "--wait", "1m"}, "invalid --wait: does not apply to a gang"},
	}
	for _, tt := range tests {
		r := b.run(t, "", tt.args...)
		require.Equal(t, 1, r.code, "%v", tt.args)
		require.True(t, strings.HasPrefix(r.stderr, "Error: "), "%v", tt.args)
		require.Contains(t, r.stderr, tt.want, "%v", tt.args)
	}
	rf.locked(func() {
		require.Empty(t, rf.creates, "a usage error sends nothing")
		require.Empty(t, rf.previews)
	})
}

func TestReserveWait(t *testing.T) {
	t.Parallel()
	b, rf := setupReservations(t)

	out := b.ok(t, "reserve", "--pool", "h100", "--gpus", "2", "--wait", "10s")
	require.Regexp(t, `(?m)^rsv_4\s+active\s+h100\s+gpu-1\s+2 × H100\s+2\s+`, out)
	require.Len(t, b.f.callsTo("ReservationService/Get"), 2, "pending → placed → active")

	rf.locked(func() { rf.path = []string{"pending", "binding", "failed"} })
	r := b.run(t, "", "reserve", "--pool", "h100", "--gpus", "2", "--wait", "10s")
	require.Equal(t, 1, r.code)
	require.Regexp(t, `(?m)^rsv_5\s+failed\s+`, r.stdout)
	require.Contains(t, r.stderr, "Error: ABORTED: reservation rsv_5 is failed: the agent did not bind within 2m")

	// Never placed: give up after --wait and say it is still pending.
	rf.locked(func() { rf.path = []string{"pending"} })
	r = b.run(t, "", "reserve", "--pool", "h100", "--gpus", "2", "--wait", "50ms")
	require.Equal(t, 1, r.code)
	require.Regexp(t, `(?m)^rsv_6\s+pending\s+`, r.stdout)
	require.Contains(t, r.stderr, "Error: DEADLINE_EXCEEDED: reservation rsv_6 still pending after 50ms")

	// Without --wait the first answer is the output.
	gets := len(b.f.callsTo("ReservationService/Get"))
	require.Regexp(t, `(?m)^rsv_7\s+pending\s+`, b.ok(t, "reserve", "--pool", "h100", "--gpus", "2"))
	require.Len(t, b.f.callsTo("ReservationService/Get"), gets)
}

func TestReservationsList(t *testing.T) {
	t.Parallel()
	b, rf := setupReservations(t)

	out := b.ok(t, "reservations", "list")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 4)
	require.Equal(t, []string{"ID", "STATE", "POOL", "NODE", "GPUS", "ATOMS", "START", "END"}, strings.Fields(lines[0]))
	require.Regexp(t, `^rsv_1\s+active\s+h100\s+gpu-1\s+2 × H100\s+2\s+2025-01-02T04:00:00Z\s+2025-01-02T08:00:00Z$`, lines[1])
	require.Regexp(t, `^rsv_2\s+pending\s+h100\s+-\s+2 × H100\s+-\s+`, lines[2])
	require.Len(t, b.f.callsTo("ReservationService/List"), 2, "follows next_page_token")

	b.ok(t, "reservations", "list", "--project", "train", "--pool", "h100", "--state", "active,pending", "--tenant", "globex", "--limit", "1")
	rf.locked(func() {
		requireProto(t, &apiv1.ListReservationsRequest{Tenant: "globex", Project: "train", Pool: "h100", State: "active,pending", PageSize: 1}, rf.lists[len(rf.lists)-1])
	})

	var js struct {
		Reservations []struct{ ID, State string } `json:"reservations"`
	}
	require.NoError(t, json.Unmarshal([]byte(b.ok(t, "reservations", "list", "--state", "pending", "-o", "json")), &js))
	require.Len(t, js.Reservations, 1)
	require.Equal(t, "rsv_2", js.Reservations[0].ID)
	rf.locked(func() {
		require.Equal(t, "acme", rf.lists[len(rf.lists)-1].GetTenant(), "the token's tenant by default")
	})

	// A platform token lists every tenant's.
	b.f.me = &apiv1.WhoAmIResponse{PrincipalId: "usr_root", Role: "platform-admin"}
	b.ok(t, "reservations", "list")
	rf.locked(func() { require.Empty(t, rf.lists[len(rf.lists)-1].GetTenant()) })
}

func TestReservationsGet(t *testing.T) {
	t.Parallel()
	b, _ := setupReservations(t)

	out := b.ok(t, "reservations", "get", "rsv_1")
	for _, want := range []string{
		`(?m)^ID:\s+rsv_1$`,
		`(?m)^STATE:\s+active$`,
		`(?m)^GPUS:\s+2 × H100$`,
		`(?m)^HOST:\s+16 vCPU, 128 GiB memory, 0 × 1 GiB huge pages$`,
		`(?m)^NODE:\s+gpu-1 \(nod_1\)$`,
		`(?m)^ATOMS:\s+GPU-aaa, GPU-bbb$`,
		`(?m)^NUMA:\s+0$`,
		`(?m)^CPUSET:\s+0-15$`,
		`(?m)^NVLINK ISLAND:\s+- \(none or several\)$`,
		`(?m)^SCORE:\s+0\.85 \(binpack 0\.80, topology 1\.00, fragmentation 0\.90, spread 0\.50\)$`,
		`(?m)^CONDITION\s+STATUS\s+REASON\s+MESSAGE\s+UPDATED$`,
		`(?m)^DevicesHeld\s+true\s+CgroupApplied\s+2 GPUs held\s+2025-01-02T03:04:05Z$`,
	} {
		require.Regexp(t, want, out)
	}

	var js struct {
		Reservation struct {
			Placement struct {
				NodeName string   `json:"nodeName"`
				Atoms    []string `json:"atoms"`
			} `json:"placement"`
		} `json:"reservation"`
	}
	// rsv_3 was released: no placement. rsv_2 is pending: its Get says why.
	out = b.ok(t, "reservations", "get", "rsv_3", "-o", "json")
	require.NoError(t, json.Unmarshal([]byte(out), &js))
	require.Empty(t, js.Reservation.Placement.NodeName)
	require.Contains(t, b.ok(t, "reservations", "get", "rsv_2"), "15 nodes evaluated, 0 feasible")

	r := b.run(t, "", "reservations", "get", "rsv_404")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "Error: NOT_FOUND: reservation rsv_404 not found")
	r = b.run(t, "", "reservations", "get")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "ID: required")
}

func TestReservationsPreview(t *testing.T) {
	t.Parallel()
	b, rf := setupReservations(t)
	quota := &apiv1.QuotaEffect{Uses: []*apiv1.QuotaUse{
		{Scope: "tenant", GpusLimit: 16, GpusUsed: 8, GpusRequested: 2, GpuHoursLimit: 1000, GpuHoursUsed: 120, GpuHoursRequested: 8},
	}}
	rf.locked(func() {
		rf.preview = &apiv1.PreviewReservationResponse{Feasible: true, Placement: placedOnGPU1(), StartTime: rsvStart, EndTime: rsvEnd, Quota: quota,
			Explanation: &apiv1.Explanation{Evaluated: 4, Feasible: 1, Summary: "3 nodes: not enough free GPUs",
				Lines: []*apiv1.ExplanationLine{{Class: "H100/h100/8gpu", Reason: "not enough free GPUs", Nodes: 3}}}}
	})

	out := b.ok(t, "reservations", "preview", "--pool", "h100", "--gpus", "2", "--for", "4h", "--mig", "1g.10gb")
	rf.locked(func() {
		requireProto(t, &apiv1.PreviewReservationRequest{Request: &apiv1.CreateReservationRequest{Tenant: "acme", Pool: "h100", Gpus: 2, MigProfile: "1g.10gb", DurationSeconds: 4 * 3600}},
			rf.previews[0])
	})
	require.Empty(t, b.f.callsTo("ReservationService/Create"), "preview books nothing")
	lines := strings.Split(out, "\n")
	require.Equal(t, "would place on gpu-1: atoms GPU-aaa, GPU-bbb", lines[0])
	require.Equal(t, "  numa 0, nvlink island - (none or several), cpuset 0-15, score 0.85", lines[1])
	require.Equal(t, "window: 2025-01-02T04:00:00Z to 2025-01-02T08:00:00Z", lines[2])
	require.Regexp(t, `(?m)^CLASS\s+NODES\s+REASON\n^H100/h100/8gpu\s+3\s+not enough free GPUs\n^4 nodes evaluated, 1 feasible: 3 nodes: not enough free GPUs$`, out)
	require.Regexp(t, `(?m)^SCOPE\s+GPUS\s+GPU-HOURS\s+EXCEEDED\n^tenant\s+8\+2/16\s+120\+8/1000\s+no\n^within quota$`, out)

	// Nothing fits: the table, and a non-zero exit a script can test.
	rf.locked(func() { rf.preview = &apiv1.PreviewReservationResponse{Explanation: noCapacity(), Quota: quota} })
	r := b.run(t, "", "reservations", "preview", "--pool", "h100", "--gpus", "4")
	require.Equal(t, 1, r.code)
	out = r.stdout
	require.True(t, strings.HasPrefix(out, "no node fits\n\nCLASS"), out)
	require.Contains(t, out, "15 nodes evaluated, 0 feasible: 12 nodes")
	require.Equal(t, "Error: NO_CAPACITY: no node of pool h100 fits the request now\n", r.stderr)

	var js struct {
		Feasible    bool `json:"feasible"`
		Explanation struct {
			Evaluated int `json:"evaluated"`
		} `json:"explanation"`
	}
	r = b.run(t, "", "reservations", "preview", "--pool", "h100", "--gpus", "4", "-o", "json")
	require.Equal(t, 1, r.code, "the exit code does not depend on the output format")
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &js))
	require.False(t, js.Feasible)
	require.Equal(t, 15, js.Explanation.Evaluated)
}

func TestReservationsExtendReleaseCancel(t *testing.T) {
	t.Parallel()
	b, rf := setupReservations(t)

	out := b.ok(t, "reservations", "extend", "rsv_1", "--for", "2h")
	require.Regexp(t, `(?m)^rsv_1\s+active\s+.*2025-01-02T10:00:00Z$`, out)
	rf.locked(func() {
		requireProto(t, &apiv1.ExtendReservationRequest{Tenant: "acme", Reservation: "rsv_1", ExtendSeconds: 7200}, rf.extends[0])
	})

	b.ok(t, "reservations", "extend", "rsv_1", "--until", "2025-01-03T00:00:00Z", "--tenant", "acme")
	rf.locked(func() {
		requireProto(t, &apiv1.ExtendReservationRequest{Tenant: "acme", Reservation: "rsv_1", EndTime: timestamppb.New(time.Date(2025, 1, 3, 0, 0, 0, 0, time.UTC))}, rf.extends[1])
	})

	r := b.run(t, "", "reservations", "extend", "rsv_1", "--for", "200h")
	require.Equal(t, 1, r.code)
	require.Regexp(t, `(?m)^tenant\s+8\+2/16\s+995\.5\+8/1000\s+yes$`, r.stderr)
	require.Contains(t, r.stderr, "Error: QUOTA_EXCEEDED")

	for _, args := range [][]string{
		{"reservations", "extend", "rsv_1"},
		{"reservations", "extend", "rsv_1", "--for", "1h", "--until", "+3h"},
		{"reservations", "extend", "rsv_1", "--until", "later"},
	} {
		r := b.run(t, "", args...)
		require.Equal(t, 1, r.code, "%v", args)
		require.Contains(t, r.stderr, "Error: INVALID_ARGUMENT", "%v", args)
	}
	rf.locked(func() { require.Len(t, rf.extends, 3, "refused flags send nothing") })

	// Release is idempotent: a lost answer is retried.
	b.f.failCreates = 1
	require.Regexp(t, `(?m)^rsv_1\s+released\s+`, b.ok(t, "reservations", "release", "rsv_1"))
	require.Len(t, b.f.callsTo("ReservationService/Release"), 2)
	require.Regexp(t, `(?m)^rsv_1\s+released\s+`, b.ok(t, "reservations", "release", "rsv_1"))

	require.Regexp(t, `(?m)^rsv_2\s+canceled\s+`, b.ok(t, "reservations", "cancel", "rsv_2"))
	var js struct {
		Reservation struct{ State string } `json:"reservation"`
	}
	require.NoError(t, json.Unmarshal([]byte(b.ok(t, "reservations", "cancel", "rsv_2", "-o", "json")), &js))
	require.Equal(t, "canceled", js.Reservation.State)
	rf.locked(func() { rf.byID["rsv_3"].State = "active" })
	r = b.run(t, "", "reservations", "cancel", "rsv_3")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "Error: FAILED_PRECONDITION: reservation rsv_3 is active: release it instead")
}

func TestReservationsWatch(t *testing.T) {
	t.Parallel()
	b, rf := setupReservations(t)

	out := b.watchEnds(t, "reservation stream; resume with --cursor 3", "reservations", "watch")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 4)
	require.Equal(t, []string{"TIME", "TYPE", "ID", "STATE", "CURSOR"}, strings.Fields(lines[0]))
	require.Regexp(t, `^2025-01-02T03:04:05Z\s+reservation\.active\s+rsv_1\s+active\s+1$`, lines[1])
	require.Regexp(t, `^2025-01-02T03:04:05Z\s+reservation\.released\s+rsv_3\s+released\s+3$`, lines[3])
	rf.locked(func() { requireProto(t, &apiv1.WatchReservationsRequest{Tenant: "acme"}, rf.watches[0]) })

	out = b.watchEnds(t, "resume with --cursor 3", "reservations", "watch", "--cursor", "1", "-o", "json")
	lines = strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2)
	var ev struct {
		Type        string
		Cursor      string
		Reservation struct{ ID string }
	}
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &ev))
	require.Equal(t, "reservation.pending", ev.Type)
	require.Equal(t, "rsv_2", ev.Reservation.ID)
	require.Equal(t, "2", ev.Cursor)

	out = b.watchEnds(t, "resume with --cursor", "reservations", "watch", "rsv_2", "--tenant", "acme")
	require.Len(t, strings.Split(strings.TrimSpace(out), "\n"), 2)
	rf.locked(func() {
		requireProto(t, &apiv1.WatchReservationsRequest{Tenant: "acme", Reservation: "rsv_2"}, rf.watches[2])
		require.Equal(t, "1", rf.watches[1].GetCursor())
	})

	r := b.run(t, "", "reservations", "watch", "rsv_1", "rsv_2")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, `unexpected argument "rsv_2"`)
}

func TestReservationsWatchInterruptIsClean(t *testing.T) {
	t.Parallel()
	b, _ := setupReservations(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	a := newApp("dev", func(k string) (string, bool) {
		v := map[string]string{envServer: b.srv.URL, envToken: token, envConfig: b.cfgPath}[k]
		return v, v != ""
	})
	var out, errb strings.Builder
	require.Equal(t, 0, run(ctx, a, []string{"reservations", "watch", "--tenant", "acme"}, nil, &out, &errb), errb.String())
}
