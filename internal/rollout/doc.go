// Package rollout rolls a published bcd release out to a pool's nodes in
// waves: it sends daemon.upgrade to at most max_unavailable nodes of the
// current wave, waits for each to come back Ready on the release's version
// with no new health finding and to stay so for the soak time, pauses
// between waves, and halts at the first failure, sending daemon.rollback
// to every node of the wave it upgraded.
//
// The controller is level-triggered: each pass reads a rollout and its
// nodes in one transaction and acts on what it finds, so running it twice,
// late, or on another replica is safe. It never waits on a node's timing:
// it reads the node's row (liveness, agent_version) and the command's.
//
// It must never push a release that is not published (the release store
// vouches for the signed manifest; bcd verifies it again) and never touch
// a node outside the rollout's fixed node list.
package rollout
