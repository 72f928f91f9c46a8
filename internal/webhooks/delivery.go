package webhooks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/better-compute/better-compute/client/webhook"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/events"
	"github.com/better-compute/better-compute/internal/store"
)

// Retry policy: the delay before attempt n+1 doubles from BackoffBase up to
// BackoffMax, with jitter (between half and all of it); a delivery still
// failing RetryWindow after its first attempt is dead, and so is an endpoint
// failing that long: it is disabled.
const (
	BackoffBase = 5 * time.Second
	BackoffMax  = time.Hour
	RetryWindow = 24 * time.Hour
	// AttemptTimeout bounds one POST.
	AttemptTimeout = 15 * time.Second
	// maxPerJob bounds how many deliveries one job sends before it leaves
	// the rest to the next.
	maxPerJob = 100
)

// Backoff is the delay after the attempts-th failed attempt, before jitter.
func Backoff(attempts int) time.Duration {
	d := BackoffBase
	for i := 1; i < attempts && d < BackoffMax; i++ {
		d *= 2
	}
	return min(d, BackoffMax)
}

// CloudEvent renders an outbox event as a CloudEvents 1.0 JSON document
// (structured mode). id is the event id (the outbox cursor), or for events
// that never were in the outbox (webhook.test), the delivery id.
func CloudEvent(ev events.Stored, id string) ([]byte, error) {
	if ev.Seq > 0 {
		id = strconv.FormatInt(ev.Seq, 10)
	}
	data := ev.Data
	if data == nil {
		data = map[string]any{}
	}
	return json.Marshal(map[string]any{
		"specversion":     "1.0",
		"id":              id,
		"source":          "/tenants/" + ev.TenantID,
		"type":            ev.Type,
		"subject":         ev.ResourceType + "/" + ev.ResourceID,
		"time":            ev.Time.UTC().Format(time.RFC3339Nano),
		"datacontenttype": "application/json",
		"tenantid":        ev.TenantID,
		"data":            data,
	})
}

// DeliverArgs is the job that sends an endpoint's due deliveries in order.
type DeliverArgs struct {
	WebhookID string `json:"webhook_id"`
}

// Kind implements river.JobArgs.
func (DeliverArgs) Kind() string { return "webhooks.deliver" }

// DeliverOpts makes the job unique per endpoint while waiting or running:
// one delivery job per endpoint at a time is what keeps its events in
// order. A job that failed (retryable) does not count: its retry is
// scheduled on the clock, and the dispatcher's next pass must be able to
// enqueue a fresh one rather than wait for it.
func DeliverOpts() *river.InsertOpts {
	return &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true, ByState: []rivertype.JobState{
		rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRunning, rivertype.JobStateScheduled,
	}}}
}

// Recorder writes outbox events (webhook.disabled).
type Recorder interface {
	InsertEvents(ctx context.Context, tx store.Tx, evs []envelope.Event) error
}

// Deliverer sends deliveries: the River worker of DeliverArgs.
type Deliverer struct {
	river.WorkerDefaults[DeliverArgs]
	DB     *store.DB
	Sealer Sealer
	Guard  *Guard
	Rec    Recorder
	Log    *slog.Logger
	// Metrics counts attempts by outcome; may be nil.
	Metrics func(outcome string)
	client  *http.Client
}

// NewDeliverer returns the worker with an HTTP client whose every
// connection the guard checks.
func NewDeliverer(db *store.DB, sealer Sealer, guard *Guard, rec Recorder, log *slog.Logger) *Deliverer {
	// The guard's Control sees each address the name resolved to, just
	// before the connection is made: a name that resolved to a public
	// address when the endpoint was checked and to a refused one now is
	// not dialed. Names resolve with the guard's resolver, as CheckURL's.
	d := &net.Dialer{Timeout: 10 * time.Second, Control: guard.Control, Resolver: guard.Resolver}
	tr := &http.Transport{DialContext: d.DialContext, Proxy: nil, MaxIdleConnsPerHost: 2, IdleConnTimeout: time.Minute,
		TLSHandshakeTimeout: 10 * time.Second, ResponseHeaderTimeout: AttemptTimeout}
	return &Deliverer{DB: db, Sealer: sealer, Guard: guard, Rec: rec, Log: log, client: &http.Client{
		Transport: tr, Timeout: AttemptTimeout,
		// A redirect could lead anywhere; the endpoint is the URL given.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// Timeout implements river.Worker: a job sends up to maxPerJob deliveries.
func (w *Deliverer) Timeout(*river.Job[DeliverArgs]) time.Duration { return 10 * time.Minute }

// Work sends the endpoint's due pending deliveries, oldest first, and stops
// at the first failure: the next waits for its retry.
func (w *Deliverer) Work(ctx context.Context, job *river.Job[DeliverArgs]) error {
	for range maxPerJob {
		more, err := w.deliverHead(ctx, job.Args.WebhookID)
		if err != nil || !more {
			return err
		}
	}
	return nil
}

// deliverHead sends the head delivery if it is due; more says whether to
// go on with the next.
func (w *Deliverer) deliverHead(ctx context.Context, webhookID string) (more bool, err error) {
	var (
		hook Webhook
		d    Delivery
	)
	now := w.DB.Clock().Now()
	err = w.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		var err error
		if hook, err = WebhookByID(ctx, tx, webhookID); err != nil {
			return err
		}
		d, err = DeliveryHead(ctx, tx, webhookID)
		return err
	})
	if errors.Is(err, store.ErrNotFound) {
		return false, nil // gone, or nothing pending
	}
	if err != nil || hook.State != StateEnabled || d.NextAttemptTime.After(now) {
		return false, err
	}
	secrets, err := w.secrets(hook, now)
	if err != nil {
		return false, err
	}
	status, sendErr := w.send(ctx, hook.URL, secrets, d, now)
	if ctx.Err() != nil {
		return false, ctx.Err() // shutting down: the attempt does not count
	}
	ok := sendErr == nil && status >= 200 && status < 300
	if w.Metrics != nil {
		w.Metrics(map[bool]string{true: "ok", false: "failed"}[ok])
	}
	err = w.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		cur, err := WebhookLock(ctx, tx, webhookID)
		if err != nil {
			return err
		}
		head, err := DeliveryHead(ctx, tx, webhookID)
		if err != nil || head.ID != d.ID {
			return err // redelivered or deleted meanwhile: leave it
		}
		now := w.DB.Clock().Now()
		head.Attempts++
		head.LastStatus, head.LastError, head.UpdateTime = status, "", now
		if sendErr != nil {
			head.LastError = truncate(sendErr.Error(), 512)
		} else if !ok {
			head.LastError = "HTTP " + strconv.Itoa(status)
		}
		if head.FirstAttemptTime == nil {
			head.FirstAttemptTime = &now
		}
		if ok {
			head.State = DeliverySucceeded
			if cur.FailingSince != nil {
				cur.FailingSince, cur.UpdateTime = nil, now
				if err := WebhookUpdate(ctx, tx, &cur); err != nil {
					return err
				}
			}
			return DeliveryUpdate(ctx, tx, &head)
		}
		delay := Backoff(head.Attempts)
		delay = delay/2 + rand.N(delay/2+1)
		head.NextAttemptTime = now.Add(delay)
		if now.Sub(*head.FirstAttemptTime) >= RetryWindow {
			head.State = DeliveryDead
		}
		if err := DeliveryUpdate(ctx, tx, &head); err != nil {
			return err
		}
		if cur.FailingSince == nil {
			cur.FailingSince, cur.UpdateTime = &now, now
			return WebhookUpdate(ctx, tx, &cur)
		}
		if now.Sub(*cur.FailingSince) < RetryWindow || cur.State != StateEnabled {
			return nil
		}
		cur.State, cur.UpdateTime = StateDisabled, now
		cur.DisabledReason = fmt.Sprintf("failing since %s: %s", cur.FailingSince.UTC().Format(time.RFC3339), head.LastError)
		if err := WebhookUpdate(ctx, tx, &cur); err != nil {
			return err
		}
		return w.Rec.InsertEvents(ctx, tx, []envelope.Event{{Type: "webhook.disabled", TenantID: cur.TenantID,
			ResourceType: "Webhook", ResourceID: cur.ID, Time: now,
			Data: map[string]any{"url": cur.URL, "reason": cur.DisabledReason, "dead_delivery": head.ID}}})
	})
	return ok && err == nil, err
}

// secrets opens the endpoint's current secret and, during a rotation's
// overlap, the previous one.
func (w *Deliverer) secrets(h Webhook, now time.Time) ([]string, error) {
	if w.Sealer == nil {
		return nil, errors.New("webhooks: no sealer (BETTER_COMPUTE_SECRET) to open endpoint secrets")
	}
	cur, err := w.Sealer.Open("webhook/"+h.ID, h.Secret)
	if err != nil {
		return nil, fmt.Errorf("open the secret of %s: %w", h.ID, err)
	}
	out := []string{string(cur)}
	if len(h.PreviousSecret) > 0 && h.PreviousExpireTime != nil && now.Before(*h.PreviousExpireTime) {
		prev, err := w.Sealer.Open("webhook/"+h.ID, h.PreviousSecret)
		if err != nil {
			return nil, fmt.Errorf("open the previous secret of %s: %w", h.ID, err)
		}
		out = append(out, string(prev))
	}
	return out, nil
}

// send posts one delivery, signed at now.
func (w *Deliverer) send(ctx context.Context, url string, secrets []string, d Delivery, now time.Time) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, AttemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(d.Payload))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/cloudevents+json")
	req.Header.Set("User-Agent", "better-compute-webhooks/1")
	if err := webhook.Sign(req.Header, secrets, d.ID, now, d.Payload); err != nil {
		return 0, err
	}
	res, err := w.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	return res.StatusCode, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
