package reservation

import "github.com/better-compute/better-compute/internal/capacity/capmodel"

// The shared capacity types live in capmodel (a leaf every capacity package
// imports); these names keep reservation's API as it was for its callers.
type (
	Reservation     = capmodel.Reservation
	Condition       = capmodel.Condition
	PlacementRecord = capmodel.PlacementRecord
)

// Reservation states.
const (
	StatePending   = capmodel.StatePending
	StatePlaced    = capmodel.StatePlaced
	StateBinding   = capmodel.StateBinding
	StateActive    = capmodel.StateActive
	StateReleasing = capmodel.StateReleasing
	StateReleased  = capmodel.StateReleased
	StateExpired   = capmodel.StateExpired
	StateFailed    = capmodel.StateFailed
	StateCanceled  = capmodel.StateCanceled
)

// Bindings.
const (
	BindingNode       = capmodel.BindingNode
	BindingKubernetes = capmodel.BindingKubernetes
	BindingNone       = capmodel.BindingNone
	BindingInstance   = capmodel.BindingInstance
	BindingMachine    = capmodel.BindingMachine
)

// Condition types.
const (
	CondDevicesHeld  = capmodel.CondDevicesHeld
	CondBindTimeout  = capmodel.CondBindTimeout
	CondNodeLost     = capmodel.CondNodeLost
	CondIsolated     = capmodel.CondIsolated
	CondNodeReleased = capmodel.CondNodeReleased
	CondHeldPastEnd  = capmodel.CondHeldPastEnd
	CondGPUUnhealthy = capmodel.CondGPUUnhealthy
	CondMachineLease = capmodel.CondMachineLease
)

// Atom kinds.
const (
	KindGPU  = capmodel.KindGPU
	KindMIG  = capmodel.KindMIG
	KindSlot = capmodel.KindSlot
	KindCPU  = capmodel.KindCPU
)
