package app_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/bctest/redfish"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/imagesig"
	"github.com/better-compute/better-compute/internal/metal"
	"github.com/better-compute/better-compute/internal/store"
)

// rigLoops runs the rig's lifecycle this many times per machine (a soak):
// go test ./internal/app -run TestRigLifecycle -args -loops 5, or
// BC_RIG_LOOPS=5.
var rigLoops = flag.Int("loops", 0, "TestRigLifecycle: lifecycle loops per machine (default BC_RIG_LOOPS or 1)")

// rigEnv is the rig without its machines: the provisioning network in a
// namespace, the control plane on a veth into it (tenant acme, project
// infra, site dc1), a real bcd site agent holding dc1's boot lease, and
// the sample image's bytes.
type rigEnv struct {
	rig      *metalRig
	cp       *bctest.ControlPlane
	admin    *client.Client
	ns, pfx  string
	disk     []byte
	site     *rigLog
	siteTok  string
	qemuArgs func(n int, mac string) []string
}

// startRig builds the rig (see TestRigLifecycle); it skips without
// BC_RIG=1.
func startRig(t *testing.T) *rigEnv {
	if os.Getenv("BC_RIG") != "1" {
		t.Skip("the bare-metal rig needs BC_RIG=1 (root, qemu, ipmi_sim, ipxe; make ramdisk sample-image)")
	}
	if os.Geteuid() != 0 {
		t.Fatal("BC_RIG=1 but not root: the rig creates a network namespace")
	}
	for _, bin := range []string{"ip", "qemu-system-x86_64", "ipmi_sim", "go"} {
		_, err := exec.LookPath(bin)
		require.NoError(t, err, "the rig needs %s", bin)
	}
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	ramdiskDir := cmpOr(os.Getenv("BC_RAMDISK_DIR"), filepath.Join(repo, ".cache", "ramdisk", "out"))
	sampleDir := cmpOr(os.Getenv("BC_SAMPLE_IMAGE_DIR"), filepath.Join(repo, "bin", "sample-image"))
	ipxeDir := cmpOr(os.Getenv("BC_RIG_IPXE_DIR"), "/usr/lib/ipxe")
	for _, f := range []string{filepath.Join(ramdiskDir, "vmlinuz"), filepath.Join(ramdiskDir, "initrd.cpio.gz"),
		filepath.Join(sampleDir, "sample.raw"), filepath.Join(ipxeDir, "undionly.kpxe")} {
		_, err := os.Stat(f)
		require.NoError(t, err, "run make ramdisk sample-image (and install ipxe) first")
	}
	accel := cmpOr(os.Getenv("BC_RIG_ACCEL"), "tcg")

	work, err := os.MkdirTemp("", "bcrig")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(work) })
	rig := &metalRig{t: t, work: work, start: time.Now()}

	// bcd, as a site agent runs it.
	bcd := filepath.Join(work, "bcd")
	build := exec.Command("go", "build", "-o", bcd, "./cmd/bcd")
	build.Dir, build.Env = repo, append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build bcd: %s", out)
	rig.phase("", "build bcd")

	// The provisioning network: a bridge in a namespace, a veth from this
	// process's namespace (the control plane, the Redfish BMC) into it, a
	// tap per VM.
	id := os.Getpid() % 200
	pfx := fmt.Sprintf("10.231.%d.", id+20)
	ns, veth := fmt.Sprintf("bcrig%d", os.Getpid()), fmt.Sprintf("bcrh%d", os.Getpid()%100000)
	rigRun(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	rigRun(t, "ip", "link", "add", veth, "type", "veth", "peer", "name", "vn0", "netns", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", veth).Run() })
	rigRun(t, "ip", "addr", "add", pfx+"1/24", "dev", veth)
	rigRun(t, "ip", "link", "set", veth, "up")
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", "br0", "type", "bridge"},
		{"addr", "add", pfx + "2/24", "dev", "br0"},
		{"link", "set", "br0", "up"},
		{"link", "set", "vn0", "master", "br0"},
		{"link", "set", "vn0", "up"},
		{"tuntap", "add", "dev", "tap0", "mode", "tap"},
		{"link", "set", "tap0", "master", "br0"},
		{"link", "set", "tap0", "up"},
		{"tuntap", "add", "dev", "tap1", "mode", "tap"},
		{"link", "set", "tap1", "master", "br0"},
		{"link", "set", "tap1", "up"},
	} {
		rigRun(t, "ip", append([]string{"-n", ns}, args...)...)
	}

	// The control plane: its gateway and API on the veth.
	cp := bctest.NewControlPlane(t, func(c *app.Config) {
		c.GatewayListen, c.GatewayHosts = pfx+"1:0", []string{pfx + "1"}
	})
	dumpSteps(t, cp)
	// The rig runs in real time: ramdisks boot on the wall clock, and a
	// step's retry backoff must elapse.
	ticking := make(chan struct{})
	go func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ticking:
				return
			case <-tick.C:
				cp.Clock.Set(time.Now())
			}
		}
	}()
	t.Cleanup(func() { close(ticking) })
	apiLn, err := net.Listen("tcp", pfx+"1:0")
	require.NoError(t, err)
	api := &http.Server{Handler: cp.App.Handler, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = api.Serve(apiLn) }()
	t.Cleanup(func() { _ = api.Close() })
	apiURL := "http://" + apiLn.Addr().String()

	admin := cp.Admin()
	ctx := context.Background()
	_, err = admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "infra"}))
	require.NoError(t, err)
	_, err = admin.Sites.Create(ctx, connect.NewRequest(&apiv1.CreateSiteRequest{Tenant: "acme", Name: "dc1", Networks: []string{pfx + "0/24"}}))
	require.NoError(t, err)

	// The sample image.
	disk, err := os.ReadFile(filepath.Join(sampleDir, "sample.raw"))
	require.NoError(t, err)

	// The site agent, in the namespace.
	tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "infra", Role: "site", Site: "dc1"}))
	require.NoError(t, err)
	_, gwPort, err := net.SplitHostPort(cp.GatewayAddr)
	require.NoError(t, err)
	// The site host's identity: the gateway holds a host whose DMI serials
	// are missing or a vendor's filler values for an operator's approval,
	// so the rig gives its site host real-looking ones.
	siteRoot := filepath.Join(work, "siteroot")
	for f, v := range map[string]string{"sys/class/dmi/id/product_uuid": "5e1c0e2a-0000-4000-8000-00000000051e",
		"sys/class/dmi/id/product_serial": fmt.Sprintf("RIGSITE-%d", os.Getpid()), "sys/class/dmi/id/board_serial": "RIGSITEBOARD",
		"sys/class/dmi/id/product_name": "rig site", "proc/sys/kernel/hostname": "rig-site"} {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(siteRoot, f)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(siteRoot, f), []byte(v+"\n"), 0o644))
	}
	require.NoError(t, os.MkdirAll(filepath.Join(siteRoot, "sys/class/net"), 0o755))
	site := rig.process("site", exec.Command("ip", "netns", "exec", ns, bcd, "--mode", "site", "--server", pfx+"1:"+gwPort,
		"--state-dir", filepath.Join(work, "site"), "--hardware", "none", "--metrics-listen", "", "--sysfs-root", siteRoot,
		"--site-interface", "br0", "--site-dhcp", "full", "--site-server-ip", pfx+"2", "--site-subnet", pfx+"0/24",
		"--site-range", pfx+"100-"+pfx+"150", "--site-http-listen", ":8080", "--site-boot-dir", ipxeDir,
		"--site-files-dir", ramdiskDir, "--site-ramdisk-kernel", "vmlinuz", "--site-ramdisk-initrd", "initrd.cpio.gz",
		"--site-ramdisk-cmdline", "console=ttyS0 panic=-1 bc.server="+pfx+"1:"+gwPort,
		"--site-control-plane-url", apiURL), "BCD_JOIN_TOKEN="+tok.Msg.GetToken())
	bctest.WaitFor(t, "the site agent to take the boot lease", func() bool {
		// A join held for approval is approved, as an operator would.
		if reqs, err := admin.JoinRequests.List(ctx, connect.NewRequest(&apiv1.ListJoinRequestsRequest{Tenant: "acme", State: "pending"})); err == nil {
			for _, jr := range reqs.Msg.GetJoinRequests() {
				_, _ = admin.JoinRequests.Approve(ctx, connect.NewRequest(&apiv1.ApproveJoinRequestRequest{Tenant: "acme", Id: jr.GetId()}))
			}
		}
		return rig.siteHoldsLease(cp)
	})
	rig.phase("", "site agent joined")

	// The machines: QEMU VMs booting from the network first.
	qemuArgs := func(n int, mac string) []string {
		d := filepath.Join(work, fmt.Sprintf("disk%d.img", n))
		require.NoError(t, os.WriteFile(d, bytes.Repeat([]byte{0xa5}, 64<<20), 0o600))
		return []string{"-accel", accel, "-m", "768", "-display", "none", "-monitor", "none", "-no-reboot",
			"-serial", "file:" + filepath.Join(work, fmt.Sprintf("console%d.log", n)),
			"-netdev", fmt.Sprintf("tap,id=n0,ifname=tap%d,script=no,downscript=no", n-1),
			"-device", "virtio-net-pci,netdev=n0,mac=" + mac,
			"-drive", "file=" + d + ",if=virtio,format=raw,discard=unmap",
			"-boot", "order=n",
			// SeaBIOS mirrors its and the iPXE ROM's output to the serial
			// console: the log shows a PXE boot's DHCP and script.
			"-fw_cfg", "name=etc/sercon-port,string=0x3f8",
			"-smbios", fmt.Sprintf("type=1,manufacturer=BetterCompute,product=rig,serial=RIG-%d-%d,uuid=6b1c0e2a-0000-4000-8000-%012d", os.Getpid(), n, n),
			"-smbios", fmt.Sprintf("type=2,serial=RIGBOARD-%d-%d", os.Getpid(), n)}
	}
	return &rigEnv{rig: rig, cp: cp, admin: admin, ns: ns, pfx: pfx, disk: disk, site: site, siteTok: tok.Msg.GetToken(), qemuArgs: qemuArgs}
}

// TestRigLifecycle is the bare-metal rig end to end on emulated machines
// that really boot. A network namespace holds a bridge, the VMs' taps and
// a real `bcd --mode site` (built here) that joined with a site token and
// serves DHCP, TFTP and HTTP on the bridge; the control plane runs in this
// process on a veth into the bridge. Machine m1 is a QEMU VM (TCG, iPXE
// ROM, PXE first, a 64 MiB virtio disk) behind OpenIPMI's ipmi_sim;
// machine m2 the same behind the bctest Redfish emulator. Both,
// concurrently: enroll → inspect (PXE → ramdisk, inventory) → commission (PXE → ramdisk, inventory, attested
// wipe) → ready → deploy the signed sample image (the ramdisk fetches it
// from the site's cache and writes it; configure writes the node join
// token into its config slot) → PXE says sanboot, the sample OS boots and
// its bcd joins as a node and reports its inventory → deployed → release
// (attested wipe) → ready. Each phase's wall time is logged.
//
// It needs BC_RIG=1, root, iproute2, qemu-system-x86, ipxe + ipxe-qemu,
// openipmi, `make ramdisk` and `make sample-image`.
func TestRigLifecycle(t *testing.T) {
	env := startRig(t)
	rig, cp, admin, ns, pfx, qemuArgs, site := env.rig, env.cp, env.admin, env.ns, env.pfx, env.qemuArgs, env.site
	ctx := context.Background()
	loops := *rigLoops
	if loops == 0 {
		loops, _ = strconv.Atoi(cmpOr(os.Getenv("BC_RIG_LOOPS"), "1"))
	}
	loops = max(loops, 1)
	img := pushSigned(t, admin, "acme", "sample", env.disk)
	rig.phase("", fmt.Sprintf("push and sign the sample image (%d MiB, sha256:%s…)", len(env.disk)>>20, img.GetSha256()[:12]))

	const pw = "rig-secret"
	mac1, mac2 := "52:54:00:bc:01:01", "52:54:00:bc:01:02"
	ipmiAddr := rig.startIPMI(ns, pfx+"2", qemuArgs(1, mac1), pw)
	rfAddr := rig.startRedfish(ns, pfx+"1", qemuArgs(2, mac2), pw)
	for _, m := range []struct{ name, driver, addr, mac string }{{"m1", "ipmi", ipmiAddr, mac1}, {"m2", "redfish", rfAddr, mac2}} {
		_, err := admin.Machines.Enroll(ctx, connect.NewRequest(&apiv1.EnrollMachineRequest{Tenant: "acme", Site: "dc1", Name: m.name,
			BmcDriver: m.driver, BmcAddress: m.addr, BmcUsername: "admin", BmcPassword: pw, Mac: m.mac}))
		require.NoError(t, err, "enroll %s", m.name)
	}
	rig.phase("", "enrolled m1 (IPMI) and m2 (Redfish)")

	var wg sync.WaitGroup
	for _, name := range []string{"m1", "m2"} {
		wg.Go(func() {
			for loop := 1; loop <= loops; loop++ {
				if !rig.lifecycle(cp, name, loop) {
					return
				}
			}
		})
	}
	wg.Wait()
	require.NotContains(t, site.String(), env.siteTok, "the site token never reaches the site agent's log")
	t.Logf("rig: %d loop(s) of both machines in %.0f s", loops, time.Since(rig.start).Seconds())
}

// metalRig holds the rig's processes and logs each phase's wall time.
type metalRig struct {
	t     *testing.T
	work  string
	start time.Time
	mu    sync.Mutex
	procs map[string]*rigLog
}

// rigLog is a process's output, safe to read while it runs.
type rigLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *rigLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *rigLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (r *metalRig) phase(machine, what string) {
	r.t.Helper()
	r.t.Logf("rig %6.1fs %s %s", time.Since(r.start).Seconds(), cmpOr(machine, "--"), what)
}

// process starts a long-running helper; its output is printed if the
// test fails, and it ends with the test.
func (r *metalRig) process(name string, cmd *exec.Cmd, env ...string) *rigLog {
	r.t.Helper()
	l := &rigLog{}
	cmd.Stdout, cmd.Stderr = l, l
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	require.NoError(r.t, cmd.Start(), "start %s", name)
	r.t.Cleanup(func() {
		// The whole group: ip netns exec, and what a BMC started.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	r.t.Cleanup(func() {
		if r.t.Failed() {
			r.t.Logf("%s output:\n%s", name, tail(l.String(), 12000))
		}
	})
	r.mu.Lock()
	if r.procs == nil {
		r.procs = map[string]*rigLog{}
	}
	r.procs[name] = l
	r.mu.Unlock()
	return l
}

// siteHoldsLease: a site agent holds dc1's boot lease.
func (r *metalRig) siteHoldsLease(cp *bctest.ControlPlane) bool {
	var n int
	_ = cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM site_boot_leases`).Scan(&n)
	})
	return n > 0
}

// startIPMI runs ipmi_sim in the namespace as m1's BMC: power on starts
// the VM (its startcmd), power off kills it.
func (r *metalRig) startIPMI(ns, ip string, qemuArgs []string, pw string) string {
	t := r.t
	dir := filepath.Join(r.work, "ipmi")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "state"), 0o700))
	pidfile := filepath.Join(dir, "qemu.pid")
	startcmd := "qemu-system-x86_64 -name bcrig-m1 -pidfile " + pidfile + " " + strings.Join(qemuArgs, " ") +
		" -chardev socket,id=ipmi0,host=127.0.0.1,port=9002,reconnect=1 -device ipmi-bmc-extern,id=bmc0,chardev=ipmi0 -device isa-ipmi-kcs,bmc=bmc0"
	lanConf := fmt.Sprintf(`name "bcrig"
set_working_mc 0x20
  startlan 1
    addr %s 6230
    priv_limit admin
    allowed_auths_callback md5
    allowed_auths_user md5
    allowed_auths_operator md5
    allowed_auths_admin md5
    guid a123456789abcdefa123456789abcdef
  endlan
  serial 15 127.0.0.1 9002 codec VM
  startcmd "%s"
  startnow false
  poweroff_wait 2
  kill_wait 2
  user 2 true "admin" "%s" admin 10 md5
`, ip, startcmd, pw)
	emu := "mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr\nsel_enable 0x20 1000 0x0a\nmc_enable 0x20\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "lan.conf"), []byte(lanConf), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "bmc.emu"), []byte(emu), 0o600))
	r.process("ipmi_sim", exec.Command("ip", "netns", "exec", ns, "ipmi_sim", "-c", filepath.Join(dir, "lan.conf"),
		"-f", filepath.Join(dir, "bmc.emu"), "-s", filepath.Join(dir, "state"), "-n"))
	t.Cleanup(func() {
		// ipmi_sim leaves a running VM behind when it dies.
		if b, err := os.ReadFile(pidfile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	return ip + ":6230"
}

// startRedfish serves the bctest Redfish emulator on the veth as m2's
// BMC; its power starts the VM inside the namespace.
func (r *metalRig) startRedfish(ns, ip string, qemuArgs []string, pw string) string {
	t := r.t
	qmpDir, err := os.MkdirTemp("", "bcrf")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(qmpDir) })
	power, err := redfish.NewQEMUPower(redfish.QEMUConfig{Binary: "ip",
		Args: append([]string{"netns", "exec", ns, "qemu-system-x86_64"}, qemuArgs...), Dir: qmpDir})
	require.NoError(t, err)
	t.Cleanup(func() { _ = power.Close() })
	ln, err := net.Listen("tcp", ip+":0")
	require.NoError(t, err)
	srv := &http.Server{Handler: redfish.New(redfish.Config{Username: "admin", Password: pw, Power: power}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

// lifecycle runs one loop on a machine; false when it failed (the test
// is marked failed, the machine's other loops are skipped).
func (r *metalRig) lifecycle(cp *bctest.ControlPlane, name string, loop int) bool {
	t := r.t
	admin := cp.Admin()
	ctx := context.Background()
	tag := fmt.Sprintf("%s#%d", name, loop)
	step := func(op string, call func() error, want string) (*apiv1.Machine, bool) {
		start := time.Now()
		if err := call(); err != nil {
			t.Errorf("%s %s: %v", tag, op, err)
			return nil, false
		}
		var m *apiv1.Machine
		deadline := time.Now().Add(rigPhaseLimit)
		for m.GetWorkflowId() != "" || m == nil {
			if time.Now().After(deadline) {
				t.Errorf("%s %s: still %s after %v (step logs: machines get); consoles under %s", tag, op, m.GetState(), rigPhaseLimit, r.work)
				r.consoles()
				return m, false
			}
			time.Sleep(250 * time.Millisecond)
			res, err := admin.Machines.Get(ctx, connect.NewRequest(&apiv1.GetMachineRequest{Tenant: "acme", Machine: name}))
			if err == nil {
				m = res.Msg.GetMachine()
			}
		}
		if m.GetState() != want {
			t.Errorf("%s %s ended %s, want %s: step %s: %s\n%s", tag, op, m.GetState(), want, m.GetFailedStep(), m.GetFailureReason(), m.GetFailureLogs())
			return m, false
		}
		r.phase(tag, fmt.Sprintf("%-10s %6.1f s → %s", op, time.Since(start).Seconds(), want))
		return m, true
	}
	// Inspect first: PXE → ramdisk → inventory → power off; the machine
	// keeps its state (enrolled, or ready once commissioned).
	was := "enrolled"
	if loop > 1 {
		was = "ready"
	}
	m, ok := step("inspect", func() error {
		_, err := admin.Machines.Inspect(ctx, connect.NewRequest(&apiv1.InspectMachineRequest{Tenant: "acme", Machine: name}))
		return err
	}, was)
	if !ok {
		return false
	}
	if cpus := m.GetInventory().GetFields()["cpus"]; cpus == nil {
		t.Errorf("%s: inspect left no inventory: %v", tag, m.GetInventory())
		return false
	}
	m, ok = step("commission", func() error {
		_, err := admin.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: name}))
		return err
	}, "ready")
	if !ok || !attested(t, tag, m) {
		return false
	}
	if disks := m.GetInventory().GetFields()["disks"].GetListValue().GetValues(); len(disks) == 0 {
		t.Errorf("%s: the inventory lists no disk", tag)
		return false
	}
	m, ok = step("deploy", func() error {
		_, err := admin.Machines.Deploy(ctx, connect.NewRequest(&apiv1.DeployMachineRequest{Tenant: "acme", Machine: name, Image: "sample"}))
		return err
	}, "deployed")
	if !ok {
		return false
	}
	// The deployed OS's bcd joined as a node of the machine and reported
	// its inventory.
	nodes, err := admin.Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{Tenant: "acme"}))
	if err != nil {
		t.Errorf("%s: list nodes: %v", tag, err)
		return false
	}
	var node *apiv1.Node
	for _, n := range nodes.Msg.GetNodes() {
		if n.GetLabels()[metal.MachineLabel] == m.GetId() && n.GetState() != "retired" {
			node = n
		}
	}
	if node == nil {
		t.Errorf("%s: no node of the deployed machine", tag)
		return false
	}
	inv, err := admin.Inventory.Get(ctx, connect.NewRequest(&apiv1.GetInventoryRequest{Tenant: "acme", Node: node.GetId()}))
	if err != nil || inv.Msg.GetDigest() == "" {
		t.Errorf("%s: the deployed node %s shows no inventory: %v", tag, node.GetName(), err)
		return false
	}
	r.phase(tag, fmt.Sprintf("deployed OS joined as node %s (mode %s), inventory %s…", node.GetName(), node.GetMode(), inv.Msg.GetDigest()[:12]))
	m, ok = step("release", func() error {
		_, err := admin.Machines.Release(ctx, connect.NewRequest(&apiv1.ReleaseMachineRequest{Tenant: "acme", Machine: name}))
		return err
	}, "ready")
	if !ok || !attested(t, tag, m) {
		return false
	}
	got, err := admin.Nodes.Get(ctx, connect.NewRequest(&apiv1.GetNodeRequest{Tenant: "acme", Node: node.GetId()}))
	if err != nil || got.Msg.GetNode().GetState() != "retired" {
		t.Errorf("%s: the deployed node outlived the release: %v %v", tag, got.Msg.GetNode().GetState(), err)
		return false
	}
	return true
}

// rigPhaseLimit bounds one phase (a commission, a deploy, a release) so a
// machine stuck at boot fails the test with its consoles instead of
// running into go test's timeout. On TCG a phase takes 30–80 s.
const rigPhaseLimit = 8 * time.Minute

// consoles logs the tail of each VM's serial console.
func (r *metalRig) consoles() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range []int{1, 2} {
		b, _ := os.ReadFile(filepath.Join(r.work, fmt.Sprintf("console%d.log", n)))
		r.t.Logf("m%d console (tail):\n%s", n, tail(string(b), 4000))
	}
}

// attested: the machine shows a wipe record the control plane verified.
func attested(t *testing.T, tag string, m *apiv1.Machine) bool {
	rec := m.GetEraseRecord().GetFields()
	if !rec["attested"].GetBoolValue() || len(rec["drives"].GetListValue().GetValues()) == 0 {
		t.Errorf("%s: no attested wipe record: %v", tag, rec)
		return false
	}
	d := rec["drives"].GetListValue().GetValues()[0].GetStructValue().GetFields()
	t.Logf("%s: wiped %s (%.0f MiB) with %s in %.0f ms", tag, d["device"].GetStringValue(), d["bytes"].GetNumberValue()/(1<<20),
		d["method"].GetStringValue(), d["duration_ms"].GetNumberValue())
	return true
}

// pushSigned pushes an image and signs it with a key on the tenant's
// allowlist.
func pushSigned(t *testing.T, c *client.Client, tenant, name string, b []byte) *apiv1.Image {
	t.Helper()
	ctx := context.Background()
	sum := sha256.Sum256(b)
	res, err := c.PushImage(ctx, &apiv1.PushImageHeader{Tenant: tenant, Name: name, Kind: "raw",
		Sha256: hex.EncodeToString(sum[:]), SizeBytes: int64(len(b))}, bytes.NewReader(b), "")
	require.NoError(t, err)
	s, _, err := imagesig.GenerateKey(imagesig.AlgEd25519)
	require.NoError(t, err)
	_, err = c.SignerKeys.Add(ctx, connect.NewRequest(&apiv1.AddSignerKeyRequest{Tenant: tenant, Name: "rig", PublicKey: s.Public.PEM()}))
	require.NoError(t, err)
	img := res.GetImage()
	sig, err := s.Sign(imagesig.Payload(img.GetName(), img.GetKind(), img.GetSha256()))
	require.NoError(t, err)
	signed, err := c.Images.Sign(ctx, connect.NewRequest(&apiv1.SignImageRequest{Tenant: tenant, Image: img.GetId(),
		KeyFingerprint: s.Public.Fingerprint, Signature: sig}))
	require.NoError(t, err)
	return signed.Msg.GetImage()
}

func rigRun(t *testing.T, name string, args ...string) {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	require.NoError(t, err, "%s %s: %s", name, strings.Join(args, " "), out)
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// TestRigDedicatedLease runs a dedicated-root lease's whole life on the
// rig: m1 (a QEMU VM behind ipmi_sim) is commissioned (the real ramdisk
// signs its inventory, whose DMI firmware becomes the baseline), offered to
// tenant beta, which accepts with its own signed copy of the sample image
// and root's key; the sample OS boots with root's key installed and no
// platform server or token (it never joins). beta's release runs the
// teardown through the real site agent and ramdisk — fence, ramdisk,
// firmware, attested erase, burn-in, power off, a BMC password rotation on
// ipmi_sim — and the machine is ready again with every step's signed
// evidence verified. Same gate as TestRigLifecycle.
func TestRigDedicatedLease(t *testing.T) {
	env := startRig(t)
	rig, admin := env.rig, env.admin
	ctx := context.Background()
	const pw = "rig-secret"
	mac := "52:54:00:bc:02:01"
	addr := rig.startIPMI(env.ns, env.pfx+"2", env.qemuArgs(1, mac), pw)
	_, err := admin.Machines.Enroll(ctx, connect.NewRequest(&apiv1.EnrollMachineRequest{Tenant: "acme", Site: "dc1", Name: "m1",
		BmcDriver: "ipmi", BmcAddress: addr, BmcUsername: "admin", BmcPassword: pw, Mac: mac}))
	require.NoError(t, err)
	get := func() *apiv1.Machine {
		res, err := admin.Machines.Get(ctx, connect.NewRequest(&apiv1.GetMachineRequest{Tenant: "acme", Machine: "m1"}))
		require.NoError(t, err)
		return res.Msg.GetMachine()
	}
	wait := func(op, want string) *apiv1.Machine {
		t.Helper()
		start, deadline := time.Now(), time.Now().Add(rigPhaseLimit)
		m := get()
		for m.GetWorkflowId() != "" {
			if time.Now().After(deadline) {
				rig.consoles()
				t.Fatalf("m1 %s: still %s after %v; consoles under %s", op, m.GetState(), rigPhaseLimit, rig.work)
			}
			time.Sleep(250 * time.Millisecond)
			m = get()
		}
		if m.GetState() != want {
			rig.consoles()
			t.Fatalf("m1 %s ended %s, want %s: step %s: %s\n%s", op, m.GetState(), want, m.GetFailedStep(), m.GetFailureReason(), m.GetFailureLogs())
		}
		rig.phase("m1", fmt.Sprintf("%-14s %6.1f s → %s", op, time.Since(start).Seconds(), want))
		return m
	}

	_, err = admin.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	before := wait("commission", "ready")
	require.True(t, attested(t, "m1", before))

	_, err = admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "beta"}))
	require.NoError(t, err)
	k, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "beta", Role: "admin"}))
	require.NoError(t, err)
	beta := env.cp.Client(k.Msg.GetSecret())
	pushSigned(t, beta, "beta", "beta-os", env.disk)

	offer, err := admin.Machines.Lease(ctx, connect.NewRequest(&apiv1.LeaseMachineRequest{Tenant: "acme", Machine: "m1", Lessee: "beta"}))
	require.NoError(t, err, "the commissioning's signed firmware is the baseline a lease needs")
	id := offer.Msg.GetLease().GetId()
	const rootKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl root@beta"
	_, err = beta.Machines.AcceptLease(ctx, connect.NewRequest(&apiv1.AcceptMachineLeaseRequest{Tenant: "beta", Lease: id,
		Image: "beta-os", SshKey: rootKey}))
	require.NoError(t, err)
	m := wait("lease-deploy", "deployed")
	require.Equal(t, id, m.GetLeaseId())
	// The lessee's OS boots with root's key and nothing to join with.
	console := filepath.Join(rig.work, "console1.log")
	bctest.WaitFor(t, "the lessee's OS to boot", func() bool {
		b, _ := os.ReadFile(console)
		return strings.Contains(string(b), "dedicated-root lease: root's authorized key installed (root@beta)") &&
			strings.Contains(string(b), "sample image: no BCD_SERVER")
	})
	disk, err := os.ReadFile(filepath.Join(rig.work, "disk1.img"))
	require.NoError(t, err)
	require.Contains(t, string(disk), "BCD_ROOT_AUTHORIZED_KEY='"+rootKey+"'")
	require.NotContains(t, string(disk), "BCD_JOIN_TOKEN='", "no platform join token on the lessee's disk")
	nodes, err := admin.Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{Tenant: "acme"}))
	require.NoError(t, err)
	for _, n := range nodes.Msg.GetNodes() {
		if n.GetLabels()[metal.MachineLabel] == m.GetId() && n.GetMode() == "node" {
			require.Equal(t, "retired", n.GetState(), "no live platform node for the leased machine")
		}
	}
	rig.phase("m1", "the lessee's OS booted with root's key and no join token")

	_, err = beta.Machines.ReleaseLease(ctx, connect.NewRequest(&apiv1.ReleaseMachineLeaseRequest{Tenant: "beta", Lease: id}))
	require.NoError(t, err)
	m = wait("lease-teardown", "ready")
	require.Empty(t, m.GetLeaseId())
	require.True(t, attested(t, "m1", m))
	require.NotEqual(t, before.GetBmcCredentialRef(), m.GetBmcCredentialRef(), "the BMC password was rotated")
	_, err = env.cp.App.Metal.PowerStatus(ctx, m.GetId())
	require.NoError(t, err, "the BMC takes the new current password")
	res, err := beta.Machines.GetLease(ctx, connect.NewRequest(&apiv1.GetMachineLeaseRequest{Tenant: "beta", Lease: id}))
	require.NoError(t, err)
	l := res.Msg.GetLease()
	require.Equal(t, metal.LeaseReturned, l.GetState())
	require.Len(t, l.GetEvidence(), len(metal.TeardownSteps))
	for _, e := range l.GetEvidence() {
		require.True(t, e.GetVerified(), "%s: %s", e.GetStep(), e.GetDetail())
		rig.phase("m1", fmt.Sprintf("evidence %-16s %-18s %s sha256:%s…", e.GetStep(), e.GetKind(), e.GetSigner(), e.GetDigest()[:12]))
	}
	t.Logf("rig: the dedicated-root lease's life in %.0f s", time.Since(rig.start).Seconds())
}
