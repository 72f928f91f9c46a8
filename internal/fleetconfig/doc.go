// Package fleetconfig is fleet configuration as code: YAML documents that
// declare flavors, IP pools, pools and quotas, a plan that diffs them
// against the live state read through the public API client, an apply
// that makes each change one API mutation (its own decision and audit
// row), and an export that writes the live state back as documents.
//
// Only the public API is used, with the caller's credentials: what the
// caller may not read or change is refused by the API, as it would be for
// the CLI verbs.
package fleetconfig
