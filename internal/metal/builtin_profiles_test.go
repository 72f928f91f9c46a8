package metal

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/internal/provision"
)

// TestBuiltinDocumentsMatchTheGoProfiles proves that the built-in profile
// documents expand to exactly the profiles the Go code below defined before
// they became documents: no workflow changes with the move.
func TestBuiltinDocumentsMatchTheGoProfiles(t *testing.T) {
	t.Parallel()
	want := goProfiles()
	got := Profiles()
	require.Len(t, got, len(want))
	for i := range want {
		require.Equal(t, want[i], got[i], "profile %s", want[i].Name)
	}
}

// The profiles as Go code, as they were before internal/profiles/builtin.

func goRamdiskBoot(mode string) []provision.Step {
	return []provision.Step{
		{Name: "boot-" + mode, Kind: KindPowerCycle, Destructive: true, Params: map[string]any{"boot": mode},
			Timeout: 5 * time.Minute, Retries: 2, Backoff: 10 * time.Second},
		{Name: mode + "-joined", Kind: provision.KindAwaitRejoin, Timeout: 20 * time.Minute},
	}
}

var goPowerOff = provision.Step{Name: "power-off", Kind: KindPowerOff, Destructive: true, Timeout: 5 * time.Minute,
	Retries: 2, Backoff: 10 * time.Second}

// Profiles are the seed's machine profiles: inspect (inventory),
// commission (inventory + wipe + optional burn-in), deploy (write the
// image, configure, reboot into it), release (wipe) and rescue (the
// ramdisk with an SSH key).
func goProfiles() []provision.Profile {
	inventory := provision.Step{Name: "inventory", Kind: KindInventory, Timeout: 10 * time.Minute, Retries: 1}
	wipe := provision.Step{Name: "wipe", Kind: KindDiskWipe, Destructive: true, Timeout: 6 * time.Hour}
	return append(goLeaseProfiles(), []provision.Profile{
		{Name: OpInspect, Steps: append(goRamdiskBoot(BootRamdisk), inventory, goPowerOff)},
		{Name: OpCommission, Steps: append(goRamdiskBoot(BootRamdisk), inventory, wipe,
			provision.Step{Name: "burn-in", Kind: KindBurnIn, When: "input.burn_in == true", Timeout: 4 * time.Hour}, goPowerOff)},
		{Name: OpDeploy, Steps: append(goRamdiskBoot(BootRamdisk),
			provision.Step{Name: "write-image", Kind: KindImageWrite, Destructive: true, Timeout: 2 * time.Hour},
			provision.Step{Name: "configure", Kind: KindConfigure, Timeout: 10 * time.Minute, Retries: 2},
			provision.Step{Name: "boot-disk", Kind: KindPowerCycle, Destructive: true, Params: map[string]any{"boot": BootDisk},
				Timeout: 5 * time.Minute, Retries: 2, Backoff: 10 * time.Second},
			provision.Step{Name: "os-joined", Kind: provision.KindAwaitRejoin, Timeout: 30 * time.Minute})},
		{Name: OpRelease, Steps: append(goRamdiskBoot(BootRamdisk), wipe, goPowerOff)},
		{Name: OpRescue, Steps: goRamdiskBoot(BootRescue)},
		{Name: OpRescueEndDisk, Steps: []provision.Step{
			{Name: "boot-disk", Kind: KindPowerCycle, Destructive: true, Params: map[string]any{"boot": BootDisk},
				Timeout: 5 * time.Minute, Retries: 2, Backoff: 10 * time.Second},
			{Name: "os-joined", Kind: provision.KindAwaitRejoin, Timeout: 30 * time.Minute}}},
		{Name: OpRescueEndOff, Steps: []provision.Step{goPowerOff}},
		// An operator's power actions: the BMC call alone, no boot mode
		// asked of the site's iPXE script.
		{Name: OpPowerOn, Steps: []provision.Step{{Name: "power-on", Kind: KindPowerOn, Destructive: true, Timeout: 5 * time.Minute,
			Retries: 2, Backoff: 10 * time.Second}}},
		{Name: OpPowerOff, Steps: []provision.Step{goPowerOff}},
		{Name: OpPowerCycle, Steps: []provision.Step{{Name: "power-cycle", Kind: KindPowerCycle, Destructive: true, Timeout: 5 * time.Minute,
			Retries: 2, Backoff: 10 * time.Second}}},
		// A rotation is tried once: a second attempt with the same pending
		// password after an unknown outcome could not tell which password
		// the BMC holds.
		{Name: OpRotateBMC, Steps: []provision.Step{{Name: "rotate-bmc", Kind: KindBMCRotate, Destructive: true, Timeout: 5 * time.Minute}}},
	}...)
}

// leaseProfiles are the lease's workflows: the deploy writes the lessee's
// image and boots it without waiting for a join (its OS answers to the
// lessee, not to the platform); the teardown fences, erases, diagnoses,
// checks the firmware, powers off and rotates the BMC password.
func goLeaseProfiles() []provision.Profile {
	bmcStep := func(name, kind string, params map[string]any) provision.Step {
		return provision.Step{Name: name, Kind: kind, Destructive: true, Params: params, Timeout: 5 * time.Minute,
			Retries: 2, Backoff: 10 * time.Second}
	}
	return []provision.Profile{
		{Name: OpLeaseDeploy, Steps: append(goRamdiskBoot(BootRamdisk),
			provision.Step{Name: "write-image", Kind: KindImageWrite, Destructive: true, Timeout: 2 * time.Hour},
			provision.Step{Name: "configure", Kind: KindConfigure, Timeout: 10 * time.Minute, Retries: 2},
			bmcStep("boot-disk", KindPowerCycle, map[string]any{"boot": BootDisk}))},
		{Name: OpLeaseTeardown, Steps: append(append([]provision.Step{
			bmcStep(stepFence, KindPowerOff, map[string]any{"boot": BootFenced})},
			goRamdiskBoot(BootRamdisk)...),
			provision.Step{Name: stepFirmware, Kind: KindInventory, Timeout: 10 * time.Minute, Retries: 1},
			provision.Step{Name: stepErase, Kind: KindDiskWipe, Destructive: true, Timeout: 6 * time.Hour},
			provision.Step{Name: stepDiagnostics, Kind: KindBurnIn, Timeout: 4 * time.Hour},
			bmcStep(stepPowerOff, KindPowerOff, nil),
			// Tried once, like a rotation of its own (see Profiles).
			provision.Step{Name: stepRotate, Kind: KindBMCRotate, Destructive: true, Timeout: 5 * time.Minute})},
	}
}

// TestDriverActionRefusesUnknownOperations: a driver.invoke step whose
// operation drivers do not carry out is refused as not dispatched, naming
// it; the known ones map to the site agent's bmc.power actions.
func TestDriverActionRefusesUnknownOperations(t *testing.T) {
	t.Parallel()
	a, err := driverAction(provision.StepRun{Name: "off", Params: map[string]any{"operation": "power.shutdown"}})
	require.NoError(t, err)
	require.Equal(t, "shutdown", a)
	_, err = driverAction(provision.StepRun{Name: "flash", Params: map[string]any{"operation": "firmware.flash"}})
	require.ErrorIs(t, err, provision.ErrNotDispatched)
	require.ErrorContains(t, err, `step flash: driver.invoke operation "firmware.flash" is not one drivers carry out`)
}
