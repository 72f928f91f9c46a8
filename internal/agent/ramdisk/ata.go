package ramdisk

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ATA Security erase through SG_IO and ATA PASS-THROUGH (16), the way
// hdparm --security-erase does it, so the ramdisk needs no hdparm. A SATA
// drive behind libata (sd*) takes it when IDENTIFY DEVICE says the
// security feature set is supported, not frozen, not locked and no
// password is set yet: the ramdisk sets a one-time user password, runs
// SECURITY ERASE PREPARE and a normal SECURITY ERASE UNIT (which writes
// zeros, so the read-back sample verifies it), and the drive clears the
// password itself when the erase completes. A failed erase disables the
// password again so the drive is never left locked.

// sgIOHdr is struct sg_io_hdr (scsi/sg.h) on 64-bit Linux: 88 bytes.
type sgIOHdr struct {
	interfaceID    int32
	dxferDirection int32
	cmdLen         uint8
	mxSbLen        uint8
	iovecCount     uint16
	dxferLen       uint32
	dxferp         uintptr
	cmdp           uintptr
	sbp            uintptr
	timeout        uint32
	flags          uint32
	packID         int32
	usrPtr         uintptr
	status         uint8
	maskedStatus   uint8
	msgStatus      uint8
	sbLenWr        uint8
	hostStatus     uint16
	driverStatus   uint16
	resid          int32
	duration       uint32
	info           uint32
}

const (
	sgIO           = 0x2285
	sgDxferNone    = -1
	sgDxferToDev   = -2
	sgDxferFromDev = -3

	ataPassThrough16 = 0x85
	ataProtoNonData  = 3
	ataProtoPIOIn    = 4
	ataProtoPIOOut   = 5

	ataIdentify        = 0xEC
	ataSecSetPassword  = 0xF1
	ataSecErasePrepare = 0xF3
	ataSecEraseUnit    = 0xF4
	ataSecDisablePass  = 0xF6

	ataSector = 512
)

// ataCDB builds an ATA PASS-THROUGH (16) CDB for a 28-bit command with a
// sector count of one (the data commands here move one 512-byte block).
func ataCDB(command byte, protocol byte) [16]byte {
	var c [16]byte
	c[0] = ataPassThrough16
	c[1] = protocol << 1
	switch protocol {
	case ataProtoPIOIn:
		c[2] = 0x0e // t_dir from device, byte_block, length in sector_count
		c[6] = 1
	case ataProtoPIOOut:
		c[2] = 0x06 // t_dir to device, byte_block, length in sector_count
		c[6] = 1
	}
	c[13] = 0x40 // device: LBA mode
	c[14] = command
	return c
}

// ataSecurity is what IDENTIFY DEVICE says of the security feature set.
type ataSecurity struct {
	supported, enabled, locked, frozen, countExpired, enhanced bool
	// eraseTime is the drive's estimate of a normal erase (0: unknown).
	eraseTime time.Duration
}

// usable: the erase can run without a password someone else set.
func (s ataSecurity) usable() bool {
	return s.supported && !s.enabled && !s.locked && !s.frozen && !s.countExpired
}

// parseIdentify reads words 82, 89 and 128 of IDENTIFY DEVICE data.
func parseIdentify(id []byte) (ataSecurity, error) {
	if len(id) < ataSector {
		return ataSecurity{}, fmt.Errorf("identify data is %d bytes, want %d", len(id), ataSector)
	}
	word := func(n int) uint16 { return binary.LittleEndian.Uint16(id[2*n:]) }
	w82, w128 := word(82), word(128)
	// 0x0000 and 0xffff mean the word is not reported.
	if w82 == 0xffff || w128 == 0xffff {
		return ataSecurity{}, nil
	}
	s := ataSecurity{supported: w82&(1<<1) != 0 && w128&1 != 0, enabled: w128&(1<<1) != 0, locked: w128&(1<<2) != 0,
		frozen: w128&(1<<3) != 0, countExpired: w128&(1<<4) != 0, enhanced: w128&(1<<5) != 0}
	// Word 89: normal erase time in 2-minute units; 255 means over 508
	// minutes (bit 15 set: the extended format, units in bits 14:0).
	switch w89 := word(89); {
	case w89&0x8000 != 0:
		s.eraseTime = time.Duration(w89&0x7fff) * 2 * time.Minute
	case w89 > 0:
		s.eraseTime = time.Duration(w89&0xff) * 2 * time.Minute
	}
	return s, nil
}

// ataEraseTimeout is how long SECURITY ERASE UNIT may take: the drive's
// estimate with a margin, or 12 h when it gives none.
func ataEraseTimeout(s ataSecurity) time.Duration {
	if s.eraseTime <= 0 {
		return 12 * time.Hour
	}
	return s.eraseTime*2 + 10*time.Minute
}

// ataPasswordBlock is the 512-byte data of SET PASSWORD, ERASE UNIT and
// DISABLE PASSWORD: word 0 selects the user password (bit 0 clear) and,
// for ERASE UNIT, normal erase (bit 1 clear); words 1–16 hold it.
func ataPasswordBlock(password []byte) []byte {
	b := make([]byte, ataSector)
	copy(b[2:34], password)
	return b
}

// ataCommand runs one ATA command on f through SG_IO.
func ataCommand(f *os.File, cdb [16]byte, dir int32, data []byte, timeout time.Duration) error {
	var sense [32]byte
	h := sgIOHdr{interfaceID: 'S', dxferDirection: dir, cmdLen: uint8(len(cdb)), mxSbLen: uint8(len(sense)),
		cmdp: uintptr(unsafe.Pointer(&cdb[0])), sbp: uintptr(unsafe.Pointer(&sense[0])),
		timeout: uint32(min(timeout, 49*24*time.Hour) / time.Millisecond)}
	if len(data) > 0 {
		h.dxferLen, h.dxferp = uint32(len(data)), uintptr(unsafe.Pointer(&data[0]))
	}
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), sgIO, uintptr(unsafe.Pointer(&h)))
	if errno != 0 {
		return fmt.Errorf("SG_IO ATA %#x: %w", cdb[14], errno)
	}
	if h.status != 0 || h.hostStatus != 0 || h.driverStatus&0x0f != 0 {
		return fmt.Errorf("ATA %#x: scsi status %#x, host %#x, driver %#x, sense % x", cdb[14], h.status, h.hostStatus,
			h.driverStatus, sense[:h.sbLenWr])
	}
	return nil
}

// ataIdentifySecurity asks the drive what it supports.
func ataIdentifySecurity(f *os.File) (ataSecurity, error) {
	id := make([]byte, ataSector)
	if err := ataCommand(f, ataCDB(ataIdentify, ataProtoPIOIn), sgDxferFromDev, id, 15*time.Second); err != nil {
		return ataSecurity{}, err
	}
	return parseIdentify(id)
}

// errATANotUsable: the drive does not offer a security erase now.
var errATANotUsable = errors.New("ata security erase is not usable on this drive")

// ataSecureErase runs a normal security erase with a one-time password.
func ataSecureErase(ctx context.Context, f *os.File, password []byte) (err error) {
	s, err := ataIdentifySecurity(f)
	if err != nil {
		return err
	}
	if !s.usable() {
		return fmt.Errorf("%w: %+v", errATANotUsable, s)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	pw := ataPasswordBlock(password)
	if err := ataCommand(f, ataCDB(ataSecSetPassword, ataProtoPIOOut), sgDxferToDev, pw, 15*time.Second); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			// Never leave the drive locked behind a password nobody keeps.
			if derr := ataCommand(f, ataCDB(ataSecDisablePass, ataProtoPIOOut), sgDxferToDev, pw, 15*time.Second); derr != nil {
				err = fmt.Errorf("%w; disabling the password also failed: %w", err, derr)
			}
		}
	}()
	if err := ataCommand(f, ataCDB(ataSecErasePrepare, ataProtoNonData), sgDxferNone, nil, 15*time.Second); err != nil {
		return err
	}
	return ataCommand(f, ataCDB(ataSecEraseUnit, ataProtoPIOOut), sgDxferToDev, pw, ataEraseTimeout(s))
}
