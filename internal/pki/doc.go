// Package pki is the control plane's certificate authority: an ECDSA P-256
// root with node, serving and internal intermediates on the standard
// library's crypto/x509, node certificates carrying SPIFFE IDs
// (spiffe://<trust-domain>/node/<id>) and roles, revocation, the renew
// replay guard, join tokens sealed as JWE, and the Sealer that encrypts every
// secret the package keeps in the database under BETTER_COMPUTE_SECRET.
//
// It must never write a private key unsealed to the database or to a log:
// CA keys reach the database only through Sealer.Seal, bound to their ref,
// and the only unsealed key it ever writes is an offline root key, to the
// 0600 file the operator asked for.
package pki
