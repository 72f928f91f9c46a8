package runtime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Capabilities is what this host can run guests with, and why.
type Capabilities struct {
	// Accel is "kvm" or "tcg".
	Accel string
	// AccelReason says why (the probe's outcome, or the forced setting).
	AccelReason     string
	HugePages       bool
	HugePagesReason string
}

// Capabilities probes once (lazily) and returns the cached result.
func (r *Runtime) Capabilities(ctx context.Context) Capabilities {
	r.capsOnce.Do(func() {
		r.caps.Accel, r.caps.AccelReason = r.probeAccel(ctx)
		if r.caps.Accel == "tcg" {
			r.log.Warn("runtime: guests run on TCG (software emulation, slow)", "why", r.caps.AccelReason)
		} else {
			r.log.Info("runtime: guests run on KVM", "why", r.caps.AccelReason)
		}
		r.caps.HugePages, r.caps.HugePagesReason = probeHugePages()
	})
	return r.caps
}

func (r *Runtime) probeAccel(ctx context.Context) (string, string) {
	switch r.cfg.Accel {
	case "kvm":
		return "kvm", "forced by configuration"
	case "tcg":
		return "tcg", "forced by configuration"
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return "tcg", fmt.Sprintf("/dev/kvm: %v", err)
	}
	_ = f.Close()
	if err := r.bootProbe(ctx, "kvm"); err != nil {
		return "tcg", "kvm probe failed: " + err.Error()
	}
	if r.cfg.ProbeKernel == "" {
		return "kvm", "kvm booted the probe sector (no probe kernel configured)"
	}
	return "kvm", "kvm booted the probe kernel"
}

// probeSector is a boot sector that writes 0x31 to isa-debug-exit's port
// and halts: QEMU then exits with status (0x31<<1)|1 = 99.
var probeSector = func() []byte {
	b := make([]byte, 512)
	copy(b, []byte{
		0xb0, 0x31, // mov al, 0x31
		0xba, 0xf4, 0x00, // mov dx, 0xf4
		0xee,       // out dx, al
		0xf4,       // hlt
		0xeb, 0xfd, // jmp hlt
	})
	b[510], b[511] = 0x55, 0xaa
	return b
}()

// bootProbe boots something tiny on accel within ProbeTimeout: the probe
// kernel until it panics for want of a root (-no-reboot turns the panic's
// reboot into an exit), or the probe sector. A kvm that hangs stock
// kernels times out here.
func (r *Runtime) bootProbe(ctx context.Context, accel string) error {
	dir, err := os.MkdirTemp("", "bc-kvm-probe-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	console := filepath.Join(dir, "console")
	args := []string{"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-accel", accel, "-m", "128M", "-serial", "file:" + console}
	if r.cfg.ProbeKernel != "" {
		args = append(args, "-kernel", r.cfg.ProbeKernel, "-append", "console=ttyS0 panic=-1 root=/dev/bc-probe-none")
	} else {
		img := filepath.Join(dir, "probe.img")
		if err := os.WriteFile(img, probeSector, 0o600); err != nil {
			return err
		}
		args = append(args, "-drive", "file="+img+",format=raw,if=floppy", "-device", "isa-debug-exit,iobase=0xf4,iosize=0x04")
	}
	pctx, cancel := context.WithTimeout(ctx, r.cfg.ProbeTimeout)
	defer cancel()
	cmd := exec.CommandContext(pctx, r.cfg.QEMU, args...)
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if pctx.Err() != nil {
		return fmt.Errorf("no exit within %s (a hung guest)", r.cfg.ProbeTimeout)
	}
	if r.cfg.ProbeKernel != "" {
		con, _ := os.ReadFile(console)
		if err != nil {
			return fmt.Errorf("qemu: %w: %s", err, bytes.TrimSpace(out))
		}
		if !bytes.Contains(con, []byte("Linux version")) {
			return errors.New("the probe kernel printed nothing")
		}
		return nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 99 {
		return nil
	}
	return fmt.Errorf("probe sector did not run: %w: %s", err, bytes.TrimSpace(out))
}

// probeHugePages: hugetlbfs mounted at /dev/hugepages with pages reserved.
func probeHugePages() (bool, string) {
	mounts, err := os.ReadFile("/proc/mounts")
	if err != nil {
		return false, err.Error()
	}
	mounted := false
	for _, l := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 && f[1] == "/dev/hugepages" && f[2] == "hugetlbfs" {
			mounted = true
		}
	}
	if !mounted {
		return false, "/dev/hugepages is not a hugetlbfs mount"
	}
	var st unix.Statfs_t
	if err := unix.Statfs("/dev/hugepages", &st); err != nil {
		return false, err.Error()
	}
	if st.Blocks == 0 {
		return false, "no huge pages reserved (vm.nr_hugepages is 0)"
	}
	return true, fmt.Sprintf("%d huge pages of %d KiB", st.Blocks, st.Bsize>>10)
}
