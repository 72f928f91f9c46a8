package usage

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"time"
)

// Export formats and their content types.
const (
	FormatCSV         = "csv"
	FormatCloudEvents = "cloudevents"
	FormatJSONL       = "jsonl"

	ContentTypeCSV         = "text/csv; charset=utf-8"
	ContentTypeCloudEvents = "application/x-ndjson"
	ContentTypeJSONL       = "application/x-ndjson"
)

// CSVHeader is the first line of a CSV export.
var CSVHeader = []string{"tenant_id", "project_id", "reservation_id", "metric", "window_start", "quantity", "idempotency_key", "revision", "pool_id"}

// CloudEventType is the type of every exported CloudEvent.
const CloudEventType = "com.bettercompute.usage.window"

// WriteCSV writes windows as CSV with CSVHeader, times in RFC 3339 (UTC) and
// quantities in the shortest decimal that reads back exactly.
func WriteCSV(w io.Writer, windows []UsageWindow) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(CSVHeader); err != nil {
		return fmt.Errorf("usage csv: %w", err)
	}
	for _, u := range windows {
		if err := cw.Write([]string{u.TenantID, u.ProjectID, u.ReservationID, u.Metric,
			u.WindowStart.UTC().Format(time.RFC3339), strconv.FormatFloat(u.Quantity, 'f', -1, 64),
			u.IdempotencyKey(), strconv.FormatInt(u.Revision, 10), u.PoolID}); err != nil {
			return fmt.Errorf("usage csv: %w", err)
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("usage csv: %w", err)
	}
	return nil
}

// CloudEvent is one exported window: a CloudEvents 1.0 event in structured
// JSON mode. Its id is stable (reservation/metric/window start), so a
// consumer that reads an export twice can drop the repeats; time is when
// the window closed.
type CloudEvent struct {
	SpecVersion     string         `json:"specversion"`
	Type            string         `json:"type"`
	Source          string         `json:"source"`
	ID              string         `json:"id"`
	Time            string         `json:"time"`
	DataContentType string         `json:"datacontenttype"`
	Data            CloudEventData `json:"data"`
}

// CloudEventData is the data of an exported window, and one line of a
// jsonl export: the same fields as the usage.window_closed event's data.
type CloudEventData struct {
	IdempotencyKey string  `json:"idempotency_key"`
	Revision       int64   `json:"revision"`
	TenantID       string  `json:"tenant_id"`
	ProjectID      string  `json:"project_id"`
	ReservationID  string  `json:"reservation_id"`
	Metric         string  `json:"metric"`
	WindowStart    string  `json:"window_start"`
	WindowEnd      string  `json:"window_end"`
	Quantity       float64 `json:"quantity"`
	// PoolID is in exports only (the event is written before it is read).
	PoolID string `json:"pool_id,omitempty"`
}

// windowData is a window as the exports and the event carry it.
func windowData(u UsageWindow) CloudEventData {
	start := u.WindowStart.UTC()
	return CloudEventData{IdempotencyKey: u.IdempotencyKey(), Revision: u.Revision, TenantID: u.TenantID, ProjectID: u.ProjectID,
		ReservationID: u.ReservationID, Metric: u.Metric, WindowStart: start.Format(time.RFC3339),
		WindowEnd: start.Add(Window).Format(time.RFC3339), Quantity: u.Quantity, PoolID: u.PoolID}
}

// NewCloudEvent returns the event of a window.
func NewCloudEvent(u UsageWindow) CloudEvent {
	d := windowData(u)
	return CloudEvent{
		SpecVersion: "1.0", Type: CloudEventType, Source: "/tenants/" + u.TenantID,
		ID: d.IdempotencyKey, Time: d.WindowEnd, DataContentType: "application/json", Data: d,
	}
}

// WriteJSONL writes windows as JSON lines, one CloudEventData object a
// line: the window without the CloudEvents envelope.
func WriteJSONL(w io.Writer, windows []UsageWindow) error {
	enc := json.NewEncoder(w)
	for _, u := range windows {
		if err := enc.Encode(windowData(u)); err != nil {
			return fmt.Errorf("usage jsonl: %w", err)
		}
	}
	return nil
}

// WriteCloudEvents writes windows as JSON lines, one CloudEvent a line.
func WriteCloudEvents(w io.Writer, windows []UsageWindow) error {
	enc := json.NewEncoder(w)
	for _, u := range windows {
		if err := enc.Encode(NewCloudEvent(u)); err != nil {
			return fmt.Errorf("usage cloudevents: %w", err)
		}
	}
	return nil
}
