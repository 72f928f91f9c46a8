// Package workloadid issues workload identity tokens
// (WorkloadIdentityService, docs/workload-identity.md): short-lived ES256
// JWTs naming a tenant's reservation, instance or sandbox, signed with the
// PKI's workload key and verifiable against the JWKS the control plane
// serves at /.well-known/jwks.json beside an OIDC discovery document.
//
// It must never issue a token for a workload the caller may not act on, for
// one that has ended, or for a tenant that may not act (tenancy.Active);
// every issue goes through the envelope (one decision, audited), and the
// token never reaches the idempotency store.
package workloadid
