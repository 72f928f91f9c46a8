package ramdisk

import (
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
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
