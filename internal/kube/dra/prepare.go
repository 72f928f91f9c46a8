package dra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// CDI names: the runtime resolves "bcd.dev/gpu=<claim UID>" from the spec
// file the driver writes for the claim.
const (
	cdiVendor  = "bcd.dev"
	cdiClass   = "gpu"
	cdiKind    = cdiVendor + "/" + cdiClass
	cdiVersion = "0.6.0" // the first with device annotations
	// AnnotationReservation on the CDI device names the reservations
	// whose GPUs the claim got.
	AnnotationReservation = "bcd.dev/reservation"
)

// PrepareResourceClaims implements kubeletplugin.DRAPlugin. Each claim
// is prepared or refused on its own; the helper serializes the calls.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.op.Lock()
	defer d.op.Unlock()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		res, err := d.prepare(c)
		if err != nil {
			d.log.Warn("claim refused", "claim", c.Namespace+"/"+c.Name, "uid", c.UID, "error", err)
			res = kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)}
		}
		out[c.UID] = res
	}
	return out, nil
}

func (d *Driver) prepare(claim *resourceapi.ResourceClaim) (kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	done, ok := d.prepared[claim.UID]
	d.mu.Unlock()
	if ok {
		return done, nil
	}
	if claim.Status.Allocation == nil {
		return kubeletplugin.PrepareResult{}, errors.New("not allocated")
	}
	// Devices by published name: what the allocation result refers to.
	offered := map[string]string{}
	for _, dev := range d.cfg.Set.Devices() {
		offered[deviceName(dev.UUID)] = dev.UUID
	}
	holders := d.cfg.Set.Holders()
	holder := holderPrefix + string(claim.UID)
	var (
		uuids   []string
		result  kubeletplugin.PrepareResult
		cdiID   = cdiKind + "=" + string(claim.UID)
		request = map[string]bool{}
	)
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		if r.Pool != d.cfg.NodeName {
			return kubeletplugin.PrepareResult{}, fmt.Errorf("device %s is from pool %q, not this node's %q", r.Device, r.Pool, d.cfg.NodeName)
		}
		uuid, ok := offered[r.Device]
		if !ok {
			return kubeletplugin.PrepareResult{}, fmt.Errorf("device %s is not offered by bcd on node %s (its reservation was released or never bound here)", r.Device, d.cfg.NodeName)
		}
		// The last line of defence against two workloads on one GPU:
		// another claim, or a pod given it by bcd's device plugin (the
		// scheduler counts the two apart). An admin-access claim
		// (monitoring) may share it.
		if !ptrTrue(r.AdminAccess) {
			for h, us := range holders {
				if h != holder && slices.Contains(us, uuid) {
					return kubeletplugin.PrepareResult{}, fmt.Errorf("device %s is held by %s already", r.Device, h)
				}
			}
		}
		uuids = append(uuids, uuid)
		dev := kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device}
		// One CDI device for the whole claim, named once per request so a
		// container's request does not list it twice.
		if !request[r.Request] {
			request[r.Request] = true
			dev.CDIDeviceIDs = []string{cdiID}
		}
		result.Devices = append(result.Devices, dev)
	}
	if len(uuids) == 0 {
		return kubeletplugin.PrepareResult{}, fmt.Errorf("no device of driver %s is allocated", DriverName)
	}
	if err := d.cfg.Set.Hold(holder, uuids); err != nil {
		return kubeletplugin.PrepareResult{}, err
	}
	if err := d.writeSpec(claim.UID, uuids); err != nil {
		d.cfg.Set.Let(holder)
		return kubeletplugin.PrepareResult{}, err
	}
	d.mu.Lock()
	d.prepared[claim.UID] = result
	d.mu.Unlock()
	d.log.Info("claim prepared", "claim", claim.Namespace+"/"+claim.Name, "uid", claim.UID, "devices", uuids)
	return result, nil
}

func ptrTrue(b *bool) bool { return b != nil && *b }

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin: the spec
// goes and the claim lets go of its GPUs. A claim not prepared (or
// unprepared already) is no error: the kubelet retries.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.op.Lock()
	defer d.op.Unlock()
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		err := os.Remove(d.specPath(c.UID))
		if errors.Is(err, os.ErrNotExist) {
			err = nil
		}
		if err != nil {
			out[c.UID] = fmt.Errorf("claim %s/%s: remove CDI spec: %w", c.Namespace, c.Name, err)
			continue
		}
		d.cfg.Set.Let(holderPrefix + string(c.UID))
		d.mu.Lock()
		delete(d.prepared, c.UID)
		d.mu.Unlock()
		out[c.UID] = nil
	}
	return out, nil
}

// CDI spec, the subset the driver writes
// (https://github.com/cncf-tags/container-device-interface/blob/main/SPEC.md).
type cdiSpec struct {
	CDIVersion string      `json:"cdiVersion"`
	Kind       string      `json:"kind"`
	Devices    []cdiDevice `json:"devices"`
}

type cdiDevice struct {
	Name           string            `json:"name"`
	Annotations    map[string]string `json:"annotations,omitempty"`
	ContainerEdits cdiEdits          `json:"containerEdits"`
}

type cdiEdits struct {
	Env         []string        `json:"env,omitempty"`
	DeviceNodes []cdiDeviceNode `json:"deviceNodes,omitempty"`
}

type cdiDeviceNode struct {
	Path string `json:"path"`
}

// specPath follows CDI's naming of transient specs: vendor-class_id.json.
func (d *Driver) specPath(claim types.UID) string {
	return filepath.Join(d.cfg.CDIDir, cdiVendor+"-"+cdiClass+"_"+string(claim)+".json")
}

// writeSpec writes the claim's CDI spec: its GPUs' device nodes, and
// their UUIDs for the NVIDIA container runtime and CUDA. Written to a
// temporary file and renamed, so the runtime never reads half a spec.
func (d *Driver) writeSpec(claim types.UID, uuids []string) error {
	var paths, reservations []string
	for _, u := range uuids {
		dev, ok := d.cfg.Set.Device(u)
		if !ok {
			return fmt.Errorf("device %s is no longer offered", u)
		}
		paths = append(paths, dev.Paths...)
		reservations = append(reservations, dev.AllocationID)
	}
	slices.Sort(paths)
	slices.Sort(reservations)
	visible := strings.Join(uuids, ",")
	dev := cdiDevice{
		Name:        string(claim),
		Annotations: map[string]string{AnnotationReservation: strings.Join(slices.Compact(reservations), ",")},
		ContainerEdits: cdiEdits{
			Env: []string{"NVIDIA_VISIBLE_DEVICES=" + visible, "CUDA_VISIBLE_DEVICES=" + visible},
		},
	}
	for _, p := range slices.Compact(paths) {
		dev.ContainerEdits.DeviceNodes = append(dev.ContainerEdits.DeviceNodes, cdiDeviceNode{Path: p})
	}
	data, err := json.MarshalIndent(cdiSpec{CDIVersion: cdiVersion, Kind: cdiKind, Devices: []cdiDevice{dev}}, "", "  ")
	if err != nil {
		return fmt.Errorf("encode CDI spec: %w", err)
	}
	path := d.specPath(claim)
	tmp, err := os.CreateTemp(d.cfg.CDIDir, ".bcd-*.tmp")
	if err != nil {
		return fmt.Errorf("write CDI spec: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("write CDI spec %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write CDI spec %s: %w", path, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("write CDI spec %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write CDI spec %s: %w", path, err)
	}
	return nil
}

// adopt holds again, for each claim whose CDI spec is on disk but which
// holds nothing, the GPUs its spec names. The kubelet does not prepare a
// running pod's claims again after bcd restarts, so without this a
// release would complete under a running pod. A claim whose GPUs are not
// offered (yet) or are unhealthy is tried again at the next change.
func (d *Driver) adopt() {
	d.op.Lock()
	defer d.op.Unlock()
	specs, err := filepath.Glob(filepath.Join(d.cfg.CDIDir, cdiVendor+"-"+cdiClass+"_*.json"))
	if err != nil {
		d.log.Error("list CDI specs", "error", err)
		return
	}
	holders := d.cfg.Set.Holders()
	for _, path := range specs {
		uid := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(path), cdiVendor+"-"+cdiClass+"_"), ".json")
		holder := holderPrefix + uid
		if _, ok := holders[holder]; ok {
			continue
		}
		uuids, err := specUUIDs(path)
		if errors.Is(err, os.ErrNotExist) {
			continue // unprepared meanwhile
		}
		if err != nil {
			d.log.Error("read CDI spec of a prepared claim", "path", path, "error", err)
			continue
		}
		if err := d.cfg.Set.Hold(holder, uuids); err != nil {
			d.log.Warn("claim prepared before a restart not held yet", "claim uid", uid, "error", err)
			continue
		}
		d.log.Info("claim prepared before a restart held again", "claim uid", uid, "devices", uuids)
	}
}

// specUUIDs reads the GPU UUIDs from a spec the driver wrote.
func specUUIDs(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var spec cdiSpec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("decode %s: %w", path, err)
	}
	for _, dev := range spec.Devices {
		for _, env := range dev.ContainerEdits.Env {
			if v, ok := strings.CutPrefix(env, "NVIDIA_VISIBLE_DEVICES="); ok && v != "" {
				return strings.Split(v, ","), nil
			}
		}
	}
	return nil, fmt.Errorf("%s names no NVIDIA_VISIBLE_DEVICES", path)
}
