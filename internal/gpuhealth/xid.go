// Package gpuhealth holds what the gateway and bcd agree a GPU health
// event means, so that the control plane's quarantine and the node's own
// (its kubelet stops getting the GPU) follow one list.
package gpuhealth

// KindXID is the HealthEvent kind of an XID error (device: the GPU's UUID,
// code: the XID).
const KindXID = "gpu.xid"

// fatalXIDs are the XID errors after which a GPU must not take new work
// until an operator looks at it (NVIDIA XID catalogue: double-bit ECC,
// row-remap failure, NVLink error, fallen off the bus, uncontained ECC).
var fatalXIDs = map[int64]bool{48: true, 63: true, 64: true, 74: true, 79: true, 92: true, 94: true, 95: true}

// Quarantines reports whether an event of kind on device with code takes
// the GPU out of service.
func Quarantines(kind, device string, code int64) bool {
	return kind == KindXID && device != "" && fatalXIDs[code]
}
