package fleet

import "slices"

// DestructiveKind is a command kind that destroys what a machine holds:
// the API runs it only in a command batch a quorum of the tenant's
// approvers signed (internal/quorum), never through CommandService.Run.
type DestructiveKind struct {
	Kind string
	// Subject is what a leaf of the kind names: SubjectNode or
	// SubjectMachine.
	Subject string
	// What says what the kind destroys, for docs/quorum.md.
	What string
}

// Leaf subjects: a node id of the batch's tenant, or a machine of its
// bare metal qualified by its site ("site/<site id>/machine/<machine id>"),
// whose BMC the site's agent drives.
const (
	SubjectNode    = "node"
	SubjectMachine = "machine"
)

// DestructiveKinds is the one list of destructive command kinds: the quorum
// check and docs/quorum.md both read it (a test keeps the docs in step).
var DestructiveKinds = []DestructiveKind{
	{Kind: KindDiskWipe, Subject: SubjectNode, What: "erases every disk of a machine in its commissioning ramdisk"},
	{Kind: KindImageWrite, Subject: SubjectNode, What: "writes an OS image over a machine's disk (reimage)"},
	// The health module's remediations: what runs on the node (or the
	// GPU) stops. The module sends them itself, under the pool's health
	// policy, once the node has drained.
	{Kind: "node.reboot", Subject: SubjectNode, What: "reboots a node (everything running on it stops)"},
	{Kind: "gpu.reset", Subject: SubjectNode, What: "resets one GPU of a node (what runs on it is killed)"},
	// The bare-metal power actions, as the site agent's step kinds name
	// them: what runs on the machine stops.
	{Kind: "power.off", Subject: SubjectMachine, What: "turns a machine off through its BMC"},
	{Kind: "power.cycle", Subject: SubjectMachine, What: "power-cycles a machine through its BMC"},
	// A rotation that fails holds the machine in maintenance, and one that
	// goes wrong on the BMC can lock the site agent out of it.
	{Kind: "bmc.rotate", Subject: SubjectMachine, What: "replaces a machine's BMC password (a failure holds the machine in maintenance)"},
}

// Destructive returns the kind's entry in DestructiveKinds.
func Destructive(kind string) (DestructiveKind, bool) {
	i := slices.IndexFunc(DestructiveKinds, func(d DestructiveKind) bool { return d.Kind == kind })
	if i < 0 {
		return DestructiveKind{}, false
	}
	return DestructiveKinds[i], true
}
