package runtime

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
	"golang.org/x/sys/unix"
)

// Config configures a Runtime; zero fields take defaults.
type Config struct {
	// StateDir holds one directory per instance (spec.json, overlay disk,
	// seed, QMP socket, pidfile, console log). Required.
	StateDir string
	QEMU     string // default qemu-system-x86_64
	QEMUImg  string // default qemu-img
	// Accel forces "kvm" or "tcg"; empty probes KVM by booting.
	Accel string
	// ProbeKernel is a stock kernel the KVM probe boots (the guest image's
	// vmlinuz); without it the probe boots a one-sector program, which
	// catches a missing or broken /dev/kvm but not a kvm that hangs only
	// stock kernels.
	ProbeKernel  string
	ProbeTimeout time.Duration // default 30s
	// StopTimeout is how long Stop waits for an ACPI shutdown before it
	// quits QEMU (default 60s).
	StopTimeout time.Duration
	Logger      *slog.Logger
}

// State is an instance's run state.
type State string

const (
	StateCreated State = "created" // never started, or stopped
	StateRunning State = "running"
	StatePaused  State = "paused"
	// StateStopped: QEMU exited (guest shut down, or it was stopped).
	StateStopped State = "stopped"
)

// Info is one instance as the runtime sees it.
type Info struct {
	ID    string
	State State
	// PID is QEMU's process id while it runs.
	PID   int
	Accel string
	Spec  Spec
}

// Errors callers can test for.
var (
	ErrNotFound   = errors.New("runtime: no such instance")
	ErrExists     = errors.New("runtime: instance exists")
	ErrNotRunning = errors.New("runtime: instance is not running")
)

// Runtime runs QEMU guests. Methods are safe for concurrent use; one
// instance's operations are serialised.
type Runtime struct {
	cfg Config
	log *slog.Logger

	mu        sync.Mutex
	instances map[string]*instance
	// bridgeMu serialises bridge creation: the first guests of a host,
	// created at once, would otherwise both add the bridge.
	bridgeMu sync.Mutex

	capsOnce sync.Once
	caps     Capabilities
}

type instance struct {
	mu   sync.Mutex
	dir  string
	spec Spec
}

// New returns a Runtime over cfg.StateDir (created when missing). It does
// not look at existing instances: call Adopt.
func New(cfg Config) (*Runtime, error) {
	if cfg.StateDir == "" || !filepath.IsAbs(cfg.StateDir) {
		return nil, errors.New("runtime: config: state dir must be an absolute path")
	}
	if cfg.Accel != "" && cfg.Accel != "kvm" && cfg.Accel != "tcg" {
		return nil, fmt.Errorf("runtime: config: accel %q must be kvm, tcg or empty (probe)", cfg.Accel)
	}
	cfg.QEMU = cmpOr(cfg.QEMU, "qemu-system-x86_64")
	cfg.QEMUImg = cmpOr(cfg.QEMUImg, "qemu-img")
	if cfg.ProbeTimeout == 0 {
		cfg.ProbeTimeout = 30 * time.Second
	}
	if cfg.StopTimeout == 0 {
		cfg.StopTimeout = 60 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("runtime: state dir: %w", err)
	}
	return &Runtime{cfg: cfg, log: cfg.Logger, instances: map[string]*instance{}}, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Files in an instance's state directory.
const (
	fileSpec    = "spec.json"
	fileDisk    = "disk.qcow2"
	fileSeed    = "seed.img"
	fileQMP     = "qmp.sock"
	filePID     = "qemu.pid"
	fileConsole = "console.log"
	fileAccel   = "accel"
)

func (r *Runtime) get(id string) (*instance, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	in, ok := r.instances[id]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	return in, nil
}

// Create validates spec and prepares the instance: state directory, spec
// file, the root disk as a qcow2 overlay on the base image (or a copy of
// spec.FromDisk), and the seed. On error nothing is left behind.
func (r *Runtime) Create(ctx context.Context, spec Spec) (err error) {
	if err := spec.Validate(); err != nil {
		return err
	}
	dir := filepath.Join(r.cfg.StateDir, spec.ID)
	r.mu.Lock()
	if _, ok := r.instances[spec.ID]; ok {
		r.mu.Unlock()
		return fmt.Errorf("%w: %q", ErrExists, spec.ID)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		r.mu.Unlock()
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("%w: %q (state directory %s)", ErrExists, spec.ID, dir)
		}
		return fmt.Errorf("runtime: create: %w", err)
	}
	// The stored spec has no FromDisk: the disk is the instance's own once
	// made, and the source (a snapshot) may be deleted later.
	stored := spec
	stored.FromDisk = ""
	in := &instance{dir: dir, spec: stored}
	in.mu.Lock()
	defer in.mu.Unlock()
	r.instances[spec.ID] = in
	r.mu.Unlock()
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
			r.mu.Lock()
			delete(r.instances, spec.ID)
			r.mu.Unlock()
		}
	}()

	base, err := r.imageInfo(ctx, spec.Image.Disk)
	if err != nil {
		return err
	}
	size := base.VirtualSize
	if spec.DiskMiB > 0 {
		want := int64(spec.DiskMiB) << 20
		if want < base.VirtualSize {
			return &SpecError{Field: "disk_mib", Reason: fmt.Sprintf("%d MiB is smaller than the base image (%d MiB)", spec.DiskMiB, base.VirtualSize>>20)}
		}
		size = want
	}
	if spec.FromDisk != "" {
		if err := r.copyDisk(ctx, &spec, size, filepath.Join(dir, fileDisk)); err != nil {
			return err
		}
	} else if out, err := exec.CommandContext(ctx, r.cfg.QEMUImg, "create", "-q", "-f", "qcow2", "-F", base.Format,
		"-b", spec.Image.Disk, filepath.Join(dir, fileDisk), strconv.FormatInt(size, 10)).CombinedOutput(); err != nil {
		return fmt.Errorf("runtime: create overlay: %w: %s", err, bytes.TrimSpace(out))
	}
	if spec.Seed != nil {
		files, err := RenderSeed(spec.Seed, spec.ID, spec.MAC)
		if err != nil {
			return err
		}
		if err := WriteSeedImage(ctx, filepath.Join(dir, fileSeed), files); err != nil {
			return err
		}
	}
	return writeSpec(dir, &stored)
}

// copyDisk makes the root disk a copy of spec.FromDisk, which must be a
// qcow2 overlay on the spec's own base image (its guest data is only the
// difference to that base), grown to size when it is smaller; a source
// larger than an explicit DiskMiB is refused (a qcow2 is not shrunk under
// a file system). DiskMiB 0 keeps the source's size.
func (r *Runtime) copyDisk(ctx context.Context, spec *Spec, size int64, dst string) error {
	from, err := r.imageInfo(ctx, spec.FromDisk)
	if err != nil {
		return err
	}
	if from.Format != "qcow2" {
		return &SpecError{Field: "from_disk", Reason: fmt.Sprintf("%q is %s, not a qcow2 overlay", spec.FromDisk, from.Format)}
	}
	if backing := cmpOr(from.FullBackingFilename, from.BackingFilename); backing != spec.Image.Disk {
		return &SpecError{Field: "from_disk", Reason: fmt.Sprintf("%q is an overlay on %q, not on the image's disk %q", spec.FromDisk, backing, spec.Image.Disk)}
	}
	if spec.DiskMiB == 0 {
		size = max(size, from.VirtualSize)
	}
	if from.VirtualSize > size {
		return &SpecError{Field: "disk_mib", Reason: fmt.Sprintf("%d MiB is smaller than the disk of from_disk (%d MiB)", spec.DiskMiB, from.VirtualSize>>20)}
	}
	if err := copyFile(ctx, spec.FromDisk, dst); err != nil {
		return err
	}
	if from.VirtualSize < size {
		if out, err := exec.CommandContext(ctx, r.cfg.QEMUImg, "resize", "-q", "-f", "qcow2", dst, strconv.FormatInt(size, 10)).CombinedOutput(); err != nil {
			return fmt.Errorf("runtime: resize disk: %w: %s", err, bytes.TrimSpace(out))
		}
	}
	return nil
}

func writeSpec(dir string, spec *Spec) error {
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return fmt.Errorf("runtime: spec: %w", err)
	}
	tmp := filepath.Join(dir, fileSpec+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("runtime: spec: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, fileSpec)); err != nil {
		return fmt.Errorf("runtime: spec: %w", err)
	}
	return nil
}

type imageInfo struct {
	Format              string `json:"format"`
	VirtualSize         int64  `json:"virtual-size"`
	BackingFilename     string `json:"backing-filename"`
	FullBackingFilename string `json:"full-backing-filename"`
}

func (r *Runtime) imageInfo(ctx context.Context, path string) (imageInfo, error) {
	out, err := exec.CommandContext(ctx, r.cfg.QEMUImg, "info", "--output=json", "-U", path).Output()
	if err != nil {
		return imageInfo{}, fmt.Errorf("runtime: qemu-img info %s: %w", path, exitDetail(err))
	}
	var ii imageInfo
	if err := json.Unmarshal(out, &ii); err != nil {
		return imageInfo{}, fmt.Errorf("runtime: qemu-img info %s: %w", path, err)
	}
	return ii, nil
}

func exitDetail(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return fmt.Errorf("%w: %s", err, bytes.TrimSpace(ee.Stderr))
	}
	return err
}

// Start boots the instance (a no-op when QEMU already runs).
func (r *Runtime) Start(ctx context.Context, id string) error {
	in, err := r.get(id)
	if err != nil {
		return err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if pidAlive(in.pid(), id) {
		return nil
	}
	return r.startLocked(ctx, in, false)
}

// startLocked launches QEMU daemonized; incoming starts it waiting for a
// migration stream (Restore).
func (r *Runtime) startLocked(ctx context.Context, in *instance, incoming bool) error {
	caps := r.Capabilities(ctx)
	spec := &in.spec
	if spec.HugePages && !caps.HugePages {
		return &SpecError{Field: "huge_pages", Reason: "not available on this host: " + caps.HugePagesReason}
	}
	if spec.NUMANode != nil {
		if _, err := os.Stat(fmt.Sprintf("/sys/devices/system/node/node%d", *spec.NUMANode)); err != nil {
			return &SpecError{Field: "numa_node", Reason: fmt.Sprintf("host has no NUMA node %d", *spec.NUMANode)}
		}
	}
	for i, c := range spec.HostCPUs {
		if _, err := os.Stat(fmt.Sprintf("/sys/devices/system/cpu/cpu%d", c)); err != nil {
			return &SpecError{Field: fmt.Sprintf("host_cpus[%d]", i), Reason: fmt.Sprintf("host has no CPU %d", c)}
		}
	}
	if spec.Network != nil {
		if err := r.ensureTap(ctx, spec); err != nil {
			return err
		}
	}
	_ = os.Remove(filepath.Join(in.dir, fileQMP))
	_ = os.Remove(filepath.Join(in.dir, filePID))
	args := r.qemuArgs(in, caps.Accel, incoming)
	name, argv := r.cfg.QEMU, args
	if spec.Network != nil && spec.Network.NetNS != "" {
		name, argv = "ip", append([]string{"netns", "exec", spec.Network.NetNS, r.cfg.QEMU}, args...)
	}
	cmd := exec.CommandContext(ctx, name, argv...)
	// QEMU daemonizes: it outlives this process, so a restarted bcd adopts
	// it; its own session keeps bcd's signals away from it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("runtime: start %s: qemu: %w: %s", spec.ID, err, bytes.TrimSpace(out))
	}
	if err := os.WriteFile(filepath.Join(in.dir, fileAccel), []byte(caps.Accel), 0o600); err != nil {
		return fmt.Errorf("runtime: start: %w", err)
	}
	if len(spec.HostCPUs) > 0 {
		if err := r.pinLocked(ctx, in); err != nil {
			_ = r.killLocked(ctx, in)
			return err
		}
	}
	r.log.Info("runtime: guest started", "id", spec.ID, "pid", in.pid(), "accel", caps.Accel, "incoming", incoming)
	return nil
}

func (r *Runtime) qemuArgs(in *instance, accel string, incoming bool) []string {
	s := &in.spec
	p := func(f string) string { return filepath.Join(in.dir, f) }
	args := []string{
		"-name", "guest=" + s.ID + ",debug-threads=on",
		"-nodefaults", "-no-user-config", "-display", "none", "-vga", "none",
		"-machine", "pc",
		"-smp", strconv.Itoa(s.VCPUs),
		"-serial", "file:" + p(fileConsole),
		"-qmp", "unix:" + p(fileQMP) + ",server=on,wait=off",
		"-pidfile", p(filePID),
		"-daemonize",
		"-kernel", s.Image.Kernel,
	}
	if accel == "kvm" {
		args = append(args, "-accel", "kvm", "-cpu", "host")
	} else {
		args = append(args, "-accel", "tcg,thread=multi", "-cpu", "max")
	}
	if s.Image.Initrd != "" {
		args = append(args, "-initrd", s.Image.Initrd)
	}
	args = append(args, "-append", cmpOr(s.Image.Cmdline, "root=/dev/vda rw console=ttyS0"))
	// Memory: a backend object only when it must be placed (hugepages, a
	// NUMA node); plain -m otherwise.
	if s.HugePages || s.NUMANode != nil {
		backend := fmt.Sprintf("memory-backend-ram,id=mem0,size=%dM", s.MemoryMiB)
		if s.HugePages {
			backend = fmt.Sprintf("memory-backend-file,id=mem0,size=%dM,mem-path=/dev/hugepages,share=on,prealloc=on", s.MemoryMiB)
		}
		if s.NUMANode != nil {
			backend += fmt.Sprintf(",host-nodes=%d,policy=bind", *s.NUMANode)
		}
		args = append(args, "-m", fmt.Sprintf("%dM", s.MemoryMiB), "-object", backend, "-machine", "memory-backend=mem0")
	} else {
		args = append(args, "-m", fmt.Sprintf("%dM", s.MemoryMiB))
	}
	args = append(args,
		"-blockdev", blockdev("disk0", p(fileDisk), "qcow2", false),
		"-device", "virtio-blk-pci,drive=disk0,id=dev-disk0")
	for _, v := range s.Volumes {
		args = append(args, "-blockdev", blockdev(volNode(v.ID), v.Path, v.Format, v.ReadOnly),
			"-device", volumeDevice(v))
	}
	if s.Seed != nil {
		args = append(args, "-blockdev", blockdev("seed", p(fileSeed), "raw", true),
			"-device", "virtio-blk-pci,drive=seed,id=dev-seed")
	}
	if s.Network != nil {
		args = append(args,
			"-netdev", "tap,id=net0,ifname="+s.tapName()+",script=no,downscript=no",
			"-device", "virtio-net-pci,netdev=net0,mac="+s.MAC)
	}
	args = append(args, "-device", "virtio-balloon-pci,id=balloon0")
	if incoming {
		args = append(args, "-incoming", "defer")
	}
	return args
}

// blockdev is a -blockdev in JSON form; the file child is implicit, so a
// blockdev-del of the node removes both.
func blockdev(node, path, format string, ro bool) string {
	b, _ := json.Marshal(blockdevArgs(node, path, format, ro))
	return string(b)
}

func blockdevArgs(node, path, format string, ro bool) map[string]any {
	return map[string]any{
		"node-name": node, "driver": format, "read-only": ro,
		"file": map[string]any{"driver": "file", "filename": path, "read-only": ro},
	}
}

func volumeDevice(v Volume) string {
	return "virtio-blk-pci,drive=" + volNode(v.ID) + ",id=dev-vol-" + v.ID + ",serial=" + serial(v.ID)
}

// volNode is a volume's block node name: QEMU keeps at most 31
// characters, and the control plane's volume ids (vol-<ULID>, 30) are
// longer once prefixed, so a long id is named by its digest (the same on
// every start, so a re-adopted guest's nodes keep their names).
func volNode(id string) string {
	if n := "vol-" + id; len(n) <= 31 {
		return n
	}
	h := sha256.Sum256([]byte(id))
	return "vol-" + hex.EncodeToString(h[:])[:27]
}

// serial is the virtio serial the guest sees (/dev/disk/by-id/virtio-…);
// virtio-blk keeps 20 characters.
func serial(id string) string {
	if len(id) > 20 {
		return id[:20]
	}
	return id
}

func (in *instance) pid() int {
	b, err := os.ReadFile(filepath.Join(in.dir, filePID))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0
	}
	return pid
}

// pidAlive reports whether pid is this instance's QEMU: the process exists
// and its command line names the guest (a recycled pid does not).
func pidAlive(pid int, id string) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(b) == 0 {
		return false
	}
	return bytes.Contains(b, []byte("guest="+id+",")) && bytes.Contains(b, []byte("qemu"))
}

// monitor runs one QMP command on a fresh connection: QMP is cheap to
// open, and no connection outlives a call (a restarted bcd has none to
// lose).
func (in *instance) monitor(command string, args any) (json.RawMessage, error) {
	mon, err := qmp.NewSocketMonitor("unix", filepath.Join(in.dir, fileQMP), 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("runtime: %s: qmp: %w", in.spec.ID, err)
	}
	if err := mon.Connect(); err != nil {
		return nil, fmt.Errorf("runtime: %s: qmp connect: %w", in.spec.ID, err)
	}
	defer func() { _ = mon.Disconnect() }()
	req := map[string]any{"execute": command}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("runtime: qmp %s: %w", command, err)
	}
	raw, err := mon.Run(b)
	if err != nil {
		return nil, fmt.Errorf("runtime: %s: qmp %s: %w", in.spec.ID, command, err)
	}
	var resp struct {
		Return json.RawMessage `json:"return"`
	}
	if err := json.Unmarshal(raw, &resp); err != nil {
		return nil, fmt.Errorf("runtime: qmp %s: %w", command, err)
	}
	return resp.Return, nil
}

// running is the locked precondition for QMP calls.
func (in *instance) runningLocked() error {
	if !pidAlive(in.pid(), in.spec.ID) {
		return fmt.Errorf("%w: %q", ErrNotRunning, in.spec.ID)
	}
	return nil
}

func (r *Runtime) do(id, command string, args any) error {
	in, err := r.get(id)
	if err != nil {
		return err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if err := in.runningLocked(); err != nil {
		return err
	}
	_, err = in.monitor(command, args)
	return err
}

// Pause stops the vCPUs; the guest keeps its memory.
func (r *Runtime) Pause(_ context.Context, id string) error { return r.do(id, "stop", nil) }

// Resume runs paused vCPUs again.
func (r *Runtime) Resume(_ context.Context, id string) error { return r.do(id, "cont", nil) }

// Reboot resets the guest (a hard reset: the guest is not asked).
func (r *Runtime) Reboot(_ context.Context, id string) error { return r.do(id, "system_reset", nil) }

// SetBalloon asks the guest's balloon driver to bring its memory to mib.
func (r *Runtime) SetBalloon(_ context.Context, id string, mib int) error {
	in, err := r.get(id)
	if err != nil {
		return err
	}
	if mib < MinMemoryMiB || mib > in.spec.MemoryMiB {
		return &SpecError{Field: "balloon_mib", Reason: fmt.Sprintf("must be %d..%d, got %d", MinMemoryMiB, in.spec.MemoryMiB, mib)}
	}
	return r.do(id, "balloon", map[string]any{"value": int64(mib) << 20})
}

// Balloon is the guest's current memory as the balloon reports it (MiB).
func (r *Runtime) Balloon(_ context.Context, id string) (int, error) {
	in, err := r.get(id)
	if err != nil {
		return 0, err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if err := in.runningLocked(); err != nil {
		return 0, err
	}
	raw, err := in.monitor("query-balloon", nil)
	if err != nil {
		return 0, err
	}
	var b struct {
		Actual int64 `json:"actual"`
	}
	if err := json.Unmarshal(raw, &b); err != nil {
		return 0, fmt.Errorf("runtime: query-balloon: %w", err)
	}
	return int(b.Actual >> 20), nil
}

// Stop shuts the guest down over ACPI and waits for QEMU to exit; past
// StopTimeout (or ctx) it quits QEMU.
func (r *Runtime) Stop(ctx context.Context, id string) error {
	in, err := r.get(id)
	if err != nil {
		return err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	pid := in.pid()
	if !pidAlive(pid, id) {
		return nil
	}
	if _, err := in.monitor("system_powerdown", nil); err != nil && pidAlive(pid, id) {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, r.cfg.StopTimeout)
	defer cancel()
	if waitExit(wctx, pid, id) == nil {
		return nil
	}
	r.log.Warn("runtime: guest did not shut down in time; quitting QEMU", "id", id, "timeout", r.cfg.StopTimeout)
	return r.killLocked(context.WithoutCancel(ctx), in)
}

// Kill ends QEMU now (QMP quit, then SIGKILL).
func (r *Runtime) Kill(ctx context.Context, id string) error {
	in, err := r.get(id)
	if err != nil {
		return err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return r.killLocked(ctx, in)
}

func (r *Runtime) killLocked(ctx context.Context, in *instance) error {
	pid := in.pid()
	if !pidAlive(pid, in.spec.ID) {
		return nil
	}
	_, _ = in.monitor("quit", nil)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if waitExit(wctx, pid, in.spec.ID) == nil {
		return nil
	}
	if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("runtime: kill %s: %w", in.spec.ID, err)
	}
	wctx2, cancel2 := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel2()
	if err := waitExit(wctx2, pid, in.spec.ID); err != nil {
		return fmt.Errorf("runtime: %s: qemu pid %d did not exit after SIGKILL", in.spec.ID, pid)
	}
	return nil
}

// waitExit polls: QEMU is daemonized, not our child, so there is no wait
// to block on.
func waitExit(ctx context.Context, pid int, id string) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for pidAlive(pid, id) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// Delete ends QEMU, removes the tap and the state directory. Volumes named
// by the spec are the caller's and stay.
func (r *Runtime) Delete(ctx context.Context, id string) error {
	in, err := r.get(id)
	if err != nil {
		return err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if err := r.killLocked(ctx, in); err != nil {
		return err
	}
	if in.spec.Network != nil {
		if err := r.deleteTap(ctx, &in.spec); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(in.dir); err != nil {
		return fmt.Errorf("runtime: delete %s: %w", id, err)
	}
	r.mu.Lock()
	delete(r.instances, id)
	r.mu.Unlock()
	r.log.Info("runtime: guest deleted", "id", id)
	return nil
}

// Get is one instance's state.
func (r *Runtime) Get(_ context.Context, id string) (Info, error) {
	in, err := r.get(id)
	if err != nil {
		return Info{}, err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.infoLocked(), nil
}

// List is every instance, by ID.
func (r *Runtime) List(ctx context.Context) []Info {
	r.mu.Lock()
	ids := make([]string, 0, len(r.instances))
	for id := range r.instances {
		ids = append(ids, id)
	}
	r.mu.Unlock()
	slices.Sort(ids)
	out := make([]Info, 0, len(ids))
	for _, id := range ids {
		if info, err := r.Get(ctx, id); err == nil {
			out = append(out, info)
		}
	}
	return out
}

func (in *instance) infoLocked() Info {
	info := Info{ID: in.spec.ID, Spec: in.spec, State: StateCreated}
	pid := in.pid()
	if b, err := os.ReadFile(filepath.Join(in.dir, fileAccel)); err == nil {
		info.Accel = string(b)
	}
	if !pidAlive(pid, in.spec.ID) {
		// QEMU removes its pidfile when it exits; the accel file says it
		// was started.
		if _, err := os.Stat(filepath.Join(in.dir, fileAccel)); err == nil {
			info.State = StateStopped
		}
		return info
	}
	info.PID = pid
	info.State = StateRunning
	raw, err := in.monitor("query-status", nil)
	if err != nil {
		return info
	}
	var st struct {
		Status string `json:"status"`
	}
	if json.Unmarshal(raw, &st) == nil {
		switch st.Status {
		case "running":
		case "shutdown", "guest-panicked":
			info.State = StateStopped
		default: // paused, postmigrate, inmigrate, prelaunch, suspended…
			info.State = StatePaused
		}
	}
	return info
}

// Adopt loads every instance in the state directory, running or not: after
// a bcd restart, guests whose QEMU still runs are managed again. It
// returns what it found.
func (r *Runtime) Adopt(ctx context.Context) ([]Info, error) {
	entries, err := os.ReadDir(r.cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("runtime: adopt: %w", err)
	}
	for _, e := range entries {
		if !e.IsDir() || !idRE.MatchString(e.Name()) {
			continue
		}
		dir := filepath.Join(r.cfg.StateDir, e.Name())
		b, err := os.ReadFile(filepath.Join(dir, fileSpec))
		if errors.Is(err, os.ErrNotExist) {
			// A Create that died half-way (the spec is written last, and
			// nothing was started): removed, so the instance can be
			// created again. One this runtime is creating is left alone.
			r.mu.Lock()
			_, creating := r.instances[e.Name()]
			r.mu.Unlock()
			if !creating {
				r.log.Warn("runtime: adopt: removed a half-created instance", "dir", dir)
				if err := os.RemoveAll(dir); err != nil {
					return nil, fmt.Errorf("runtime: adopt: %w", err)
				}
			}
			continue
		}
		if err != nil {
			r.log.Warn("runtime: adopt: unreadable spec; skipped", "dir", dir, "err", err)
			continue
		}
		var spec Spec
		if err := json.Unmarshal(b, &spec); err != nil || spec.ID != e.Name() {
			r.log.Warn("runtime: adopt: unreadable spec; skipped", "dir", dir, "err", err)
			continue
		}
		r.mu.Lock()
		if _, ok := r.instances[spec.ID]; !ok {
			r.instances[spec.ID] = &instance{dir: dir, spec: spec}
		}
		r.mu.Unlock()
	}
	list := r.List(ctx)
	for _, info := range list {
		if info.PID > 0 {
			r.log.Info("runtime: adopted running guest", "id", info.ID, "pid", info.PID, "state", info.State)
		}
	}
	return list, nil
}
