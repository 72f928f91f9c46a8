package site

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/agent"
	"github.com/better-compute/better-compute/internal/metal/bmc"
)

// LoadDrivers is the site agent's driver registry: the built-ins, and
// every driver binary in dir ("" for none), each started once to ask its
// Info. A driver that fails to register fails the load: a site agent
// that started without a driver its machines name would fail their
// steps later, far from the cause.
func LoadDrivers(ctx context.Context, dir string, log *slog.Logger) (*bmc.Registry, error) {
	reg := bmc.NewRegistry(log)
	if dir == "" {
		return reg, nil
	}
	if _, err := reg.RegisterDir(ctx, dir); err != nil {
		return nil, err
	}
	return reg, nil
}

// BMCDrivers are the agent's drivers as its Hello reports them to the
// control plane (agent.Config.BMCDrivers).
func (a *Agent) BMCDrivers() []*agentv1.BMCDriver {
	var out []*agentv1.BMCDriver
	for _, d := range a.cfg.Drivers.List() {
		out = append(out, &agentv1.BMCDriver{Name: d.Name, Reports: wireText(d.Reports), Version: wireText(d.Version),
			BuiltIn: d.BuiltIn, Path: d.Path, Capabilities: wireTexts(d.Capabilities)})
	}
	return out
}

// wireText keeps a driver's self-reported text in the shape the gateway
// accepts (letters, digits and ._:/+-, 128 bytes): a driver with an odd
// version string must not get its agent's session refused.
func wireText(s string) string {
	s = strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', strings.ContainsRune("._:/+-", r):
			return r
		}
		return '_'
	}, s)
	if len(s) > 128 {
		s = s[:128]
	}
	return s
}

func wireTexts(ss []string) []string {
	var out []string
	for _, s := range ss {
		if s = wireText(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// checkDriver refuses a command for a driver this agent does not have,
// before anything is recorded or sent to a BMC. A "plugin:<path>" name is
// refused too: the control plane must never make the agent start a
// binary that is not in its drivers directory.
func (a *Agent) checkDriver(name string) error {
	names := a.cfg.Drivers.Names()
	if slices.Contains(names, name) {
		return nil
	}
	return agent.CommandError(FailNoDriver, fmt.Errorf("this site agent has no BMC driver %q (it has %s): install it in the agent's drivers directory and restart the agent",
		name, strings.Join(names, ", ")))
}

// newDriver builds a BMC driver through the agent's registry, only under a
// name the registry lists.
func (a *Agent) newDriver(name, address string, creds bmc.Credentials) (bmc.Driver, error) {
	if err := a.checkDriver(name); err != nil {
		return nil, err
	}
	return a.cfg.Drivers.New(name, address, creds, a.cfg.BMC)
}
