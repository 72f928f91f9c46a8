package ramdisk

import (
	"bytes"
	"context"
	cryptorand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/better-compute/better-compute/internal/erase"
)

// blockBytes is the size of a read-back sample and of the overwrite's
// alignment.
const blockBytes = 4096

// overwriteChunk is how much one write of zeros covers.
const overwriteChunk = 4 << 20

// drive is an open drive being wiped.
type drive struct {
	path  string
	name  string // the sysfs name (nvme0n1, sda), "" for a file
	f     *os.File
	size  int64
	block bool
}

func (r *Ramdisk) wipeCommand(ctx context.Context, params map[string]any, id Identity) (map[string]any, error) {
	machineID, workflowID := paramString(params, "machine_id"), paramString(params, "workflow_id")
	if machineID == "" || workflowID == "" {
		return nil, fmt.Errorf("%w: machine_id and workflow_id are required (the signed record names them)", ErrInvalidParams)
	}
	if id.Key == nil {
		return nil, errors.New("no ramdisk key to sign the wipe record")
	}
	devices, err := paramStrings(params, "devices")
	if err != nil {
		return nil, err
	}
	if len(devices) == 0 {
		disks, err := r.disks()
		if err != nil {
			return nil, err
		}
		for _, d := range disks {
			devices = append(devices, d.Device)
		}
	}
	if len(devices) == 0 {
		return nil, errors.New("no drives to wipe")
	}
	rec := erase.Record{MachineID: machineID, WorkflowID: workflowID, NodeID: id.NodeID}
	for _, dev := range devices {
		d, err := r.Wipe(ctx, dev)
		if err != nil {
			return nil, fmt.Errorf("wipe %s: %w", dev, err)
		}
		rec.Drives = append(rec.Drives, d)
	}
	rec.Time = r.cfg.Clock.Now()
	signed, err := erase.Sign(id.Key, rec)
	if err != nil {
		return nil, err
	}
	return signed.Output(), nil
}

// Wipe erases one drive with the strongest method it supports and reads
// back a random sample. A method whose sample does not read zeros (a
// crypto erase, a discard on a drive that does not zero discarded blocks)
// is followed by the next one, down to an overwrite with zeros.
func (r *Ramdisk) Wipe(ctx context.Context, device string) (erase.Drive, error) {
	d, err := r.open(device)
	if err != nil {
		return erase.Drive{}, err
	}
	defer d.f.Close()
	start := r.cfg.Clock.Now()
	for _, m := range r.methods(d) {
		if err := ctx.Err(); err != nil {
			return erase.Drive{}, err
		}
		if err := m.run(ctx, d); err != nil {
			if m.name == erase.MethodOverwrite {
				return erase.Drive{}, fmt.Errorf("%s: %w", m.name, err)
			}
			continue // the next method
		}
		v, err := r.sample(d)
		if err != nil {
			return erase.Drive{}, fmt.Errorf("read back after %s: %w", m.name, err)
		}
		if v.Zero {
			return erase.Drive{Device: device, Method: m.name, Bytes: d.size,
				DurationMS: r.cfg.Clock.Now().Sub(start).Milliseconds(), Verification: v}, nil
		}
		if m.name == erase.MethodOverwrite {
			return erase.Drive{}, errors.New("the read-back sample is not zero after an overwrite")
		}
	}
	return erase.Drive{}, errors.New("no wipe method left") // overwrite is always last
}

func (r *Ramdisk) open(device string) (*drive, error) {
	fi, err := os.Stat(device)
	if err != nil {
		return nil, err
	}
	d := &drive{path: device}
	flags := os.O_RDWR
	switch {
	case fi.Mode()&os.ModeDevice != 0 && fi.Mode()&os.ModeCharDevice == 0:
		d.block, d.name = true, filepath.Base(device)
		// O_EXCL on a block device fails while it is mounted or in use.
		flags |= unix.O_EXCL
	case fi.Mode().IsRegular() && r.cfg.AllowFileDisks:
	case fi.Mode().IsRegular():
		return nil, fmt.Errorf("%w: %s is a regular file, not a block device", ErrInvalidParams, device)
	default:
		return nil, fmt.Errorf("%w: %s is not a block device", ErrInvalidParams, device)
	}
	if d.f, err = os.OpenFile(device, flags, 0); err != nil {
		return nil, err
	}
	if d.size, err = d.f.Seek(0, io.SeekEnd); err != nil {
		d.f.Close()
		return nil, err
	}
	if d.size <= 0 {
		d.f.Close()
		return nil, fmt.Errorf("%s is empty", device)
	}
	return d, nil
}

type method struct {
	name string
	run  func(ctx context.Context, d *drive) error
}

// methods lists what d supports, strongest first.
func (r *Ramdisk) methods(d *drive) []method {
	var out []method
	if d.block && strings.HasPrefix(d.name, "nvme") {
		if caps, err := nvmeIdentify(d.f); err == nil {
			if caps.sanitizeBlockErase {
				out = append(out, method{erase.MethodNVMeSanitize, func(ctx context.Context, d *drive) error { return nvmeSanitize(ctx, d.f) }})
			}
			if caps.format {
				out = append(out, method{erase.MethodNVMeFormat, func(_ context.Context, d *drive) error { return nvmeFormat(d.f) }})
			}
		}
	}
	// A SATA drive (sd*, behind libata) that offers the security feature
	// set erases itself, remapped and spare sectors included.
	if d.block && strings.HasPrefix(d.name, "sd") {
		if s, err := ataIdentifySecurity(d.f); err == nil && s.usable() {
			out = append(out, method{erase.MethodATASecure, func(ctx context.Context, d *drive) error {
				pw := make([]byte, 16)
				if _, err := cryptorand.Read(pw); err != nil {
					return err
				}
				return ataSecureErase(ctx, d.f, []byte(hex.EncodeToString(pw)))
			}})
		}
	}
	if d.block && r.discards(d.name) {
		out = append(out, method{erase.MethodDiscard, func(_ context.Context, d *drive) error { return blkdiscard(d.f, d.size) }})
	}
	return append(out, method{erase.MethodOverwrite, overwrite})
}

func (r *Ramdisk) discards(name string) bool {
	n, _ := strconv.ParseInt(readTrim(filepath.Join(r.cfg.SysfsRoot, "sys/block", name, "queue/discard_max_bytes")), 10, 64)
	return n > 0
}

func blkdiscard(f *os.File, size int64) error {
	rng := [2]uint64{0, uint64(size)}
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKDISCARD, uintptr(unsafe.Pointer(&rng)))
	if errno != 0 {
		return fmt.Errorf("BLKDISCARD: %w", errno)
	}
	return nil
}

func overwrite(ctx context.Context, d *drive) error {
	zero := make([]byte, overwriteChunk)
	for off := int64(0); off < d.size; off += overwriteChunk {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := min(int64(overwriteChunk), d.size-off)
		if _, err := d.f.WriteAt(zero[:n], off); err != nil {
			return err
		}
	}
	return d.f.Sync()
}

// sample reads back the first and last blocks and Samples random ones,
// after dropping what the kernel caches of the drive, so what is read
// comes from the medium.
func (r *Ramdisk) sample(d *drive) (erase.Verification, error) {
	if d.block {
		if err := unix.IoctlSetInt(int(d.f.Fd()), unix.BLKFLSBUF, 0); err != nil {
			return erase.Verification{}, fmt.Errorf("BLKFLSBUF: %w", err)
		}
	} else if err := unix.Fadvise(int(d.f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return erase.Verification{}, fmt.Errorf("fadvise: %w", err)
	}
	blocks := max(d.size/blockBytes, 1)
	offsets := []int64{0, (blocks - 1) * blockBytes}
	for range r.cfg.Samples {
		offsets = append(offsets, rand.Int64N(blocks)*blockBytes)
	}
	buf := make([]byte, blockBytes)
	zero := make([]byte, blockBytes)
	v := erase.Verification{Samples: len(offsets), BlockBytes: blockBytes, Zero: true}
	for _, off := range offsets {
		n, err := d.f.ReadAt(buf, off)
		if err != nil && !errors.Is(err, io.EOF) {
			return erase.Verification{}, err
		}
		if !bytes.Equal(buf[:n], zero[:n]) {
			v.Zero = false
		}
	}
	return v, nil
}

// wipeTimeout bounds one firmware erase.
const wipeTimeout = 6 * time.Hour
