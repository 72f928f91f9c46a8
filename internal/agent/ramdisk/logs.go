package ramdisk

import (
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/better-compute/better-compute/internal/imagesig"
)

// maxLogBytes bounds each log logs.collect returns.
const maxLogBytes = 64 << 10

// collectLogs returns the tail of the kernel ring buffer, the kernel
// command line (the discovery token is redacted) and the agent's own log.
func (r *Ramdisk) collectLogs() map[string]any {
	out := map[string]any{}
	buf := make([]byte, 1<<20)
	if n, err := unix.Klogctl(unix.SYSLOG_ACTION_READ_ALL, buf); err == nil {
		out["kernel"] = tail(string(buf[:n]))
	} else {
		out["kernel_error"] = err.Error()
	}
	if b, err := os.ReadFile(filepath.Join(r.cfg.SysfsRoot, "proc/cmdline")); err == nil {
		out["cmdline"] = redactCmdline(string(b))
	}
	if r.cfg.Logs != nil {
		out["agent"] = tail(r.cfg.Logs())
	}
	return out
}

func tail(s string) string {
	if len(s) > maxLogBytes {
		return s[len(s)-maxLogBytes:]
	}
	return s
}

// LogRing keeps the last bytes of the agent's log for logs.collect; it is
// an io.Writer a logger's handler writes to.
type LogRing struct {
	mu  sync.Mutex
	buf []byte
}

// Write appends p, dropping the oldest bytes past maxLogBytes.
func (r *LogRing) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buf = append(r.buf, p...)
	if over := len(r.buf) - maxLogBytes; over > 0 {
		r.buf = append(r.buf[:0], r.buf[over:]...)
	}
	return len(p), nil
}

// String returns what the ring holds.
func (r *LogRing) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return string(r.buf)
}

// LoadTrustedKeys reads the PEM public keys an image must be signed with
// (one or more "PUBLIC KEY" blocks).
func LoadTrustedKeys(path string) ([]imagesig.PublicKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var keys []imagesig.PublicKey
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		k, err := imagesig.ParsePublicKeyDER(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: key %d: %w", path, len(keys)+1, err)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%s holds no PEM public key", path)
	}
	return keys, nil
}
