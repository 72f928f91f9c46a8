package bctest

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
)

// FleetSimConfig describes a simulated fleet.
type FleetSimConfig struct {
	// Template is applied to every daemon; StateDir and Seed are set per
	// daemon.
	Template FakeDaemonConfig
	// Root holds one state dir per daemon.
	Root string
	// N is how many daemons to run.
	N int
	// Profiles is the mix, assigned round-robin ("dgxh100", "dgxa100",
	// "dgxb200"); empty means all dgxh100.
	Profiles []string
	// Token returns the join token for daemon i (each token is single-use).
	// It is called only for daemons that have not joined before.
	Token func(ctx context.Context, i int) (string, error)
}

// FleetSim is N fake daemons.
type FleetSim struct {
	Daemons []*FakeDaemon
}

// ParseProfiles reads a profile mix such as "dgxh100" or "dgxh100,dgxa100".
func ParseProfiles(s string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		switch p {
		case "":
		case "dgxh100", "dgxa100", "dgxb200":
			out = append(out, p)
		default:
			return nil, fmt.Errorf("unknown sim profile %q (want dgxh100, dgxa100 or dgxb200)", p)
		}
	}
	return out, nil
}

// StartFleetSim joins (where needed) and starts every daemon. Daemons whose
// state dir already holds an identity rejoin nothing: a restarted dev keeps
// its simulated nodes.
func StartFleetSim(ctx context.Context, cfg FleetSimConfig) (*FleetSim, error) {
	sim := &FleetSim{Daemons: make([]*FakeDaemon, cfg.N)}
	errs := make([]error, cfg.N)
	var wg sync.WaitGroup
	for i := range cfg.N {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := cfg.Template
			c.StateDir = filepath.Join(cfg.Root, fmt.Sprintf("node-%03d", i))
			c.Seed = fmt.Sprintf("%s/sim-%d", cfg.Root, i)
			if len(cfg.Profiles) > 0 {
				c.Profile = cfg.Profiles[i%len(cfg.Profiles)]
			}
			if c.CgroupRoot != "" {
				// One cgroup subtree per node: allocation ids are unique,
				// but a node removes only what is below its own root.
				c.CgroupRoot = filepath.Join(c.CgroupRoot, fmt.Sprintf("node-%03d", i))
			}
			d, err := NewFakeDaemon(c)
			if err != nil {
				errs[i] = err
				return
			}
			if !d.Joined() {
				tok, err := cfg.Token(ctx, i)
				if err == nil {
					err = d.Join(ctx, tok)
				}
				if err != nil {
					errs[i] = errors.Join(fmt.Errorf("sim node %d: join: %w", i, err), d.Close())
					return
				}
			}
			d.Start()
			sim.Daemons[i] = d
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		sim.Stop()
		return nil, err
	}
	return sim, nil
}

// Stop stops every daemon.
func (s *FleetSim) Stop() {
	var wg sync.WaitGroup
	for _, d := range s.Daemons {
		if d == nil {
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = d.Stop() }()
	}
	wg.Wait()
}
