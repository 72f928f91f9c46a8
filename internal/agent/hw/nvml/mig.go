//go:build cgo

package nvml

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/better-compute/better-compute/internal/agent/hw"
)

var _ hw.MIGConfigurer = (*Backend)(nil)

// ConfigureMIG gives the GPU the MIG layout profiles (see hw.MIGConfigurer).
// Every profile is resolved before anything changes, and a GPU with a
// process on it or on one of its MIG devices is refused with hw.ErrGPUBusy.
// Enabling MIG mode on a GPU that needs a reset for it leaves the mode
// pending (the inventory says so) and returns an error.
func (b *Backend) ConfigureMIG(ctx context.Context, uuid string, profiles []string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.lib == nil {
		return errors.New("nvml backend closed")
	}
	d, ret := b.lib.DeviceGetHandleByUUID(uuid)
	if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
		return fmt.Errorf("nvml: GPU %s: %w", uuid, hw.ErrNoGPU)
	}
	if err := check("device "+uuid, ret); err != nil {
		return err
	}
	infos, err := resolveProfiles(d, profiles)
	if err != nil {
		return fmt.Errorf("nvml: GPU %s: %w", uuid, err)
	}
	if busy, err := inUse(d); err != nil || busy {
		if err == nil {
			err = hw.ErrGPUBusy
		}
		return fmt.Errorf("nvml: GPU %s: %w", uuid, err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	cur, _, ret := d.GetMigMode()
	if err := check("MIG mode of "+uuid, ret); err != nil {
		return err
	}
	if cur != nvml.DEVICE_MIG_ENABLE {
		activation, ret := d.SetMigMode(nvml.DEVICE_MIG_ENABLE)
		if err := check("enable MIG on "+uuid, ret); err != nil {
			return err
		}
		if activation != nvml.SUCCESS {
			return fmt.Errorf("nvml: MIG mode on %s is pending a GPU reset (%s)", uuid, nvml.ErrorString(activation))
		}
	}
	if err := destroyInstances(d); err != nil {
		return fmt.Errorf("nvml: GPU %s: %w", uuid, err)
	}
	// Largest first: the big instances have the fewest placements.
	slices.SortStableFunc(infos, func(a, b nvml.GpuInstanceProfileInfo) int { return cmp.Compare(b.SliceCount, a.SliceCount) })
	for _, info := range infos {
		gi, ret := d.CreateGpuInstance(&info)
		if ret == nvml.ERROR_INSUFFICIENT_RESOURCES {
			return fmt.Errorf("nvml: GPU %s: %s does not fit beside the others: %w", uuid, profileName(info), hw.ErrMIGLayout)
		}
		if err := check("create GPU instance "+profileName(info), ret); err != nil {
			return err
		}
		ci, err := fullComputeProfile(gi, info.SliceCount)
		if err != nil {
			return fmt.Errorf("nvml: GPU %s: %w", uuid, err)
		}
		if _, ret := gi.CreateComputeInstance(&ci); ret != nvml.SUCCESS {
			return check("create compute instance in "+profileName(info), ret)
		}
	}
	return nil
}

// profileName spells a GPU instance profile as the inventory does.
func profileName(info nvml.GpuInstanceProfileInfo) string {
	return fmt.Sprintf("%dg.%dgb", info.SliceCount, (info.MemorySizeMB+1023)/1024)
}

// resolveProfiles finds each profile's GPU instance profile on d.
func resolveProfiles(d nvml.Device, profiles []string) ([]nvml.GpuInstanceProfileInfo, error) {
	byName := map[string]nvml.GpuInstanceProfileInfo{}
	for p := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		if info, ret := d.GetGpuInstanceProfileInfo(p); ret == nvml.SUCCESS {
			if _, seen := byName[profileName(info)]; !seen {
				byName[profileName(info)] = info
			}
		}
	}
	out := make([]nvml.GpuInstanceProfileInfo, 0, len(profiles))
	for _, name := range profiles {
		info, ok := byName[name]
		if !ok {
			return nil, fmt.Errorf("profile %q: %w", name, hw.ErrMIGLayout)
		}
		out = append(out, info)
	}
	return out, nil
}

// inUse reports whether any compute process runs on d or on one of its MIG
// devices.
func inUse(d nvml.Device) (busy bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			busy, err = true, fmt.Errorf("cannot list the GPU's processes: %v", r)
		}
	}()
	procs, ret := d.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_SUPPORTED {
		return true, check("list processes", ret)
	}
	if len(procs) > 0 {
		return true, nil
	}
	n, ret := d.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return false, nil
	}
	for i := range n {
		md, ret := d.GetMigDeviceHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		if procs, ret := md.GetComputeRunningProcesses(); ret == nvml.SUCCESS && len(procs) > 0 {
			return true, nil
		}
	}
	return false, nil
}

// destroyInstances destroys every compute and GPU instance of d.
func destroyInstances(d nvml.Device) error {
	for p := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := d.GetGpuInstanceProfileInfo(p)
		if ret != nvml.SUCCESS {
			continue
		}
		gis, ret := d.GetGpuInstances(&info)
		if ret != nvml.SUCCESS {
			continue
		}
		for _, gi := range gis {
			for c := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
				ci, ret := gi.GetComputeInstanceProfileInfo(c, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
				if ret != nvml.SUCCESS {
					continue
				}
				cis, ret := gi.GetComputeInstances(&ci)
				if ret != nvml.SUCCESS {
					continue
				}
				for _, inst := range cis {
					if err := check("destroy compute instance", inst.Destroy()); err != nil {
						return err
					}
				}
			}
			if err := check("destroy GPU instance "+profileName(info), gi.Destroy()); err != nil {
				return err
			}
		}
	}
	return nil
}

// fullComputeProfile is the compute instance profile that fills a GPU
// instance of slices compute slices.
func fullComputeProfile(gi nvml.GpuInstance, slices uint32) (nvml.ComputeInstanceProfileInfo, error) {
	for c := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		ci, ret := gi.GetComputeInstanceProfileInfo(c, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret == nvml.SUCCESS && ci.SliceCount == slices {
			return ci, nil
		}
	}
	return nvml.ComputeInstanceProfileInfo{}, fmt.Errorf("no compute instance profile of %d slices", slices)
}
