package usage

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Migrations returns the module's tables. They read reservations (of the
// reservation module) only at run time, so they may be applied in any order
// after it.
func Migrations() store.Migrations {
	return store.Embedded("usage", migrationsFS)
}

// Metrics.
const (
	MetricVCPUHours      = "vcpu.hours"
	MetricMemoryGiBHours = "memoryGiB.hours"
)

// Window is the length of a usage window.
const Window = time.Hour

// Grace is how far before the last closed hour a rollup looks again, so an
// active interval recorded a little late still lands in its windows.
const Grace = time.Hour

var (
	metricRE     = regexp.MustCompile(`(?i)^((gpu|instance)\.[A-Za-z0-9_-]{1,64}\.hours|vcpu\.hours|memoryGiB\.hours)$`)
	modelCleanRE = regexp.MustCompile(`[^A-Za-z0-9_-]+`)
)

// GPUMetric returns the metric of a GPU model's hours: gpu.<model>.hours,
// with every run of characters other than letters, digits, _ and - in the
// model replaced by "-" (so the metric splits on its dots), and "unknown"
// for an empty model.
func GPUMetric(model string) string {
	m := strings.Trim(modelCleanRE.ReplaceAllString(model, "-"), "-")
	if m == "" {
		m = "unknown"
	}
	if len(m) > 64 {
		m = m[:64]
	}
	return "gpu." + m + ".hours"
}

// InstanceMetric returns the metric of an instance flavor's hours:
// instance.<flavor>.hours (one per hour an instance holds its host), the
// flavor cleaned as GPUMetric cleans a model.
func InstanceMetric(flavor string) string {
	m := strings.Trim(modelCleanRE.ReplaceAllString(flavor, "-"), "-")
	if m == "" {
		m = "unknown"
	}
	if len(m) > 64 {
		m = m[:64]
	}
	return "instance." + m + ".hours"
}

// metrics are the quantities of one reservation: its GPUs of a model,
// vCPUs, memory and, for an instance's, one instance of its flavor.
func (r *activeInterval) metrics() []metricQuantity {
	if r.own != nil {
		return r.own
	}
	out := []metricQuantity{{GPUMetric(r.model), r.gpus}, {MetricVCPUHours, r.vcpu}, {MetricMemoryGiBHours, r.memoryGiB}}
	if r.binding == "instance" {
		out = append(out, metricQuantity{InstanceMetric(r.flavor), 1})
	}
	return out
}

// metricQuantity is one metric of an interval and its quantity per hour.
type metricQuantity struct {
	metric string
	n      int64
}

// ValidMetric reports whether s is a metric name this package writes, in
// any case (listings match metrics case-insensitively).
func ValidMetric(s string) bool { return metricRE.MatchString(s) }

// UsageWindow is one row of usage_windows: an hour of one metric of one
// reservation.
type UsageWindow struct {
	TenantID      string
	ProjectID     string
	ReservationID string
	Metric        string
	WindowStart   time.Time
	Quantity      float64
	UpdateTime    time.Time
	// PoolID is the pool of the window's reservation, read by List ("" for
	// a window of something other than a reservation).
	PoolID string
	// Revision is 1 when the window is first written and grows by one each
	// time a later rollup changes it.
	Revision int64
}

// IdempotencyKey names the window across revisions:
// <reservation>/<metric>/<window start, RFC 3339>. A billing system keys
// its line on it and keeps the highest Revision.
func (w UsageWindow) IdempotencyKey() string {
	return w.ReservationID + "/" + w.Metric + "/" + w.WindowStart.UTC().Format(time.RFC3339)
}

// EventWindowClosed is the outbox event of a window the rollup wrote or
// changed; webhooks deliver it signed and at least once.
const EventWindowClosed = "usage.window_closed"

// windowEvent is the usage.window_closed event of a window written at now.
func windowEvent(w UsageWindow, now time.Time) envelope.Event {
	d := windowData(w)
	return envelope.Event{Type: EventWindowClosed, TenantID: w.TenantID, ResourceType: "UsageWindow", ResourceID: d.IdempotencyKey,
		Time: now, Data: map[string]any{
			"idempotency_key": d.IdempotencyKey, "revision": d.Revision,
			"tenant_id": d.TenantID, "project_id": d.ProjectID, "reservation_id": d.ReservationID, "metric": d.Metric,
			"window_start": d.WindowStart, "window_end": d.WindowEnd, "quantity": d.Quantity,
		}}
}

// activeInterval is what the rollup reads of a reservation.
type activeInterval struct {
	id, tenantID, projectID string
	gpus, vcpu, memoryGiB   int64
	model, binding, flavor  string
	since                   time.Time
	until                   *time.Time
	// own are the metrics of an IntervalSource's interval.
	own []metricQuantity
}

// Rollup writes the usage windows closed by upTo: every hour window
// [h, h+1h) with h+1h at or before upTo (truncated to the hour) that
// overlaps a reservation's active interval [active_since,
// coalesce(active_until, upTo)) gets, per metric, the quantity times the
// hours of the overlap (gpus for gpu.<model>.hours, vcpu, memory_gib).
// Metrics of quantity zero are not written.
//
// It is idempotent: windows are upserted, and a window whose values did not
// change is left alone. It returns the windows inserted or changed. To bound
// the work it reads only reservations still active, or whose active
// interval ended after the last closed hour less Grace, and writes windows
// from that point on (the first run, with no cursor, writes everything).
// sources add intervals other modules meter (a provider pool's servers).
// It runs in the caller's transaction, and writes there, through rec, a
// usage.window_closed event for each window inserted or changed (rec nil:
// none, for callers that only read windows back).
func Rollup(ctx context.Context, tx store.Tx, upTo time.Time, rec envelope.Recorder, sources ...IntervalSource) (int, error) {
	closeAt := upTo.UTC().Truncate(Window)
	var from time.Time // zero: no run yet, start at each reservation's beginning
	var cursor time.Time
	switch err := tx.QueryRow(ctx, `SELECT closed_until FROM usage_cursor WHERE id = 1`).Scan(&cursor); {
	case err == nil:
		from = cursor.UTC().Add(-Grace)
	case !errors.Is(err, store.ErrNotFound):
		return 0, fmt.Errorf("usage rollup: read cursor: %w", err)
	}

	intervals, err := activeIntervals(ctx, tx, from, closeAt, sources)
	if err != nil {
		return 0, err
	}
	var changed []envelope.Event
	for _, r := range intervals {
		until := closeAt
		if r.until != nil && r.until.Before(until) {
			until = r.until.UTC()
		}
		first := r.since.UTC().Truncate(Window)
		if first.Before(from) {
			first = from.Truncate(Window)
		}
		for h := first; !h.Add(Window).After(closeAt); h = h.Add(Window) {
			lo, hi := maxTime(h, r.since), minTime(h.Add(Window), until)
			if !hi.After(lo) {
				continue
			}
			hours := hi.Sub(lo).Hours()
			for _, m := range r.metrics() {
				if m.n <= 0 {
					continue
				}
				w := UsageWindow{TenantID: r.tenantID, ProjectID: r.projectID, ReservationID: r.id,
					Metric: m.metric, WindowStart: h, Quantity: float64(m.n) * hours}
				ok, err := upsertWindow(ctx, tx, &w)
				if err != nil {
					return len(changed), err
				}
				if ok {
					changed = append(changed, windowEvent(w, upTo))
				}
			}
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO usage_cursor (id, closed_until) VALUES (1, $1)
		ON CONFLICT (id) DO UPDATE SET closed_until = excluded.closed_until
		WHERE usage_cursor.closed_until < excluded.closed_until`, closeAt); err != nil {
		return len(changed), fmt.Errorf("usage rollup: move cursor: %w", err)
	}
	if rec != nil && len(changed) > 0 {
		if err := rec.InsertEvents(ctx, tx, changed); err != nil {
			return len(changed), fmt.Errorf("usage rollup: record events: %w", err)
		}
	}
	return len(changed), nil
}

// OpenHour computes the windows of the hour still open at now, [h, now)
// with h now truncated to the hour, as Rollup will write them once the
// hour closes: the quantity so far. Nothing is written. Empty tenantID,
// projectID and metric do not filter; metric matches case-insensitively.
// Windows come ordered by reservation and metric.
func OpenHour(ctx context.Context, q store.Querier, tenantID, projectID, metric string, now time.Time, sources ...IntervalSource) ([]UsageWindow, error) {
	h := now.UTC().Truncate(Window)
	intervals, err := activeIntervals(ctx, q, h, now, sources)
	if err != nil {
		return nil, err
	}
	var out []UsageWindow
	for _, r := range intervals {
		if (tenantID != "" && r.tenantID != tenantID) || (projectID != "" && r.projectID != projectID) {
			continue
		}
		until := now
		if r.until != nil && r.until.Before(until) {
			until = r.until.UTC()
		}
		lo := maxTime(h, r.since)
		if !until.After(lo) {
			continue
		}
		hours := until.Sub(lo).Hours()
		for _, m := range r.metrics() {
			if m.n <= 0 || (metric != "" && !strings.EqualFold(metric, m.metric)) {
				continue
			}
			out = append(out, UsageWindow{TenantID: r.tenantID, ProjectID: r.projectID, ReservationID: r.id,
				Metric: m.metric, WindowStart: h, Quantity: float64(m.n) * hours})
		}
	}
	slices.SortFunc(out, func(a, b UsageWindow) int {
		return cmp.Or(cmp.Compare(a.ReservationID, b.ReservationID), cmp.Compare(a.Metric, b.Metric))
	})
	return out, nil
}

// Interval is a metered interval of something other than a reservation
// (a provider pool's server): Quantity of Metric per hour from Since to
// Until (nil: still running). ID keys its windows as a reservation's id
// does.
type Interval struct {
	ID, TenantID, ProjectID, Metric string
	Quantity                        int64
	Since                           time.Time
	Until                           *time.Time
}

// IntervalSource lists the intervals of one kind overlapping [from,
// closeAt), reading its own module's tables.
type IntervalSource func(ctx context.Context, q store.Querier, from, closeAt time.Time) ([]Interval, error)

func sourceIntervals(ctx context.Context, q store.Querier, from, closeAt time.Time, srcs []IntervalSource) ([]activeInterval, error) {
	var out []activeInterval
	for _, src := range srcs {
		ivs, err := src(ctx, q, from, closeAt)
		if err != nil {
			return nil, fmt.Errorf("usage rollup: %w", err)
		}
		for _, iv := range ivs {
			out = append(out, activeInterval{id: iv.ID, tenantID: iv.TenantID, projectID: iv.ProjectID, since: iv.Since,
				until: iv.Until, own: []metricQuantity{{metric: iv.Metric, n: iv.Quantity}}})
		}
	}
	return out, nil
}

// activeIntervals reads the reservations whose active interval began before
// closeAt and had not ended by from.
func activeIntervals(ctx context.Context, tx store.Querier, from, closeAt time.Time, srcs []IntervalSource) ([]activeInterval, error) {
	rows, err := tx.Query(ctx, `SELECT id, tenant_id, project_id, gpus, vcpu, memory_gib,
			CASE WHEN gpu_model <> '' THEN gpu_model ELSE model END, active_since, active_until, binding, flavor
		FROM reservations
		WHERE active_since IS NOT NULL AND active_since < $1 AND (active_until IS NULL OR active_until > $2)
		ORDER BY id`, closeAt, from)
	if err != nil {
		return nil, fmt.Errorf("usage rollup: read active reservations: %w", err)
	}
	defer rows.Close()
	var out []activeInterval
	for rows.Next() {
		var r activeInterval
		if err := rows.Scan(&r.id, &r.tenantID, &r.projectID, &r.gpus, &r.vcpu, &r.memoryGiB, &r.model, &r.since, &r.until, &r.binding, &r.flavor); err != nil {
			return nil, fmt.Errorf("usage rollup: read active reservations: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	more, err := sourceIntervals(ctx, tx, from, closeAt, srcs)
	return append(out, more...), err
}

// upsertWindow writes one window, leaving an unchanged one alone; it
// reports whether it inserted or changed the row, and sets w.Revision and
// w.UpdateTime to the row's when it did.
func upsertWindow(ctx context.Context, tx store.Tx, w *UsageWindow) (bool, error) {
	err := tx.QueryRow(ctx, `INSERT INTO usage_windows (tenant_id, project_id, reservation_id, metric, window_start, quantity, update_time, revision)
		VALUES ($1, $2, $3, $4, $5, $6, compute_now(), 1)
		ON CONFLICT (reservation_id, metric, window_start) DO UPDATE
		SET tenant_id = excluded.tenant_id, project_id = excluded.project_id,
			quantity = excluded.quantity, update_time = excluded.update_time, revision = usage_windows.revision + 1
		WHERE usage_windows.quantity <> excluded.quantity
			OR usage_windows.tenant_id <> excluded.tenant_id
			OR usage_windows.project_id <> excluded.project_id
		RETURNING revision, update_time`,
		w.TenantID, w.ProjectID, w.ReservationID, w.Metric, w.WindowStart, w.Quantity).Scan(&w.Revision, &w.UpdateTime)
	switch {
	case errors.Is(err, store.ErrNotFound):
		// Unchanged: the conflict's WHERE kept the row as it was.
		return false, nil
	case err != nil:
		return false, fmt.Errorf("usage rollup: write %s %s %s: %w", w.ReservationID, w.Metric, w.WindowStart.Format(time.RFC3339), err)
	}
	w.UpdateTime = w.UpdateTime.UTC()
	return true, nil
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// Cursor is a position in the order windows are listed in: window start,
// then reservation, then metric.
type Cursor struct {
	WindowStart   time.Time
	ReservationID string
	Metric        string
}

// String encodes the cursor for a page token.
func (c Cursor) String() string {
	return c.WindowStart.UTC().Format(time.RFC3339Nano) + "|" + c.ReservationID + "|" + c.Metric
}

// ParseCursor decodes Cursor.String.
func ParseCursor(s string) (Cursor, error) {
	parts := strings.SplitN(s, "|", 3)
	if len(parts) != 3 {
		return Cursor{}, fmt.Errorf("usage cursor %q: want three parts", s)
	}
	t, err := time.Parse(time.RFC3339Nano, parts[0])
	if err != nil {
		return Cursor{}, fmt.Errorf("usage cursor %q: %w", s, err)
	}
	return Cursor{WindowStart: t.UTC(), ReservationID: parts[1], Metric: parts[2]}, nil
}

// ListParams filter a usage listing. Empty strings and zero times do not
// filter.
type ListParams struct {
	TenantID  string
	ProjectID string
	Metric    string
	// Start and End bound window_start: Start <= window_start < End.
	Start, End time.Time
	// After continues after a position; nil starts at the beginning.
	After *Cursor
	Limit int
}

// farFuture stands for an open end: later than any window.
var farFuture = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

// List lists usage windows by window start, reservation and metric.
func List(ctx context.Context, q store.Querier, p *ListParams) ([]UsageWindow, error) {
	end := p.End
	if end.IsZero() {
		end = farFuture
	}
	var after Cursor
	if p.After != nil {
		after = *p.After
	}
	// The pool is the reservation's: what capacity by-consumer groups by.
	rows, err := q.Query(ctx, `SELECT w.tenant_id, w.project_id, w.reservation_id, w.metric, w.window_start, w.quantity, w.update_time,
			w.revision, COALESCE(r.pool_id, '')
		FROM usage_windows w LEFT JOIN reservations r ON r.id = w.reservation_id
		WHERE ($1 = '' OR w.tenant_id = $1) AND ($2 = '' OR w.project_id = $2) AND ($3 = '' OR lower(w.metric) = lower($3))
		  AND w.window_start >= $4 AND w.window_start < $5
		  AND (w.window_start > $6 OR (w.window_start = $6 AND (w.reservation_id > $7 OR (w.reservation_id = $7 AND w.metric > $8))))
		ORDER BY w.window_start, w.reservation_id, w.metric
		LIMIT $9`,
		p.TenantID, p.ProjectID, p.Metric, p.Start.UTC(), end.UTC(), after.WindowStart.UTC(), after.ReservationID, after.Metric, p.Limit)
	if err != nil {
		return nil, fmt.Errorf("list usage: %w", err)
	}
	defer rows.Close()
	var out []UsageWindow
	for rows.Next() {
		var w UsageWindow
		if err := rows.Scan(&w.TenantID, &w.ProjectID, &w.ReservationID, &w.Metric, &w.WindowStart, &w.Quantity, &w.UpdateTime, &w.Revision, &w.PoolID); err != nil {
			return nil, fmt.Errorf("list usage: %w", err)
		}
		w.WindowStart, w.UpdateTime = w.WindowStart.UTC(), w.UpdateTime.UTC()
		out = append(out, w)
	}
	return out, rows.Err()
}
