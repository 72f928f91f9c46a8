// Package provision is the workflow engine that drives machines through
// profiles: ordered steps (power, wipe, image write, await a rejoin,
// inventory), each with a timeout, retries with exponential backoff and an
// on_failure rule. Workflows and their steps are rows; the database holds
// the invariants (one active workflow per target, one in-flight step per
// workflow, one claim per idempotency key); River jobs and a
// level-triggered sweep move them forward; what a step does is up to the
// StepRunner the caller registers for its kind.
//
// A destructive step is dispatched at most once per idempotency key, and
// the key is committed before the dispatch. After a worker dies the engine
// never dispatches that key again: it asks the runner what became of it and
// re-attaches, or fails the step with an unknown outcome for an operator.
//
// It must never talk to a BMC, a site or a machine itself (runners do), and
// never decide access: callers (MachineService) authorize and audit, and
// call in with their own transaction where the change must be atomic with
// theirs.
package provision
