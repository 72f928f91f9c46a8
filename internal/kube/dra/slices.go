package dra

import (
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/better-compute/better-compute/internal/kubebind"
)

// Attribute names published with each device; a DeviceClass or a claim
// selects on them in CEL as device.attributes["gpu.bcd.dev"].model.
const (
	AttrUUID         = "uuid"
	AttrModel        = "model"
	AttrNVLinkIsland = "nvlinkIsland"
	AttrMIG          = "mig"
	AttrMIGProfile   = "migProfile"
	AttrReservation  = "reservation"
	// CapMemory is the device's memory, a capacity.
	CapMemory = "memory"
)

// resources is the node's pool: one device per offered, healthy GPU.
// Quarantined devices are left out rather than tainted: device taints
// are beta behind the DRADeviceTaints gate in 1.37, and on a cluster
// without it the apiserver drops the taint and the scheduler would hand
// out the quarantined GPU. Leaving it out holds on every cluster; pods
// already running on it learn through the health service.
func (d *Driver) resources() resourceslice.DriverResources {
	devs := []resourceapi.Device{}
	seen := map[string]string{}
	for _, dev := range d.cfg.Set.Devices() {
		if !dev.Healthy {
			continue
		}
		name := deviceName(dev.UUID)
		if other, ok := seen[name]; ok || name == "" {
			d.log.Error("device not published: its name collides with another's or is empty",
				"uuid", dev.UUID, "name", name, "other", other)
			continue
		}
		seen[name] = dev.UUID
		devs = append(devs, apiDevice(name, dev))
	}
	// An empty slice still says the driver runs and has nothing to offer.
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		d.cfg.NodeName: {Slices: []resourceslice.Slice{{Devices: devs}}},
	}}
}

func apiDevice(name string, dev kubebind.Device) resourceapi.Device {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		AttrUUID:        {StringValue: ptr.To(dev.UUID)},
		AttrReservation: {StringValue: ptr.To(dev.AllocationID)},
		AttrMIG:         {BoolValue: ptr.To(dev.MIGProfile != "")},
	}
	// Unknown values are left out rather than published empty, so a
	// selector's has() tells them apart.
	for k, v := range map[resourceapi.QualifiedName]string{
		AttrModel: dev.Model, AttrNVLinkIsland: dev.NVLinkIsland, AttrMIGProfile: dev.MIGProfile,
	} {
		if v != "" {
			attrs[k] = resourceapi.DeviceAttribute{StringValue: ptr.To(v)}
		}
	}
	out := resourceapi.Device{Name: name, Attributes: attrs}
	if dev.MemoryMiB > 0 {
		out.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			CapMemory: {Value: *resource.NewQuantity(dev.MemoryMiB<<20, resource.BinarySI)},
		}
	}
	return out
}

// deviceName turns a UUID (GPU-6f1e..., MIG-...) into the DNS label a
// device name must be: lower case, other characters as '-', at most 63.
func deviceName(uuid string) string {
	b := []byte(strings.ToLower(uuid))
	for i, c := range b {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			b[i] = '-'
		}
	}
	s := string(b)
	if len(s) > 63 {
		s = s[:63]
	}
	return strings.Trim(s, "-")
}
