// Package devfilter builds the cgroup v2 device program
// (BPF_PROG_TYPE_CGROUP_DEVICE) that lets an allocation's processes open
// only the device nodes it was given — its GPUs' /dev/nvidiaN, the NVIDIA
// control nodes and the usual pseudo-devices — and attaches it to the
// allocation's cgroup with cilium/ebpf.
//
// It must never attach to a cgroup other than the one it is given, and it
// decides nothing: the caller says which devices an allocation may open.
package devfilter

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Type is a device node's type.
type Type byte

// Device types, as in a devices.allow line.
const (
	Char  Type = 'c'
	Block Type = 'b'
)

// Wildcard in Rule.Major or Rule.Minor matches every number.
const Wildcard int64 = -1

// Access bits a rule grants.
const (
	AccessMknod = 1 << iota
	AccessRead
	AccessWrite
	AccessAll = AccessMknod | AccessRead | AccessWrite
)

// Rule allows one device (or, with a Wildcard, a range of them).
type Rule struct {
	Type  Type
	Major int64
	Minor int64
	// Access is a mask of AccessMknod, AccessRead and AccessWrite.
	Access int
	// Name says what the rule is for, e.g. "/dev/nvidia3".
	Name string
}

func (r Rule) String() string {
	num := func(n int64) string {
		if n == Wildcard {
			return "*"
		}
		return strconv.FormatInt(n, 10)
	}
	acc := ""
	for _, a := range []struct {
		bit int
		c   string
	}{{AccessRead, "r"}, {AccessWrite, "w"}, {AccessMknod, "m"}} {
		if r.Access&a.bit != 0 {
			acc += a.c
		}
	}
	return fmt.Sprintf("%c %s:%s %s", r.Type, num(r.Major), num(r.Minor), acc)
}

// Validate refuses a rule the program cannot express.
func (r Rule) Validate() error {
	switch {
	case r.Type != Char && r.Type != Block:
		return fmt.Errorf("device rule %q: type must be 'c' or 'b'", r.Name)
	case r.Major < Wildcard || r.Major > math.MaxUint32 || r.Minor < Wildcard || r.Minor > math.MaxUint32:
		return fmt.Errorf("device rule %q: major and minor must be 0..%d or a wildcard", r.Name, uint32(math.MaxUint32))
	case r.Access&^AccessAll != 0 || r.Access == 0:
		return fmt.Errorf("device rule %q: access must be a non-empty mask of read, write and mknod", r.Name)
	}
	return nil
}

// NVIDIA's fixed character device numbers (the driver's major 195).
const (
	NvidiaMajor        = 195
	NvidiaCtlMinor     = 255
	NvidiaModesetMinor = 254
)

// Pseudo are the pseudo-devices every process expects: runc's default
// allow list (/dev/null, zero, full, random, urandom, tty, console, ptmx
// and the pts slaves).
func Pseudo() []Rule {
	rw := AccessRead | AccessWrite
	return []Rule{
		{Char, 1, 3, rw, "/dev/null"},
		{Char, 1, 5, rw, "/dev/zero"},
		{Char, 1, 7, rw, "/dev/full"},
		{Char, 1, 8, rw, "/dev/random"},
		{Char, 1, 9, rw, "/dev/urandom"},
		{Char, 5, 0, rw, "/dev/tty"},
		{Char, 5, 1, rw, "/dev/console"},
		{Char, 5, 2, rw, "/dev/ptmx"},
		{Char, 136, Wildcard, rw, "/dev/pts/*"},
	}
}

// GPU allows one GPU's /dev/nvidiaN.
func GPU(minor int32) Rule {
	return Rule{Char, NvidiaMajor, int64(minor), AccessRead | AccessWrite, fmt.Sprintf("/dev/nvidia%d", minor)}
}

// NvidiaControl allows the nodes every CUDA process opens besides its
// GPUs: nvidiactl and nvidia-modeset (fixed numbers), and nvidia-uvm and
// nvidia-uvm-tools, whose major the kernel assigns at load time: it is read
// from procDevices (/proc/devices). Without the uvm module loaded there is
// no uvm device to allow, and none is.
func NvidiaControl(procDevices string) ([]Rule, error) {
	rw := AccessRead | AccessWrite
	rules := []Rule{
		{Char, NvidiaMajor, NvidiaCtlMinor, rw, "/dev/nvidiactl"},
		{Char, NvidiaMajor, NvidiaModesetMinor, rw, "/dev/nvidia-modeset"},
	}
	major, err := charMajor(procDevices, "nvidia-uvm")
	if err != nil {
		return nil, err
	}
	if major >= 0 {
		rules = append(rules,
			Rule{Char, major, 0, rw, "/dev/nvidia-uvm"},
			Rule{Char, major, 1, rw, "/dev/nvidia-uvm-tools"})
	}
	return rules, nil
}

// charMajor is the major of a character driver in /proc/devices, -1 when
// the driver is not listed (or the file does not exist: no driver at all).
func charMajor(procDevices, driver string) (int64, error) {
	f, err := os.Open(procDevices)
	if errors.Is(err, os.ErrNotExist) {
		return -1, nil
	}
	if err != nil {
		return -1, fmt.Errorf("read %s: %w", procDevices, err)
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	inChar := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch line {
		case "Character devices:":
			inChar = true
			continue
		case "Block devices:":
			inChar = false
			continue
		}
		fields := strings.Fields(line)
		if !inChar || len(fields) != 2 || fields[1] != driver {
			continue
		}
		n, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return -1, fmt.Errorf("%s: bad major %q for %s", procDevices, fields[0], driver)
		}
		return n, nil
	}
	if err := sc.Err(); err != nil {
		return -1, fmt.Errorf("read %s: %w", procDevices, err)
	}
	return -1, nil
}

// Instructions is the device program for rules: allow (return 1) when an
// access matches a rule, deny (return 0) otherwise. The context is struct
// bpf_cgroup_dev_ctx { u32 access_type; u32 major; u32 minor; } with the
// device type in the low 16 bits of access_type and the access in the high.
func Instructions(rules []Rule) (asm.Instructions, error) {
	const (
		devTypeBlock = 1 // BPF_DEVCG_DEV_BLOCK
		devTypeChar  = 2 // BPF_DEVCG_DEV_CHAR
	)
	insns := asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, 0, asm.Word),
		asm.And.Imm32(asm.R2, 0xffff), // R2: type
		asm.LoadMem(asm.R3, asm.R1, 0, asm.Word),
		asm.RSh.Imm32(asm.R3, 16),                // R3: access asked for
		asm.LoadMem(asm.R4, asm.R1, 4, asm.Word), // R4: major
		asm.LoadMem(asm.R5, asm.R1, 8, asm.Word), // R5: minor
	}
	for i, r := range rules {
		if err := r.Validate(); err != nil {
			return nil, err
		}
		// A rule that does not match jumps to the next one's first
		// instruction; after the last rule comes the deny.
		next := fmt.Sprintf("rule%d", i+1)
		typ := int32(devTypeChar)
		if r.Type == Block {
			typ = devTypeBlock
		}
		block := asm.Instructions{
			asm.JNE.Imm(asm.R2, typ, next),
			// Every access bit asked for must be granted: (asked & granted) == asked.
			asm.Mov.Reg32(asm.R1, asm.R3),
			asm.And.Imm32(asm.R1, int32(r.Access)),
			asm.JNE.Reg(asm.R1, asm.R3, next),
		}
		if r.Major != Wildcard {
			block = append(block, asm.JNE.Imm32(asm.R4, int32(uint32(r.Major)), next))
		}
		if r.Minor != Wildcard {
			block = append(block, asm.JNE.Imm32(asm.R5, int32(uint32(r.Minor)), next))
		}
		block = append(block, asm.Mov.Imm(asm.R0, 1), asm.Return())
		if i > 0 {
			block[0] = block[0].WithSymbol(fmt.Sprintf("rule%d", i))
		}
		insns = append(insns, block...)
	}
	deny := asm.Mov.Imm(asm.R0, 0)
	if len(rules) > 0 {
		deny = deny.WithSymbol(fmt.Sprintf("rule%d", len(rules)))
	}
	insns = append(insns, deny, asm.Return())
	return insns, nil
}

// Attacher puts a device filter on a cgroup directory.
type Attacher interface {
	Attach(cgroupDir string, rules []Rule) error
}

// BPF attaches the real device program with BPF_PROG_ATTACH. The
// attachment belongs to the cgroup, not to bcd's file descriptors: it
// stays in force when bcd restarts and goes with the cgroup's removal. It
// is attached without BPF_F_ALLOW_OVERRIDE or MULTI, so nothing below the
// allocation's cgroup can attach a laxer one; attaching again (a resent
// bind) replaces the program.
type BPF struct{}

// Attach loads the program for rules and attaches it to cgroupDir.
func (BPF) Attach(cgroupDir string, rules []Rule) error {
	insns, err := Instructions(rules)
	if err != nil {
		return err
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "bc_devices", Type: ebpf.CGroupDevice, License: "Apache-2.0", Instructions: insns,
	})
	if err != nil {
		return fmt.Errorf("load device program: %w", err)
	}
	// The attachment holds its own reference to the program.
	defer func() { _ = prog.Close() }()
	fd, err := unix.Open(cgroupDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open cgroup %s: %w", cgroupDir, err)
	}
	defer func() { _ = unix.Close(fd) }()
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: fd, Program: prog, Attach: ebpf.AttachCGroupDevice}); err != nil {
		return fmt.Errorf("attach device program to %s: %w", cgroupDir, err)
	}
	return nil
}

// SimulatedFile is where Simulated writes a simulated node's allow list.
const SimulatedFile = "devices.allow.simulated"

// Simulated is a simulated node's filter: it writes the allow list into
// the (plain) cgroup directory, one rule a line, where a test can read
// what a real node would have attached. Nothing enforces it.
type Simulated struct{}

// Attach writes the rules to cgroupDir/SimulatedFile.
func (Simulated) Attach(cgroupDir string, rules []Rule) error {
	var b strings.Builder
	for _, r := range rules {
		if err := r.Validate(); err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %s\n", r, r.Name)
	}
	if err := os.WriteFile(filepath.Join(cgroupDir, SimulatedFile), []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("write simulated device filter: %w", err)
	}
	return nil
}
