package bctest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// WriteSimHost writes the /proc and /sys facts of a DGX-like host (two
// sockets of 56 cores with SMT, two NUMA nodes, 2 TiB of memory, hugepages)
// below dir, for simulated agents whose GPUs come from go-nvml's mocks. The
// agent reads it through the same sysfs code as on a real host.
func WriteSimHost(dir string) error {
	const (
		sockets        = 2
		coresPerSocket = 56
		nodeMemKiB     = 1056462848
	)
	files := map[string]string{
		"etc/os-release":            "PRETTY_NAME=\"Ubuntu 22.04.4 LTS\"\nID=ubuntu\n",
		"proc/sys/kernel/osrelease": "5.15.0-105-generic\n",
		"proc/meminfo": fmt.Sprintf("MemTotal:       %d kB\nMemFree:        %d kB\nHugePages_Total:    2048\nHugepagesize:       2048 kB\n",
			2*nodeMemKiB, 2*nodeMemKiB-100000000),
		"proc/pressure/cpu":                                        "some avg10=0.50 avg60=0.40 avg300=0.20 total=1000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
		"proc/pressure/memory":                                     "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
		"proc/pressure/io":                                         "some avg10=0.10 avg60=0.10 avg300=0.00 total=10\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
		"sys/devices/system/node/online":                           "0-1\n",
		"sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages":    "2048\n",
		"sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages": "32\n",
	}
	var cpuinfo strings.Builder
	threads := sockets * coresPerSocket * 2
	for p := range threads {
		socket := (p / coresPerSocket) % sockets
		fmt.Fprintf(&cpuinfo, "processor\t: %d\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480C\nphysical id\t: %d\nsiblings\t: %d\ncore id\t\t: %d\ncpu cores\t: %d\n\n",
			p, socket, coresPerSocket*2, p%coresPerSocket, coresPerSocket)
	}
	files["proc/cpuinfo"] = cpuinfo.String()
	for n := range sockets {
		base := fmt.Sprintf("sys/devices/system/node/node%d/", n)
		lo, hi := n*coresPerSocket, (n+1)*coresPerSocket-1
		files[base+"cpulist"] = fmt.Sprintf("%d-%d,%d-%d\n", lo, hi, lo+sockets*coresPerSocket, hi+sockets*coresPerSocket)
		files[base+"meminfo"] = fmt.Sprintf("Node %d MemTotal:       %d kB\nNode %d MemFree:        %d kB\nNode %d HugePages_Total:  16\n", n, nodeMemKiB, n, nodeMemKiB-50000000, n)
		files[base+"hugepages/hugepages-2048kB/nr_hugepages"] = "1024\n"
		files[base+"hugepages/hugepages-1048576kB/nr_hugepages"] = "16\n"
	}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			return err
		}
	}
	return nil
}
