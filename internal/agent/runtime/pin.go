package runtime

import (
	"context"
	"encoding/json"
	"fmt"

	"golang.org/x/sys/unix"
)

// VCPUThreads maps vCPU index to QEMU's host thread id (query-cpus-fast).
func (in *instance) vcpuThreads() (map[int]int, error) {
	raw, err := in.monitor("query-cpus-fast", nil)
	if err != nil {
		return nil, err
	}
	var cpus []struct {
		CPUIndex int `json:"cpu-index"`
		ThreadID int `json:"thread-id"`
	}
	if err := json.Unmarshal(raw, &cpus); err != nil {
		return nil, fmt.Errorf("runtime: query-cpus-fast: %w", err)
	}
	out := make(map[int]int, len(cpus))
	for _, c := range cpus {
		out[c.CPUIndex] = c.ThreadID
	}
	return out, nil
}

// pinLocked sets each vCPU thread's affinity to its host CPU.
func (r *Runtime) pinLocked(_ context.Context, in *instance) error {
	threads, err := in.vcpuThreads()
	if err != nil {
		return err
	}
	cpus := in.spec.HostCPUs
	for idx, tid := range threads {
		var set unix.CPUSet
		set.Zero()
		set.Set(cpus[idx%len(cpus)])
		if err := unix.SchedSetaffinity(tid, &set); err != nil {
			return fmt.Errorf("runtime: pin vcpu %d (thread %d) to cpu %d: %w", idx, tid, cpus[idx%len(cpus)], err)
		}
	}
	return nil
}

// VCPUAffinity is each vCPU's host CPU set as the kernel reports it.
func (r *Runtime) VCPUAffinity(_ context.Context, id string) (map[int][]int, error) {
	in, err := r.get(id)
	if err != nil {
		return nil, err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if err := in.runningLocked(); err != nil {
		return nil, err
	}
	threads, err := in.vcpuThreads()
	if err != nil {
		return nil, err
	}
	out := map[int][]int{}
	for idx, tid := range threads {
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(tid, &set); err != nil {
			return nil, fmt.Errorf("runtime: affinity of thread %d: %w", tid, err)
		}
		for c := 0; c < 1024; c++ {
			if set.IsSet(c) {
				out[idx] = append(out[idx], c)
			}
		}
	}
	return out, nil
}
