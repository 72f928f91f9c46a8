package app_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/provision"
)

// TestRamdiskRigQEMU boots the ramdisk `make ramdisk` built in QEMU (TCG,
// -kernel/-initrd, user-mode networking) with the discovery token on its
// kernel command line: the real bcd in the real initramfs joins the
// gateway, wipes the VM's virtio disk and signs the record, and the
// machine ends ready. It needs BC_RIG=1, qemu-system-x86_64 and the
// ramdisk under .cache/ramdisk/out (or BC_RAMDISK_DIR).
func TestRamdiskRigQEMU(t *testing.T) {
	if os.Getenv("BC_RIG") != "1" {
		t.Skip("BC_RIG=1 boots the built ramdisk in QEMU (run make ramdisk first)")
	}
	dir := os.Getenv("BC_RAMDISK_DIR")
	if dir == "" {
		dir = filepath.Join("..", "..", ".cache", "ramdisk", "out")
	}
	for _, f := range []string{"vmlinuz", "initrd.cpio.gz"} {
		_, err := os.Stat(filepath.Join(dir, f))
		require.NoError(t, err, "run make ramdisk first")
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	require.NoError(t, err)

	// The guest reaches the host's loopback as 10.0.2.2 (QEMU's user
	// network): the gateway's certificate must name it.
	cp := bctest.NewControlPlane(t, func(c *app.Config) { c.GatewayHosts = []string{"127.0.0.1", "localhost", "10.0.2.2"} })
	f := &ramdiskFixture{cp: cp, admin: cp.Admin(), mac: "52:54:00:aa:bb:02"}
	ctx := context.Background()
	_, err = f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	site, err := f.admin.Sites.Create(ctx, connect.NewRequest(&apiv1.CreateSiteRequest{Tenant: "acme", Name: "dc1", Networks: []string{"127.0.0.0/8"}}))
	require.NoError(t, err)
	f.site = &ramdiskSite{rt: cp.App.Metal, boots: make(chan string, 4), keys: map[string]provision.Outcome{}}
	t.Cleanup(cp.App.Metal.Agents.Register(site.Msg.GetSite().GetId(), f.site))
	_, err = f.admin.Machines.Enroll(ctx, connect.NewRequest(&apiv1.EnrollMachineRequest{Tenant: "acme", Site: "dc1", Name: "m1",
		BmcDriver: "redfish", BmcAddress: "http://127.0.0.1:1", BmcUsername: "admin", BmcPassword: "pw", Mac: f.mac}))
	require.NoError(t, err)

	disk := filepath.Join(t.TempDir(), "disk.img")
	require.NoError(t, os.WriteFile(disk, bytes.Repeat([]byte{0xa5}, 8<<20), 0o600))
	_, port, err := net.SplitHostPort(cp.GatewayAddr)
	require.NoError(t, err)

	_, err = f.admin.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1"}))
	require.NoError(t, err)
	token := bctest.Receive(t, "the ramdisk boot", f.site.boots)
	console := filepath.Join(t.TempDir(), "console.log")
	vm := exec.Command(qemu, "-accel", "tcg", "-m", "768", "-display", "none", "-no-reboot", "-serial", "file:"+console,
		"-kernel", filepath.Join(dir, "vmlinuz"), "-initrd", filepath.Join(dir, "initrd.cpio.gz"),
		"-append", "console=ttyS0 panic=-1 bc.server=10.0.2.2:"+port+" bc.token="+token,
		"-nic", "user,model=virtio-net-pci,mac="+f.mac,
		"-drive", "file="+disk+",if=virtio,format=raw,discard=unmap")
	require.NoError(t, vm.Start())
	t.Cleanup(func() { _ = vm.Process.Kill(); _ = vm.Wait() })
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(console)
			t.Logf("guest console:\n%s", b)
		}
	})

	var m *apiv1.Machine
	bctest.WaitFor(t, "the commissioning in QEMU to end", func() bool {
		m = f.machine(t)
		return m.GetWorkflowId() == ""
	})
	require.Equal(t, "ready", m.GetState(), "failure: %s %s %s", m.GetFailedStep(), m.GetFailureReason(), m.GetFailureLogs())
	rec := m.GetEraseRecord().GetFields()
	require.True(t, rec["attested"].GetBoolValue())
	drive := rec["drives"].GetListValue().GetValues()[0].GetStructValue().GetFields()
	require.Equal(t, "/dev/vda", drive["device"].GetStringValue())
	require.EqualValues(t, 8<<20, drive["bytes"].GetNumberValue())
	t.Logf("wiped /dev/vda with %s in %.0f ms", drive["method"].GetStringValue(), drive["duration_ms"].GetNumberValue())
	b, err := os.ReadFile(disk)
	require.NoError(t, err)
	require.True(t, bytes.Equal(b, make([]byte, len(b))), "the VM's disk reads zeros")
	log, _ := os.ReadFile(console)
	require.True(t, strings.Contains(string(log), "bcd-ramdisk: starting bcd"), "the console shows the ramdisk's init")
}
