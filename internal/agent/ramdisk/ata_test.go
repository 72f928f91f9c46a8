package ramdisk

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// identify builds IDENTIFY DEVICE data with words 82, 89 and 128 set.
func identify(w82, w89, w128 uint16) []byte {
	b := make([]byte, ataSector)
	binary.LittleEndian.PutUint16(b[2*82:], w82)
	binary.LittleEndian.PutUint16(b[2*89:], w89)
	binary.LittleEndian.PutUint16(b[2*128:], w128)
	return b
}

func TestParseIdentifySecurity(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name        string
		w82, w128   uint16
		w89         uint16
		usable      bool
		eraseTime   time.Duration
		enhanced    bool
		frozen      bool
		notReported bool
	}{
		{name: "supported, not frozen", w82: 1 << 1, w128: 1 | 1<<5, w89: 3, usable: true, eraseTime: 6 * time.Minute, enhanced: true},
		{name: "frozen by the BIOS", w82: 1 << 1, w128: 1 | 1<<3, frozen: true},
		{name: "a password is already set", w82: 1 << 1, w128: 1 | 1<<1},
		{name: "locked", w82: 1 << 1, w128: 1 | 1<<1 | 1<<2},
		{name: "attempts exhausted", w82: 1 << 1, w128: 1 | 1<<4},
		{name: "no security feature set", w82: 0, w128: 0},
		{name: "word 128 not reported", w82: 1 << 1, w128: 0xffff, notReported: true},
		{name: "extended erase time", w82: 1 << 1, w128: 1, w89: 0x8000 | 300, usable: true, eraseTime: 600 * time.Minute},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := parseIdentify(identify(c.w82, c.w89, c.w128))
			require.NoError(t, err)
			require.Equal(t, c.usable, s.usable(), "%+v", s)
			require.Equal(t, c.frozen, s.frozen)
			require.Equal(t, c.enhanced, s.enhanced)
			require.Equal(t, c.eraseTime, s.eraseTime)
			if c.notReported {
				require.False(t, s.supported)
			}
		})
	}
	_, err := parseIdentify(make([]byte, 100))
	require.ErrorContains(t, err, "identify data is 100 bytes")
}

func TestATAEraseTimeout(t *testing.T) {
	t.Parallel()
	require.Equal(t, 12*time.Hour, ataEraseTimeout(ataSecurity{}))
	require.Equal(t, 22*time.Minute, ataEraseTimeout(ataSecurity{eraseTime: 6 * time.Minute}))
}

func TestATACDBs(t *testing.T) {
	t.Parallel()
	// IDENTIFY: PIO data-in of one block, from the device.
	require.Equal(t, [16]byte{0x85, 4 << 1, 0x0e, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0x40, 0xEC, 0}, ataCDB(ataIdentify, ataProtoPIOIn))
	// ERASE UNIT: PIO data-out of one block, to the device.
	require.Equal(t, [16]byte{0x85, 5 << 1, 0x06, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0x40, 0xF4, 0}, ataCDB(ataSecEraseUnit, ataProtoPIOOut))
	// ERASE PREPARE: no data.
	require.Equal(t, [16]byte{0x85, 3 << 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x40, 0xF3, 0}, ataCDB(ataSecErasePrepare, ataProtoNonData))

	// The password block: user password, normal erase, 32 bytes of it.
	pw := ataPasswordBlock([]byte("0123456789abcdef0123456789abcdef"))
	require.Len(t, pw, ataSector)
	require.Equal(t, []byte{0, 0}, pw[:2])
	require.Equal(t, "0123456789abcdef0123456789abcdef", string(pw[2:34]))
	require.Equal(t, make([]byte, ataSector-34), pw[34:])

	// The header matches the kernel's struct sg_io_hdr.
	if unsafe.Sizeof(uintptr(0)) == 8 {
		require.EqualValues(t, 88, unsafe.Sizeof(sgIOHdr{}))
		require.EqualValues(t, 56, unsafe.Offsetof(sgIOHdr{}.usrPtr))
		require.EqualValues(t, 64, unsafe.Offsetof(sgIOHdr{}.status))
	}
}

// TestATAOnAFileFails: SG_IO on something that is not a SCSI device fails
// cleanly, so methods() skips the ATA erase and the wipe goes on.
func TestATAOnAFileFails(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "disk")
	require.NoError(t, os.WriteFile(p, make([]byte, 4096), 0o600))
	f, err := os.Open(p)
	require.NoError(t, err)
	defer f.Close()
	_, err = ataIdentifySecurity(f)
	require.Error(t, err)
}
