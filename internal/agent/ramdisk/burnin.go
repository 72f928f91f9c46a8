package ramdisk

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"time"
)

// Burn-in bounds: a pass never runs longer than maxBurnIn, and its memory
// check never takes more than burnInMemory (the initramfs lives in RAM too).
const (
	defaultBurnIn = 30 * time.Second
	maxBurnIn     = 4 * time.Hour
	burnInMemory  = 64 << 20
)

// burnInCommand is a bounded health pass: read the machine's disks end to
// end (a third of the time each at most), write and verify a memory
// pattern, and hash on the CPU until the time is up. A disk read error or a memory
// mismatch fails it.
//
// Params: enabled (false: skipped), duration_seconds (default 30, at most
// 4 h), devices (default: every disk the inventory sees).
func (r *Ramdisk) burnInCommand(ctx context.Context, params map[string]any) (map[string]any, error) {
	if on, _ := params["enabled"].(bool); !on {
		return map[string]any{"skipped": true}, nil
	}
	d := defaultBurnIn
	if s, ok := params["duration_seconds"].(float64); ok {
		if s <= 0 || time.Duration(s)*time.Second > maxBurnIn {
			return nil, fmt.Errorf("%w: duration_seconds: must be between 1 and %d", ErrInvalidParams, int(maxBurnIn/time.Second))
		}
		d = time.Duration(s) * time.Second
	}
	devices, err := paramStrings(params, "devices")
	if err != nil {
		return nil, err
	}
	if len(devices) == 0 {
		inv, err := r.Inventory()
		if err != nil {
			return nil, err
		}
		for _, disk := range inv.Disks {
			devices = append(devices, disk.Device)
		}
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()

	// Disks: sequential reads, a third of the time each at most.
	var read int64
	buf := make([]byte, 1<<20)
	for _, dev := range devices {
		dst, err := r.open(dev)
		if err != nil {
			return nil, fmt.Errorf("burn-in: %w", err)
		}
		dctx, dcancel := context.WithTimeout(ctx, d/3)
		for off := int64(0); off < dst.size && dctx.Err() == nil; {
			n, err := dst.f.ReadAt(buf, off)
			if err != nil && err != io.EOF {
				dcancel()
				_ = dst.f.Close()
				return nil, fmt.Errorf("burn-in: read %s at %d: %w", dev, off, err)
			}
			off, read = off+int64(n), read+int64(n)
			if n == 0 {
				break
			}
		}
		dcancel()
		_ = dst.f.Close()
	}
	// Memory: a pattern written and read back, twice inverted.
	mem := make([]byte, burnInMemory)
	for _, pat := range []byte{0x55, 0xaa} {
		for i := range mem {
			mem[i] = pat ^ byte(i)
		}
		for i := range mem {
			if mem[i] != pat^byte(i) {
				return nil, fmt.Errorf("burn-in: memory mismatch at offset %d", i)
			}
		}
	}
	// CPU: hash until the time is up, at least one block even when the
	// disks and memory took the whole time (a slow machine).
	var hashed int64
	block := bytes.Repeat([]byte{0x5a}, 1<<20)
	for hashed == 0 || ctx.Err() == nil {
		sum := sha256.Sum256(block)
		block[0] = sum[0]
		hashed += int64(len(block))
	}
	return map[string]any{"passed": true, "duration_ms": time.Since(start).Milliseconds(), "memory_bytes_verified": int64(burnInMemory),
		"disk_bytes_read": read, "cpu_bytes_hashed": hashed, "devices": anyStrings(devices)}, nil
}

func anyStrings(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
