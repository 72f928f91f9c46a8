package metal

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/profiles"
	"github.com/better-compute/better-compute/internal/provision"
	"github.com/better-compute/better-compute/internal/store"
)

// KindDriverInvoke runs an operation of the machine's BMC driver through
// its site agent (a profile's driver.invoke step).
const KindDriverInvoke = profiles.KindDriverInvoke

// DriverOps are the operations a driver.invoke step may name, and the
// bmc.power action the site agent carries each out with: every driver,
// built-in or external, implements them (bmc.Driver).
var DriverOps = map[string]string{
	"power.on":       "on",
	"power.off":      "off",
	"power.cycle":    "cycle",
	"power.shutdown": "shutdown",
}

// driverAction is the bmc.power action of a driver.invoke step; an
// operation drivers do not carry out is refused as not dispatched.
func driverAction(run provision.StepRun) (string, error) {
	op, _ := run.Params["operation"].(string)
	a, ok := DriverOps[op]
	if !ok {
		return "", fmt.Errorf("%w: step %s: driver.invoke operation %q is not one drivers carry out (%v)",
			provision.ErrNotDispatched, run.Name, op, slices.Sorted(maps.Keys(DriverOps)))
	}
	return a, nil
}

// ProfileCatalog is what profile documents are checked against: the step
// kinds the machine engine runs and the driver operations.
func (r *Runtime) ProfileCatalog() profiles.Catalog {
	var names []string
	for _, p := range r.Engine.Profiles() {
		names = append(names, p.Name)
	}
	return profiles.Catalog{Kinds: r.Engine.Kinds(), DriverOps: slices.Sorted(maps.Keys(DriverOps)), Profiles: names}
}

// inputProfile is the workflow input that names the tenant's deploy
// profile a deploy runs (and profile_version its version).
const inputProfile = "profile"

// tenantProfile is the tenant's deploy profile a workflow's input names,
// as the engine runs it under the operation's name (the machine's
// transitions follow the operation); the zero Profile when none is named.
// A profile of another tenant is not found.
func tenantProfile(ctx context.Context, q store.Querier, m Machine, op string, input map[string]any) (provision.Profile, error) {
	name, _ := input[inputProfile].(string)
	if name == "" {
		return provision.Profile{}, nil
	}
	p, err := deployProfile(ctx, q, m.TenantID, name, op)
	if err != nil {
		return provision.Profile{}, err
	}
	input["profile_version"] = p.Version
	prof := p.Expansion
	prof.Name = op
	return prof, nil
}

// deployProfile reads a tenant's deploy profile by name: NOT_FOUND for a
// name the tenant has not (another tenant's is never found).
func deployProfile(ctx context.Context, q store.Querier, tenantID, name, op string) (profiles.Stored, error) {
	p, err := profiles.Get(ctx, q, tenantID, name, "")
	if errors.Is(err, store.ErrNotFound) {
		return p, envelope.NotFound("profile", name)
	}
	if err != nil {
		return p, err
	}
	if p.Kind != profiles.KindDeploy {
		return p, envelope.Invalid(envelope.Violation{Field: "profile",
			Reason: fmt.Sprintf("%s is a %s: %s runs a %s", p.Name, p.Kind, op, profiles.KindDeploy)})
	}
	return p, nil
}

// checkHardwareProfile refuses a machine whose hardware profile names a
// tenant's HardwareProfile that needs a driver the machine is not driven
// by or its site lacks. A hardware_profile that names no profile is a
// label, as before profiles existed.
func checkHardwareProfile(ctx context.Context, q store.Querier, site Site, tenantID, name, bmcDriver string) error {
	if name == "" {
		return nil
	}
	p, err := profiles.Get(ctx, q, tenantID, name, "")
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if p.Kind != profiles.KindHardware || p.Driver == "" {
		return nil
	}
	if bmcDriver != p.Driver {
		return envelope.Invalid(envelope.Violation{Field: "hardware_profile", Reason: fmt.Sprintf(
			"hardware profile %s needs BMC driver %q, the machine's bmc_driver is %q", p.Name, p.Driver, bmcDriver)})
	}
	if err := checkSiteDriver(ctx, q, site, p.Driver); err != nil {
		var ee *envelope.Error
		if errors.As(err, &ee) && len(ee.Violations) > 0 {
			return envelope.Invalid(envelope.Violation{Field: "hardware_profile",
				Reason: fmt.Sprintf("hardware profile %s needs driver %q: %s", p.Name, p.Driver, ee.Violations[0].Reason)})
		}
		return err
	}
	return nil
}

// machineFacts are what a profile's conditions see as machine: its
// driver, hardware profile, site, state and inventory. A target that is
// not a machine (a node's remediation) has none.
func machineFacts(ctx context.Context, q store.Querier, id string) (map[string]any, error) {
	m, err := MachineByID(ctx, q, id, "")
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return map[string]any{"id": m.ID, "name": m.Name, "bmc_driver": m.BMCDriver, "hardware_profile": m.HardwareProfile,
		"site_id": m.SiteID, "state": string(m.State), "commissioned": m.Commissioned, "inventory": m.Inventory}, nil
}
