package ramdisk_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/agent/ramdisk"
	"github.com/better-compute/better-compute/internal/sealbox"
)

// imageWithSlot is a disk whose image holds the empty config slot at a
// sector, as build-sample.sh lays bcd.env on its FAT partition.
func imageWithSlot(t *testing.T, at int) (string, int) {
	img := bytes.Repeat([]byte{0x11}, 1<<20)
	copy(img[at:], ramdisk.EmptySlot())
	path := filepath.Join(t.TempDir(), "disk.img")
	require.NoError(t, os.WriteFile(path, append(img, make([]byte, 1<<20)...), 0o600))
	return path, len(img)
}

func TestConfigureWritesTheSlot(t *testing.T) {
	t.Parallel()
	path, size := imageWithSlot(t, 300*512)
	id, pub := identity(t)
	sealed, err := sealbox.Seal(pub, "join/mch_1", []byte("bcjt1.pin.tok-en_value"))
	require.NoError(t, err)
	rd := ramdisk.New(ramdisk.Config{AllowFileDisks: true, Server: "10.9.0.1:7443"})
	out, err := rd.Apply(context.Background(), ramdisk.KindConfigure, map[string]any{"device": path, "size_bytes": float64(size),
		"machine_id": "mch_1", "join_token_sealed": sealed}, id)
	require.NoError(t, err)
	require.EqualValues(t, 300*512, out["slot_offset"])
	require.NotContains(t, strings.Join([]string{out["device"].(string), out["server"].(string)}, " "), "tok-en")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	slot := string(b[300*512 : 300*512+ramdisk.SlotSize])
	require.True(t, strings.HasPrefix(slot, ramdisk.SlotMagic))
	require.True(t, strings.HasSuffix(slot, ramdisk.SlotEnd))
	require.Contains(t, slot, "BCD_SERVER='10.9.0.1:7443'\nBCD_JOIN_TOKEN='bcjt1.pin.tok-en_value'\nBCD_MACHINE='mch_1'\n")
	require.Equal(t, bytes.Repeat([]byte{0x11}, 300*512), b[:300*512], "nothing before the slot changed")

	// Sealed to another ramdisk's key, or for another machine: refused.
	other, _ := identity(t)
	_, err = rd.Apply(context.Background(), ramdisk.KindConfigure, map[string]any{"device": path, "size_bytes": float64(size),
		"machine_id": "mch_1", "join_token_sealed": sealed}, other)
	require.ErrorIs(t, err, ramdisk.ErrInvalidParams)
	_, err = rd.Apply(context.Background(), ramdisk.KindConfigure, map[string]any{"device": path, "size_bytes": float64(size),
		"machine_id": "mch_2", "join_token_sealed": sealed}, id)
	require.ErrorIs(t, err, ramdisk.ErrInvalidParams)
}

// TestConfigureWritesAGatewayList: a ramdisk given several gateways
// (bc.server=a,b) hands the deployed system all of them.
func TestConfigureWritesAGatewayList(t *testing.T) {
	t.Parallel()
	path, size := imageWithSlot(t, 8*512)
	id, _ := identity(t)
	rd := ramdisk.New(ramdisk.Config{AllowFileDisks: true, Server: "10.9.0.1:7443,10.9.0.2:7443"})
	_, err := rd.Apply(context.Background(), ramdisk.KindConfigure, map[string]any{"device": path, "size_bytes": float64(size),
		"join_token": "tok"}, id)
	require.NoError(t, err)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Contains(t, string(b[8*512:8*512+ramdisk.SlotSize]), "BCD_SERVER='10.9.0.1:7443,10.9.0.2:7443'\n")
}

func TestConfigureRefusesAnImageWithoutASlot(t *testing.T) {
	t.Parallel()
	id, _ := identity(t)
	rd := ramdisk.New(ramdisk.Config{AllowFileDisks: true, Server: "10.9.0.1:7443"})
	path := dirtyDisk(t, 2<<20)
	_, err := rd.Apply(context.Background(), ramdisk.KindConfigure, map[string]any{"device": path, "size_bytes": float64(1 << 20),
		"join_token": "tok"}, id)
	require.ErrorIs(t, err, ramdisk.ErrInvalidParams)
	require.ErrorContains(t, err, "no config slot")
	before, _ := os.ReadFile(path)
	require.Equal(t, bytes.Repeat([]byte{0xa5}, 2<<20), before, "nothing written")

	// A slot beyond the image's size is not searched; a token with a
	// quote could break out of the env file.
	slotted, size := imageWithSlot(t, 8*512)
	_, err = rd.Apply(context.Background(), ramdisk.KindConfigure, map[string]any{"device": slotted, "size_bytes": float64(4 * 512),
		"join_token": "tok"}, id)
	require.ErrorContains(t, err, "no config slot")
	_, err = rd.Apply(context.Background(), ramdisk.KindConfigure, map[string]any{"device": slotted, "size_bytes": float64(size),
		"join_token": "tok'; reboot; '"}, id)
	require.ErrorContains(t, err, "join_token")
}

func TestBurnIn(t *testing.T) {
	t.Parallel()
	id, _ := identity(t)
	rd := ramdisk.New(ramdisk.Config{AllowFileDisks: true, SysfsRoot: t.TempDir()})
	out, err := rd.Apply(context.Background(), ramdisk.KindBurnIn, map[string]any{"enabled": false}, id)
	require.NoError(t, err)
	require.Equal(t, true, out["skipped"])
	path := dirtyDisk(t, 4<<20)
	out, err = rd.Apply(context.Background(), ramdisk.KindBurnIn, map[string]any{"enabled": true, "duration_seconds": float64(2),
		"devices": []any{path}}, id)
	require.NoError(t, err)
	require.Equal(t, true, out["passed"])
	require.EqualValues(t, 4<<20, out["disk_bytes_read"])
	require.Positive(t, out["cpu_bytes_hashed"])
	_, err = rd.Apply(context.Background(), ramdisk.KindBurnIn, map[string]any{"enabled": true, "duration_seconds": float64(99999)}, id)
	require.ErrorIs(t, err, ramdisk.ErrInvalidParams)
	_, err = rd.Apply(context.Background(), ramdisk.KindBurnIn, map[string]any{"enabled": true, "duration_seconds": float64(1),
		"devices": []any{filepath.Join(t.TempDir(), "missing")}}, id)
	require.Error(t, err)
}

// TestConfigureALease: a dedicated-root lease's configure writes root's
// key and the machine, and no server or token: the lessee's OS has nothing
// to join the platform with. A key that could break out of its quotes is
// refused with the disk untouched.
func TestConfigureALease(t *testing.T) {
	t.Parallel()
	path, size := imageWithSlot(t, 16*512)
	id, _ := identity(t)
	rd := ramdisk.New(ramdisk.Config{AllowFileDisks: true, Server: "10.9.0.1:7443"})
	const key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl root@lessee"
	before, err := os.ReadFile(path)
	require.NoError(t, err)
	_, err = rd.Apply(context.Background(), ramdisk.KindConfigure, map[string]any{"device": path, "size_bytes": float64(size),
		"machine_id": "mch_1", "root_authorized_key": "ssh-ed25519 AAAA' ; reboot ; '"}, id)
	require.ErrorIs(t, err, ramdisk.ErrInvalidParams)
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, before, after)

	out, err := rd.Apply(context.Background(), ramdisk.KindConfigure, map[string]any{"device": path, "size_bytes": float64(size),
		"machine_id": "mch_1", "root_authorized_key": key}, id)
	require.NoError(t, err)
	require.EqualValues(t, 16*512, out["slot_offset"])
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	slot := string(b[16*512 : 16*512+ramdisk.SlotSize])
	require.Contains(t, slot, "BCD_ROOT_AUTHORIZED_KEY='"+key+"'\nBCD_MACHINE='mch_1'\n")
	require.NotContains(t, slot, "BCD_SERVER")
	require.NotContains(t, slot, "BCD_JOIN_TOKEN")
}
