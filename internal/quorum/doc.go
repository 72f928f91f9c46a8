// Package quorum owns command batches and approver sets: a tenant's
// destructive commands (fleet.DestructiveKinds) run only as the leaves of a
// batch that M of the tenant's N approver keys signed, and an approver set
// changes only with the previous set's quorum. It serves the
// CommandBatchService API.
//
// It must never run a leaf that was not approved (Run re-verifies every
// stored approval against the root recomputed from the stored leaves), never
// hold an approver's private key, and never create commands except through
// fleet.SendSystemCommand, so every command row it writes is an ordinary one.
package quorum
