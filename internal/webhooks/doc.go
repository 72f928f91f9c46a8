// Package webhooks owns tenants' webhook endpoints (WebhookService) and
// their delivery: the dispatcher reads the transactional outbox after each
// endpoint's cursor and queues a delivery per matching event, enqueueing a
// River job in the same transaction; the job posts the endpoint's oldest
// pending delivery as a CloudEvent signed by the Standard Webhooks scheme,
// one at a time per endpoint, retrying with exponential backoff and jitter
// on the control plane's clock for up to a day before it dead-letters the
// delivery and disables the endpoint.
//
// It must never deliver to an address the SSRF guard refuses, store a
// secret unsealed, or decide access itself: every API call goes through the
// envelope.
package webhooks
