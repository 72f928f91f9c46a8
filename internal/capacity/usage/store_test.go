package usage_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/capacity/usage"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

// quantities returns "metric@hour-offset=quantity" for each window.
func quantities(ws []usage.UsageWindow) []string {
	var out []string
	for _, w := range ws {
		out = append(out, w.Metric+"@"+strconv.FormatFloat(w.WindowStart.Sub(t0).Hours(), 'f', -1, 64)+"="+
			strconv.FormatFloat(w.Quantity, 'f', -1, 64))
	}
	return out
}

func TestRollupPartialHoursIdempotent(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	insertReservation(t, db, rsv{id: "rsv_a", tenant: "tnt_a", project: "prj_a", gpus: 2, vcpu: 8, mem: 64, gpuModel: "H100",
		since: at(0.5), until: ptr(at(2.25))})

	require.Equal(t, 9, rollup(t, db, at(3).Add(10*time.Minute)))
	got := list(t, db, usage.ListParams{})
	require.Equal(t, []string{
		"gpu.H100.hours@0=1", "memoryGiB.hours@0=32", "vcpu.hours@0=4",
		"gpu.H100.hours@1=2", "memoryGiB.hours@1=64", "vcpu.hours@1=8",
		"gpu.H100.hours@2=0.5", "memoryGiB.hours@2=16", "vcpu.hours@2=2",
	}, quantities(got))
	for _, w := range got {
		require.Equal(t, "tnt_a", w.TenantID)
		require.Equal(t, "prj_a", w.ProjectID)
		require.Equal(t, "rsv_a", w.ReservationID)
	}

	// Twice: nothing new, the same rows (update times included).
	require.Equal(t, 0, rollup(t, db, at(3).Add(10*time.Minute)))
	require.Equal(t, got, list(t, db, usage.ListParams{}))
	require.Equal(t, 0, rollup(t, db, at(7)))
	require.Equal(t, got, list(t, db, usage.ListParams{}))
}

func TestRollupWritesClosedHoursOnly(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	// No GPU model recorded at placement: the requested one, made safe for
	// the metric's dots. CPU-only reservations write no GPU metric.
	insertReservation(t, db, rsv{id: "rsv_b", tenant: "tnt_a", project: "prj_a", gpus: 1, model: "A100 80GB.sxm", since: at(0)})
	insertReservation(t, db, rsv{id: "rsv_c", tenant: "tnt_a", project: "prj_a", vcpu: 2, since: at(1.75)})

	require.Equal(t, 3, rollup(t, db, at(2.5)), "hours 0 and 1 of b, hour 1 of c; hour 2 is still open")
	require.Equal(t, []string{"gpu.A100-80GB-sxm.hours@0=1", "gpu.A100-80GB-sxm.hours@1=1", "vcpu.hours@1=0.5"},
		quantities(list(t, db, usage.ListParams{})))

	require.Equal(t, 2, rollup(t, db, at(3).Add(5*time.Minute)))
	setUntil(t, db, "rsv_b", at(3.5))
	require.Equal(t, 3, rollup(t, db, at(5)), "b's last half hour; c's hours 3 and 4")
	require.Equal(t, []string{
		"gpu.A100-80GB-sxm.hours@0=1", "gpu.A100-80GB-sxm.hours@1=1", "vcpu.hours@1=0.5",
		"gpu.A100-80GB-sxm.hours@2=1", "vcpu.hours@2=2",
		"gpu.A100-80GB-sxm.hours@3=0.5", "vcpu.hours@3=2",
		"vcpu.hours@4=2",
	}, quantities(list(t, db, usage.ListParams{})))
}

func TestRollupBoundedByCursor(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	insertReservation(t, db, rsv{id: "rsv_a", tenant: "tnt_a", project: "prj_a", vcpu: 1, since: at(0), until: ptr(at(2))})
	require.Equal(t, 2, rollup(t, db, at(10)))

	// Recorded late: an interval that ended within the grace hour before the
	// last closed hour is still rolled up from there; older ones are not
	// read again.
	insertReservation(t, db, rsv{id: "rsv_late", tenant: "tnt_a", project: "prj_a", vcpu: 1, since: at(7), until: ptr(at(9.5))})
	insertReservation(t, db, rsv{id: "rsv_old", tenant: "tnt_a", project: "prj_a", vcpu: 1, since: at(1), until: ptr(at(3))})
	require.Equal(t, 1, rollup(t, db, at(11)))
	require.Equal(t, []string{"rsv_a", "rsv_a", "rsv_late"}, func() []string {
		var ids []string
		for _, w := range list(t, db, usage.ListParams{}) {
			ids = append(ids, w.ReservationID)
		}
		return ids
	}())
}

func TestListFiltersAndCursor(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	insertReservation(t, db, rsv{id: "rsv_1", tenant: "tnt_a", project: "prj_a", gpus: 1, vcpu: 1, gpuModel: "H100", since: at(0)})
	insertReservation(t, db, rsv{id: "rsv_2", tenant: "tnt_a", project: "prj_b", vcpu: 1, since: at(0)})
	insertReservation(t, db, rsv{id: "rsv_3", tenant: "tnt_b", project: "prj_c", vcpu: 1, since: at(0)})
	require.Equal(t, 4*3, rollup(t, db, at(3)))

	require.Len(t, list(t, db, usage.ListParams{TenantID: "tnt_a"}), 3*3)
	require.Len(t, list(t, db, usage.ListParams{TenantID: "tnt_a", ProjectID: "prj_b"}), 3)
	require.Len(t, list(t, db, usage.ListParams{Metric: usage.MetricVCPUHours}), 3*3)
	require.Len(t, list(t, db, usage.ListParams{Metric: usage.GPUMetric("H100")}), 3)
	require.Len(t, list(t, db, usage.ListParams{Start: at(1), End: at(2)}), 4)
	require.Len(t, list(t, db, usage.ListParams{Start: at(1)}), 8)

	// Pages of 5 walk every window once, in order.
	all := list(t, db, usage.ListParams{})
	var paged []usage.UsageWindow
	var after *usage.Cursor
	for {
		page := list(t, db, usage.ListParams{After: after, Limit: 5})
		paged = append(paged, page...)
		if len(page) < 5 {
			break
		}
		last := page[len(page)-1]
		c, err := usage.ParseCursor(usage.Cursor{WindowStart: last.WindowStart, ReservationID: last.ReservationID, Metric: last.Metric}.String())
		require.NoError(t, err)
		after = &c
	}
	require.Equal(t, all, paged)
	_, err := usage.ParseCursor("nope")
	require.Error(t, err)
}

func TestExportsParse(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	insertReservation(t, db, rsv{id: "rsv_1", tenant: "tnt_a", project: "prj_a", gpus: 4, vcpu: 32, mem: 256, gpuModel: "H100",
		since: at(0.25), until: ptr(at(1.5))})
	rollup(t, db, at(2))
	ws := list(t, db, usage.ListParams{})
	require.Len(t, ws, 6)

	var buf bytes.Buffer
	require.NoError(t, usage.WriteCSV(&buf, ws))
	records, err := csv.NewReader(&buf).ReadAll()
	require.NoError(t, err)
	require.Equal(t, []string{"tenant_id", "project_id", "reservation_id", "metric", "window_start", "quantity",
		"idempotency_key", "revision", "pool_id"}, records[0])
	require.Len(t, records, 7)
	for i, rec := range records[1:] {
		start, err := time.Parse(time.RFC3339, rec[4])
		require.NoError(t, err)
		require.Equal(t, ws[i].WindowStart, start)
		q, err := strconv.ParseFloat(rec[5], 64)
		require.NoError(t, err)
		require.Equal(t, ws[i].Quantity, q)
		require.Equal(t, []string{"tnt_a", "prj_a", "rsv_1", ws[i].Metric}, rec[:4])
		require.Equal(t, []string{"rsv_1/" + ws[i].Metric + "/" + rec[4], "1", "pool_x"}, rec[6:])
	}

	buf.Reset()
	require.NoError(t, usage.WriteJSONL(&buf, ws))
	jl := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	require.Len(t, jl, 6)
	for i, line := range jl {
		var d usage.CloudEventData
		require.NoError(t, json.Unmarshal([]byte(line), &d), line)
		start := ws[i].WindowStart.Format(time.RFC3339)
		require.Equal(t, usage.CloudEventData{IdempotencyKey: "rsv_1/" + ws[i].Metric + "/" + start, Revision: 1,
			TenantID: "tnt_a", ProjectID: "prj_a", ReservationID: "rsv_1", Metric: ws[i].Metric, WindowStart: start,
			WindowEnd: ws[i].WindowStart.Add(time.Hour).Format(time.RFC3339), Quantity: ws[i].Quantity, PoolID: "pool_x"}, d)
	}

	buf.Reset()
	require.NoError(t, usage.WriteCloudEvents(&buf, ws))
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	require.Len(t, lines, 6)
	for i, line := range lines {
		var ev map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &ev), line)
		start := ws[i].WindowStart.Format(time.RFC3339)
		require.Equal(t, "1.0", ev["specversion"])
		require.Equal(t, "com.bettercompute.usage.window", ev["type"])
		require.Equal(t, "/tenants/tnt_a", ev["source"])
		require.Equal(t, "rsv_1/"+ws[i].Metric+"/"+start, ev["id"])
		require.Equal(t, ws[i].WindowStart.Add(time.Hour).Format(time.RFC3339), ev["time"])
		require.Equal(t, "application/json", ev["datacontenttype"])
		data := ev["data"].(map[string]any)
		require.Equal(t, ws[i].Quantity, data["quantity"])
		require.Equal(t, start, data["window_start"])
		require.Equal(t, ws[i].Metric, data["metric"])
	}
}

func TestMetricNames(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"H100": "gpu.H100.hours", "": "gpu.unknown.hours", "NVIDIA H100 80GB HBM3": "gpu.NVIDIA-H100-80GB-HBM3.hours",
		"a.b": "gpu.a-b.hours", "...": "gpu.unknown.hours",
	} {
		require.Equal(t, want, usage.GPUMetric(in), in)
		require.True(t, usage.ValidMetric(want), want)
	}
	for _, bad := range []string{"gpu.hours", "gpu.a.b.hours", "cpu.hours", "vcpu.hours ", "gpu..hours"} {
		require.False(t, usage.ValidMetric(bad), bad)
	}
}

// events records the events a rollup writes.
type events struct{ got []envelope.Event }

func (e *events) InsertAudits(context.Context, store.Tx, []envelope.AuditEntry) error { return nil }
func (e *events) InsertEvents(_ context.Context, _ store.Tx, evs []envelope.Event) error {
	e.got = append(e.got, evs...)
	return nil
}

// TestRollupEventsAndRevisions: each window the rollup inserts or changes
// is a usage.window_closed event keyed by reservation/metric/window start;
// a rerun writes none, and a late change to an interval bumps the
// revision of the windows it changes and only those.
func TestRollupEventsAndRevisions(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	insertReservation(t, db, rsv{id: "rsv_1", tenant: "tnt_a", project: "prj_a", vcpu: 2, since: at(0)})
	run := func(upTo time.Time) []envelope.Event {
		rec := &events{}
		require.NoError(t, db.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
			_, err := usage.Rollup(ctx, tx, upTo, rec)
			return err
		}))
		return rec.got
	}
	evs := run(at(2))
	require.Len(t, evs, 2, "hours 0 and 1 of vcpu.hours")
	for i, ev := range evs {
		start := at(float64(i)).Format(time.RFC3339)
		require.Equal(t, usage.EventWindowClosed, ev.Type)
		require.Equal(t, "tnt_a", ev.TenantID)
		require.Equal(t, "rsv_1/vcpu.hours/"+start, ev.ResourceID)
		require.Equal(t, "rsv_1/vcpu.hours/"+start, ev.Data["idempotency_key"])
		require.EqualValues(t, 1, ev.Data["revision"])
		require.EqualValues(t, 2.0, ev.Data["quantity"])
		require.Equal(t, at(float64(i+1)).Format(time.RFC3339), ev.Data["window_end"])
	}
	require.Empty(t, run(at(2)), "an unchanged rerun emits nothing")

	// The reservation's end is recorded late, inside hour 1: that window
	// changes (revision 2), hour 0 does not.
	setUntil(t, db, "rsv_1", at(1.5))
	evs = run(at(3))
	require.Len(t, evs, 1)
	require.Equal(t, "rsv_1/vcpu.hours/"+at(1).Format(time.RFC3339), evs[0].Data["idempotency_key"])
	require.EqualValues(t, 2, evs[0].Data["revision"])
	require.EqualValues(t, 1.0, evs[0].Data["quantity"])
	ws := list(t, db, usage.ListParams{})
	require.Len(t, ws, 2)
	require.Equal(t, []int64{1, 2}, []int64{ws[0].Revision, ws[1].Revision})
}
