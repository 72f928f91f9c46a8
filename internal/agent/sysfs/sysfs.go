// Package sysfs reads the host facts bcd reports from the kernel's pseudo
// filesystems: CPUs, NUMA nodes, memory and hugepages, the DMI identity, MAC
// addresses and PSI pressure. Every path is taken relative to a root so that
// tests read a fixture tree instead of the host.
//
// It only reads; it must never write below the root.
package sysfs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
)

// FS reads host facts below Root ("/" on a real host).
type FS struct {
	Root string
}

func (f FS) path(p string) string { return filepath.Join(cmpRoot(f.Root), p) }

func cmpRoot(r string) string {
	if r == "" {
		return "/"
	}
	return r
}

func (f FS) readTrim(p string) (string, error) {
	b, err := os.ReadFile(f.path(p))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// Identity reads the DMI identity and the primary MAC addresses. Files the
// kernel hides from unprivileged readers are left empty rather than failing.
func (f FS) Identity() (*agentv1.HardwareIdentity, error) {
	id := &agentv1.HardwareIdentity{}
	dmi := func(name string) string {
		v, _ := f.readTrim("sys/class/dmi/id/" + name)
		return v
	}
	id.DmiProductUuid = strings.ToLower(dmi("product_uuid"))
	id.DmiProductSerial = dmi("product_serial")
	id.DmiBoardSerial = dmi("board_serial")
	id.DmiProductName = dmi("product_name")
	if h, err := f.readTrim("proc/sys/kernel/hostname"); err == nil && h != "" {
		id.Hostname = h
	} else if cmpRoot(f.Root) == "/" {
		id.Hostname, _ = os.Hostname()
	}
	macs, err := f.MACs()
	if err != nil {
		return nil, err
	}
	id.Macs = macs
	return id, nil
}

// MACs lists the addresses of physical network interfaces: loopback,
// virtual devices (bridges, veths, tunnels) and all-zero addresses are left
// out because they do not identify the machine.
func (f FS) MACs() ([]string, error) {
	dir := f.path("sys/class/net")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list network interfaces: %w", err)
	}
	var macs []string
	for _, e := range ents {
		name := e.Name()
		if name == "lo" {
			continue
		}
		if target, err := os.Readlink(filepath.Join(dir, name)); err == nil && strings.Contains(target, "/virtual/") {
			continue
		}
		addr, err := f.readTrim(filepath.Join("sys/class/net", name, "address"))
		if err != nil || addr == "" || addr == "00:00:00:00:00:00" {
			continue
		}
		macs = append(macs, strings.ToLower(addr))
	}
	sort.Strings(macs)
	return slices.Compact(macs), nil
}

// CPU reads the CPU model, socket/core/thread counts and the NUMA nodes with
// their CPUs, memory and hugepages.
func (f FS) CPU() (*agentv1.CpuInventory, error) {
	inv := &agentv1.CpuInventory{}
	b, err := os.ReadFile(f.path("proc/cpuinfo"))
	if err != nil {
		return nil, fmt.Errorf("read cpuinfo: %w", err)
	}
	sockets := map[string]bool{}
	cores := map[string]bool{}
	var threads int32
	var phys string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch k {
		case "processor":
			threads++
			phys = "0"
		case "model name":
			if inv.Model == "" {
				inv.Model = v
			}
		case "physical id":
			phys = v
			sockets[v] = true
		case "core id":
			cores[phys+"/"+v] = true
		}
	}
	inv.Threads = threads
	inv.Sockets = int32(max(len(sockets), 1))
	inv.Cores = int32(len(cores))
	if inv.Cores == 0 {
		inv.Cores = threads
	}
	nodes, err := f.NUMANodes()
	if err != nil {
		return nil, err
	}
	inv.NumaNodes = nodes
	return inv, nil
}

// NUMANodes reads node*/ under sys/devices/system/node. A host without NUMA
// information reports none.
func (f FS) NUMANodes() ([]*agentv1.NumaNode, error) {
	base := "sys/devices/system/node"
	ents, err := os.ReadDir(f.path(base))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list numa nodes: %w", err)
	}
	var nodes []*agentv1.NumaNode
	for _, e := range ents {
		idStr, ok := strings.CutPrefix(e.Name(), "node")
		if !ok {
			continue
		}
		id, err := strconv.Atoi(idStr)
		if err != nil {
			continue
		}
		dir := filepath.Join(base, e.Name())
		n := &agentv1.NumaNode{Id: int32(id)}
		n.Cpus, _ = f.readTrim(filepath.Join(dir, "cpulist"))
		if mi, err := os.ReadFile(f.path(filepath.Join(dir, "meminfo"))); err == nil {
			n.MemoryMib = meminfoKB(mi, "MemTotal") / 1024
		}
		n.Hugepages_2Mi = f.readUint(filepath.Join(dir, "hugepages/hugepages-2048kB/nr_hugepages"))
		n.Hugepages_1Gi = f.readUint(filepath.Join(dir, "hugepages/hugepages-1048576kB/nr_hugepages"))
		nodes = append(nodes, n)
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Id < nodes[j].Id })
	return nodes, nil
}

// Memory reads the total memory and the hugepage pools.
func (f FS) Memory() (*agentv1.MemoryInventory, error) {
	mi, err := os.ReadFile(f.path("proc/meminfo"))
	if err != nil {
		return nil, fmt.Errorf("read meminfo: %w", err)
	}
	return &agentv1.MemoryInventory{
		TotalMib:           meminfoKB(mi, "MemTotal") / 1024,
		Hugepages_2MiTotal: f.readUint("sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"),
		Hugepages_1GiTotal: f.readUint("sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages"),
	}, nil
}

// Kernel returns the running kernel release and the OS's pretty name.
func (f FS) Kernel() (kernel, osName string) {
	kernel, _ = f.readTrim("proc/sys/kernel/osrelease")
	b, err := os.ReadFile(f.path("etc/os-release"))
	if err != nil {
		return kernel, ""
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
			osName = strings.Trim(v, `"'`)
		}
	}
	return kernel, osName
}

// Pressure reads the 10 s "some" PSI averages; ok is false when the kernel
// does not expose PSI.
func (f FS) Pressure() (p *agentv1.Pressure, ok bool) {
	p = &agentv1.Pressure{}
	read := func(name string) (float64, bool) {
		b, err := os.ReadFile(f.path("proc/pressure/" + name))
		if err != nil {
			return 0, false
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if !strings.HasPrefix(line, "some ") {
				continue
			}
			for field := range strings.FieldsSeq(line) {
				if v, ok := strings.CutPrefix(field, "avg10="); ok {
					x, err := strconv.ParseFloat(v, 64)
					return x, err == nil
				}
			}
		}
		return 0, false
	}
	var okCPU, okMem, okIO bool
	p.Cpu, okCPU = read("cpu")
	p.Memory, okMem = read("memory")
	p.Io, okIO = read("io")
	return p, okCPU || okMem || okIO
}

func (f FS) readUint(p string) uint64 {
	s, err := f.readTrim(p)
	if err != nil {
		return 0
	}
	v, _ := strconv.ParseUint(s, 10, 64)
	return v
}

// meminfoKB finds key in a /proc/meminfo or per-node meminfo file (whose
// lines start with "Node N ") and returns its value in kB.
func meminfoKB(b []byte, key string) uint64 {
	for line := range strings.SplitSeq(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) >= 2 && fields[0] == "Node" {
			fields = fields[2:]
		}
		if len(fields) >= 2 && fields[0] == key+":" {
			v, _ := strconv.ParseUint(fields[1], 10, 64)
			return v
		}
	}
	return 0
}
