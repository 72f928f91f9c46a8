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
	"time"
)

// A snapshot directory holds the guest's memory and device state (QMP
// migrate to a file), copies of its disks taken while it was paused, and
// the spec: a Restore brings the guest back as it was at that instant.
const (
	snapMemory = "memory"
	snapDisk   = "disk.qcow2"
)

func snapVolume(v Volume) string { return "volume-" + v.ID + "." + v.Format }

// Snapshot saves the running guest into dir (created; must not exist). The
// guest is paused meanwhile and runs again afterwards if it was running.
func (r *Runtime) Snapshot(ctx context.Context, id, dir string) (err error) {
	if !pathRE.MatchString(dir) || filepath.Clean(dir) != dir {
		return &SpecError{Field: "snapshot_dir", Reason: fmt.Sprintf("%q must be a clean absolute path of letters, digits and /_.+@-", dir)}
	}
	in, err := r.get(id)
	if err != nil {
		return err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if err := in.runningLocked(); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("runtime: snapshot: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	wasRunning := in.infoLocked().State == StateRunning
	if _, err := in.monitor("stop", nil); err != nil {
		return err
	}
	defer func() {
		if wasRunning {
			if _, cerr := in.monitor("cont", nil); cerr != nil && err == nil {
				err = cerr
			}
		}
	}()
	// The guest is paused: no downtime to bound, so no bandwidth limit.
	if _, err := in.monitor("migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40}); err != nil {
		return err
	}
	// QEMU 7.2 has no file: URI; exec: runs through /bin/sh, and dir is
	// restricted to shell-safe characters above.
	if _, err := in.monitor("migrate", map[string]any{"uri": "exec:cat > " + filepath.Join(dir, snapMemory)}); err != nil {
		return err
	}
	if err := waitMigration(ctx, in); err != nil {
		return err
	}
	// Disks are copied while the vCPUs are stopped, so they match memory.
	if err := copyFile(ctx, filepath.Join(in.dir, fileDisk), filepath.Join(dir, snapDisk)); err != nil {
		return err
	}
	for _, v := range in.spec.Volumes {
		if err := copyFile(ctx, v.Path, filepath.Join(dir, snapVolume(v))); err != nil {
			return err
		}
	}
	if err := writeSpec(dir, &in.spec); err != nil {
		return err
	}
	r.log.Info("runtime: snapshot taken", "id", id, "dir", dir)
	return nil
}

// waitMigration polls query-migrate until the stream completed or failed.
func waitMigration(ctx context.Context, in *instance) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		raw, err := in.monitor("query-migrate", nil)
		if err != nil {
			return err
		}
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := json.Unmarshal(raw, &st); err != nil {
			return fmt.Errorf("runtime: query-migrate: %w", err)
		}
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("runtime: %s: migration %s: %s", in.spec.ID, st.Status, st.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			_, _ = in.monitor("migrate_cancel", nil)
			return fmt.Errorf("runtime: %s: migration: %w", in.spec.ID, ctx.Err())
		case <-t.C:
		}
	}
}

// copyFile copies sparsely (disks are mostly holes).
func copyFile(ctx context.Context, src, dst string) error {
	if out, err := exec.CommandContext(ctx, "cp", "--sparse=always", "--", src, dst).CombinedOutput(); err != nil {
		return fmt.Errorf("runtime: copy %s: %w: %s", src, err, bytes.TrimSpace(out))
	}
	return nil
}

// Restore brings the instance back to a snapshot of it: QEMU (if running)
// is ended, the disks are put back, and a new QEMU loads the saved state
// and runs.
func (r *Runtime) Restore(ctx context.Context, id, dir string) error {
	if !pathRE.MatchString(dir) || filepath.Clean(dir) != dir {
		return &SpecError{Field: "snapshot_dir", Reason: fmt.Sprintf("%q must be a clean absolute path of letters, digits and /_.+@-", dir)}
	}
	in, err := r.get(id)
	if err != nil {
		return err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	b, err := os.ReadFile(filepath.Join(dir, fileSpec))
	if err != nil {
		return fmt.Errorf("runtime: restore: not a snapshot: %w", err)
	}
	var snap Spec
	if err := json.Unmarshal(b, &snap); err != nil {
		return fmt.Errorf("runtime: restore: snapshot spec: %w", err)
	}
	// The saved device state only loads into the same machine shape.
	if snap.ID != id || snap.VCPUs != in.spec.VCPUs || snap.MemoryMiB != in.spec.MemoryMiB || len(snap.Volumes) != len(in.spec.Volumes) {
		return &SpecError{Field: "snapshot_dir", Reason: fmt.Sprintf("snapshot of %q (%d vCPUs, %d MiB, %d volumes) does not fit %q (%d vCPUs, %d MiB, %d volumes)",
			snap.ID, snap.VCPUs, snap.MemoryMiB, len(snap.Volumes), id, in.spec.VCPUs, in.spec.MemoryMiB, len(in.spec.Volumes))}
	}
	for _, f := range []string{snapMemory, snapDisk} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return fmt.Errorf("runtime: restore: snapshot incomplete: %w", err)
		}
	}
	if err := r.killLocked(ctx, in); err != nil {
		return err
	}
	if err := copyFile(ctx, filepath.Join(dir, snapDisk), filepath.Join(in.dir, fileDisk)); err != nil {
		return err
	}
	for i, v := range in.spec.Volumes {
		if err := copyFile(ctx, filepath.Join(dir, snapVolume(snap.Volumes[i])), v.Path); err != nil {
			return err
		}
	}
	if err := r.startLocked(ctx, in, true); err != nil {
		return err
	}
	if _, err := in.monitor("migrate-incoming", map[string]any{"uri": "exec:cat " + filepath.Join(dir, snapMemory)}); err != nil {
		_ = r.killLocked(ctx, in)
		return err
	}
	if err := waitIncoming(ctx, in); err != nil {
		_ = r.killLocked(ctx, in)
		return err
	}
	if _, err := in.monitor("cont", nil); err != nil {
		return err
	}
	r.log.Info("runtime: snapshot restored", "id", id, "dir", dir)
	return nil
}

// waitIncoming polls until the incoming stream is loaded: the run state
// leaves inmigrate.
func waitIncoming(ctx context.Context, in *instance) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		raw, err := in.monitor("query-status", nil)
		if err != nil {
			return err
		}
		var st struct {
			Status string `json:"status"`
		}
		if err := json.Unmarshal(raw, &st); err != nil {
			return fmt.Errorf("runtime: query-status: %w", err)
		}
		switch st.Status {
		case "inmigrate":
		case "paused", "running", "postmigrate":
			return nil
		default:
			m, _ := in.monitor("query-migrate", nil)
			return errors.New("runtime: restore " + in.spec.ID + ": state " + st.Status + ": " + string(m))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("runtime: %s: restore: %w", in.spec.ID, ctx.Err())
		case <-t.C:
		}
	}
}
