// Package releases publishes signed bcd releases in the control plane: the
// releases table, the ReleaseService API (Create streams a release's signed
// manifest and its binaries and SBOMs into the blob store; Get, List,
// Delete), and what /downloads serves of them.
//
// Releases are the platform's. A release is published only when its
// manifest verifies under one of the control plane's release public keys
// (--release-pubkey) and every file it names arrived with the size and
// sha256 the manifest pins; otherwise nothing is kept. The manifest format
// and its checks are internal/release's: this package must never read or
// verify a manifest any other way, nor publish anything unsigned.
package releases
