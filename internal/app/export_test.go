package app

// TenantCleaners exposes the delete cascade to the tests of package
// app_test, which interrupt it midway.
var TenantCleaners = tenantCleaners
