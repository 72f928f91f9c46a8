package images_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/imagesig"
)

// TestSampleImage builds the sample image with deploy/images/build-sample.sh,
// pushes and signs it through the catalog, checks what Verify hands the
// ramdisk against the disk's bytes, and boots the disk under QEMU (TCG) until
// its init runs. It needs the script's Debian packages, a Debian mirror and
// qemu-system-x86, so it runs only with BC_TEST_SAMPLE_IMAGE=1; with
// BC_TEST_SAMPLE_IMAGE_DIR set it uses an image built there already.
func TestSampleImage(t *testing.T) {
	if os.Getenv("BC_TEST_SAMPLE_IMAGE") != "1" {
		t.Skip("set BC_TEST_SAMPLE_IMAGE=1 to build and boot the sample image")
	}
	t.Parallel()
	dir := os.Getenv("BC_TEST_SAMPLE_IMAGE_DIR")
	if dir == "" {
		dir = t.TempDir()
		_, file, _, _ := runtime.Caller(0)
		script := filepath.Join(filepath.Dir(file), "..", "..", "deploy", "images", "build-sample.sh")
		out, err := exec.Command(script, dir).CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	disk, err := os.ReadFile(filepath.Join(dir, "sample.raw"))
	require.NoError(t, err)

	// An MBR with one bootable FAT32 (LBA) partition at 1 MiB.
	require.Equal(t, []byte{0x55, 0xaa}, disk[510:512])
	entry := disk[446:462]
	require.Equal(t, byte(0x80), entry[0], "bootable")
	require.Equal(t, byte(0x0c), entry[4], "FAT32 LBA")
	require.Equal(t, uint32(2048), binary.LittleEndian.Uint32(entry[8:12]))

	f := setup(t)
	c := f.keys["admin"]
	res, err := push(t, c, "acme", "sample", "raw", disk)
	require.NoError(t, err)
	key := addKey(t, c, "acme", "ci", imagesig.AlgEd25519)
	_, err = sign(t, c, "acme", res.GetImage(), key)
	require.NoError(t, err)
	d, err := f.verify(t, f.acme, "sample")
	require.NoError(t, err)
	var pulled bytes.Buffer
	_, err = c.PullImage(context.Background(), &apiv1.PullImageRequest{Tenant: "acme", Image: "sample"}, &pulled)
	require.NoError(t, err)
	var written bytes.Buffer
	_, err = imagesig.CopyVerified(&written, &pulled, d.Descriptor, d.Trusted)
	require.NoError(t, err)
	require.Equal(t, disk, written.Bytes())

	// Boot it: SeaBIOS → SYSLINUX → the kernel → /init, which says so on
	// the serial console and, with no bcd.env, drops to a shell.
	boot := filepath.Join(t.TempDir(), "boot.raw")
	require.NoError(t, os.WriteFile(boot, disk, 0o600))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	qemu := exec.CommandContext(ctx, "qemu-system-x86_64", "-accel", "tcg", "-m", "512", "-nographic", "-no-reboot",
		"-drive", "file="+boot+",format=raw,if=virtio", "-netdev", "user,id=n0", "-device", "virtio-net-pci,netdev=n0")
	stdout, err := qemu.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, qemu.Start())
	defer func() { _ = qemu.Process.Kill(); _ = qemu.Wait() }()
	want := []string{"SYSLINUX", "sample image: kernel", "lease of", "no BCD_SERVER"}
	sc := bufio.NewScanner(stdout)
	var seen []string
	for sc.Scan() && len(want) > 0 {
		line := sc.Text()
		seen = append(seen, line)
		if strings.Contains(line, want[0]) {
			want = want[1:]
		}
	}
	require.Empty(t, want, "console:\n%s", strings.Join(seen, "\n"))
}
