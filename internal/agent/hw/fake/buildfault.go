package fake

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/better-compute/better-compute/internal/gpuhealth"
)

// buildFault is a test aid, set only at link time:
//
//	go build -ldflags "-X github.com/better-compute/better-compute/internal/agent/hw/fake.buildFault=ecc_uncorrectable:0" ./cmd/bcd
//
// makes every fake machine of that build start with the standing finding
// KIND on GPU INDEX (KIND[:INDEX[:CODE]], comma-separated for several;
// KIND as InjectFinding takes it, with or without its "gpu." prefix). It
// exists so that a rollout test can build, from the same source, a
// release that fails its health check once installed. It touches only
// the fake backend: a real node's GPUs are read through NVML.
var buildFault string

// fault is one finding buildFault injects.
type fault struct {
	kind string
	gpu  int
	code int64
}

// parseBuildFault reads spec (buildFault's form) for a machine of gpus
// GPUs.
func parseBuildFault(spec string, gpus int) ([]fault, error) {
	if spec == "" {
		return nil, nil
	}
	var out []fault
	for item := range strings.SplitSeq(spec, ",") {
		parts := strings.Split(strings.TrimSpace(item), ":")
		if len(parts) > 3 || parts[0] == "" {
			return nil, fmt.Errorf("fake: build fault %q: want KIND[:GPU[:CODE]]", item)
		}
		f := fault{kind: parts[0]}
		if !strings.HasPrefix(f.kind, "gpu.") {
			f.kind = "gpu." + f.kind
		}
		if f.kind == gpuhealth.KindXID || !slices.Contains(gpuhealth.Kinds, f.kind) {
			return nil, fmt.Errorf("fake: build fault %q: kind %q is not a standing finding (one of %s but %s)",
				item, parts[0], strings.Join(gpuhealth.Kinds, ", "), gpuhealth.KindXID)
		}
		if len(parts) > 1 {
			n, err := strconv.Atoi(parts[1])
			if err != nil || n < 0 || n >= gpus {
				return nil, fmt.Errorf("fake: build fault %q: GPU %q is not an index of this machine's %d GPUs", item, parts[1], gpus)
			}
			f.gpu = n
		}
		if len(parts) > 2 {
			c, err := strconv.ParseInt(parts[2], 0, 64)
			if err != nil {
				return nil, fmt.Errorf("fake: build fault %q: code %q is not a number", item, parts[2])
			}
			f.code = c
		}
		out = append(out, f)
	}
	return out, nil
}

// injectBuildFault applies spec to b.
func (b *Backend) injectBuildFault(spec string) error {
	faults, err := parseBuildFault(spec, b.faults.gpus)
	if err != nil {
		return err
	}
	for _, f := range faults {
		b.InjectFinding(f.kind, f.gpu, f.code)
	}
	return nil
}
