package driver_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/better-compute/better-compute/pkg/driver"
)

// memoryDriver is a whole driver: a BMC kept in memory, with one account.
// A real driver speaks a protocol to the address in Open's Target.
type memoryDriver struct {
	log *slog.Logger
}

const (
	exampleUser     = "admin"
	examplePassword = "Example-pw-9f3k"
)

func (memoryDriver) Info() driver.Info {
	return driver.Info{Name: "memory", Version: "0.1.0", Capabilities: []driver.Capability{driver.CapSetPassword}}
}

func (d memoryDriver) Open(_ context.Context, t driver.Target) (driver.BMC, error) {
	if t.Address == "" {
		return nil, &driver.Error{Driver: "memory", Op: "new", Kind: driver.ErrInvalidAddress, Detail: "no address"}
	}
	d.log.Info("opened a BMC", "target", t) // Target prints its password redacted
	return &memoryBMC{target: t, power: driver.PowerOff}, nil
}

type memoryBMC struct {
	target driver.Target
	mu     sync.Mutex
	power  driver.PowerState
}

func (b *memoryBMC) Name() string { return "memory" }

// login is where a real driver opens a session with the BMC.
func (b *memoryBMC) login(op string) error {
	if b.target.Username != exampleUser || b.target.Password != examplePassword {
		return &driver.Error{Driver: "memory", Address: b.target.Address, Op: op, Kind: driver.ErrAuth,
			Detail: "the BMC refused user " + b.target.Username}
	}
	return nil
}

func (b *memoryBMC) set(op string, st driver.PowerState) error {
	if err := b.login(op); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.power = st
	return nil
}

func (b *memoryBMC) PowerOn(context.Context) error    { return b.set("power on", driver.PowerOn) }
func (b *memoryBMC) PowerOff(context.Context) error   { return b.set("power off", driver.PowerOff) }
func (b *memoryBMC) Shutdown(context.Context) error   { return b.set("shutdown", driver.PowerOff) }
func (b *memoryBMC) PowerCycle(context.Context) error { return b.set("power cycle", driver.PowerOn) }

func (b *memoryBMC) PowerStatus(context.Context) (driver.PowerState, error) {
	if err := b.login("power status"); err != nil {
		return driver.PowerUnknown, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.power, nil
}

func (b *memoryBMC) SetBootOverride(context.Context, driver.BootOverride) error {
	return b.login("set boot override")
}

func (b *memoryBMC) InsertVirtualMedia(context.Context, string) error {
	return &driver.Error{Driver: "memory", Address: b.target.Address, Op: "insert virtual media",
		Kind: driver.ErrUnsupported, Detail: "this BMC has no virtual media"}
}

func (b *memoryBMC) EjectVirtualMedia(context.Context) error {
	return &driver.Error{Driver: "memory", Address: b.target.Address, Op: "eject virtual media",
		Kind: driver.ErrUnsupported, Detail: "this BMC has no virtual media"}
}

func (b *memoryBMC) SetPassword(_ context.Context, password string) error {
	if err := b.login("set password"); err != nil {
		return err
	}
	if len(password) < 8 {
		return &driver.Error{Driver: "memory", Address: b.target.Address, Op: "set password",
			Kind: driver.ErrInvalidArgument, Detail: "a password is at least 8 bytes"}
	}
	return nil
}

func (b *memoryBMC) Close(context.Context) error { return nil }

// Example opens a BMC through a driver process. A driver binary's main is
// driver.ServeBMC(memoryDriver{...}); here the test binary plays that
// binary when BC_DRIVER_TEST_MODE says so (see TestMain).
func Example() {
	ctx := context.Background()
	target := driver.Target{Address: "10.0.0.5:623", Username: exampleUser, Password: examplePassword}
	bmc, proc, err := driver.OpenBMC(ctx, os.Args[0], target, driver.Options{Env: []string{"BC_DRIVER_TEST_MODE=memory"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer proc.Close()
	defer bmc.Close(ctx)

	st, _ := bmc.PowerStatus(ctx)
	fmt.Println(bmc.Name(), "power", st)
	if err := bmc.PowerOn(ctx); err != nil {
		fmt.Println(err)
		return
	}
	st, _ = bmc.PowerStatus(ctx)
	fmt.Println(bmc.Name(), "power", st)
	err = bmc.InsertVirtualMedia(ctx, "http://10.0.0.1/boot.iso")
	fmt.Println(errors.Is(err, driver.ErrUnsupported), err)
	// Output:
	// memory power off
	// memory power on
	// true bmc memory 10.0.0.5:623: insert virtual media: not supported: this BMC has no virtual media
}
