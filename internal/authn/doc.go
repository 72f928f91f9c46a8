// Package authn answers "who is calling": API keys (bc_ prefix, stored only
// as a hash, shown once, revocable, optionally expiring) and OIDC bearer
// tokens from a configured issuer. It owns the api_keys table and the
// ApiKeyService, and implements the envelope's Authenticator.
//
// It must never store or log a secret, and never decide access: that is the
// envelope's one authorization decision.
package authn
