package bmc

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"

	"github.com/better-compute/better-compute/pkg/driver"
)

// The two directions between this package's Driver and pkg/driver's BMC:
// Served puts a built-in driver behind the SDK (a driver binary serves
// it), and newPlugin puts a driver process behind Driver (the agent uses
// it like a built-in).

// PluginPrefix names an external driver by its binary's path in New:
// "plugin:/usr/lib/better-compute/drivers/acme-bmc".
const PluginPrefix = "plugin:"

// Served is the built-in driver called name as a pkg/driver BMCDriver, for
// a driver binary to serve out of process (examples/bmc-driver). log
// receives the driver's debug lines (never a password).
func Served(name string, log *slog.Logger) (driver.BMCDriver, error) {
	info, ok := builtinInfo(name)
	if !ok {
		return nil, &Error{Driver: name, Op: "serve", Kind: ErrUnsupported, Detail: "not a built-in driver (want one of " +
			strings.Join(Drivers(), ", ") + ")"}
	}
	return served{name: name, info: info, log: log}, nil
}

type served struct {
	name string
	info DriverInfo
	log  *slog.Logger
}

func (s served) Info() driver.Info {
	i := driver.Info{Name: s.info.Name, Version: s.info.Version}
	for _, c := range s.info.Capabilities {
		i.Capabilities = append(i.Capabilities, driver.Capability(c))
	}
	return i
}

func (s served) Open(_ context.Context, t driver.Target) (driver.BMC, error) {
	d, err := New(s.name, t.Address, NewCredentials(t.Username, t.Password),
		Options{Timeout: t.Timeout, Logger: s.log, InsecureSkipVerify: t.InsecureSkipVerify, BasicAuth: t.BasicAuth})
	if err != nil {
		return nil, toSDKError(err)
	}
	return servedBMC{d}, nil
}

// servedBMC is a Driver seen as a pkg/driver BMC.
type servedBMC struct{ d Driver }

func (b servedBMC) Name() string                         { return b.d.Name() }
func (b servedBMC) PowerOn(ctx context.Context) error    { return toSDKError(b.d.PowerOn(ctx)) }
func (b servedBMC) PowerOff(ctx context.Context) error   { return toSDKError(b.d.PowerOff(ctx)) }
func (b servedBMC) Shutdown(ctx context.Context) error   { return toSDKError(b.d.Shutdown(ctx)) }
func (b servedBMC) PowerCycle(ctx context.Context) error { return toSDKError(b.d.PowerCycle(ctx)) }
func (b servedBMC) EjectVirtualMedia(ctx context.Context) error {
	return toSDKError(b.d.EjectVirtualMedia(ctx))
}
func (b servedBMC) Close(ctx context.Context) error { return toSDKError(b.d.Close(ctx)) }

func (b servedBMC) PowerStatus(ctx context.Context) (driver.PowerState, error) {
	st, err := b.d.PowerStatus(ctx)
	return driver.PowerState(st), toSDKError(err)
}

func (b servedBMC) SetBootOverride(ctx context.Context, o driver.BootOverride) error {
	return toSDKError(b.d.SetBootOverride(ctx, BootOverride{Target: BootTarget(o.Target), Persistent: o.Persistent}))
}

func (b servedBMC) InsertVirtualMedia(ctx context.Context, imageURL string) error {
	return toSDKError(b.d.InsertVirtualMedia(ctx, imageURL))
}

// SetPassword reaches the driver's PasswordSetter; a driver without one
// says so with ErrUnsupported.
func (b servedBMC) SetPassword(ctx context.Context, password string) error {
	ps, ok := b.d.(PasswordSetter)
	if !ok {
		return &driver.Error{Driver: b.d.Name(), Op: "set password", Kind: driver.ErrUnsupported,
			Detail: "this driver cannot change a BMC password"}
	}
	return toSDKError(ps.SetPassword(ctx, password))
}

// kindPairs maps this package's kinds to the SDK's, one to one.
var kindPairs = []struct{ ours, sdk error }{
	{ErrAuth, driver.ErrAuth},
	{ErrUnreachable, driver.ErrUnreachable},
	{ErrUnsupported, driver.ErrUnsupported},
	{ErrInvalidAddress, driver.ErrInvalidAddress},
	{ErrInvalidArgument, driver.ErrInvalidArgument},
	{ErrRefused, driver.ErrRefused},
}

// toSDKError carries an *Error across as a *driver.Error of the same kind.
func toSDKError(err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if !errors.As(err, &e) {
		return err
	}
	out := &driver.Error{Driver: e.Driver, Address: e.Address, Op: e.Op, Kind: driver.ErrRefused, Detail: e.Detail, Err: e.Err}
	for _, p := range kindPairs {
		if errors.Is(e.Kind, p.ours) {
			out.Kind = p.sdk
		}
	}
	return out
}

// fromSDKError carries a *driver.Error back as an *Error, scrubbed of the
// credentials again (the driver process is not trusted to have done it).
// A failed driver process has no kind of its own here: it is
// ErrUnreachable, since a retry starts a new process.
func fromSDKError(err error, creds Credentials, name, address, op string) error {
	if err == nil {
		return nil
	}
	e := &Error{Driver: name, Address: address, Op: op, Kind: ErrRefused, Detail: err.Error()}
	var de *driver.Error
	if errors.As(err, &de) {
		e.Driver, e.Address, e.Op, e.Detail, e.Err = de.Driver, de.Address, de.Op, de.Detail, de.Err
		for _, p := range kindPairs {
			if errors.Is(de.Kind, p.sdk) {
				e.Kind = p.ours
			}
		}
		if errors.Is(de.Kind, driver.ErrDriver) {
			e.Kind, e.Detail = ErrUnreachable, "driver process: "+de.Detail
		}
	} else if errors.Is(err, driver.ErrDriver) {
		e.Kind = ErrUnreachable
	}
	e.Address, e.Detail = creds.scrub(e.Address), creds.scrub(e.Detail)
	return e
}

// pluginDriver is a Driver served by a driver process, one process per
// Driver: the process ends when the Driver is closed.
type pluginDriver struct {
	name    string
	address string
	creds   Credentials
	opts    Options
	b       driver.BMC
	proc    io.Closer
}

// newPlugin starts the driver binary at path and opens the BMC at address
// through it.
func newPlugin(name, path, address string, creds Credentials, opts Options) (Driver, error) {
	ctx, cancel := context.WithTimeout(context.Background(), opts.Timeout)
	defer cancel()
	t := driver.Target{Address: address, Username: creds.username, Password: creds.password, Timeout: opts.Timeout,
		InsecureSkipVerify: opts.InsecureSkipVerify, BasicAuth: opts.BasicAuth}
	b, proc, err := driver.OpenBMC(ctx, path, t, driver.Options{Logger: opts.Logger, StartTimeout: opts.Timeout})
	if err != nil {
		return nil, fromSDKError(err, creds, name, printable(address), "new")
	}
	d := &pluginDriver{name: name, address: printable(address), creds: creds, opts: opts, b: b, proc: proc}
	if _, ok := b.(driver.PasswordSetter); ok {
		return &pluginSetter{d}, nil
	}
	return d, nil
}

func (d *pluginDriver) fail(err error, op string) error {
	return fromSDKError(err, d.creds, d.name, d.address, op)
}

func (d *pluginDriver) call(ctx context.Context, op string, fn func(context.Context) error) error {
	ctx, cancel := callContext(ctx, d.opts)
	defer cancel()
	return d.fail(fn(ctx), op)
}

// Name is the name the driver was built with ("plugin:<path>" or the
// name it is registered under).
func (d *pluginDriver) Name() string { return d.name }

func (d *pluginDriver) PowerOn(ctx context.Context) error {
	return d.call(ctx, "power on", d.b.PowerOn)
}

func (d *pluginDriver) PowerOff(ctx context.Context) error {
	return d.call(ctx, "power off", d.b.PowerOff)
}

func (d *pluginDriver) Shutdown(ctx context.Context) error {
	return d.call(ctx, "shutdown", d.b.Shutdown)
}

func (d *pluginDriver) PowerCycle(ctx context.Context) error {
	return d.call(ctx, "power cycle", d.b.PowerCycle)
}

func (d *pluginDriver) PowerStatus(ctx context.Context) (PowerState, error) {
	st := PowerUnknown
	err := d.call(ctx, "power status", func(ctx context.Context) error {
		s, err := d.b.PowerStatus(ctx)
		st = PowerState(s)
		return err
	})
	if err != nil {
		return PowerUnknown, err
	}
	return st, nil
}

func (d *pluginDriver) SetBootOverride(ctx context.Context, o BootOverride) error {
	if err := o.validate(); err != nil {
		return newError(d.name, d.address, "set boot override", ErrInvalidArgument, d.creds, err.Error())
	}
	return d.call(ctx, "set boot override", func(ctx context.Context) error {
		return d.b.SetBootOverride(ctx, driver.BootOverride{Target: driver.BootTarget(o.Target), Persistent: o.Persistent})
	})
}

func (d *pluginDriver) InsertVirtualMedia(ctx context.Context, imageURL string) error {
	return d.call(ctx, "insert virtual media", func(ctx context.Context) error {
		return d.b.InsertVirtualMedia(ctx, imageURL)
	})
}

func (d *pluginDriver) EjectVirtualMedia(ctx context.Context) error {
	return d.call(ctx, "eject virtual media", d.b.EjectVirtualMedia)
}

// Close releases the BMC in the driver, then ends the driver process,
// even when the first fails.
func (d *pluginDriver) Close(ctx context.Context) error {
	err := d.call(ctx, "close", d.b.Close)
	if perr := d.proc.Close(); err == nil && perr != nil {
		err = d.fail(perr, "close")
	}
	return err
}

// pluginSetter is a pluginDriver whose driver sets passwords.
type pluginSetter struct{ *pluginDriver }

func (d *pluginSetter) SetPassword(ctx context.Context, password string) error {
	// The new password is scrubbed from errors as the current one is.
	scrub := NewCredentials(d.creds.username, password)
	err := d.call(ctx, "set password", func(ctx context.Context) error {
		return d.b.(driver.PasswordSetter).SetPassword(ctx, password)
	})
	var e *Error
	if errors.As(err, &e) {
		e.Detail = scrub.scrub(e.Detail)
	}
	return err
}
