// Package usage turns the time reservations spend active into hourly usage
// windows, and serves them through the UsageService API (list and export as
// CSV or CloudEvents).
//
// A window is one hour [h, h+1h) of one metric of one reservation, written
// only once the hour has closed: gpu.<model>.hours (GPUs times the active
// hours inside the window, model being the reservation's GPU model),
// vcpu.hours and memoryGiB.hours. The rollup (Rollup, run hourly as a River
// job) is idempotent: it upserts each window from the reservation's active
// interval [active_since, active_until), so running it twice, or again after
// a crash, writes the same rows.
//
// It must never change reservations or decide what a reservation costs:
// it reads the active intervals the reservation engine records and reports
// quantities; pricing belongs to whoever consumes the export. Every API call
// goes through the envelope.
package usage
