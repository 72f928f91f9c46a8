// Package health answers the fleet operator's question — what broke, what
// is the system doing about it, how much capacity is out. It records the
// findings bcd reports (XIDs and standing inventory findings) as rows,
// applies each pool's health policy to them (record, quarantine a GPU,
// mark it for RMA, or remediate: drain the node and reset the GPU or
// reboot the node), and runs remediations on the provisioning engine
// within the pool's disruption budget, behind a per-pool circuit breaker
// that stops node-by-node "repairs" of a fleet-wide cause.
//
// Quarantine is a row in health_gpus plus the node condition
// GpuQuarantined/<uuid> that capacity's atoms read, written together so
// placement and this module never disagree.
//
// It must never talk to a node or a BMC itself: remediation steps go
// through the provisioning engine's runners, and drains through the fleet.
package health
