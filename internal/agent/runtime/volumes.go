package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"
)

// CreateVolume makes an empty volume file (qcow2 or raw) of sizeMiB.
func (r *Runtime) CreateVolume(ctx context.Context, path, format string, sizeMiB int) error {
	if format != "qcow2" && format != "raw" {
		return &SpecError{Field: "format", Reason: fmt.Sprintf("must be qcow2 or raw, got %q", format)}
	}
	if !pathRE.MatchString(path) || filepath.Clean(path) != path {
		return &SpecError{Field: "path", Reason: fmt.Sprintf("%q must be a clean absolute path of letters, digits and /_.+@-", path)}
	}
	if sizeMiB < 1 {
		return &SpecError{Field: "size_mib", Reason: fmt.Sprintf("must be at least 1, got %d", sizeMiB)}
	}
	if _, err := os.Stat(path); err == nil {
		return &SpecError{Field: "path", Reason: fmt.Sprintf("%q exists", path)}
	}
	if out, err := exec.CommandContext(ctx, r.cfg.QEMUImg, "create", "-q", "-f", format, path, fmt.Sprintf("%dM", sizeMiB)).CombinedOutput(); err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("runtime: create volume: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// DeleteVolume removes a volume file no instance of this runtime uses.
func (r *Runtime) DeleteVolume(_ context.Context, path string) error {
	r.mu.Lock()
	for _, in := range r.instances {
		in.mu.Lock()
		used := slices.ContainsFunc(in.spec.Volumes, func(v Volume) bool { return v.Path == path })
		id := in.spec.ID
		in.mu.Unlock()
		if used {
			r.mu.Unlock()
			return fmt.Errorf("runtime: volume %s is attached to %q", path, id)
		}
	}
	r.mu.Unlock()
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("runtime: delete volume: %w", err)
	}
	return nil
}

// AttachVolume adds a volume to the instance: hot-plugged when QEMU runs,
// and in the spec for every later start.
func (r *Runtime) AttachVolume(ctx context.Context, id string, v Volume) error {
	in, err := r.get(id)
	if err != nil {
		return err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	next := in.spec
	next.Volumes = append(slices.Clone(in.spec.Volumes), v)
	if err := next.Validate(); err != nil {
		return err
	}
	if pidAlive(in.pid(), id) {
		if _, err := in.monitor("blockdev-add", blockdevArgs(volNode(v.ID), v.Path, v.Format, v.ReadOnly)); err != nil {
			return err
		}
		if _, err := in.monitor("device_add", map[string]any{
			"driver": "virtio-blk-pci", "drive": volNode(v.ID), "id": "dev-vol-" + v.ID, "serial": serial(v.ID),
		}); err != nil {
			_, _ = in.monitor("blockdev-del", map[string]any{"node-name": volNode(v.ID)})
			return err
		}
	}
	in.spec = next
	return writeSpec(in.dir, &in.spec)
}

// DetachVolume removes a volume from the instance. A running guest must
// release the device (ACPI hot-unplug); ctx bounds the wait.
func (r *Runtime) DetachVolume(ctx context.Context, id, volumeID string) error {
	in, err := r.get(id)
	if err != nil {
		return err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	i := slices.IndexFunc(in.spec.Volumes, func(v Volume) bool { return v.ID == volumeID })
	if i < 0 {
		return &SpecError{Field: "volume_id", Reason: fmt.Sprintf("%q is not attached to %q", volumeID, id)}
	}
	if pidAlive(in.pid(), id) {
		if _, err := in.monitor("device_del", map[string]any{"id": "dev-vol-" + volumeID}); err != nil {
			return err
		}
		// The device is gone once the guest acknowledged the unplug; the
		// node can be deleted only then.
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			_, err := in.monitor("blockdev-del", map[string]any{"node-name": volNode(volumeID)})
			if err == nil {
				break
			}
			var gone bool
			if raw, qerr := in.monitor("query-named-block-nodes", map[string]any{"flat": true}); qerr == nil {
				var nodes []struct {
					NodeName string `json:"node-name"`
				}
				if json.Unmarshal(raw, &nodes) == nil {
					gone = !slices.ContainsFunc(nodes, func(n struct {
						NodeName string `json:"node-name"`
					}) bool {
						return n.NodeName == volNode(volumeID)
					})
				}
			}
			if gone {
				break
			}
			select {
			case <-ctx.Done():
				return errors.Join(fmt.Errorf("runtime: detach %s from %s: guest did not release the device: %w", volumeID, id, ctx.Err()), err)
			case <-t.C:
			}
		}
	}
	in.spec.Volumes = slices.Delete(slices.Clone(in.spec.Volumes), i, i+1)
	return writeSpec(in.dir, &in.spec)
}
