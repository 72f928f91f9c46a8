// Package sandbox runs short-lived guests from tenant templates: template
// checks against a pool, warm pools of paused instances, TTL expiry,
// extension and snapshots. Every sandbox is one instance of internal/vps,
// booted, resumed and deleted through the instance service's Go API in
// the sandbox's own transaction. It must never put a secret's value in an
// event, a log line, an audit row or an API response: values go only into
// the guest's user data.
package sandbox
