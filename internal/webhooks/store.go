package webhooks

import (
	"context"
	"embed"
	"strings"
	"time"

	"github.com/better-compute/better-compute/internal/store"
)

//go:embed migrations
var migrationsFS embed.FS

// Migrations returns the module's tables.
func Migrations() store.Migrations {
	return store.Embedded("webhooks", migrationsFS)
}

// Id prefixes (envelope.NewID).
const (
	IDPrefix         = "whk"
	DeliveryIDPrefix = "whd"
)

// Endpoint states.
const (
	StateEnabled  = "enabled"
	StateDisabled = "disabled"
)

// Delivery states.
const (
	DeliveryPending   = "pending"
	DeliverySucceeded = "succeeded"
	DeliveryDead      = "dead"
)

// Webhook is a row of webhooks.
type Webhook struct {
	ID             string
	TenantID       string
	URL            string
	Types          []string
	Description    string
	State          string
	DisabledReason string
	// Secret and PreviousSecret are sealed.
	Secret             []byte
	PreviousSecret     []byte
	PreviousExpireTime *time.Time
	Cursor             int64
	FailingSince       *time.Time
	CreatedBy          string
	CreateTime         time.Time
	UpdateTime         time.Time
}

const webhookColumns = `id, tenant_id, url, types, description, state, disabled_reason, secret, previous_secret,
	previous_secret_expire_time, event_cursor, failing_since, created_by, create_time, update_time`

func scanWebhook(row interface{ Scan(...any) error }) (Webhook, error) {
	var (
		w     Webhook
		types string
	)
	err := row.Scan(&w.ID, &w.TenantID, &w.URL, &types, &w.Description, &w.State, &w.DisabledReason, &w.Secret,
		&w.PreviousSecret, &w.PreviousExpireTime, &w.Cursor, &w.FailingSince, &w.CreatedBy, &w.CreateTime, &w.UpdateTime)
	if types != "" {
		w.Types = strings.Split(types, ",")
	}
	return w, err
}

func scanWebhooks(rows store.Rows, err error) ([]Webhook, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Webhook
	for rows.Next() {
		w, err := scanWebhook(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	return out, rows.Err()
}

// WebhookInsert writes a new endpoint.
func WebhookInsert(ctx context.Context, tx store.Tx, w *Webhook) error {
	_, err := tx.Exec(ctx, `INSERT INTO webhooks (`+webhookColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`,
		w.ID, w.TenantID, w.URL, strings.Join(w.Types, ","), w.Description, w.State, w.DisabledReason, w.Secret,
		w.PreviousSecret, w.PreviousExpireTime, w.Cursor, w.FailingSince, w.CreatedBy, w.CreateTime, w.UpdateTime)
	return err
}

// WebhookUpdate writes an endpoint's settings, secrets and failure state
// (not its cursor: the dispatcher owns it).
func WebhookUpdate(ctx context.Context, tx store.Tx, w *Webhook) error {
	n, err := tx.Exec(ctx, `UPDATE webhooks SET url = $2, types = $3, description = $4, state = $5, disabled_reason = $6,
		secret = $7, previous_secret = $8, previous_secret_expire_time = $9, failing_since = $10, update_time = $11
		WHERE id = $1`,
		w.ID, w.URL, strings.Join(w.Types, ","), w.Description, w.State, w.DisabledReason, w.Secret, w.PreviousSecret,
		w.PreviousExpireTime, w.FailingSince, w.UpdateTime)
	if err == nil && n == 0 {
		return store.ErrNotFound
	}
	return err
}

// WebhookSetCursor moves an endpoint's outbox cursor.
func WebhookSetCursor(ctx context.Context, tx store.Tx, id string, cursor int64) error {
	_, err := tx.Exec(ctx, `UPDATE webhooks SET event_cursor = $2 WHERE id = $1`, id, cursor)
	return err
}

// WebhookDelete deletes an endpoint and its deliveries.
func WebhookDelete(ctx context.Context, tx store.Tx, tenantID, id string) error {
	if _, err := tx.Exec(ctx, `DELETE FROM webhook_deliveries WHERE webhook_id = $1 AND tenant_id = $2`, id, tenantID); err != nil {
		return err
	}
	n, err := tx.Exec(ctx, `DELETE FROM webhooks WHERE id = $1 AND tenant_id = $2`, id, tenantID)
	if err == nil && n == 0 {
		return store.ErrNotFound
	}
	return err
}

// WebhookGet reads an endpoint of a tenant.
func WebhookGet(ctx context.Context, q store.Querier, tenantID, id string) (Webhook, error) {
	return scanWebhook(q.QueryRow(ctx, `SELECT `+webhookColumns+` FROM webhooks WHERE id = $1 AND tenant_id = $2`, id, tenantID))
}

// WebhookByID reads an endpoint by id alone (background work).
func WebhookByID(ctx context.Context, q store.Querier, id string) (Webhook, error) {
	return scanWebhook(q.QueryRow(ctx, `SELECT `+webhookColumns+` FROM webhooks WHERE id = $1`, id))
}

// WebhookLock reads an endpoint by id, locking its row on PostgreSQL so
// that dispatchers and workers of several replicas take turns on it (SQLite
// has one writer).
func WebhookLock(ctx context.Context, tx store.Tx, id string) (Webhook, error) {
	q := `SELECT ` + webhookColumns + ` FROM webhooks WHERE id = $1`
	if tx.Dialect() == store.Postgres {
		q += ` FOR UPDATE`
	}
	return scanWebhook(tx.QueryRow(ctx, q, id))
}

// WebhookListParams filter a listing.
type WebhookListParams struct {
	TenantID string
	After    string
	Limit    int
}

// WebhookList lists a tenant's endpoints by id.
func WebhookList(ctx context.Context, q store.Querier, p *WebhookListParams) ([]Webhook, error) {
	return scanWebhooks(q.Query(ctx, `SELECT `+webhookColumns+` FROM webhooks
		WHERE tenant_id = $1 AND id > $2 ORDER BY id LIMIT $3`, p.TenantID, p.After, p.Limit))
}

// WebhookIDsEnabled lists the ids of every enabled endpoint.
func WebhookIDsEnabled(ctx context.Context, q store.Querier) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT id FROM webhooks WHERE state = 'enabled' ORDER BY id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// WebhookMinCursor is the smallest outbox cursor of any endpoint, and
// whether there is any endpoint at all.
func WebhookMinCursor(ctx context.Context, q store.Querier) (int64, bool, error) {
	var (
		n   int64
		min *int64
	)
	if err := q.QueryRow(ctx, `SELECT count(*), min(event_cursor) FROM webhooks`).Scan(&n, &min); err != nil {
		return 0, false, err
	}
	if n == 0 || min == nil {
		return 0, false, nil
	}
	return *min, true, nil
}

// Delivery is a row of webhook_deliveries.
type Delivery struct {
	Seq              int64
	ID               string
	WebhookID        string
	TenantID         string
	EventID          string
	EventType        string
	Payload          []byte
	State            string
	Attempts         int
	LastStatus       int
	LastError        string
	FirstAttemptTime *time.Time
	NextAttemptTime  time.Time
	CreateTime       time.Time
	UpdateTime       time.Time
}

const deliveryColumns = `seq, id, webhook_id, tenant_id, event_id, event_type, payload, state, attempts, last_status, last_error,
	first_attempt_time, next_attempt_time, create_time, update_time`

func scanDelivery(row interface{ Scan(...any) error }) (Delivery, error) {
	var d Delivery
	err := row.Scan(&d.Seq, &d.ID, &d.WebhookID, &d.TenantID, &d.EventID, &d.EventType, &d.Payload, &d.State, &d.Attempts,
		&d.LastStatus, &d.LastError, &d.FirstAttemptTime, &d.NextAttemptTime, &d.CreateTime, &d.UpdateTime)
	return d, err
}

// DeliveryInsert queues a delivery; it takes the next seq of the table, so
// it goes after the endpoint's deliveries already queued.
func DeliveryInsert(ctx context.Context, tx store.Tx, d *Delivery) error {
	return tx.QueryRow(ctx, `INSERT INTO webhook_deliveries (id, webhook_id, tenant_id, event_id, event_type, payload, state,
		attempts, last_status, last_error, first_attempt_time, next_attempt_time, create_time, update_time)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) RETURNING seq`,
		d.ID, d.WebhookID, d.TenantID, d.EventID, d.EventType, d.Payload, d.State, d.Attempts, d.LastStatus, d.LastError,
		d.FirstAttemptTime, d.NextAttemptTime, d.CreateTime, d.UpdateTime).Scan(&d.Seq)
}

// DeliveryUpdate writes a delivery's outcome.
func DeliveryUpdate(ctx context.Context, tx store.Tx, d *Delivery) error {
	_, err := tx.Exec(ctx, `UPDATE webhook_deliveries SET state = $2, attempts = $3, last_status = $4, last_error = $5,
		first_attempt_time = $6, next_attempt_time = $7, update_time = $8 WHERE id = $1`,
		d.ID, d.State, d.Attempts, d.LastStatus, d.LastError, d.FirstAttemptTime, d.NextAttemptTime, d.UpdateTime)
	return err
}

// DeliveryHead reads an endpoint's oldest pending delivery: the only one
// that may be in flight.
func DeliveryHead(ctx context.Context, q store.Querier, webhookID string) (Delivery, error) {
	return scanDelivery(q.QueryRow(ctx, `SELECT `+deliveryColumns+` FROM webhook_deliveries
		WHERE webhook_id = $1 AND state = 'pending' ORDER BY seq LIMIT 1`, webhookID))
}

// DeliveryGet reads a delivery of an endpoint.
func DeliveryGet(ctx context.Context, q store.Querier, webhookID, id string) (Delivery, error) {
	return scanDelivery(q.QueryRow(ctx, `SELECT `+deliveryColumns+` FROM webhook_deliveries
		WHERE webhook_id = $1 AND id = $2`, webhookID, id))
}

// DeliveryListParams filter a listing; After is a seq.
type DeliveryListParams struct {
	WebhookID string
	State     string
	After     int64
	Limit     int
}

// DeliveryList lists an endpoint's deliveries in queue order.
func DeliveryList(ctx context.Context, q store.Querier, p *DeliveryListParams) ([]Delivery, error) {
	rows, err := q.Query(ctx, `SELECT `+deliveryColumns+` FROM webhook_deliveries
		WHERE webhook_id = $1 AND ($2 = '' OR state = $2) AND seq > $3 ORDER BY seq LIMIT $4`,
		p.WebhookID, p.State, p.After, p.Limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Delivery
	for rows.Next() {
		d, err := scanDelivery(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// DeliveryDueWebhooks lists the enabled endpoints whose head delivery is
// due at now.
func DeliveryDueWebhooks(ctx context.Context, q store.Querier, now time.Time) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT DISTINCT d.webhook_id FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id
		WHERE w.state = 'enabled' AND d.state = 'pending' AND d.next_attempt_time <= $1 ORDER BY d.webhook_id`, now)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// WebhookSecrets lists every endpoint's sealed secrets (for a reseal).
func WebhookSecrets(ctx context.Context, q store.Querier) ([]Webhook, error) {
	return scanWebhooks(q.Query(ctx, `SELECT `+webhookColumns+` FROM webhooks ORDER BY id`))
}

// WebhookSetSecrets writes an endpoint's sealed secrets.
func WebhookSetSecrets(ctx context.Context, tx store.Tx, id string, secret, previous []byte) error {
	_, err := tx.Exec(ctx, `UPDATE webhooks SET secret = $2, previous_secret = $3 WHERE id = $1`, id, secret, previous)
	return err
}

// webhookSecretReseal replaces an endpoint's sealed secret (previous: its
// previous secret) with the same plaintext sealed anew, only while the row
// still holds old: a rotation since the read wins. It reports whether it
// replaced it.
func webhookSecretReseal(ctx context.Context, tx store.Tx, id string, previous bool, old, resealed []byte) (bool, error) {
	q := `UPDATE webhooks SET secret = $3 WHERE id = $1 AND secret = $2`
	if previous {
		q = `UPDATE webhooks SET previous_secret = $3 WHERE id = $1 AND previous_secret = $2`
	}
	n, err := tx.Exec(ctx, q, id, old, resealed)
	return n > 0, err
}
