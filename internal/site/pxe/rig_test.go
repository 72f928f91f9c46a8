package pxe

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The real rig: a QEMU VM PXE-boots from this package's server inside a
// network namespace (bridge + tap). Behind BC_RIG=1, as root.
//
// The server runs in a child process (this test binary again, under
// `ip netns exec`), because a Go process cannot keep all its threads in
// another namespace and pin/tftp opens a socket per transfer.

const (
	rigMAC     = "52:54:00:bc:00:01"
	rigToken   = "rigT0ken-single-use_42"
	rigMarker  = "BC-PXE-INIT-STARTED"
	helperEnv  = "BC_PXE_RIG_HELPER"
	rigNetPref = "10.213.77."
)

// rigHelperConfig is what the parent hands the server process.
type rigHelperConfig struct {
	Interface string `json:"interface"`
	Net       string `json:"net"` // "a.b.c.": the server is .1, the range .100-.150
	MAC       string `json:"mac"` // the one machine the Decider knows
	HTTPAddr  string `json:"http_addr"`
	Mode      Mode   `json:"mode"` // default full
	Host      string `json:"host"` // the server's last octet, default "1"

	BootDir string            `json:"boot_dir"`
	Blobs   map[string]string `json:"blobs"` // digest → file
	Kernel  string            `json:"kernel"`
	Initrd  string            `json:"initrd"`
	Cache   string            `json:"cache"`
}

func TestPXEBootsQEMU(t *testing.T) {
	if os.Getenv("BC_RIG") != "1" {
		t.Skip("the PXE rig needs BC_RIG=1 (root, iproute2, qemu-system-x86, ipxe, ipxe-qemu)")
	}
	if os.Geteuid() != 0 {
		t.Fatal("BC_RIG=1 but not root: the rig creates a network namespace")
	}
	for _, bin := range []string{"ip", "qemu-system-x86_64"} {
		_, err := exec.LookPath(bin)
		require.NoError(t, err, "the rig needs %s", bin)
	}
	bootDir := cmpEnv("BC_RIG_IPXE_DIR", "/usr/lib/ipxe")
	_, err := os.Stat(filepath.Join(bootDir, "undionly.kpxe"))
	require.NoError(t, err, "Debian's ipxe package provides the chainload binaries")

	work := t.TempDir()
	cfg := rigHelperConfig{BootDir: bootDir, Blobs: map[string]string{}, Cache: filepath.Join(work, "cache")}
	kernel := rigKernel(t)
	if kernel != "" {
		initrd := filepath.Join(work, "initrd.cpio")
		buildRigInitrd(t, work, initrd)
		cfg.Kernel = addBlob(t, cfg.Blobs, kernel)
		cfg.Initrd = addBlob(t, cfg.Blobs, initrd)
		t.Logf("booting kernel %s with a Go init over HTTP", kernel)
	} else {
		t.Log("no kernel (BC_RIG_KERNEL, /boot/vmlinuz-*, or apt-get download): the VM gets a local-disk script and the test checks it was fetched")
	}

	ns := fmt.Sprintf("bcpxe%d", os.Getpid())
	run(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", "br0", "type", "bridge"},
		{"addr", "add", rigNetPref + "1/24", "dev", "br0"},
		{"link", "set", "br0", "up"},
		{"tuntap", "add", "dev", "tap0", "mode", "tap"},
		{"link", "set", "tap0", "master", "br0"},
		{"link", "set", "tap0", "up"},
	} {
		run(t, "ip", append([]string{"-n", ns}, args...)...)
	}

	start := time.Now()
	cfg.Interface, cfg.Net, cfg.MAC = "br0", rigNetPref, rigMAC
	srv := startServerProcess(t, ns, cfg)

	serial := filepath.Join(work, "serial.log")
	qemu := exec.Command("ip", "netns", "exec", ns, "qemu-system-x86_64",
		"-accel", "tcg", "-m", "256", "-boot", "n", "-no-reboot",
		"-display", "none", "-monitor", "none", "-serial", "file:"+serial,
		"-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n0,mac="+rigMAC,
	)
	qemu.SysProcAttr = dieWithParent()
	var qemuOut bytes.Buffer
	qemu.Stdout, qemu.Stderr = &qemuOut, &qemuOut
	require.NoError(t, qemu.Start())
	t.Cleanup(func() { stop(qemu) })
	qemuDone := make(chan error, 1)
	go func() { qemuDone <- qemu.Wait() }()

	// The VM's DHCP, its script fetch over HTTP, and (with a kernel) its
	// kernel's init reporting in on the serial console and powering off.
	if err := srv.waitLog("ipxe script served", rigMAC, qemuDone); err != nil {
		t.Fatalf("qemu ended before fetching its script: %v\n%s\nserver:\n%s", err, qemuOut.String(), srv.logs())
	}
	t.Logf("script fetched %.1f s after the server started", time.Since(start).Seconds())
	if kernel != "" {
		err := <-qemuDone // the init powers the VM off
		out, _ := os.ReadFile(serial)
		require.NoError(t, err, "qemu: %s", qemuOut.String())
		require.Contains(t, string(out), rigMarker, "the kernel ran our init")
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, rigMarker) {
				// The token is the test's own; printing it here is fine.
				t.Logf("serial: %s", strings.TrimSpace(line))
			}
		}
		require.Contains(t, string(out), "bc.token="+rigToken, "the token reached the kernel command line")
		t.Logf("PXE boot to init (DHCP, iPXE script, kernel+initrd over HTTP, Linux, init) in %.1f s wall", time.Since(start).Seconds())
	}
	all := srv.stop(t)
	require.NotContains(t, all, rigToken, "the token never reaches the logs")
	require.Contains(t, all, "dhcp ack")
}

// TestPXEProxyBootsQEMU: the VM's iPXE ROM takes its address from the
// network's DHCP server (in its own namespace, knowing no machine) and its
// boot answer from this package in proxy mode (port 67 offer, port 4011
// request), then fetches its script.
func TestPXEProxyBootsQEMU(t *testing.T) {
	if os.Getenv("BC_RIG") != "1" {
		t.Skip("the PXE rig needs BC_RIG=1 (root, iproute2, qemu-system-x86, ipxe, ipxe-qemu)")
	}
	if os.Geteuid() != 0 {
		t.Fatal("BC_RIG=1 but not root: the rig creates network namespaces")
	}
	bootDir := cmpEnv("BC_RIG_IPXE_DIR", "/usr/lib/ipxe")
	const net3 = "10.213.79."
	id := fmt.Sprintf("%d", os.Getpid())
	nsR, nsD := "bcpxer"+id, "bcpxed"+id // the machines' LAN, the existing DHCP server
	for _, ns := range []string{nsR, nsD} {
		run(t, "ip", "netns", "add", ns)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	for _, args := range [][]string{
		{"-n", nsR, "link", "add", "br0", "type", "bridge"},
		{"-n", nsR, "addr", "add", net3 + "2/24", "dev", "br0"},
		{"-n", nsR, "link", "set", "br0", "up"},
		{"-n", nsR, "tuntap", "add", "dev", "tap0", "mode", "tap"},
		{"-n", nsR, "link", "set", "tap0", "master", "br0"},
		{"-n", nsR, "link", "set", "tap0", "up"},
		{"-n", nsR, "link", "add", "vlan0", "type", "veth", "peer", "name", "vdhcp", "netns", nsD},
		{"-n", nsR, "link", "set", "vlan0", "master", "br0"},
		{"-n", nsR, "link", "set", "vlan0", "up"},
		{"-n", nsD, "addr", "add", net3 + "1/24", "dev", "vdhcp"},
		{"-n", nsD, "link", "set", "vdhcp", "up"},
	} {
		run(t, "ip", args...)
	}
	start := time.Now()
	existing := startServerProcess(t, nsD, rigHelperConfig{
		Interface: "vdhcp", Net: net3, BootDir: bootDir, Blobs: map[string]string{},
		Cache: filepath.Join(t.TempDir(), "d"),
	})
	proxy := startServerProcess(t, nsR, rigHelperConfig{
		Mode: ModeProxy, Host: "2", Interface: "br0", Net: net3, MAC: rigMAC, BootDir: bootDir,
		Blobs: map[string]string{}, Cache: filepath.Join(t.TempDir(), "p"),
	})

	qemu := exec.Command("ip", "netns", "exec", nsR, "qemu-system-x86_64",
		"-accel", "tcg", "-m", "256", "-boot", "n", "-no-reboot",
		"-display", "none", "-monitor", "none", "-serial", "none",
		"-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n0,mac="+rigMAC,
	)
	qemu.SysProcAttr = dieWithParent()
	var qemuOut bytes.Buffer
	qemu.Stdout, qemu.Stderr = &qemuOut, &qemuOut
	require.NoError(t, qemu.Start())
	t.Cleanup(func() { stop(qemu) })
	qemuDone := make(chan error, 1)
	go func() { qemuDone <- qemu.Wait() }()

	if err := proxy.waitLog("ipxe script served", rigMAC, qemuDone); err != nil {
		t.Fatalf("%v\nqemu: %s\nproxy:\n%s\nexisting DHCP:\n%s", err, qemuOut.String(), proxy.logs(), existing.logs())
	}
	t.Logf("proxyDHCP: script fetched %.1f s after the servers started", time.Since(start).Seconds())
	stop(qemu)
	plogs, dlogs := proxy.stop(t), existing.stop(t)
	require.Contains(t, plogs, "proxydhcp offer")
	require.Contains(t, dlogs, "dhcp ack", "the address came from the network's server")
	require.NotContains(t, dlogs, "/boot/", "the network's server handed out no boot file")
}

// TestPXERigServerProcess is the server half of TestPXEBootsQEMU, run inside
// the namespace; it does nothing in a normal test run.
func TestPXERigServerProcess(t *testing.T) {
	raw := os.Getenv(helperEnv)
	if raw == "" {
		t.Skip("server process of TestPXEBootsQEMU only")
	}
	var cfg rigHelperConfig
	require.NoError(t, json.Unmarshal([]byte(raw), &cfg))
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()

	var mac net.HardwareAddr
	if cfg.MAC != "" {
		var err error
		mac, err = normalizeMAC(cfg.MAC)
		require.NoError(t, err)
	}
	decider := DeciderFunc(func(_ context.Context, req Request) (Boot, error) {
		if mac == nil || req.MAC.String() != mac.String() {
			return Unknown{}, nil
		}
		if cfg.Kernel == "" {
			return LocalDisk{}, nil
		}
		return Ramdisk{
			Kernel: cfg.Kernel, Initrd: cfg.Initrd,
			Cmdline: "console=ttyS0 panic=-1 quiet",
			Token:   Secret(rigToken),
		}, nil
	})
	srv, err := New(Config{
		Mode:       cmp.Or(cfg.Mode, ModeFull),
		Interface:  cfg.Interface,
		ServerIP:   netip.MustParseAddr(cfg.Net + cmp.Or(cfg.Host, "1")),
		Subnet:     netip.MustParsePrefix(cfg.Net + "0/24"),
		RangeStart: netip.MustParseAddr(cfg.Net + "100"),
		RangeEnd:   netip.MustParseAddr(cfg.Net + "150"),
		HTTPAddr:   cfg.HTTPAddr,
		ProxyAddr:  ":4011",
		BootDir:    cfg.BootDir,
		CacheDir:   cfg.Cache,
		Upstream: func(_ context.Context, digest string) (io.ReadCloser, error) {
			p, ok := cfg.Blobs[digest]
			if !ok {
				return nil, fmt.Errorf("no blob %s", digest)
			}
			return os.Open(p)
		},
		Decider: decider,
		Logger:  slog.New(slog.NewJSONHandler(os.Stdout, nil)),
	})
	require.NoError(t, err)
	require.NoError(t, srv.Start(ctx))
	<-ctx.Done()
	require.NoError(t, srv.Close())
}

// serverProcess is the server running in a namespace as a child process,
// its JSON log lines collected.
type serverProcess struct {
	cmd  *exec.Cmd
	done chan error

	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{} // closed and replaced on every line
	ended   bool
}

func startServerProcess(t *testing.T, ns string, cfg rigHelperConfig) *serverProcess {
	t.Helper()
	raw, err := json.Marshal(cfg)
	require.NoError(t, err)
	p := &serverProcess{done: make(chan error, 1), changed: make(chan struct{})}
	p.cmd = exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run=^TestPXERigServerProcess$", "-test.v")
	p.cmd.Env = append(os.Environ(), helperEnv+"="+string(raw))
	p.cmd.SysProcAttr = dieWithParent()
	out, err := p.cmd.StdoutPipe()
	require.NoError(t, err)
	p.cmd.Stderr = p.cmd.Stdout
	require.NoError(t, p.cmd.Start())
	t.Cleanup(func() { stop(p.cmd) })
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.mu.Lock()
			p.buf.WriteString(sc.Text() + "\n")
			close(p.changed)
			p.changed = make(chan struct{})
			p.mu.Unlock()
		}
		p.mu.Lock()
		p.ended = true
		close(p.changed)
		p.mu.Unlock()
		p.done <- p.cmd.Wait()
	}()
	if err := p.waitLog("provisioning services listening", "", nil); err != nil {
		t.Fatalf("server process: %v\n%s", err, p.logs())
	}
	return p
}

func (p *serverProcess) logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.buf.String()
}

// waitLog waits for a log line containing both substrings; it gives up when
// the process ends or abort yields.
func (p *serverProcess) waitLog(msg, also string, abort <-chan error) error {
	for {
		p.mu.Lock()
		for _, line := range strings.Split(p.buf.String(), "\n") {
			if strings.Contains(line, msg) && strings.Contains(line, also) {
				p.mu.Unlock()
				return nil
			}
		}
		changed, ended := p.changed, p.ended
		p.mu.Unlock()
		if ended {
			return fmt.Errorf("server process ended before logging %q", msg)
		}
		select {
		case <-changed:
		case err := <-abort:
			return fmt.Errorf("gave up waiting for %q: %w", msg, err)
		}
	}
}

// stop ends the process and returns everything it logged.
func (p *serverProcess) stop(t *testing.T) string {
	t.Helper()
	stop(p.cmd)
	<-p.done
	return p.logs()
}

func cmpEnv(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	require.NoError(t, err, "%s %s: %s", name, strings.Join(args, " "), out)
}

// dieWithParent ends a child when the test binary dies (a test timeout
// panics without running cleanups). ip netns exec execs in place, so the
// setting reaches the server or QEMU.
func dieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// stop asks a child to end; signalling one that already ended is harmless.
func stop(c *exec.Cmd) {
	if c.Process != nil {
		_ = c.Process.Signal(syscall.SIGTERM)
	}
}

func addBlob(t *testing.T, blobs map[string]string, path string) string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	h := sha256.New()
	_, err = io.Copy(h, f)
	require.NoError(t, err)
	d := "sha256:" + hex.EncodeToString(h.Sum(nil))
	blobs[d] = path
	return d
}

// rigKernel finds a Linux kernel: BC_RIG_KERNEL, the host's /boot, or
// Debian's linux-image package fetched with apt-get download and unpacked
// with dpkg-deb -x (no install hooks) into a cache directory.
func rigKernel(t *testing.T) string {
	t.Helper()
	if k := os.Getenv("BC_RIG_KERNEL"); k != "" {
		return k
	}
	if ks, _ := filepath.Glob("/boot/vmlinuz-*"); len(ks) > 0 {
		sort.Strings(ks)
		return ks[len(ks)-1]
	}
	cache := "/var/cache/bc-rig"
	if ks, _ := filepath.Glob(filepath.Join(cache, "root/boot/vmlinuz-*")); len(ks) > 0 {
		sort.Strings(ks)
		return ks[len(ks)-1]
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return ""
	}
	debs, _ := filepath.Glob(filepath.Join(cache, "linux-image-*.deb"))
	if len(debs) == 0 {
		pkg := debianKernelPackage()
		if pkg == "" {
			return ""
		}
		require.NoError(t, os.MkdirAll(cache, 0o755))
		cmd := exec.Command("apt-get", "download", pkg)
		cmd.Dir = cache
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Logf("apt-get download %s: %v: %s", pkg, err, out)
			return ""
		}
		debs, _ = filepath.Glob(filepath.Join(cache, "linux-image-*.deb"))
	}
	if len(debs) == 0 {
		return ""
	}
	run(t, "dpkg-deb", "-x", debs[0], filepath.Join(cache, "root"))
	ks, _ := filepath.Glob(filepath.Join(cache, "root/boot/vmlinuz-*"))
	if len(ks) == 0 {
		return ""
	}
	return ks[0]
}

// debianKernelPackage names the versioned image package linux-image-amd64
// depends on.
func debianKernelPackage() string {
	out, err := exec.Command("apt-cache", "depends", "linux-image-amd64").Output()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(out), "\n") {
		if dep, ok := strings.CutPrefix(strings.TrimSpace(line), "Depends: "); ok && strings.HasPrefix(dep, "linux-image-") {
			return dep
		}
	}
	return ""
}

// rigInit is the VM's /init: it says it started, with the kernel command
// line, and powers the VM off.
const rigInit = `package main

import (
	"os"
	"syscall"
)

func main() {
	_ = os.MkdirAll("/proc", 0o755)
	_ = syscall.Mount("proc", "/proc", "proc", 0, "")
	cmdline, _ := os.ReadFile("/proc/cmdline")
	os.Stdout.WriteString("` + rigMarker + ` cmdline: " + string(cmdline) + "\n")
	syscall.Sync()
	_ = syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF)
	select {}
}
`

// buildRigInitrd builds a static Go /init and packs it, with /dev/console,
// into a newc cpio archive (the initramfs format).
func buildRigInitrd(t *testing.T, work, out string) {
	t.Helper()
	src := filepath.Join(work, "init.go")
	require.NoError(t, os.WriteFile(src, []byte(rigInit), 0o644))
	bin := filepath.Join(work, "init")
	cmd := exec.Command("go", "build", "-o", bin, src)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GOFLAGS=")
	cmd.Dir = work
	o, err := cmd.CombinedOutput()
	require.NoError(t, err, "build init: %s", o)
	initBytes, err := os.ReadFile(bin)
	require.NoError(t, err)

	var buf bytes.Buffer
	ino := 1
	add := func(name string, mode, rdevMajor, rdevMinor uint32, data []byte) {
		fmt.Fprintf(&buf, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
			ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
		ino++
		buf.WriteString(name + "\x00")
		pad4(&buf)
		buf.Write(data)
		pad4(&buf)
	}
	add("dev", 0o040755, 0, 0, nil)
	add("dev/console", 0o020600, 5, 1, nil)
	add("proc", 0o040755, 0, 0, nil)
	add("init", 0o100755, 0, 0, initBytes)
	add("TRAILER!!!", 0, 0, 0, nil)
	require.NoError(t, os.WriteFile(out, buf.Bytes(), 0o644))
}

func pad4(b *bytes.Buffer) {
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
}
