// Package images is the image catalog: content-addressed images (raw and
// qcow2 disks, kernels, initrds, ramdisk bundles) in a blob directory, their
// signatures, the per-tenant and platform signer allowlists, the
// ImageService and SignerKeyService handlers, and Verify, the check the
// deploy path runs before a machine is written with an image.
//
// It must never decide access itself (every call goes through the
// envelope), keep bytes whose digest it has not checked, or trust a key
// that an allowlist does not hold.
package images
