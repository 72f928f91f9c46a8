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

// NVMe admin commands through the kernel's passthrough ioctl
// (linux/nvme_ioctl.h), so the ramdisk needs no nvme-cli.

// nvmeAdminCmd is struct nvme_passthru_cmd (72 bytes).
type nvmeAdminCmd struct {
	opcode      uint8
	flags       uint8
	rsvd1       uint16
	nsid        uint32
	cdw2, cdw3  uint32
	metadata    uint64
	addr        uint64
	metadataLen uint32
	dataLen     uint32
	cdw10       uint32
	cdw11       uint32
	cdw12       uint32
	cdw13       uint32
	cdw14       uint32
	cdw15       uint32
	timeoutMS   uint32
	result      uint32
}

// nvmeIoctlAdminCmd is _IOWR('N', 0x41, struct nvme_admin_cmd).
const nvmeIoctlAdminCmd = 0xC0484E41

// nvmeIoctlID is _IO('N', 0x40): the namespace id of a namespace device.
const nvmeIoctlID = 0x4E40

const (
	nvmeOpIdentify = 0x06
	nvmeOpGetLog   = 0x02
	nvmeOpFormat   = 0x80
	nvmeOpSanitize = 0x84
)

func nvmeAdmin(f *os.File, c *nvmeAdminCmd) error {
	status, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), nvmeIoctlAdminCmd, uintptr(unsafe.Pointer(c)))
	if errno != 0 {
		return fmt.Errorf("nvme admin opcode %#x: %w", c.opcode, errno)
	}
	if status != 0 {
		// A positive return is the command's NVMe status: refused.
		return fmt.Errorf("nvme admin opcode %#x: status %#x", c.opcode, status)
	}
	return nil
}

type nvmeCaps struct {
	nsid               uint32
	flbas              uint8
	sanitizeBlockErase bool
	format             bool
}

// nvmeIdentify reads the controller's sanitize and format support and the
// namespace's current LBA format.
func nvmeIdentify(f *os.File) (nvmeCaps, error) {
	nsid, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), nvmeIoctlID, 0)
	if errno != 0 {
		return nvmeCaps{}, fmt.Errorf("NVME_IOCTL_ID: %w", errno)
	}
	ctrl := make([]byte, 4096)
	if err := nvmeAdmin(f, &nvmeAdminCmd{opcode: nvmeOpIdentify, addr: uint64(uintptr(unsafe.Pointer(&ctrl[0]))),
		dataLen: 4096, cdw10: 1}); err != nil {
		return nvmeCaps{}, err
	}
	ns := make([]byte, 4096)
	if err := nvmeAdmin(f, &nvmeAdminCmd{opcode: nvmeOpIdentify, nsid: uint32(nsid), addr: uint64(uintptr(unsafe.Pointer(&ns[0]))),
		dataLen: 4096, cdw10: 0}); err != nil {
		return nvmeCaps{}, err
	}
	oacs := binary.LittleEndian.Uint16(ctrl[256:258])
	sanicap := binary.LittleEndian.Uint32(ctrl[328:332])
	return nvmeCaps{nsid: uint32(nsid), flbas: ns[26] & 0x0f,
		sanitizeBlockErase: sanicap&0x2 != 0, format: oacs&0x2 != 0}, nil
}

// nvmeFormat formats the namespace in its current LBA format with a user
// data erase (SES=1).
func nvmeFormat(f *os.File) error {
	caps, err := nvmeIdentify(f)
	if err != nil {
		return err
	}
	return nvmeAdmin(f, &nvmeAdminCmd{opcode: nvmeOpFormat, nsid: caps.nsid, cdw10: uint32(caps.flbas) | 1<<9,
		timeoutMS: uint32(wipeTimeout / time.Millisecond)})
}

// nvmeSanitize starts a block-erase sanitize of the whole controller and
// polls the sanitize status log until it ends.
func nvmeSanitize(ctx context.Context, f *os.File) error {
	if err := nvmeAdmin(f, &nvmeAdminCmd{opcode: nvmeOpSanitize, cdw10: 2}); err != nil {
		return err
	}
	deadline := time.Now().Add(wipeTimeout)
	log := make([]byte, 512)
	for {
		// Sanitize status log (0x81), 512 bytes: NUMDL = 512/4-1.
		if err := nvmeAdmin(f, &nvmeAdminCmd{opcode: nvmeOpGetLog, nsid: 0xffffffff, addr: uint64(uintptr(unsafe.Pointer(&log[0]))),
			dataLen: 512, cdw10: 0x81 | (512/4-1)<<16}); err != nil {
			return err
		}
		switch binary.LittleEndian.Uint16(log[2:4]) & 0x7 {
		case 1, 4: // completed (4: without deallocation)
			return nil
		case 3:
			return errors.New("nvme sanitize failed")
		}
		if time.Now().After(deadline) {
			return errors.New("nvme sanitize did not finish in time")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Second):
		}
	}
}
