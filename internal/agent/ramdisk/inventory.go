package ramdisk

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Disk is a drive the ramdisk sees.
type Disk struct {
	Device    string `json:"device"`
	SizeBytes int64  `json:"size_bytes"`
	Model     string `json:"model,omitempty"`
	Serial    string `json:"serial,omitempty"`
	// Rotational is true for spinning disks.
	Rotational bool `json:"rotational"`
	// Transport is nvme, ata/scsi (sd*), virtio (vd*) or other.
	Transport string `json:"transport"`
}

// NIC is a network interface.
type NIC struct {
	Name string `json:"name"`
	MAC  string `json:"mac"`
}

// GPU is a display or 3D controller on the PCI bus.
type GPU struct {
	PCIAddress string `json:"pci_address"`
	Vendor     string `json:"vendor"`
	VendorID   string `json:"vendor_id"`
	DeviceID   string `json:"device_id"`
	Class      string `json:"class"`
}

// Inventory is what inventory.refresh reports.
type Inventory struct {
	CPUs        int    `json:"cpus"`
	CPUModel    string `json:"cpu_model,omitempty"`
	MemoryBytes int64  `json:"memory_bytes"`
	Disks       []Disk `json:"disks"`
	NICs        []NIC  `json:"nics"`
	GPUs        []GPU  `json:"gpus"`
	// Firmware is the BIOS and board as DMI reports them
	// (/sys/class/dmi/id): what a lease's teardown compares with the
	// commissioning's baseline.
	Firmware map[string]string `json:"firmware,omitempty"`
}

// dmiFields are the DMI attributes the firmware section reports.
var dmiFields = []string{"bios_vendor", "bios_version", "bios_date", "board_vendor", "board_name", "board_version",
	"sys_vendor", "product_name"}

// Output is the inventory as a command result.
func (inv Inventory) Output() map[string]any {
	disks := make([]any, 0, len(inv.Disks))
	for _, d := range inv.Disks {
		disks = append(disks, map[string]any{"device": d.Device, "size_bytes": d.SizeBytes, "model": d.Model,
			"serial": d.Serial, "rotational": d.Rotational, "transport": d.Transport})
	}
	nics := make([]any, 0, len(inv.NICs))
	for _, n := range inv.NICs {
		nics = append(nics, map[string]any{"name": n.Name, "mac": n.MAC})
	}
	gpus := make([]any, 0, len(inv.GPUs))
	for _, g := range inv.GPUs {
		gpus = append(gpus, map[string]any{"pci_address": g.PCIAddress, "vendor": g.Vendor, "vendor_id": g.VendorID,
			"device_id": g.DeviceID, "class": g.Class})
	}
	out := map[string]any{"cpus": inv.CPUs, "cpu_model": inv.CPUModel, "memory_bytes": inv.MemoryBytes,
		"disks": disks, "nics": nics, "gpus": gpus}
	if len(inv.Firmware) > 0 {
		fw := make(map[string]any, len(inv.Firmware))
		for k, v := range inv.Firmware {
			fw[k] = v
		}
		out["firmware"] = fw
	}
	return out
}

// gpuVendors names the PCI vendors of the GPUs a fleet runs.
var gpuVendors = map[string]string{"0x10de": "nvidia", "0x1002": "amd", "0x8086": "intel"}

// Inventory reads CPUs, memory, disks, NICs and GPUs from sysfs and procfs.
func (r *Ramdisk) Inventory() (Inventory, error) {
	var inv Inventory
	root := r.cfg.SysfsRoot
	cpus, err := filepath.Glob(filepath.Join(root, "sys/devices/system/cpu/cpu[0-9]*"))
	if err != nil {
		return inv, err
	}
	inv.CPUs = len(cpus)
	if mem, err := os.ReadFile(filepath.Join(root, "proc/meminfo")); err == nil {
		inv.MemoryBytes = meminfoTotal(string(mem))
	}
	if ci, err := os.ReadFile(filepath.Join(root, "proc/cpuinfo")); err == nil {
		for line := range strings.SplitSeq(string(ci), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				inv.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if inv.Disks, err = r.disks(); err != nil {
		return inv, err
	}
	for _, f := range dmiFields {
		if v := readTrim(filepath.Join(root, "sys/class/dmi/id", f)); v != "" {
			if inv.Firmware == nil {
				inv.Firmware = map[string]string{}
			}
			inv.Firmware[f] = v
		}
	}
	nets, _ := os.ReadDir(filepath.Join(root, "sys/class/net"))
	for _, n := range nets {
		if n.Name() == "lo" {
			continue
		}
		mac := readTrim(filepath.Join(root, "sys/class/net", n.Name(), "address"))
		if mac == "" || mac == "00:00:00:00:00:00" {
			continue
		}
		inv.NICs = append(inv.NICs, NIC{Name: n.Name(), MAC: mac})
	}
	pcis, _ := os.ReadDir(filepath.Join(root, "sys/bus/pci/devices"))
	for _, p := range pcis {
		dir := filepath.Join(root, "sys/bus/pci/devices", p.Name())
		class := readTrim(filepath.Join(dir, "class"))
		// 0x03xxxx: display controllers (VGA 0x0300, 3D 0x0302).
		if !strings.HasPrefix(class, "0x03") {
			continue
		}
		vendor := readTrim(filepath.Join(dir, "vendor"))
		name, ok := gpuVendors[vendor]
		if !ok {
			continue // a BMC's VGA chip (ASPEED, Matrox) is no GPU
		}
		inv.GPUs = append(inv.GPUs, GPU{PCIAddress: p.Name(), Vendor: name, VendorID: vendor,
			DeviceID: readTrim(filepath.Join(dir, "device")), Class: class})
	}
	return inv, nil
}

// disks lists the machine's drives: block devices that are neither
// virtual (loop, ram, zram, dm, md), removable nor empty.
func (r *Ramdisk) disks() ([]Disk, error) {
	base := filepath.Join(r.cfg.SysfsRoot, "sys/block")
	ents, err := os.ReadDir(base)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", base, err)
	}
	var out []Disk
	for _, e := range ents {
		name := e.Name()
		if slices.ContainsFunc([]string{"loop", "ram", "zram", "dm-", "md", "sr", "fd", "nbd"}, func(p string) bool { return strings.HasPrefix(name, p) }) {
			continue
		}
		dir := filepath.Join(base, name)
		if readTrim(filepath.Join(dir, "removable")) == "1" {
			continue
		}
		sectors, _ := strconv.ParseInt(readTrim(filepath.Join(dir, "size")), 10, 64)
		if sectors <= 0 {
			continue
		}
		d := Disk{Device: filepath.Join(r.cfg.DevRoot, name), SizeBytes: sectors * 512,
			Model: readTrim(filepath.Join(dir, "device/model")), Serial: readTrim(filepath.Join(dir, "device/serial")),
			Rotational: readTrim(filepath.Join(dir, "queue/rotational")) == "1", Transport: transport(name)}
		out = append(out, d)
	}
	return out, nil
}

func transport(name string) string {
	switch {
	case strings.HasPrefix(name, "nvme"):
		return "nvme"
	case strings.HasPrefix(name, "sd"):
		return "ata/scsi"
	case strings.HasPrefix(name, "vd"):
		return "virtio"
	}
	return "other"
}

func meminfoTotal(s string) int64 {
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb * 1024
		}
	}
	return 0
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
