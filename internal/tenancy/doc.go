// Package tenancy owns tenants (organizations) and their projects: their
// tables, the TenantService and ProjectService handlers, and the lookups other
// modules use to resolve a tenant or project by name or id.
//
// It must never decide access itself: every call goes through the envelope.
package tenancy
