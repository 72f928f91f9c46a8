package app

import (
	"github.com/better-compute/better-compute/internal/authn"
	"github.com/better-compute/better-compute/internal/capacity/budget"
	"github.com/better-compute/better-compute/internal/capacity/pool"
	"github.com/better-compute/better-compute/internal/capacity/quota"
	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/capacity/usage"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/events"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/fleetmark"
	"github.com/better-compute/better-compute/internal/health"
	"github.com/better-compute/better-compute/internal/images"
	"github.com/better-compute/better-compute/internal/metal"
	"github.com/better-compute/better-compute/internal/policy"
	"github.com/better-compute/better-compute/internal/profiles"
	"github.com/better-compute/better-compute/internal/provideraccounts"
	"github.com/better-compute/better-compute/internal/providerpools"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/quorum"
	"github.com/better-compute/better-compute/internal/sandbox"
	"github.com/better-compute/better-compute/internal/secrets"
	"github.com/better-compute/better-compute/internal/tenancy"
	"github.com/better-compute/better-compute/internal/vps"
	"github.com/better-compute/better-compute/internal/webhooks"
)

// tenantCleaners is a tenant delete's cascade, in order: capacity first
// (the delete refuses while a reservation still holds capacity), then the
// guests it carried, credentials, webhooks and secrets, the fleet, and the
// records last. Each module deletes its own rows; the audit log stays, and
// tenancy deletes the projects and the tenant row after all of them. A
// module whose tables gain a tenant_id column adds itself here
// (TestTenantDeleteLeavesNoRow scans every such table).
//
// The sandbox module's delete is its service's: it also asks the nodes to
// remove the files of the tenant's kept snapshots, which outlive their
// sandboxes.
func tenantCleaners(sandboxes *sandbox.Service) []tenancy.Cleaner {
	return []tenancy.Cleaner{
		{Name: "reservations", Rows: reservation.TenantRows, Delete: reservation.TenantRowsDelete, Busy: reservation.TenantLiveReservations},
		{Name: "instances", Rows: vps.TenantRows, Delete: vps.TenantRowsDelete},
		{Name: "sandboxes", Rows: sandbox.TenantRows, Delete: sandboxes.TenantRowsDelete},
		{Name: "provider pools", Rows: providerpools.TenantRows, Delete: providerpools.TenantRowsDelete},
		{Name: "api keys", Rows: authn.TenantRows, Delete: authn.TenantRowsDelete},
		{Name: "webhooks", Rows: webhooks.TenantRows, Delete: webhooks.TenantRowsDelete},
		{Name: "secrets", Rows: secrets.TenantRows, Delete: secrets.TenantRowsDelete},
		{Name: "fleet marks", Rows: fleetmark.TenantRows, Delete: fleetmark.TenantRowsDelete},
		{Name: "provider accounts", Rows: provideraccounts.TenantRows, Delete: provideraccounts.TenantRowsDelete},
		{Name: "provisioning", Rows: provision.TenantRows, Delete: provision.TenantRowsDelete, Busy: provision.TenantLiveWorkflows},
		{Name: "metal", Rows: metal.TenantRows, Delete: metal.TenantRowsDelete, Busy: metal.TenantLiveLeases},
		{Name: "profiles", Rows: profiles.TenantRows, Delete: profiles.TenantRowsDelete},
		{Name: "quorum", Rows: quorum.TenantRows, Delete: quorum.TenantRowsDelete},
		{Name: "fleet", Rows: fleet.TenantRows, Delete: fleet.TenantRowsDelete},
		{Name: "health", Rows: health.TenantRows, Delete: health.TenantRowsDelete},
		{Name: "images", Rows: images.TenantRows, Delete: images.TenantRowsDelete, Busy: images.TenantImagesInUse},
		{Name: "policies", Rows: policy.TenantRows, Delete: policy.TenantRowsDelete},
		{Name: "usage", Rows: usage.TenantRows, Delete: usage.TenantRowsDelete},
		{Name: "quotas", Rows: quota.TenantRows, Delete: quota.TenantRowsDelete},
		{Name: "budgets", Rows: budget.TenantRows, Delete: budget.TenantRowsDelete},
		{Name: "pools", Rows: pool.TenantRows, Delete: pool.TenantRowsDelete},
		{Name: "confirmations", Rows: envelope.TenantRows, Delete: envelope.TenantRowsDelete},
		{Name: "events", Rows: events.TenantRows, Delete: events.TenantRowsDelete},
	}
}
