// Package runtime runs instances as QEMU guests on this host: it creates a
// qcow2 overlay on the base image and a cloud-init NoCloud seed, starts
// QEMU daemonized with a QMP socket in the instance's state directory,
// drives it over QMP (digitalocean/go-qemu), and re-adopts running guests
// after bcd restarts. It probes KVM by booting and falls back to TCG.
//
// It is a plain library: no database, no agent protocol. It must never
// touch files outside its state directory other than the images and
// volumes a spec names, and never create network devices other than the
// spec's bridge and tap.
package runtime

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Spec is what one instance is.
type Spec struct {
	// ID names the instance: its state directory and QEMU's -name.
	ID        string `json:"id"`
	VCPUs     int    `json:"vcpus"`
	MemoryMiB int    `json:"memory_mib"`
	Image     Image  `json:"image"`
	// DiskMiB is the root disk's size: the overlay's virtual size (at least
	// the base image's; the guest grows its file system to it).
	DiskMiB int `json:"disk_mib"`
	// FromDisk, when set, is a qcow2 overlay on Image.Disk (a snapshot's
	// disk) that Create copies as the root disk instead of a fresh
	// overlay, grown to DiskMiB when that is larger. It is an input of
	// Create only: the stored spec does not keep it (the instance's disk
	// is its own from then on, and the source may go).
	FromDisk string   `json:"from_disk,omitempty"`
	Volumes  []Volume `json:"volumes,omitempty"`
	// HostCPUs pins vCPU i to HostCPUs[i % len] (empty: not pinned).
	HostCPUs []int `json:"host_cpus,omitempty"`
	// HugePages backs guest memory with /dev/hugepages.
	HugePages bool `json:"huge_pages,omitempty"`
	// NUMANode binds guest memory to one host node (nil: no binding).
	NUMANode *int     `json:"numa_node,omitempty"`
	MAC      string   `json:"mac,omitempty"`
	Network  *Network `json:"network,omitempty"`
	Seed     *Seed    `json:"seed,omitempty"`
}

// Image is the guest's boot material: a base disk (qcow2, never written)
// and the kernel and initramfs QEMU loads directly.
type Image struct {
	Disk    string `json:"disk"`
	Kernel  string `json:"kernel"`
	Initrd  string `json:"initrd,omitempty"`
	Cmdline string `json:"cmdline,omitempty"`
}

// Volume is an extra disk: a qcow2 or raw file.
type Volume struct {
	ID       string `json:"id"`
	Path     string `json:"path"`
	Format   string `json:"format"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// Network attaches the guest to a bridge through a tap device.
type Network struct {
	// Bridge is the per-host bridge; created when missing.
	Bridge string `json:"bridge"`
	// BridgeAddress, when set, is given to a bridge this runtime creates
	// (CIDR; typically the guests' gateway).
	BridgeAddress string `json:"bridge_address,omitempty"`
	// Tap is the guest's tap device (default: derived from the ID).
	Tap string `json:"tap,omitempty"`
	// NetNS, when set, is a named network namespace (ip netns) holding the
	// bridge, the tap and QEMU's network side: tests use it so nothing
	// touches the host's network.
	NetNS string `json:"netns,omitempty"`
}

// SpecError is a refused spec: which field, and why.
type SpecError struct {
	Field  string
	Reason string
}

func (e *SpecError) Error() string {
	return fmt.Sprintf("runtime: invalid spec: %s: %s", e.Field, e.Reason)
}

var (
	idRE     = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	ifNameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,14}$`)
	// Paths go into QEMU's option syntax and an exec: migration command:
	// no commas, quotes, or shell metacharacters.
	pathRE = regexp.MustCompile(`^/[A-Za-z0-9/_.+@-]*$`)
)

// Limits bound a spec on this host.
const (
	MaxVCPUs     = 256
	MinMemoryMiB = 64
	MaxMemoryMiB = 4 << 20
	MaxVolumes   = 16
)

// Validate checks a spec without touching the host beyond stat calls; the
// first problem is returned as a *SpecError.
func (s *Spec) Validate() error {
	bad := func(field, format string, a ...any) error {
		return &SpecError{Field: field, Reason: fmt.Sprintf(format, a...)}
	}
	if !idRE.MatchString(s.ID) {
		return bad("id", "must be 1-63 of a-z, 0-9 and '-', starting with a letter or digit")
	}
	if s.VCPUs < 1 || s.VCPUs > MaxVCPUs {
		return bad("vcpus", "must be 1..%d, got %d", MaxVCPUs, s.VCPUs)
	}
	if s.MemoryMiB < MinMemoryMiB || s.MemoryMiB > MaxMemoryMiB {
		return bad("memory_mib", "must be %d..%d, got %d", MinMemoryMiB, MaxMemoryMiB, s.MemoryMiB)
	}
	for field, p := range map[string]string{"image.disk": s.Image.Disk, "image.kernel": s.Image.Kernel} {
		if err := checkFile(field, p, true); err != nil {
			return err
		}
	}
	if err := checkFile("image.initrd", s.Image.Initrd, false); err != nil {
		return err
	}
	if strings.ContainsAny(s.Image.Cmdline, "\n\x00") {
		return bad("image.cmdline", "must be one line")
	}
	if s.DiskMiB < 0 {
		return bad("disk_mib", "must not be negative")
	}
	if err := checkFile("from_disk", s.FromDisk, false); err != nil {
		return err
	}
	if len(s.Volumes) > MaxVolumes {
		return bad("volumes", "at most %d, got %d", MaxVolumes, len(s.Volumes))
	}
	seen := map[string]bool{}
	for i, v := range s.Volumes {
		f := fmt.Sprintf("volumes[%d]", i)
		if !idRE.MatchString(v.ID) {
			return bad(f+".id", "must be 1-63 of a-z, 0-9 and '-'")
		}
		if seen[v.ID] {
			return bad(f+".id", "%q is used twice", v.ID)
		}
		seen[v.ID] = true
		if v.Format != "qcow2" && v.Format != "raw" {
			return bad(f+".format", "must be qcow2 or raw, got %q", v.Format)
		}
		if err := checkFile(f+".path", v.Path, true); err != nil {
			return err
		}
	}
	for i, c := range s.HostCPUs {
		if c < 0 {
			return bad(fmt.Sprintf("host_cpus[%d]", i), "must not be negative")
		}
	}
	if s.NUMANode != nil && *s.NUMANode < 0 {
		return bad("numa_node", "must not be negative")
	}
	if s.MAC != "" {
		hw, err := net.ParseMAC(s.MAC)
		if err != nil || len(hw) != 6 {
			return bad("mac", "%q is not a MAC address", s.MAC)
		}
		if hw[0]&1 == 1 {
			return bad("mac", "%q is a multicast address", s.MAC)
		}
	}
	if n := s.Network; n != nil {
		if !ifNameRE.MatchString(n.Bridge) {
			return bad("network.bridge", "%q is not an interface name (1-15 characters)", n.Bridge)
		}
		if n.Tap != "" && !ifNameRE.MatchString(n.Tap) {
			return bad("network.tap", "%q is not an interface name (1-15 characters)", n.Tap)
		}
		if n.BridgeAddress != "" {
			if _, err := netip.ParsePrefix(n.BridgeAddress); err != nil {
				return bad("network.bridge_address", "%q is not an address/prefix", n.BridgeAddress)
			}
		}
		if n.NetNS != "" && !ifNameRE.MatchString(n.NetNS) && !idRE.MatchString(n.NetNS) {
			return bad("network.netns", "%q is not a namespace name", n.NetNS)
		}
		if s.MAC == "" {
			return bad("mac", "is required with a network")
		}
	}
	if s.Seed != nil {
		if err := s.Seed.validate(); err != nil {
			return err
		}
	}
	return nil
}

func checkFile(field, p string, required bool) error {
	if p == "" {
		if required {
			return &SpecError{Field: field, Reason: "is required"}
		}
		return nil
	}
	if !pathRE.MatchString(p) || filepath.Clean(p) != p {
		return &SpecError{Field: field, Reason: fmt.Sprintf("%q must be a clean absolute path of letters, digits and /_.+@-", p)}
	}
	st, err := os.Stat(p)
	if err != nil {
		return &SpecError{Field: field, Reason: fmt.Sprintf("%q: %v", p, err)}
	}
	if !st.Mode().IsRegular() {
		return &SpecError{Field: field, Reason: fmt.Sprintf("%q is not a regular file", p)}
	}
	return nil
}

// tapName is the default tap for an instance: short enough for IFNAMSIZ.
func (s *Spec) tapName() string {
	if s.Network != nil && s.Network.Tap != "" {
		return s.Network.Tap
	}
	sum := sha256.Sum256([]byte(s.ID))
	return "bct" + hex.EncodeToString(sum[:6])
}
