package ramdisk_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/agent/ramdisk"
	"github.com/better-compute/better-compute/internal/erase"
	"github.com/better-compute/better-compute/internal/imagesig"
	"github.com/better-compute/better-compute/internal/steprecord"
)

// dirtyDisk is a file-backed disk full of non-zero bytes.
func dirtyDisk(t *testing.T, size int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "disk.img")
	require.NoError(t, os.WriteFile(path, bytes.Repeat([]byte{0xa5}, size), 0o600))
	return path
}

func identity(t *testing.T) (ramdisk.Identity, []byte) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKIXPublicKey(k.Public())
	require.NoError(t, err)
	return ramdisk.Identity{NodeID: "nod_rd", Key: k}, der
}

// viaJSON sends a result through JSON, as a command result travels.
func viaJSON(t *testing.T, m map[string]any) map[string]any {
	b, err := json.Marshal(m)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}

func TestWipeFileDiskSignsOverwrite(t *testing.T) {
	t.Parallel()
	path := dirtyDisk(t, 3<<20+512)
	rd := ramdisk.New(ramdisk.Config{AllowFileDisks: true, SysfsRoot: t.TempDir()})
	id, pub := identity(t)
	out, err := rd.Apply(context.Background(), ramdisk.KindDiskWipe,
		map[string]any{"machine_id": "mch_1", "workflow_id": "wf_1", "devices": []any{path}}, id)
	require.NoError(t, err)
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, make([]byte, len(got)), got, "every byte is zero")
	s, err := erase.FromOutput(viaJSON(t, out))
	require.NoError(t, err)
	require.NoError(t, erase.Verify(pub, s))
	require.Len(t, s.Record.Drives, 1)
	d := s.Record.Drives[0]
	require.Equal(t, erase.MethodOverwrite, d.Method)
	require.Equal(t, int64(3<<20+512), d.Bytes)
	require.True(t, d.Verification.Zero)
	require.Equal(t, "mch_1", s.Record.MachineID)
	require.Equal(t, "nod_rd", s.Record.NodeID)
}

func TestWipeRefusesBadInput(t *testing.T) {
	t.Parallel()
	path := dirtyDisk(t, 8192)
	id, _ := identity(t)
	strict := ramdisk.New(ramdisk.Config{SysfsRoot: t.TempDir()})
	for name, tc := range map[string]struct {
		rd     *ramdisk.Ramdisk
		params map[string]any
		want   string
	}{
		"regular file on a real machine": {strict, map[string]any{"machine_id": "m", "workflow_id": "w", "devices": []any{path}}, "not a block device"},
		"no machine":                     {strict, map[string]any{"workflow_id": "w", "devices": []any{path}}, "machine_id and workflow_id"},
		"devices not strings":            {strict, map[string]any{"machine_id": "m", "workflow_id": "w", "devices": []any{1.0}}, "list of strings"},
		"missing device":                 {strict, map[string]any{"machine_id": "m", "workflow_id": "w", "devices": []any{"/nonexistent/disk"}}, "no such file"},
	} {
		_, err := tc.rd.Apply(context.Background(), ramdisk.KindDiskWipe, tc.params, id)
		require.ErrorContains(t, err, tc.want, name)
	}
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, bytes.Repeat([]byte{0xa5}, 8192), got, "nothing was written")
}

// TestWipeLoopDevice wipes a real block device: a loop device over a file,
// which supports discard, so the wipe discards and reads back zeros.
func TestWipeLoopDevice(t *testing.T) {
	t.Parallel()
	if os.Getuid() != 0 {
		t.Skip("loop devices need root")
	}
	path := dirtyDisk(t, 16<<20)
	out, err := exec.Command("losetup", "--find", "--show", path).CombinedOutput()
	if err != nil {
		t.Skipf("losetup does not work here: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
	rd := ramdisk.New(ramdisk.Config{})
	d, err := rd.Wipe(context.Background(), dev)
	require.NoError(t, err)
	require.Equal(t, erase.MethodDiscard, d.Method)
	require.Equal(t, int64(16<<20), d.Bytes)
	require.True(t, d.Verification.Zero)
	f, err := os.Open(dev)
	require.NoError(t, err)
	defer f.Close()
	buf := make([]byte, 16<<20)
	_, err = f.ReadAt(buf, 0)
	require.NoError(t, err)
	require.Equal(t, make([]byte, len(buf)), buf)
}

func TestImageWriteVerifiesBeforeWriting(t *testing.T) {
	t.Parallel()
	signer, _, err := imagesig.GenerateKey(imagesig.AlgEd25519)
	require.NoError(t, err)
	pub := signer.Public
	content := bytes.Repeat([]byte("debian-12 "), 1000)
	sum := sha256.Sum256(content)
	digest := hex.EncodeToString(sum[:])
	sig, err := signer.Sign(imagesig.Payload("debian-12", "disk", digest))
	require.NoError(t, err)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/evil" {
			_, _ = w.Write(bytes.Repeat([]byte("x"), len(content)))
			return
		}
		_, _ = w.Write(content)
	}))
	t.Cleanup(srv.Close)
	rd := ramdisk.New(ramdisk.Config{AllowFileDisks: true, TrustedImageKeys: []imagesig.PublicKey{pub}, SpoolDir: t.TempDir()})
	params := func(url string, sig []byte) map[string]any {
		return map[string]any{"url": url, "device": "", "name": "debian-12", "kind": "disk", "sha256": digest,
			"size_bytes": float64(len(content)),
			"signatures": []any{map[string]any{"key_fingerprint": pub.Fingerprint, "signature": base64.StdEncoding.EncodeToString(sig)}}}
	}
	forged := append([]byte(nil), sig...)
	forged[0] ^= 0xff
	for name, tc := range map[string]struct {
		url  string
		sig  []byte
		want string
	}{
		"forged signature": {srv.URL + "/img", forged, "no trusted key signed"},
		"other content":    {srv.URL + "/evil", sig, "does not match its digest"},
	} {
		disk := dirtyDisk(t, 64<<10)
		p := params(tc.url, tc.sig)
		p["device"] = disk
		_, err := rd.Apply(context.Background(), ramdisk.KindImageWrite, p, ramdisk.Identity{})
		require.ErrorContains(t, err, tc.want, name)
		got, err := os.ReadFile(disk)
		require.NoError(t, err)
		require.Equal(t, bytes.Repeat([]byte{0xa5}, 64<<10), got, "%s: the disk was not written", name)
	}
	disk := dirtyDisk(t, 64<<10)
	p := params(srv.URL+"/img", sig)
	p["device"] = disk
	out, err := rd.Apply(context.Background(), ramdisk.KindImageWrite, p, ramdisk.Identity{})
	require.NoError(t, err)
	require.Equal(t, digest, out["sha256"])
	got, err := os.ReadFile(disk)
	require.NoError(t, err)
	require.Equal(t, content, got[:len(content)])
}

func TestInventoryFromSysfs(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	write := func(rel, text string) {
		p := filepath.Join(root, rel)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(text+"\n"), 0o644))
	}
	for _, c := range []string{"cpu0", "cpu1", "cpu2", "cpu3"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, "sys/devices/system/cpu", c), 0o755))
	}
	write("proc/meminfo", "MemTotal:       16384 kB\nMemFree: 1 kB")
	write("proc/cpuinfo", "processor: 0\nmodel name\t: QEMU Virtual CPU")
	write("sys/block/nvme0n1/size", "7501476528")
	write("sys/block/nvme0n1/removable", "0")
	write("sys/block/nvme0n1/device/model", "SAMSUNG MZQL23T8")
	write("sys/block/loop0/size", "100")
	write("sys/block/sr0/size", "100")
	write("sys/class/net/lo/address", "00:00:00:00:00:00")
	write("sys/class/net/eno1/address", "52:54:00:12:34:56")
	write("sys/bus/pci/devices/0000:17:00.0/class", "0x030200")
	write("sys/bus/pci/devices/0000:17:00.0/vendor", "0x10de")
	write("sys/bus/pci/devices/0000:17:00.0/device", "0x2330")
	write("sys/bus/pci/devices/0000:03:00.0/class", "0x030000")
	write("sys/bus/pci/devices/0000:03:00.0/vendor", "0x1a03") // the BMC's ASPEED VGA
	write("sys/bus/pci/devices/0000:00:1f.0/class", "0x060100")
	write("sys/bus/pci/devices/0000:00:1f.0/vendor", "0x8086")
	write("sys/class/dmi/id/bios_vendor", "SeaBIOS")
	write("sys/class/dmi/id/bios_version", "1.16.2-debian")
	write("sys/class/dmi/id/product_name", "Standard PC (i440FX + PIIX, 1996)")
	inv, err := ramdisk.New(ramdisk.Config{SysfsRoot: root}).Inventory()
	require.NoError(t, err)
	require.Equal(t, 4, inv.CPUs)
	require.Equal(t, "QEMU Virtual CPU", inv.CPUModel)
	require.Equal(t, int64(16384<<10), inv.MemoryBytes)
	require.Equal(t, []ramdisk.Disk{{Device: "/dev/nvme0n1", SizeBytes: 7501476528 * 512, Model: "SAMSUNG MZQL23T8", Transport: "nvme"}}, inv.Disks)
	require.Equal(t, []ramdisk.NIC{{Name: "eno1", MAC: "52:54:00:12:34:56"}}, inv.NICs)
	require.Equal(t, []ramdisk.GPU{{PCIAddress: "0000:17:00.0", Vendor: "nvidia", VendorID: "0x10de", DeviceID: "0x2330", Class: "0x030200"}}, inv.GPUs)
	require.Equal(t, map[string]string{"bios_vendor": "SeaBIOS", "bios_version": "1.16.2-debian",
		"product_name": "Standard PC (i440FX + PIIX, 1996)"}, inv.Firmware)

	// Asked for a machine and workflow, the inventory comes signed with
	// the ramdisk's key, firmware and all.
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	require.NoError(t, err)
	out, err := ramdisk.New(ramdisk.Config{SysfsRoot: root}).Apply(context.Background(), ramdisk.KindInventoryRefresh,
		map[string]any{"machine_id": "mch_1", "workflow_id": "wf_1"}, ramdisk.Identity{NodeID: "n1", Key: key})
	require.NoError(t, err)
	v, err := steprecord.Verify(der, out, "mch_1", "wf_1", ramdisk.KindInventoryRefresh)
	require.NoError(t, err)
	require.Equal(t, "1.16.2-debian", v.Record.Output["firmware"].(map[string]any)["bios_version"])
}

func TestParseCmdline(t *testing.T) {
	t.Parallel()
	b, err := ramdisk.ParseCmdline("console=ttyS0 bc.server=10.0.0.1:8443 bc.pin=abc bc.token=bcdt_xyz quiet")
	require.NoError(t, err)
	require.Equal(t, ramdisk.Boot{Token: "bcdt_xyz", Server: "10.0.0.1:8443", Pin: "abc"}, b)
	_, err = ramdisk.ParseCmdline("console=ttyS0")
	require.ErrorContains(t, err, "bc.token")
}
